//! The user-policy example through the CPU interpreter: its kept sets equal the oracle's.

#[path = "../examples/pruning/policy.rs"]
mod policy;

#[test]
fn a_user_policy_runs_in_the_fused_search() {
    let dusk = dusk::Dusk::new(dusk::runtime::Device::cpu()).unwrap();
    let budgets = policy::run(&dusk, 24, 9).unwrap();
    assert_eq!(budgets.len(), 24);
    assert!(budgets.iter().all(|b| *b > 0));
}
