//! The pipeline's algorithm in f64 on the host, stage by stage: the oracle the tests and
//! the GPU check hold a planned pipeline to.
//!
//! - [`select`]: every token, a page selector's top pages from its f64 page scores, or a
//!   token selector's top tokens (Double Sparsity, SparQ) from its f64 token scores.
//! - [`estimate`]: the INT4 estimate of every candidate's score for each query head, from
//!   the quantized copy (`crate::reference::spgemv`, f64 over the same codes).
//! - [`prune`]: per query head, softmax of the estimate over the row's candidates, the
//!   sort-based cut of the policy, the union over the group.
//! - [`lists`]: attention's lists, a dense row (a sequence no longer than `dense_below`)
//!   every position of its sequence.
//! - [`attend`]: attention over the lists (mixed with the mean of V by SparQ's `alpha`).
//!
//! [`run_stages`] runs a plan's step stage by stage, downloading each stage's output;
//! [`check`] compares what a plan wrote at each stage with the reference of that stage fed
//! the stage's actual inputs (the plan's own output of the stage before), so one stage's
//! error shows up as that stage's, and a token whose weight lies within float rounding of
//! a pruner's cut may go either way, as may an item whose score lies within float rounding
//! of a selector's cut (the device ranks f32 sums).

use super::plan::PipelinePlan;
use crate::error::Result;
use crate::ops::Dusk;
use crate::paged::{KvShape, PageTable, TokenLists};
use crate::reference::{self as host, QuantizedRows};
use crate::selectors::reference::{
    ds_labels, ds_scores, page_token_lists, quest_scores, quest_update, select_items, top_k_row,
};
use crate::selectors::selector::table_pages;
use crate::selectors::sparq_reference::{paged_key, sparq_alpha, sparq_row, value_sums};
use crate::selectors::{Budget, DsCalibration, Items, Keep, SelectionShape};
use dusk_runtime::Buffer;
use half::f16;

/// A pruner's rule on the host, over the kept set at a cut: top-p, top-k, or any
/// predicate of the kept weights' sum and count (a `#[policy]`'s host form).
pub enum HostPolicy<'a> {
    TopP(f64),
    TopK(usize),
    Rule(&'a dyn Fn(f64, usize) -> bool),
}

impl HostPolicy<'_> {
    /// The kept candidates of one row of weights, and those whose membership float
    /// rounding may flip (weights within relative 4e-6 of the cut; for top-p, also the
    /// levels next to a cut whose mass lies within 1e-5 of `p`).
    pub fn keep(&self, w: &[f64]) -> (Vec<bool>, Vec<bool>) {
        match self {
            HostPolicy::TopP(p) => (host::top_p_oracle(w, *p), host::top_p_ambiguous(w, *p)),
            HostPolicy::TopK(k) => near_cut(w, host::threshold_oracle(w, |_, c| c >= *k)),
            HostPolicy::Rule(f) => near_cut(w, host::threshold_oracle(w, f)),
        }
    }
}

/// `kept`, and the weights within relative 4e-6 of its cut.
fn near_cut(w: &[f64], kept: Vec<bool>) -> (Vec<bool>, Vec<bool>) {
    let cut = (0..w.len())
        .filter(|i| kept[*i])
        .map(|i| w[i])
        .fold(f64::INFINITY, f64::min);
    let unsure = w.iter().map(|x| (x - cut).abs() <= 4e-6 * cut).collect();
    (kept, unsure)
}

/// The select stage on the host.
pub enum HostSelect<'a> {
    /// Every token.
    Full,
    /// A page selector: its f64 page scores laid out as a plan's (row `(b, h)` at
    /// `kv_indptr[b] * num_kv_heads + h * pages_b`, e.g.
    /// [`crate::selectors::reference::quest_scores`]), its budget and always-kept pages.
    Pages {
        scores: &'a [f64],
        budget: Budget,
        keep: Keep,
    },
    /// A token selector (Double Sparsity, SparQ): its f64 token scores laid out as its
    /// plan's (row `(b, h)` at `tokens before b * num_kv_heads + h * len_b`, e.g.
    /// [`ds_token_scores`], [`sparq_token_scores`]), its budget and always-kept tokens, and
    /// SparQ's output mix when the pipeline applies it.
    Tokens {
        scores: &'a [f64],
        budget: Budget,
        keep: Keep,
        mix: Option<HostMix<'a>>,
    },
}

