//! The main job's results table: for each method run on the synthetic batch, the per-head
//! budgets (mean, min, max), the output error against dense attention and the time per
//! step. [`MethodResult`] is the plain data it is made of (as is the plot, `plot.rs`), so
//! whatever runs a method fills one in.

use std::error::Error;
use std::fmt::Write;

/// What one method gave on a batch.
#[derive(Clone, Debug, PartialEq)]
pub struct MethodResult {
    /// The method as the table and the plot name it ("Quest+Twilight").
    pub name: String,
    /// Heads per sequence the budgets are given for (query heads; KV heads where a GQA
    /// group's union is what was attended).
    pub heads: usize,
    /// Tokens attended per (sequence, head): row `b * heads + h`.
    pub budgets: Vec<usize>,
    /// `|o - o_hat| / |o|` against dense attention per (sequence, query head) output row
    /// ([`row_errors`] makes them from the outputs).
    pub errors: Vec<f64>,
    /// Time per decode step in microseconds; `None` where the step was not timed.
    pub step_us: Option<f64>,
}

impl MethodResult {
    /// Head `h`'s budgets over the sequences.
    pub fn head_budgets(&self, h: usize) -> impl Iterator<Item = usize> + '_ {
        self.budgets.iter().skip(h).step_by(self.heads).copied()
    }

    /// The mean budget over every (sequence, head).
    pub fn mean_budget(&self) -> f64 {
        self.budgets.iter().sum::<usize>() as f64 / self.budgets.len().max(1) as f64
    }

    /// The mean error over the output rows.
    pub fn mean_error(&self) -> f64 {
        self.errors.iter().sum::<f64>() / self.errors.len().max(1) as f64
    }

    /// The largest error over the output rows.
    pub fn max_error(&self) -> f64 {
        self.errors.iter().copied().fold(0.0, f64::max)
    }

    /// Checks the shapes: at least one head and one sequence, whole sequences of budgets,
    /// and errors that are numbers.
    pub fn validate(&self) -> Result<(), Box<dyn Error>> {
        let fail = |what: String| Err(format!("method {:?}: {what}", self.name).into());
        if self.heads == 0 || self.budgets.is_empty() {
            return fail(format!(
                "no budgets ({} heads, {} budgets)",
                self.heads,
                self.budgets.len()
            ));
        }
        if !self.budgets.len().is_multiple_of(self.heads) {
            return fail(format!(
                "{} budgets are not whole sequences of {} heads",
                self.budgets.len(),
                self.heads
            ));
        }
        if self.errors.is_empty() || self.errors.iter().any(|e| !e.is_finite()) {
            return fail("errors: expected at least one, all finite".into());
        }
        Ok(())
    }
}

/// `|o_r - o_hat_r| / |o_r|` for each output row of `head_dim` values: `approx` the
/// method's output, `dense` dense attention's (f64 reference or f32). A row whose dense
/// output is zero has error 0 if the method's is zero too, else infinity.
pub fn row_errors(approx: &[f32], dense: &[f64], head_dim: usize) -> Vec<f64> {
    approx
        .chunks(head_dim)
        .zip(dense.chunks(head_dim))
        .map(|(a, d)| {
            let diff: f64 = a.iter().zip(d).map(|(x, y)| (*x as f64 - y).powi(2)).sum();
            let norm: f64 = d.iter().map(|y| y * y).sum();
            match (diff, norm) {
                (0.0, _) => 0.0,
                (_, 0.0) => f64::INFINITY,
                _ => (diff / norm).sqrt(),
            }
        })
        .collect()
}

/// The table, in Markdown: one row per method, budgets (tokens) over every (sequence,
/// head), errors over every output row.
pub fn table(results: &[MethodResult]) -> Result<String, Box<dyn Error>> {
    let mut out = String::from(
        "| method | budget mean | budget min | budget max | error mean | error max | step (us) |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in results {
        r.validate()?;
        let step = r.step_us.map_or("-".into(), |t| format!("{t:.1}"));
        writeln!(
            out,
            "| {} | {:.1} | {} | {} | {:.2e} | {:.2e} | {step} |",
            r.name,
            r.mean_budget(),
            r.budgets.iter().min().expect("validated"),
            r.budgets.iter().max().expect("validated"),
            r.mean_error(),
            r.max_error(),
        )?;
    }
    Ok(out)
}

/// The mean budget of `r`'s heads of kind `kind` over the sequences (`kinds[h]` names head
/// `h`'s kind); `None` when no head is of that kind.
pub fn mean_budget_of_kind(r: &MethodResult, kinds: &[&str], kind: &str) -> Option<f64> {
    let b: Vec<usize> = (0..r.heads)
        .filter(|h| kinds.get(*h) == Some(&kind))
        .flat_map(|h| r.head_budgets(h))
        .collect();
    (!b.is_empty()).then(|| b.iter().sum::<usize>() as f64 / b.len() as f64)
}

/// The mean error of the query rows of `r`'s heads of kind `kind` (`kinds[h]` names head
/// `h`'s kind; a head's query rows are its group's, `errors.len() / budgets.len()` of them
/// a head and sequence); `None` when no head is of that kind or the errors are not whole
/// groups of rows.
pub fn mean_error_of_kind(r: &MethodResult, kinds: &[&str], kind: &str) -> Option<f64> {
    let group = r.errors.len() / r.budgets.len().max(1);
    if group == 0 || r.errors.len() != group * r.budgets.len() {
        return None;
    }
    let e: Vec<f64> = (0..r.errors.len())
        .filter(|i| kinds.get((i % (r.heads * group)) / group) == Some(&kind))
        .map(|i| r.errors[i])
        .collect();
    (!e.is_empty()).then(|| e.iter().sum::<f64>() / e.len() as f64)
}

/// Each kind of head's mean budget and mean error (`kinds[h]` names head `h`'s, the kinds
/// in the order they first appear), in Markdown: one row per method, a cell per kind.
pub fn kind_table(results: &[MethodResult], kinds: &[&str]) -> Result<String, Box<dyn Error>> {
    let mut order: Vec<&str> = vec![];
    for k in kinds {
        if !order.contains(k) {
            order.push(k);
        }
    }
    let mut out = format!(
        "| method | {} |\n|---|{}\n",
        order
            .iter()
            .map(|k| format!("{k}: budget, error"))
            .collect::<Vec<_>>()
            .join(" | "),
        "---:|".repeat(order.len())
    );
    for r in results {
        r.validate()?;
        let cells: Vec<String> = order
            .iter()
            .map(|k| {
                match (
                    mean_budget_of_kind(r, kinds, k),
                    mean_error_of_kind(r, kinds, k),
                ) {
                    (Some(b), Some(e)) => format!("{b:.1}, {e:.2e}"),
                    _ => "-".into(),
                }
            })
            .collect();
        writeln!(out, "| {} | {} |", r.name, cells.join(" | "))?;
    }
    Ok(out)
}
