//! A token selector of one's own: the mean of K over each page (its centroid) and KV head,
//! updated when a page is written, and a page's score `q . centroid` summed over the GQA
//! group. Written against `dusk::kernels::selectors` exactly as the stock Quest is; the
//! plan (scores, device top-k, CSR token lists) is dusk's. [`page_scores`] is the same in
//! plain Rust, what the checks hold the kernels to.

use dusk::kernels::paged::{KvShape, PageTable};
use dusk::kernels::selectors::page;
use dusk::kernels::selectors::{Build, ScoreKernel, Selector, StateArray};
use half::f16;

/// At append: the mean of each written page's valid tokens, per KV head.
#[dusk::kernel(num_warps = 2)]
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
        store(
            mean + page::update_state_offsets::<D>(page, num_kv_heads),
            (acc / (len as f32)) as f16,
        );
    }
}

/// Every step: 32 pages a program, each scored by the group's summed query.
#[dusk::kernel(num_warps = 4)]
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
        page::store_page_scores(
            scores,
            kv_indptr,
            num_kv_heads,
            j,
            valid,
            sum(c * expand(qsum, 0, 32), 1),
        );
    }
}

/// The declaration dusk plans from: its state, its update, its score (head_dim 128, MHA or
/// GQA groups of 4).
pub const CENTROID: Selector = Selector {
    name: "centroid",
    state: &[StateArray::f16_per_page("mean")],
    update: |kv| (kv.head_dim == 128).then_some(centroid_update::build::<128> as Build),
    score: |kv, group| {
        let build = match (kv.head_dim, group) {
            (128, 1) => centroid_score::build::<128, 1> as Build,
            (128, 4) => centroid_score::build::<128, 4>,
            _ => return None,
        };
        Some(ScoreKernel {
            build,
            pages_per_program: 32,
        })
    },
    fused: None,
};

/// The page scores in plain Rust, laid out as a plan's (row `(b, h)` at `kv_indptr[b] *
/// num_kv_heads + h * pages_b`): each page's centroid as the update kernel makes it (the
/// f32 mean of its valid tokens, rounded to f16: the state's type) dotted in f64 with the
/// group's queries (`q`: `[batch, num_q_heads, head_dim]`; `k`: the cache).
pub fn page_scores(
    q: &[f16],
    k: &[f16],
    kv: &KvShape,
    table: &PageTable,
    num_q_heads: usize,
) -> Vec<f64> {
    let (d, hk, ps) = (kv.head_dim, kv.num_kv_heads, kv.page_size);
    let group = num_q_heads / hk;
    let mut out = vec![0.0; table.kv_page_indices.len() * hk];
    for b in 0..table.batch() {
        let first = table.kv_indptr[b] as usize;
        let n = table.kv_indptr[b + 1] as usize - first;
        for h in 0..hk {
            for j in 0..n {
                let page = table.kv_page_indices[first + j] as usize;
                let len = (table.seq_len(b, ps) - j * ps).min(ps);
                out[first * hk + h * n + j] = (0..d)
                    .map(|c| {
                        let sum: f64 = (0..len)
                            .map(|s| k[kv.k_row(page, s, h) * d + c].to_f64())
                            .sum();
                        let mean = f16::from_f32(sum as f32 / len as f32).to_f64();
                        let qsum: f64 = (0..group)
                            .map(|g| q[((b * hk + h) * group + g) * d + c].to_f64())
                            .sum();
                        qsum * mean
                    })
                    .sum();
            }
        }
    }
    out
}