/// SparQ's output mix on the host: per query row the approximate logits of every token of
/// its sequence (for `alpha`, the softmax mass on the kept tokens), and per (sequence, KV
/// head) the mean of V (`head_dim` values a row).
#[derive(Clone, Copy)]
pub struct HostMix<'a> {
    pub logits: &'a [Vec<f64>],
    pub v_mean: &'a [f64],
}

/// Double Sparsity's f64 token scores for `q` (the layout [`HostSelect::Tokens`] takes),
/// from the labels of every token of `table` (`calibration`'s channels of K).
pub fn ds_token_scores(
    q: &[f16],
    k: &[f16],
    kv: &KvShape,
    table: &PageTable,
    num_q_heads: usize,
    calibration: &DsCalibration,
) -> Vec<f64> {
    let mut labels = vec![f16::ZERO; kv.rows() * calibration.r()];
    let (pages, lens) = table_pages(table, kv.page_size, false);
    ds_labels(k, kv, calibration, &pages, &lens, &mut labels);
    ds_scores(q, &labels, calibration, kv, table, num_q_heads)
}

/// SparQ's f64 token scores for `q` with `r` components (the layout [`HostSelect::Tokens`]
/// takes), and each query row's approximate logits over its sequence (Algorithm 1,
/// `sparq_reference::sparq_row`).
pub fn sparq_token_scores(
    q: &[f16],
    k: &[f16],
    kv: &KvShape,
    table: &PageTable,
    num_q_heads: usize,
    r: usize,
) -> (Vec<f64>, Vec<Vec<f64>>) {
    let (mut scores, mut logits) = (vec![], vec![]);
    for b in 0..table.batch() {
        let n = table.seq_len(b, kv.page_size);
        for h in 0..kv.num_kv_heads {
            let key = paged_key(k, kv, table, b, h);
            let row = sparq_row(
                q,
                num_q_heads,
                kv.num_kv_heads,
                kv.head_dim,
                b,
                h,
                r,
                n,
                &key,
            );
            scores.extend(row.scores);
            logits.extend(row.logits);
        }
    }
    (scores, logits)
}

/// Each (sequence, KV head)'s mean of V over its tokens (`head_dim` values a row), as
/// SparQ's mix takes it.
pub fn v_means(v: &[f16], kv: &KvShape, table: &PageTable) -> Vec<f64> {
    let d = kv.head_dim * kv.num_kv_heads;
    let mut sums = value_sums(v, kv, table);
    for (b, row) in sums.chunks_mut(d).enumerate() {
        let n = table.seq_len(b, kv.page_size) as f64;
        row.iter_mut().for_each(|x| *x /= n);
    }
    sums
}

/// Quest's f64 page scores for `q` (the layout [`HostSelect::Pages`] takes), from its f64
/// state of every page of `table` (the min and max of K, rounded to f16 as the state
/// holds them).
pub fn quest_page_scores(
    q: &[f16],
    k: &[f16],
    kv: &KvShape,
    table: &PageTable,
    num_q_heads: usize,
) -> Vec<f64> {
    let n = kv.num_pages * kv.num_kv_heads * kv.head_dim;
    let (mut lo, mut hi) = (vec![f16::ZERO; n], vec![f16::ZERO; n]);
    let (pages, lens) = table_pages(table, kv.page_size, false);
    quest_update(k, kv, &pages, &lens, &mut lo, &mut hi);
    quest_scores(q, &lo, &hi, kv, table, num_q_heads)
}

/// The candidates of each (sequence, KV head): the selection.
pub fn select(sel: &HostSelect, table: &PageTable, kv: &KvShape) -> TokenLists {
    match sel {
        HostSelect::Full => TokenLists::all_tokens(table, kv.page_size, kv.num_kv_heads),
        HostSelect::Pages {
            scores,
            budget,
            keep,
        } => {
            let shape = SelectionShape::new(table, kv, Items::Pages, *budget, *keep)
                .expect("a table the plan accepted");
            page_token_lists(&select_items(scores, &shape, *keep), table, kv)
        }
        HostSelect::Tokens {
            scores,
            budget,
            keep,
            ..
        } => {
            let shape = SelectionShape::new(table, kv, Items::Tokens, *budget, *keep)
                .expect("a table the plan accepted");
            let mut lists = TokenLists {
                indptr: vec![0],
                indices: vec![],
            };
            for row in select_items(scores, &shape, *keep) {
                lists.indices.extend(row.iter().map(|t| *t as i32));
                lists.indptr.push(lists.indices.len() as i32);
            }
            lists
        }
    }
}

