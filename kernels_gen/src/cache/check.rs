//! A decode loop of appends, checked: sequences of different lengths grow by one token a
//! step for several steps (new pages taken from a shuffled free list when a last page
//! fills), each step's table uploaded and [`AppendPlan::run`] called, and at the end the
//! cache, the quantized copy and Quest's state compared bit for bit with what the host
//! ([`super::reference::append_tokens`]) and the whole-cache kernels (`quantize_k`,
//! `quest_update` over every page of the final table) make of the same tokens, and Quest's
//! state with its host reference too; Double Sparsity's labels bit for bit with `ds_update`
//! over every page, SparQ's transposed copy and the tokens it stages bit for bit and its
//! sums of V within f32 rounding with `sparq_update` over every token (and the sums with
//! the host's, in f64). Run by the tests through the interpreter and by `gpu-check
//! selectors` on the GPU.
//!
//! Before the first step the cache's unused slots hold NaN, the pages no sequence uses yet
//! hold a Quest state of finite wrong values (-1000, +1000: a page's first token that
//! failed to reset it would leave them), DS's labels hold a finite poison (0x5555) where no
//! token is, and every step's touched list is poisoned. SparQ's copy is paged by blocks of
//! its own (`sparq_block_size` tokens, from a free list of its own).

use super::append::{AppendConfig, AppendParts, AppendPlan, AppendTargets};
use super::reference::append_tokens;
use crate::engines::CsrPages;
use crate::ops::Dusk;
use crate::paged::{KvShape, PageTable};
use crate::selectors::bench::Rng;
use crate::selectors::reference::quest_update;
use crate::selectors::selector::table_pages;
use crate::selectors::sparq_reference::staged_rows;
use crate::selectors::{
    DsCalibration, DsState, PageUpdates, SelectorState, SparqBlocks, SparqState, SparqUpdates,
    QUEST,
};
use half::f16;

/// A decode loop to check.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeCase {
    /// Tokens in each sequence before the first step (0: an empty sequence).
    pub lens: Vec<usize>,
    /// Appends (one token per sequence each).
    pub steps: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub page_size: usize,
    /// Pages beyond those the sequences end with: never written, they must stay as they were.
    pub spare_pages: usize,
    pub parts: AppendParts,
    pub config: AppendConfig,
    /// Put a NaN in about one value in 256 of the new tokens (Quest ignores them as
    /// `quest_update` does; the quantized copy is what `quantize_k` makes of them).
    pub nan: bool,
    /// Tokens a block of SparQ's transposed copy holds (a power of two, 8 to 256).
    pub sparq_block_size: usize,
    pub seed: u64,
}

impl Default for DecodeCase {
    /// Four sequences (one empty, one ending on a full page) for 20 steps, 2 KV heads of
    /// 64, pages of 16, INT4 and Quest.
    fn default() -> Self {
        DecodeCase {
            lens: vec![0, 16, 37, 5],
            steps: 20,
            num_kv_heads: 2,
            head_dim: 64,
            page_size: 16,
            spare_pages: 3,
            parts: AppendParts {
                quantized: Some(4),
                quest: true,
                ..AppendParts::default()
            },
            config: AppendConfig::default(),
            nan: false,
            sparq_block_size: 32,
            seed: 0xa99e,
        }
    }
}

/// What [`check_decode`] compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeReport {
    /// Tokens appended (batch x steps).
    pub tokens: usize,
    /// Appends that started a new page (slot 0).
    pub pages_started: usize,
}

/// A random new token row: continuous values in [-3, 3), one row in 16 constant (no span
/// to quantize), NaN in about one value in 256 with `nan`.
fn token_row(rng: &mut Rng, d: usize, nan: bool) -> Vec<f16> {
    if rng.below(16) == 0 {
        return vec![f16::from_f32(rng.unit() * 3.0); d];
    }
    (0..d)
        .map(|_| {
            if nan && rng.below(256) == 0 {
                f16::NAN
            } else {
                f16::from_f32(rng.unit() * 3.0)
            }
        })
        .collect()
}

fn bits(v: &[f16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The first index where `got` and `want` differ, as an error naming `what`.
fn same<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} values, want {}", got.len(), want.len()));
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        Some(i) => Err(format!("{what}[{i}]: {:?}, want {:?}", got[i], want[i])),
        None => Ok(()),
    }
}

