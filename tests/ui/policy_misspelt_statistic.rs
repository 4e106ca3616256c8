// A misspelt statistic (`kount`) would silently become a parameter of the policy, failing
// only when a plan runs; it is a compile error unless marked `#[param]`.

#[dusk::policy]
pub fn top_k_typo(kount: i32, #[check(k >= 1)] k: i32) -> bool {
    kount >= k
}

#[dusk::policy]
pub fn statistic_marked_param(#[param] count: i32) -> bool {
    count >= 1
}

fn main() {}
