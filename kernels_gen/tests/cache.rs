//! The cache append through the CPU interpreter: decode loops checked bit for bit against
//! the host and the whole-cache kernels (`cache::check`), a page table on the device with
//! bad entries (skipped, nothing out of bounds), and the error paths.

use dusk_kernels::cache::check::{check_decode, DecodeCase};
use dusk_kernels::cache::{AppendConfig, AppendParts};
use dusk_kernels::ops::Dusk;
use dusk_runtime::Device;

fn dusk() -> Dusk {
    Dusk::new(Device::cpu()).unwrap()
}

#[test]
fn a_decode_loop_equals_the_host_and_the_whole_cache_kernels() {
    let r = check_decode(&dusk(), &DecodeCase::default()).unwrap();
    assert_eq!(r.tokens, 80);
    assert!(r.pages_started >= 5, "{r:?}");
}
