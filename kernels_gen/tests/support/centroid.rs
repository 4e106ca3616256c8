//! A selector of one's own, written with the public API only (what a user writes in their
//! crate, with `#[dusk::kernel]` and `dusk::kernels::selectors` paths; the runnable version
//! at head_dim 128 is `examples/centroid_selector`): the mean of K per page (a centroid),
//! scored by `q . centroid` summed over the group. Shared by the selector and pipeline
//! tests (`#[path]`-included: a file under tests/support/ is not a test of its own).

use dusk_kernels::selectors::page;
use dusk_kernels::selectors::{Build, ScoreKernel, Selector, StateArray};
use dusk_macros::kernel;

#[kernel(crate = "dusk_kernels::dusk_paths", num_warps = 2)]
#[allow(clippy::too_many_arguments)]
fn centroid_update<const D: usize>(
    k: Ptr<f16>,
    pages: Ptr<i32>,
    lens: Ptr<i32>,
    num_pages: i32,
    num_kv_heads: i32,
    page_size: i32,
    mean: Ptr<f16>,
) {
    let page = page::update_page(pages, lens, num_pages, page_size);
    if page >= 0 {
        let len = page::update_len(lens);
        let mut acc = zeros::<f32>([D]);
        for s0 in (0..len).step_by(16) {
            let slot = s0 + arange(0, 16);
            let offs = page::key_offsets::<16, D>(page, slot, num_kv_heads, page_size);
            acc = acc + sum(load(k + offs, expand(slot < len, 1, D)) as f32, 0);
        }
        let out = page::update_state_offsets::<D>(page, num_kv_heads);
        store(mean + out, (acc / (len as f32)) as f16);
    }
}

#[kernel(crate = "dusk_kernels::dusk_paths", num_warps = 4)]
fn centroid_score<const D: usize, const G: usize>(
    q: Ptr<f16>,
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    scores: Ptr<f32>,
    num_kv_heads: i32,
    mean: Ptr<f16>,
) {
    let n = page::seq_pages(kv_indptr, num_kv_heads);
    let j = page::tile_pages::<32>();
    if program_id(1) * 32 < n {
        let valid = j < n;
        let rows = page::page_state_rows(kv_indptr, kv_page_indices, num_kv_heads, j, valid);
        let c = load(
            mean + page::state_offsets::<32, D>(rows),
            expand(valid, 1, D),
        ) as f32;
        let qsum = sum(page::group_query::<D, G>(q), 0);
        let s = sum(c * expand(qsum, 0, 32), 1);
        page::store_page_scores(scores, kv_indptr, num_kv_heads, j, valid, s);
    }
}

pub const CENTROID: Selector = Selector {
    name: "centroid",
    state: &[StateArray::f16_per_page("mean")],
    update: |kv| (kv.head_dim == 64).then_some(centroid_update::build::<64> as Build),
    score: |kv, group| {
        let build = match (kv.head_dim, group) {
            (64, 1) => centroid_score::build::<64, 1> as Build,
            (64, 4) => centroid_score::build::<64, 4>,
            _ => return None,
        };
        Some(ScoreKernel {
            build,
            pages_per_program: 32,
        })
    },
    fused: None,
};
