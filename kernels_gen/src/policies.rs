//! The stock pruning policies, written with `#[policy]`. Each is a monotone predicate over
//! the set kept at a threshold (it holds for low thresholds and fails past one point); the
//! fused search keeps the largest set boundary at which it still holds, i.e. the fewest
//! candidates. Use them as `top_p::POLICY` with [`crate::prune::PrunePlan`].

use dusk_macros::policy;

/// Top-p (Twilight): the fewest heaviest candidates whose weights sum to at least `p`.
#[policy(crate = "crate::dusk_paths", target(mass = p))]
pub fn top_p(mass: f32, #[check(p > 0.0 && p <= 1.0)] p: f32) -> bool {
    mass >= p
}

/// Top-k: the `k` heaviest candidates (more when weights tie at the cut; all when a row
/// has fewer).
#[policy(crate = "crate::dusk_paths", target(count = k))]
pub fn top_k(count: i32, #[check(k >= 1)] k: i32) -> bool {
    count >= k
}

/// Every candidate whose weight is at least `ratio` times the row's largest weight: the set
/// holds them all while the heaviest candidate left out is below that line.
#[policy(crate = "crate::dusk_paths")]
pub fn ratio_to_max(
    below: f32,
    max_weight: f32,
    #[check(ratio > 0.0 && ratio <= 1.0)] ratio: f32,
) -> bool {
    below < ratio * max_weight
}

/// Top-p with a floor and a cap on the budget: at least `min_k` candidates (when the row
/// has them) and at most `max_k`, whatever the mass.
#[policy(crate = "crate::dusk_paths", target(mass = p))]
pub fn top_p_bounded(
    mass: f32,
    count: i32,
    #[check(p > 0.0 && p <= 1.0)] p: f32,
    #[check(min_k >= 0)] min_k: i32,
    #[check(max_k >= 1)] max_k: i32,
) -> bool {
    (mass >= p && count >= min_k) || count >= max_k
}