/// Runs `case`'s decode loop on `dusk`'s device and compares everything (see the module).
pub fn check_decode(dusk: &Dusk, case: &DecodeCase) -> Result<DecodeReport, String> {
    let e = |x: crate::DuskError| x.to_string();
    let mut rng = Rng(case.seed);
    let (ps, d, hk) = (case.page_size, case.head_dim, case.num_kv_heads);
    let batch = case.lens.len();
    let final_lens: Vec<usize> = case.lens.iter().map(|n| n + case.steps).collect();
    let kv = KvShape {
        num_pages: PageTable::pages_needed(&final_lens, ps) + case.spare_pages,
        page_size: ps,
        num_kv_heads: hk,
        head_dim: d,
    };
    let mut free: Vec<i32> = (0..kv.num_pages as i32).collect();
    for i in (1..free.len()).rev() {
        free.swap(i, rng.below(i + 1));
    }
    let mut pages: Vec<Vec<i32>> = case
        .lens
        .iter()
        .map(|n| free.split_off(free.len() - n.div_ceil(ps)))
        .collect();
    let table_of = |lens: &[usize], pages: &[Vec<i32>]| {
        PageTable::from_lengths(lens, ps, pages.concat()).map_err(e)
    };

    // The cache: NaN in every unused slot, random tokens in the used ones.
    let mut k_host = vec![f16::NAN; kv.elements()];
    let mut v_host = k_host.clone();
    for (b, &n) in case.lens.iter().enumerate() {
        for t in 0..n {
            for h in 0..hk {
                let at = kv.k_row(pages[b][t / ps] as usize, t % ps, h) * d;
                k_host[at..at + d].copy_from_slice(&token_row(&mut rng, d, false));
                v_host[at..at + d].copy_from_slice(&token_row(&mut rng, d, false));
            }
        }
    }
    let dev = dusk.device();
    let mut k = dev.upload(&k_host).map_err(|x| x.to_string())?;
    let mut v = dev.upload(&v_host).map_err(|x| x.to_string())?;
    let mut quantized = match case.parts.quantized {
        Some(bits) => Some(dusk.quantize_k(&k, kv, bits).map_err(e)?),
        None => None,
    };
    let start = table_of(&case.lens, &pages)?;
    let (mut quest, mut start_min, mut start_max) = (None, vec![], vec![]);
    if case.parts.quest {
        let mut s = SelectorState::new(dusk, &QUEST, kv).map_err(e)?;
        let n = kv.num_pages * hk * d;
        let fill = |s: &mut SelectorState, name, x: f32| {
            s.f16_mut(name)
                .expect("Quest's state")
                .copy_from_host(&vec![f16::from_f32(x); n])
                .map_err(|x| x.to_string())
        };
        fill(&mut s, "page_min", -1000.0)?;
        fill(&mut s, "page_max", 1000.0)?;
        if !start.kv_page_indices.is_empty() {
            let all = PageUpdates::all(dusk, &kv, &start).map_err(e)?;
            s.update(dusk, &k, &all).map_err(e)?;
        }
        start_min = s
            .f16("page_min")
            .unwrap()
            .download()
            .map_err(|x| x.to_string())?;
        start_max = s
            .f16("page_max")
            .unwrap()
            .download()
            .map_err(|x| x.to_string())?;
        quest = Some(s);
    }

    // Double Sparsity: random channels, labels poisoned, then written for the start pages.
    let poison = f16::from_bits(0x5555);
    let mut ds = None;
    if let Some(r) = case.parts.ds {
        let channels: Vec<Vec<usize>> = (0..hk)
            .map(|_| {
                let mut c: Vec<usize> = (0..d).collect();
                for i in (1..d).rev() {
                    c.swap(i, rng.below(i + 1));
                }
                c.truncate(r);
                c.sort();
                c
            })
            .collect();
        let cal = DsCalibration::from_channels(d, &channels).map_err(e)?;
        let mut s = DsState::new(dusk, kv, &cal).map_err(e)?;
        let n = s.labels().len();
        s.labels_mut()
            .copy_from_host(&vec![poison; n])
            .map_err(|x| x.to_string())?;
        if !start.kv_page_indices.is_empty() {
            let all = PageUpdates::all(dusk, &kv, &start).map_err(e)?;
            s.update(dusk, &k, &all).map_err(e)?;
        }
        ds = Some(s);
    }
    // SparQ: its copy's blocks from a free list of their own, the state built over the
    // start tokens.
    let bs = case.sparq_block_size;
    let blocks = SparqBlocks {
        num_blocks: PageTable::pages_needed(&final_lens, bs) + 1,
        block_size: bs,
    };
    let mut blk_free: Vec<i32> = (0..blocks.num_blocks as i32).collect();
    let mut blks: Vec<Vec<i32>> = vec![vec![]; batch];
    let blocks_of = |lens: &[usize], blks: &[Vec<i32>]| {
        PageTable::from_lengths(lens, bs, blks.concat()).map_err(e)
    };
    let mut sparq = None;
    if case.parts.sparq {
        for i in (1..blk_free.len()).rev() {
            blk_free.swap(i, rng.below(i + 1));
        }
        for (b, n) in case.lens.iter().enumerate() {
            blks[b] = blk_free.split_off(blk_free.len() - n.div_ceil(bs));
        }
        let mut s = SparqState::new(dusk, kv, batch, blocks).map_err(e)?;
        if !start.kv_page_indices.is_empty() {
            let start_blocks = blocks_of(&case.lens, &blks)?;
            let all = SparqUpdates::all(dusk, &s, &start, &start_blocks).map_err(e)?;
            s.update(dusk, &k, &v, &all).map_err(e)?;
        }
        sparq = Some(s);
    }

    let mut plan =
        AppendPlan::with_config(dusk, kv, batch, case.parts, |c| *c = case.config).map_err(e)?;
    let mut lens = case.lens.clone();
    let mut table = start;
    let mut pages_started = 0;
    for step in 0..case.steps {
        for b in 0..batch {
            if lens[b].is_multiple_of(ps) {
                pages[b].push(free.pop().expect("pages sized for every step"));
                pages_started += 1;
            }
            if case.parts.sparq && lens[b].is_multiple_of(bs) {
                blks[b].push(blk_free.pop().expect("blocks sized for every step"));
            }
            lens[b] += 1;
        }
        table = table_of(&lens, &pages)?;
        let dev_table = plan.upload_table(dusk, &table).map_err(e)?;
        let k_new: Vec<f16> = (0..batch * hk)
            .flat_map(|_| token_row(&mut rng, d, case.nan))
            .collect();
        let v_new: Vec<f16> = (0..batch * hk)
            .flat_map(|_| token_row(&mut rng, d, case.nan))
            .collect();
        append_tokens(&mut k_host, &mut v_host, &kv, &table, &k_new, &v_new);
        let kn = dev.upload(&k_new).map_err(|x| x.to_string())?;
        let vn = dev.upload(&v_new).map_err(|x| x.to_string())?;
        plan.poison_outputs(dusk, 0xFF).map_err(e)?;
        let block_table = match case.parts.sparq {
            true => Some(CsrPages::upload(dusk, &blocks_of(&lens, &blks)?).map_err(e)?),
            false => None,
        };
        let targets = AppendTargets {
            k_cache: &mut k,
            v_cache: &mut v,
            quantized: quantized.as_mut(),
            quest: quest.as_mut(),
            ds: ds.as_mut(),
            sparq: sparq.as_mut().zip(block_table.as_ref()),
        };
        plan.run(dusk, &dev_table, &kn, &vn, targets).map_err(e)?;
        let want_pages: Vec<i32> = pages.iter().map(|p| *p.last().unwrap()).collect();
        let want_lens: Vec<i32> = table.kv_last_page_len.clone();
        let got_pages = plan
            .touched()
            .pages()
            .download()
            .map_err(|x| x.to_string())?;
        let got_lens = plan
            .touched()
            .lens()
            .download()
            .map_err(|x| x.to_string())?;
        same(
            &format!("step {step}: touched pages"),
            &got_pages,
            &want_pages,
        )?;
        same(&format!("step {step}: touched lens"), &got_lens, &want_lens)?;
    }

    let dl = |b: &dusk_runtime::Buffer<f16>| b.download().map_err(|x| x.to_string());
    same("k_cache", &bits(&dl(&k)?), &bits(&k_host))?;
    same("v_cache", &bits(&dl(&v)?), &bits(&v_host))?;
    let k_final = dev.upload(&k_host).map_err(|x| x.to_string())?;
    if let Some(q) = &quantized {
        let want = dusk.quantize_k(&k_final, kv, q.bits).map_err(e)?;
        let got_packed = q.packed.download().map_err(|x| x.to_string())?;
        let want_packed = want.packed.download().map_err(|x| x.to_string())?;
        same("quantized codes", &got_packed, &want_packed)?;
        same(
            "quantized scale",
            &bits(&dl(&q.scale)?),
            &bits(&dl(&want.scale)?),
        )?;
        same(
            "quantized zero",
            &bits(&dl(&q.zero)?),
            &bits(&dl(&want.zero)?),
        )?;
    }
    if let Some(s) = &quest {
        let (got_min, got_max) = (
            dl(s.f16("page_min").unwrap())?,
            dl(s.f16("page_max").unwrap())?,
        );
        // The kernel: quest_update over every page of the final table, from the start state.
        let mut want = SelectorState::new(dusk, &QUEST, kv).map_err(e)?;
        for (name, start) in [("page_min", &start_min), ("page_max", &start_max)] {
            let buf = want.f16_mut(name).expect("Quest's state");
            buf.copy_from_host(start).map_err(|x| x.to_string())?;
        }
        let all = PageUpdates::all(dusk, &kv, &table).map_err(e)?;
        want.update(dusk, &k_final, &all).map_err(e)?;
        same(
            "page_min",
            &bits(&got_min),
            &bits(&dl(want.f16("page_min").unwrap())?),
        )?;
        same(
            "page_max",
            &bits(&got_max),
            &bits(&dl(want.f16("page_max").unwrap())?),
        )?;
        // Its host reference, the same way.
        let (mut ref_min, mut ref_max) = (start_min, start_max);
        let (up_pages, up_lens) = table_pages(&table, ps, false);
        quest_update(
            &k_host,
            &kv,
            &up_pages,
            &up_lens,
            &mut ref_min,
            &mut ref_max,
        );
        same(
            "page_min (host reference)",
            &bits(&got_min),
            &bits(&ref_min),
        )?;
        same(
            "page_max (host reference)",
            &bits(&got_max),
            &bits(&ref_max),
        )?;
    }
    if let Some(s) = &ds {
        // The kernel: ds_update over every page of the final table, from the same poison.
        let mut want = DsState::new(dusk, kv, s.calibration()).map_err(e)?;
        let n = want.labels().len();
        want.labels_mut()
            .copy_from_host(&vec![poison; n])
            .map_err(|x| x.to_string())?;
        let all = PageUpdates::all(dusk, &kv, &table).map_err(e)?;
        want.update(dusk, &k_final, &all).map_err(e)?;
        same(
            "ds labels",
            &bits(&dl(s.labels())?),
            &bits(&dl(want.labels())?),
        )?;
    }
    if let Some(s) = &sparq {
        // The kernel: sparq_update over every token of the final tables, from zero.
        let v_final = dev.upload(&v_host).map_err(|x| x.to_string())?;
        let mut want = SparqState::new(dusk, kv, batch, blocks).map_err(e)?;
        let final_blocks = blocks_of(&lens, &blks)?;
        let all = SparqUpdates::all(dusk, &want, &table, &final_blocks).map_err(e)?;
        want.update(dusk, &k_final, &v_final, &all).map_err(e)?;
        same("sparq k_t", &bits(&dl(s.k_t())?), &bits(&dl(want.k_t())?))?;
        let staged = |x: &SparqState| -> Result<Vec<u16>, String> {
            Ok(bits(&staged_rows(&dl(x.k_open())?, &kv, &table, x.run())))
        };
        same("sparq k_open", &staged(s)?, &staged(&want)?)?;
        let got = s.v_sum().download().map_err(|x| x.to_string())?;
        let kernel = want.v_sum().download().map_err(|x| x.to_string())?;
        check_v_sums(&got, &kernel, &v_host, &kv, &table)?;
    }
    Ok(DecodeReport {
        tokens: batch * case.steps,
        pages_started,
    })
}

