//! A pruning policy of one's own: top-p, but never more than a quarter of the candidates
//! (a budget cap for long, diffuse rows). Written with `#[dusk::policy]` in the kernel
//! language, it runs in the same fused threshold search as the stock policies.

use dusk::kernels::paged::TokenLists;
use dusk::kernels::prune::{ParamValues, PrunePlan};
use dusk::kernels::reference::{check_kept, softmax, threshold_oracle};
use dusk::Dusk;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Holds while the kept weights reach `p`, or once a quarter of the row is kept.
#[dusk::policy(target(mass = p))]
pub fn top_p_quarter(
    mass: f32,
    count: i32,
    candidates: i32,
    #[check(p > 0.0 && p <= 1.0)] p: f32,
) -> bool {
    mass >= p || count * 4 >= candidates
}

/// Prunes `rows` random rows (one query head each) with the policy and checks each kept
/// set against the sort-based oracle of the same rule. Returns the rows' budgets.
pub fn run(dusk: &Dusk, rows: usize, seed: u64) -> Result<Vec<i32>, Box<dyn std::error::Error>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let lens: Vec<usize> = (0..rows).map(|_| rng.random_range(1..=2000)).collect();
    let scores: Vec<Vec<f32>> = lens
        .iter()
        .map(|&n| (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect())
        .collect();
    let cand = TokenLists::leading(&lens);
    let p = 0.9;
    let mut plan = PrunePlan::new(
        dusk,
        &top_p_quarter::POLICY,
        &cand,
        1,
        1.0,
        &[ParamValues::Uniform(p)],
    )?;
    plan.run(dusk, &dusk.device().upload(&scores.concat())?)?;
    let sel_indptr = plan.sel_indptr().download()?;
    let sel = plan.sel_indices().download()?;
    for (r, row) in scores.iter().enumerate() {
        let mut kept = vec![false; row.len()];
        for &t in &sel[sel_indptr[r] as usize..sel_indptr[r + 1] as usize] {
            kept[t as usize] = true;
        }
        let w = softmax(row, 1.0);
        let n = row.len();
        let oracle = threshold_oracle(&w, |m, c| m >= p || 4 * c >= n);
        check_kept(&w, &kept, &oracle, |b, a| {
            (b - p).abs() < 1e-5 || (a - p).abs() < 1e-5
        })
        .map_err(|e| format!("row {r}: {e}"))?;
    }
    Ok(plan.budgets().download()?[..rows].to_vec())
}
