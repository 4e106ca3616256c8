//! The two claims the main job checks on its results (Twilight Sections 3 and 4): top-p's
//! budgets adapt per head, and Quest+Twilight's error is no worse than Quest's top-k at the
//! same average budget. Each is measured from the results' plain data, and says what it
//! measured whether it holds or not.

use super::report::{mean_budget_of_kind, MethodResult};

/// A claim as measured: whether it holds, and the figures it rests on.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    pub holds: bool,
    pub text: String,
}

/// Budgets adapt per head: `r`'s heads of kind `focused` keep tens of tokens on average
/// (under 100) and those of kind `diffuse` hundreds or more (100 or more). `kinds` names
/// the kind of each of `r`'s heads.
pub fn adapts(r: &MethodResult, kinds: &[&str]) -> Claim {
    let focused = mean_budget_of_kind(r, kinds, "focused");
    let diffuse = mean_budget_of_kind(r, kinds, "diffuse");
    let holds = matches!((focused, diffuse), (Some(f), Some(d)) if f < 100.0 && d >= 100.0);
    let show = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.1}"));
    Claim {
        holds,
        text: format!(
            "{}'s budgets adapt per head: focused heads keep {} tokens on average (tens: \
             under 100), diffuse heads {} (hundreds or more)",
            r.name,
            show(focused),
            show(diffuse)
        ),
    }
}

/// `twilight`'s mean output error is no worse than `top_k`'s, a top-k selector given
/// (at least) `twilight`'s average budget.
pub fn no_worse(twilight: &MethodResult, top_k: &MethodResult) -> Claim {
    let (et, ek) = (twilight.mean_error(), top_k.mean_error());
    let (bt, bk) = (twilight.mean_budget(), top_k.mean_budget());
    Claim {
        holds: et <= ek && bk >= bt,
        text: format!(
            "{}'s output error ({et:.2e} mean, {:.2e} max, {bt:.1} tokens on average) is no \
             worse than {}'s at the same average budget ({ek:.2e} mean, {:.2e} max, {bk:.1} \
             tokens)",
            twilight.name,
            twilight.max_error(),
            top_k.name,
            top_k.max_error(),
        ),
    }
}