/// SparQ's sums of V (`got`, f32 `[batch, num_kv_heads, head_dim]`) against `sparq_update`'s
/// (`kernel`) and the host's in f64 over `table`'s tokens of `v`. The order of the f32
/// additions differs (a running sum a token at a time against a page's run at once), so
/// each value may differ by the rounding of `n` additions: at most `n * 2^-24 * sum |v|`
/// from the exact sum, twice that between the two kernels. A NaN sum must be NaN in both.
fn check_v_sums(
    got: &[f32],
    kernel: &[f32],
    v: &[f16],
    kv: &KvShape,
    table: &PageTable,
) -> Result<(), String> {
    let (hk, d, ps) = (kv.num_kv_heads, kv.head_dim, kv.page_size);
    for b in 0..table.batch() {
        let n = table.seq_len(b, ps);
        for h in 0..hk {
            for c in 0..d {
                let (mut sum, mut abs) = (0f64, 0f64);
                for t in 0..n {
                    let page = table.kv_page_indices[table.kv_indptr[b] as usize + t / ps];
                    let x = v[kv.k_row(page as usize, t % ps, h) * d + c].to_f64();
                    sum += x;
                    abs += x.abs();
                }
                let i = (b * hk + h) * d + c;
                let bound = n as f64 * f64::from(f32::EPSILON) / 2.0 * abs;
                for (what, want, tol) in [
                    ("kernel", kernel[i] as f64, 2.0 * bound),
                    ("host", sum, bound),
                ] {
                    let g = got[i] as f64;
                    let ok = if want.is_nan() {
                        g.is_nan()
                    } else {
                        (g - want).abs() <= tol
                    };
                    if !ok {
                        return Err(format!(
                            "sparq v_sum[{i}] (sequence {b}, KV head {h}): {g}, want {want} \
                             ({what}, tolerance {tol})"
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}
