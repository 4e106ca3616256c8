//! The selector-of-one's-own example through the CPU interpreter: its centroids, scores and
//! token lists equal plain Rust's.

#[path = "../examples/centroid_selector/check.rs"]
mod check;
#[path = "../examples/centroid_selector/selector.rs"]
mod selector;

#[test]
fn a_user_selector_runs_in_dusks_plan() {
    let dusk = dusk::Dusk::new(dusk::runtime::Device::cpu()).unwrap();
    let kept = check::run(&dusk, &[300, 17, 100], 64, 3).unwrap();
    // Every (sequence, KV head) keeps 4 pages (64 tokens), its last page among them (12
    // tokens of 300, 4 of 100), or all of a shorter sequence.
    assert_eq!(kept, [[48 + 12; 8], [17; 8], [48 + 4; 8]].concat());
}
