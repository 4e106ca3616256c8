//! The kernel-language guide's examples through the CPU interpreter, against plain Rust.

#[path = "../examples/kernel_language/kernels.rs"]
mod kernels;

#[test]
fn guide_examples_agree_with_their_references() {
    let dusk = dusk::Dusk::new(dusk::runtime::Device::cpu()).unwrap();
    for seed in [1, 2] {
        for (name, err) in kernels::run_all(&dusk, seed).unwrap() {
            assert!(err < 1e-5, "{name}: relative error {err:.2e}");
        }
    }
}