/// The selection `got` against the reference's, item by item (pages, or tokens), but for
/// items whose score lies within float rounding of the row's cut: within `1e-5` of the
/// row's largest score magnitude of the lowest score the reference keeps (always-kept
/// items aside). Each row must hold whole items, ascending.
fn compare_selection(
    sel: &HostSelect,
    got: &TokenLists,
    table: &PageTable,
    kv: &KvShape,
) -> StageCheck {
    let want = select(sel, table, kv);
    let (scores, budget, keep, unit) = match sel {
        HostSelect::Full => return compare_lists("select", Some(got), Some(&want)),
        HostSelect::Pages {
            scores,
            budget,
            keep,
        } => (*scores, *budget, *keep, Items::Pages),
        HostSelect::Tokens {
            scores,
            budget,
            keep,
            ..
        } => (*scores, *budget, *keep, Items::Tokens),
    };
    let exact = compare_lists("select", Some(got), Some(&want));
    if exact.passed() || got.rows() != want.rows() {
        return exact;
    }
    let shape = SelectionShape::new(table, kv, unit, budget, keep).expect("an accepted table");
    let size = match unit {
        Items::Pages => kv.page_size,
        Items::Tokens => 1,
    };
    let heads = kv.num_kv_heads;
    let (mut wrong, mut detail) = (0usize, None);
    for r in 0..got.rows() {
        let b = r / heads;
        let first = shape.item_indptr[b] as usize;
        let n = shape.item_indptr[b + 1] as usize - first;
        let row_scores = &scores[first * heads + (r % heads) * n..][..n];
        let kept = top_k_row(row_scores, shape.k_items[b] as usize, keep);
        let forced = |i: usize| i < keep.sink || i + keep.recent >= n;
        let cut = kept
            .iter()
            .filter(|i| !forced(**i))
            .map(|i| row_scores[*i])
            .fold(f64::INFINITY, f64::min);
        let tol = 1e-5 * row_scores.iter().fold(0.0f64, |m, s| m.max(s.abs()));
        // The row's items, and their tokens listed again: the row must be exactly those.
        let mut items: Vec<usize> = got.row(r).iter().map(|t| *t as usize / size).collect();
        items.dedup();
        let len = table.seq_len(b, kv.page_size);
        let tokens = items
            .iter()
            .flat_map(|i| i * size..((i + 1) * size).min(len))
            .map(|t| t as i32);
        if !tokens.eq(got.row(r).iter().copied())
            || !items.is_sorted_by(|a, b| a < b)
            || items.iter().any(|i| *i >= n)
        {
            wrong += 1;
            detail.get_or_insert(format!("row {r}: not whole items, ascending"));
            continue;
        }
        for i in (0..n).filter(|i| items.binary_search(i).is_ok() != kept.binary_search(i).is_ok())
        {
            if forced(i) || (row_scores[i] - cut).abs() > tol {
                wrong += 1;
                detail.get_or_insert(format!(
                    "row {r}: item {i} (score {}) kept {}, reference {} (cut {cut})",
                    row_scores[i],
                    items.binary_search(&i).is_ok(),
                    kept.binary_search(&i).is_ok()
                ));
            }
        }
    }
    StageCheck {
        stage: "select",
        error: wrong as f64,
        tolerance: 0.0,
        detail,
    }
}

/// The estimated scores of `cand`'s tokens for every query head, in `spgemv_quant`'s
/// layout, in f64 over the quantized copy `qk`.
pub fn estimate(
    q: &[f16],
    num_q_heads: usize,
    qk: &QuantizedRows,
    bits: u32,
    kv: &KvShape,
    table: &PageTable,
    cand: &TokenLists,
) -> Vec<f64> {
    host::spgemv(q, num_q_heads, qk, bits, kv, table, cand)
}

