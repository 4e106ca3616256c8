//! What the kernel tests share: the CPU's dusk, the argument a typed error names, grid and
//! smooth values, scattered page tables. Each test file includes it (`#[path]`) and uses a
//! part.
#![allow(dead_code)]

use dusk_kernels::ops::Dusk;
use dusk_kernels::paged::PageTable;
use dusk_kernels::DuskError;
use dusk_runtime::Device;
use half::f16;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::Rng;

/// dusk on the CPU interpreter.
pub fn dusk() -> Dusk {
    Dusk::new(Device::cpu()).unwrap()
}

/// The argument an `InvalidArgument` error names (any other error fails the test).
pub fn arg_of(e: DuskError) -> &'static str {
    match e {
        DuskError::InvalidArgument { arg, .. } => arg,
        other => panic!("not an argument error: {other}"),
    }
}

/// Values on a grid of `scale` in `[-steps, steps] * scale` (1/8 in [-4, 4] for K, 1/4 in
/// [-2, 2] for q): every product and sum of Quest's and DS's scores is exact in f32, so the
/// kernels' scores equal the f64 reference's and ties are common (the tie rule is
/// exercised).
pub fn grid_values(rng: &mut SmallRng, n: usize, steps: i32, scale: f32) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(rng.random_range(-steps..=steps) as f32 * scale))
        .collect()
}

/// Continuous values with a spread of magnitudes.
pub fn smooth_values(rng: &mut SmallRng, n: usize) -> Vec<f16> {
    (0..n)
        .map(|_| {
            let x: f32 = rng.random_range(-1.0..1.0) + rng.random_range(-1.0..1.0);
            f16::from_f32(x * 1.5)
        })
        .collect()
}

/// Sequences of `lens` tokens on distinct random pages of a cache of `num_pages`.
pub fn table(rng: &mut SmallRng, lens: &[usize], page_size: usize, num_pages: usize) -> PageTable {
    let need = PageTable::pages_needed(lens, page_size);
    assert!(need <= num_pages);
    let mut ids: Vec<i32> = (0..num_pages as i32).collect();
    ids.shuffle(rng);
    ids.truncate(need);
    PageTable::from_lengths(lens, page_size, ids).unwrap()
}
