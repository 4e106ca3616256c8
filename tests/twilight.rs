//! The Twilight pipeline example (select, INT4 scores, top-p with group unions, varlen
//! attention over the pruner's lists) through the CPU interpreter.

#[path = "../examples/twilight/pipeline.rs"]
mod pipeline;

#[test]
fn select_estimate_prune_attend() {
    let dusk = dusk::Dusk::new(dusk::runtime::Device::cpu()).unwrap();
    let r = pipeline::run(&dusk, &[200, 17, 96], 0.9, 3).unwrap();
    assert!(r.kept > 0 && r.kept <= r.candidates);
    assert!(r.rel_error < 2e-3, "relative error {:.2e}", r.rel_error);
}