/// One pruner over `cand` given its scores (`spgemv_quant`'s layout, `group` query heads
/// a row): each query head's softmax (scale `scale`) and cut, the union over the group.
/// Returns the kept lists and, per candidate, whether rounding may flip it.
pub fn prune<S: Copy + Into<f64>>(
    cand: &TokenLists,
    scores: &[S],
    group: usize,
    scale: f64,
    policy: &HostPolicy,
) -> (TokenLists, Vec<bool>) {
    let mut kept = TokenLists {
        indptr: vec![0],
        indices: vec![],
    };
    let mut unsure = vec![false; cand.indices.len()];
    for r in 0..cand.rows() {
        let row = cand.row(r);
        let (start, n) = (cand.indptr[r] as usize, row.len());
        let mut union = vec![false; n];
        for g in 0..group {
            let s: Vec<f64> = scores[start * group + g * n..][..n]
                .iter()
                .map(|x| (*x).into())
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| ((x - m) * scale).exp()).collect();
            let z: f64 = e.iter().sum();
            let w: Vec<f64> = e.iter().map(|x| x / z).collect();
            let (k, u) = policy.keep(&w);
            for j in 0..n {
                union[j] |= k[j];
                unsure[start + j] |= u[j];
            }
        }
        kept.indices
            .extend((0..n).filter(|j| union[*j]).map(|j| row[j]));
        kept.indptr.push(kept.indices.len() as i32);
    }
    (kept, unsure)
}

/// Attention's lists: row `r` the pruned row, or every position of its sequence where
/// `dense[r]`.
pub fn lists(pruned: &TokenLists, dense: &[bool], table: &PageTable, kv: &KvShape) -> TokenLists {
    let mut out = TokenLists {
        indptr: vec![0],
        indices: vec![],
    };
    for (r, d) in dense.iter().enumerate() {
        if *d {
            let n = table.seq_len(r / kv.num_kv_heads, kv.page_size) as i32;
            out.indices.extend(0..n);
        } else {
            out.indices.extend_from_slice(pruned.row(r));
        }
        out.indptr.push(out.indices.len() as i32);
    }
    out
}

/// Which list rows (`batch * num_kv_heads`) are attended densely: sequences of at most
/// `dense_below` tokens.
pub fn dense_rows(table: &PageTable, kv: &KvShape, dense_below: usize) -> Vec<bool> {
    (0..table.batch() * kv.num_kv_heads)
        .map(|r| table.seq_len(r / kv.num_kv_heads, kv.page_size) <= dense_below)
        .collect()
}

/// Attention in f64 of each query row over its KV head's list (scale `1/sqrt(head_dim)`):
/// the outputs (`[batch * num_q_heads, head_dim]`) and the natural-log LSE per row. With
/// `mix` (SparQ's `alpha` per query row, the mean of V per (sequence, KV head)) each output
/// is `alpha * y + (1 - alpha) * v_mean`.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    q: &[f16],
    k: &[f16],
    v: &[f16],
    num_q_heads: usize,
    kv: &KvShape,
    table: &PageTable,
    lists: &TokenLists,
    mix: Option<(&[f32], &[f32])>,
) -> (Vec<f64>, Vec<f64>) {
    let group = num_q_heads / kv.num_kv_heads;
    let rows: Vec<Vec<i32>> = (0..table.batch() * num_q_heads)
        .map(|qr| {
            let (b, h) = (qr / num_q_heads, qr % num_q_heads);
            lists.row(b * kv.num_kv_heads + h / group).to_vec()
        })
        .collect();
    host::attention(
        q,
        k,
        v,
        num_q_heads,
        kv,
        table,
        &rows,
        1.0 / (kv.head_dim as f64).sqrt(),
        mix,
    )
}

/// The inputs of a step on the host.
pub struct HostInputs<'a> {
    pub q: &'a [f16],
    pub k: &'a [f16],
    pub v: &'a [f16],
    pub kv: KvShape,
    pub num_q_heads: usize,
    pub table: &'a PageTable,
}

/// What a plan wrote at each stage of one step, downloaded.
pub struct GotStep {
    /// The selection (`None` for `Select::Full`).
    pub selected: Option<TokenLists>,
    /// Each pruner's estimated scores (over its candidates) and kept lists.
    pub pruned: Vec<(Vec<f32>, TokenLists)>,
    /// Attention's lists (`None` when the step was dense attention).
    pub lists: Option<TokenLists>,
    /// SparQ's mix when attention applied it: `alpha` per query row and the mean of V per
    /// (sequence, KV head), `head_dim` values a row.
    pub mix: Option<(Vec<f32>, Vec<f32>)>,
    /// The output, `[batch * num_q_heads, head_dim]`, and the LSE per query row.
    pub out: Vec<f32>,
    pub lse: Vec<f32>,
}

