//! Runs the centroid selector (`selector.rs`) on a random paged cache and checks each stage
//! against plain Rust: the centroids, the page scores (f64), and the pages kept (the
//! sort-based top-k of those scores, ties to the lower page, the last page always kept).

use super::selector::{page_scores, CENTROID};
use dusk::kernels::paged::{KvShape, PageTable};
use dusk::kernels::selectors::reference::{page_token_lists, select_items};
use dusk::kernels::selectors::{Budget, Keep, PageUpdates, SelectorPlan, SelectorState};
use dusk::Dusk;
use half::f16;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Selects `budget` tokens of each (sequence, KV head) for `lens`, GQA 32/8, head_dim 128,
/// and checks every stage; returns the tokens kept per row.
pub fn run(
    dusk: &Dusk,
    lens: &[usize],
    budget: usize,
    seed: u64,
) -> Result<Vec<usize>, Box<dyn std::error::Error>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let (heads, q_heads, d, ps) = (8usize, 32usize, 128usize, 16usize);
    let num_pages = PageTable::pages_needed(lens, ps);
    let mut ids: Vec<i32> = (0..num_pages as i32).collect();
    ids.shuffle(&mut rng);
    let table = PageTable::from_lengths(lens, ps, ids)?;
    let kv = KvShape {
        num_pages,
        page_size: ps,
        num_kv_heads: heads,
        head_dim: d,
    };
    let k: Vec<f16> = (0..kv.elements())
        .map(|_| f16::from_f32(rng.random_range(-1.0..1.0)))
        .collect();
    let q: Vec<f16> = (0..lens.len() * q_heads * d)
        .map(|_| f16::from_f32(rng.random_range(-1.0..1.0)))
        .collect();

    let dev = dusk.device();
    let mut state = SelectorState::new(dusk, &CENTROID, kv)?;
    state.update(
        dusk,
        &dev.upload(&k)?,
        &PageUpdates::all(dusk, &kv, &table)?,
    )?;
    let keep = Keep { sink: 0, recent: 1 };
    let mut plan = SelectorPlan::new(dusk, state, q_heads, &table, Budget::Tokens(budget), keep)?;
    plan.poison_outputs(dusk, 0xFF)?;
    plan.select(dusk, &dev.upload(&q)?)?;

    // Centroids: each page's mean over its tokens, per KV head.
    let mean = plan
        .state()
        .f16("mean")
        .ok_or("no state `mean`")?
        .download()?;
    for (b, n) in lens.iter().enumerate() {
        let pages =
            &table.kv_page_indices[table.kv_indptr[b] as usize..table.kv_indptr[b + 1] as usize];
        for h in 0..heads {
            for (i, &p) in pages.iter().enumerate() {
                let len = (n - i * ps).min(ps);
                let row = (p as usize * heads + h) * d;
                for c in 0..d {
                    let want = (0..len)
                        .map(|s| k[kv.k_row(p as usize, s, h) * d + c].to_f64())
                        .sum::<f64>()
                        / len as f64;
                    let got = mean[row + c].to_f64();
                    if (got - want).abs() > 1e-3 * (1.0 + want.abs()) {
                        return Err(
                            format!("page {p} head {h}: centroid {got}, want {want}").into()
                        );
                    }
                }
            }
        }
    }
    // Scores against plain Rust's, then the pages kept by the sort-based top-k of the
    // kernel's own scores.
    let want_scores = page_scores(&q, &k, &kv, &table, q_heads);
    let got: Vec<f64> = plan
        .scores()
        .download()?
        .iter()
        .map(|s| *s as f64)
        .collect();
    for (i, (g, w)) in got.iter().zip(&want_scores).enumerate() {
        if (g - w).abs() > 1e-3 * (1.0 + w.abs()) {
            return Err(format!("score {i}: {g}, want {w}").into());
        }
    }
    let want_pages = select_items(&got[..want_scores.len()], plan.shape(), keep);
    let want = page_token_lists(&want_pages, &table, &kv);
    let lists = plan.sel_indices().download()?;
    let indptr = plan.sel_indptr().download()?;
    if indptr != want.indptr || lists[..want.indices.len()] != want.indices[..] {
        return Err("the token lists differ from the top-k of the scores".into());
    }
    Ok(indptr.windows(2).map(|w| (w[1] - w[0]) as usize).collect())
}