/// Runs `plan`'s step stage by stage over `q`, `k`, `v` (`out` and `lse` as
/// [`PipelinePlan::step`] takes them), downloading what each stage wrote: the checks'
/// view of a step (it waits for each stage; [`PipelinePlan::step`] does not).
#[allow(clippy::too_many_arguments)]
pub fn run_stages(
    dusk: &Dusk,
    plan: &mut PipelinePlan,
    q: &Buffer<f16>,
    k: &Buffer<f16>,
    v: &Buffer<f16>,
    out: &mut Buffer<f16>,
    lse: &mut Buffer<f32>,
) -> Result<GotStep> {
    let lists_of = |ip: &Buffer<i32>, ix: &Buffer<i32>| -> Result<TokenLists> {
        let indptr = ip.download()?;
        let mut indices = ix.download()?;
        indices.truncate((*indptr.last().unwrap_or(&0)).clamp(0, indices.len() as i32) as usize);
        Ok(TokenLists { indptr, indices })
    };
    plan.run_select(dusk, q)?;
    let selected = match plan.selector() {
        Some(s) if !plan.is_dense() => {
            let indptr = plan.selection_indptr()?;
            let mut indices = s.sel_indices().download()?;
            indices.truncate(*indptr.last().unwrap_or(&0) as usize);
            Some(TokenLists { indptr, indices })
        }
        _ => None,
    };
    let mut pruned = vec![];
    let n = if plan.is_dense() {
        0
    } else {
        plan.pruners().len()
    };
    for i in 0..n {
        plan.run_estimate(dusk, q, i)?;
        let scores = plan
            .scores()
            .map(|s| s.download())
            .transpose()?
            .unwrap_or_default();
        plan.run_prune(dusk, i)?;
        // The last pruner writes attention's lists itself unless the fallback merges.
        let kept = match plan.lists() {
            Some((ip, ix)) if i + 1 == n && !plan.has_fallback() => lists_of(ip, ix)?,
            _ => {
                let p = &plan.pruners()[i];
                lists_of(p.sel_indptr(), p.sel_indices())?
            }
        };
        pruned.push((scores, kept));
    }
    plan.run_lists(dusk)?;
    plan.run_attend(dusk, q, k, v, out, lse)?;
    let lists = plan.lists().map(|(ip, ix)| lists_of(ip, ix)).transpose()?;
    let mix = match plan.selector().and_then(|s| s.sparq_mix()) {
        Some(m) if plan.pipeline().sparq_mix && !plan.is_dense() => Some((
            m.alpha.download()?,
            m.v_mean.download()?.iter().map(|x| x.to_f32()).collect(),
        )),
        _ => None,
    };
    Ok(GotStep {
        selected,
        pruned,
        lists,
        mix,
        out: out.download()?.iter().map(|x| x.to_f32()).collect(),
        lse: lse.download()?,
    })
}

/// One stage's comparison.
#[derive(Debug)]
pub struct StageCheck {
    pub stage: &'static str,
    /// The error measured: a count of wrong tokens, or a relative L2 error.
    pub error: f64,
    pub tolerance: f64,
    /// Where it was first wrong, when it was.
    pub detail: Option<String>,
}

impl StageCheck {
    pub fn passed(&self) -> bool {
        self.error <= self.tolerance
    }
}

/// The reference's side of a check: how to select, the pruners, the dense rows' bound.
pub struct HostPipeline<'a> {
    pub select: HostSelect<'a>,
    pub prune: Vec<HostPolicy<'a>>,
    pub bits: u32,
    pub dense_below: usize,
}

/// Compares `got` with the reference, stage by stage (see the module docs). The
/// tolerances: selections and lists exact, scores `1e-3` relative L2 (fixed-point
/// queries, f32 sums), a pruner's kept tokens exact but for those within rounding of the
/// cut, the output `2e-3` relative L2 (f16 outputs) and the LSE `1e-4` of `1 + |lse|`.
pub fn check(pipe: &HostPipeline, inputs: &HostInputs, got: &GotStep) -> Vec<StageCheck> {
    let (kv, table, hq) = (&inputs.kv, inputs.table, inputs.num_q_heads);
    let group = hq / kv.num_kv_heads;
    let dense = dense_rows(table, kv, pipe.dense_below);
    let all_dense = dense.iter().all(|d| *d)
        || (matches!(pipe.select, HostSelect::Full) && pipe.prune.is_empty());
    let mut checks = vec![];
    if all_dense {
        let full = TokenLists::all_tokens(table, kv.page_size, kv.num_kv_heads);
        checks.push(compare_lists("lists (dense)", got.lists.as_ref(), None));
        checks.extend(check_out(inputs, &full, got));
        return checks;
    }
    let want_sel = select(&pipe.select, table, kv);
    let mut cand = match &got.selected {
        Some(sel) => {
            checks.push(compare_selection(&pipe.select, sel, table, kv));
            sel.clone()
        }
        None => want_sel,
    };
    if let HostSelect::Tokens { mix: Some(m), .. } = &pipe.select {
        checks.extend(compare_mix(m, &cand, got, hq, kv.num_kv_heads));
    }
    let qk = host::quantize(inputs.k, kv, pipe.bits);
    let scale = 1.0 / (kv.head_dim as f64).sqrt();
    for (i, policy) in pipe.prune.iter().enumerate() {
        let Some((scores, kept)) = got.pruned.get(i) else {
            checks.push(StageCheck {
                stage: "prune",
                error: f64::INFINITY,
                tolerance: 0.0,
                detail: Some(format!("pruner {i} wrote nothing")),
            });
            return checks;
        };
        let want = estimate(inputs.q, hq, &qk, pipe.bits, kv, table, &cand);
        checks.push(StageCheck {
            stage: "estimate",
            error: host::rel_error(&scores[..want.len().min(scores.len())], &want),
            tolerance: 1e-3,
            detail: (scores.len() < want.len())
                .then(|| format!("{} scores, {} expected", scores.len(), want.len())),
        });
        let (want_kept, unsure) = prune(&cand, &scores[..want.len()], group, scale, policy);
        checks.push(compare_kept(&cand, kept, &want_kept, &unsure));
        cand = kept.clone();
    }
    let want_lists = lists(&cand, &dense, table, kv);
    checks.push(compare_lists(
        "lists",
        got.lists.as_ref(),
        Some(&want_lists),
    ));
    let attended = got.lists.clone().unwrap_or(want_lists);
    checks.extend(check_out(inputs, &attended, got));
    checks
}

/// SparQ's mix as the device made it against the reference's: each query row's `alpha`
/// (the softmax mass of its f64 logits on the tokens selected; `1e-4`) and each row's mean
/// of V (`2e-3` relative L2: f16).
fn compare_mix(
    want: &HostMix,
    selected: &TokenLists,
    got: &GotStep,
    num_q_heads: usize,
    num_kv_heads: usize,
) -> [StageCheck; 2] {
    let missing = |stage| StageCheck {
        stage,
        error: f64::INFINITY,
        tolerance: 0.0,
        detail: Some("no SparQ mix applied".into()),
    };
    let Some((alpha, v_mean)) = &got.mix else {
        return [missing("mix (alpha)"), missing("mix (mean of V)")];
    };
    let group = num_q_heads / num_kv_heads;
    let (mut worst, mut detail) = (0.0f64, None);
    for (qr, logits) in want.logits.iter().enumerate() {
        let row = (qr / num_q_heads) * num_kv_heads + (qr % num_q_heads) / group;
        let kept: Vec<usize> = selected.row(row).iter().map(|t| *t as usize).collect();
        let a = sparq_alpha(logits, &kept);
        let d = match alpha.get(qr) {
            Some(g) if (*g as f64 - a).abs() <= worst => continue,
            Some(g) if !g.is_nan() => (*g as f64 - a).abs(),
            _ => f64::INFINITY,
        };
        worst = d;
        detail = Some(format!(
            "query row {qr}: {:?}, reference {a}",
            alpha.get(qr)
        ));
    }
    let v_err = if v_mean.len() == want.v_mean.len() {
        host::rel_error(v_mean, want.v_mean)
    } else {
        f64::INFINITY
    };
    [
        StageCheck {
            stage: "mix (alpha)",
            error: worst,
            tolerance: 1e-4,
            detail,
        },
        StageCheck {
            stage: "mix (mean of V)",
            error: v_err,
            tolerance: 2e-3,
            detail: None,
        },
    ]
}

/// Lists compared exactly (`want` `None`: there should be none).
fn compare_lists(
    stage: &'static str,
    got: Option<&TokenLists>,
    want: Option<&TokenLists>,
) -> StageCheck {
    let (error, detail) = match (got, want) {
        (None, None) => (0.0, None),
        (Some(g), Some(w)) if g.indptr.len() == w.indptr.len() => {
            let rows: Vec<usize> = (0..w.rows()).filter(|r| g.row(*r) != w.row(*r)).collect();
            let detail = rows.first().map(|r| {
                format!(
                    "row {r}: {} tokens ({:?}..), {} expected ({:?}..)",
                    g.row(*r).len(),
                    &g.row(*r)[..g.row(*r).len().min(4)],
                    w.row(*r).len(),
                    &w.row(*r)[..w.row(*r).len().min(4)]
                )
            });
            (rows.len() as f64, detail)
        }
        (g, w) => (
            f64::INFINITY,
            Some(format!(
                "{} rows, {} expected",
                g.map_or("no".into(), |l| l.rows().to_string()),
                w.map_or("no".into(), |l| l.rows().to_string())
            )),
        ),
    };
    StageCheck {
        stage,
        error,
        tolerance: 0.0,
        detail,
    }
}

/// A pruner's kept lists against the oracle's, but for candidates rounding may flip.
fn compare_kept(
    cand: &TokenLists,
    got: &TokenLists,
    want: &TokenLists,
    unsure: &[bool],
) -> StageCheck {
    let (mut wrong, mut detail) = (0usize, None);
    if got.rows() != cand.rows() {
        return StageCheck {
            stage: "prune",
            error: f64::INFINITY,
            tolerance: 0.0,
            detail: Some(format!("{} rows, {} expected", got.rows(), cand.rows())),
        };
    }
    for r in 0..cand.rows() {
        let (row, start) = (cand.row(r), cand.indptr[r] as usize);
        let (g, w) = (got.row(r), want.row(r));
        if !g.is_sorted_by(|a, b| a < b) || g.iter().any(|t| row.binary_search(t).is_err()) {
            wrong += 1;
            detail.get_or_insert(format!(
                "row {r}: kept positions not an ascending subset of the candidates"
            ));
            continue;
        }
        for (j, t) in row.iter().enumerate() {
            let (in_g, in_w) = (g.binary_search(t).is_ok(), w.binary_search(t).is_ok());
            if in_g != in_w && !unsure[start + j] {
                wrong += 1;
                detail.get_or_insert(format!("row {r}: token {t} kept {in_g}, oracle {in_w}"));
            }
        }
    }
    StageCheck {
        stage: "prune",
        error: wrong as f64,
        tolerance: 0.0,
        detail,
    }
}

/// The output (`2e-3` relative L2: f16 outputs) and the LSE (`1e-4` of `1 + |lse|`)
/// against f64 attention over `lists`.
fn check_out(inputs: &HostInputs, lists: &TokenLists, got: &GotStep) -> [StageCheck; 2] {
    let mix = got.mix.as_ref().map(|(a, m)| (a.as_slice(), m.as_slice()));
    let (want, want_lse) = attend(
        inputs.q,
        inputs.k,
        inputs.v,
        inputs.num_q_heads,
        &inputs.kv,
        inputs.table,
        lists,
        mix,
    );
    let lse_err = got
        .lse
        .iter()
        .zip(&want_lse)
        .map(|(g, w)| (*g as f64 - w).abs() / (1.0 + w.abs()))
        .fold(
            0.0,
            |a: f64, b| if b.is_nan() { f64::INFINITY } else { a.max(b) },
        );
    [
        StageCheck {
            stage: "attend",
            error: host::rel_error(&got.out, &want),
            tolerance: 2e-3,
            detail: None,
        },
        StageCheck {
            stage: "attend (lse)",
            error: if got.lse.len() == want_lse.len() {
                lse_err
            } else {
                f64::INFINITY
            },
            tolerance: 1e-4,
            detail: None,
        },
    ]
}
