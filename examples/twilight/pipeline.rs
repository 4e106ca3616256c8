//! Twilight's pipeline end to end, on the device and with no host sync between the stages:
//! a selector's candidates (a random half of each sequence's pages, as Quest would give),
//! the K cache quantized to INT4 (`quantize_k`), INT4 scores of every query head over the
//! candidates (`spgemv_quant`), the top-p pruner over those scores with the group's union of
//! kept tokens (GQA 4), and varlen paged decode attention over the kept tokens, reading the
//! pruner's lists where they lie. Afterwards each stage's output is checked on the host
//! against a reference of its own, fed the stage's actual inputs (so one stage's error does
//! not show up as the next one's): [`Report`] is the table of the checks.

use dusk::compiler::DType;
use dusk::kernels::attention_ops::{AttentionMode, AttentionPlan, AttentionSpec};
use dusk::kernels::ops::{Dusk, SpgemvPlan};
use dusk::kernels::paged::{KvShape, PageTable, TokenLists};
use dusk::kernels::policies::top_p;
use dusk::kernels::prune::{ParamValues, PrunePlan};
use dusk::kernels::reference::{self, QuantizedRows};
use half::f16;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;
use std::fmt;

/// The shape of the job: pages of 16 tokens, 8 KV heads, 32 query heads (GQA 4), head_dim
/// 128, INT4 codes.
pub const PAGE_SIZE: usize = 16;
pub const NUM_KV_HEADS: usize = 8;
pub const NUM_Q_HEADS: usize = 32;
pub const HEAD_DIM: usize = 128;
const BITS: u32 = 4;

/// How a stage's error is measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Measure {
    /// A count of wrong items (tokens), printed as an integer.
    Count(&'static str),
    /// The largest difference, in units of the quantization step.
    Steps,
    /// `‖got - want‖ / ‖want‖`.
    RelativeL2,
}

/// One stage's check: what it was compared with, the error measured, and the tolerance.
#[derive(Clone, Debug)]
pub struct Stage {
    pub name: &'static str,
    /// The reference the stage's output was compared with.
    pub reference: &'static str,
    pub measure: Measure,
    /// Why the tolerance is what it is, when it is not plain.
    pub note: &'static str,
    pub tolerance: f64,
    pub error: f64,
    /// Where it was first wrong or furthest off (printed when the stage fails).
    pub detail: Option<String>,
}

impl Stage {
    /// Within tolerance (a NaN error fails).
    pub fn passed(&self) -> bool {
        self.error <= self.tolerance
    }

    fn value(&self, x: f64) -> String {
        match self.measure {
            _ if !x.is_finite() => format!("{x}"),
            Measure::Count(unit) if x == 1.0 => format!("1 {}", unit.trim_end_matches('s')),
            Measure::Count(unit) => format!("{x} {unit}"),
            Measure::Steps if x == 1.0 => "1 step".to_string(),
            Measure::Steps if x == x.round() => format!("{x} steps"),
            Measure::Steps => format!("{x:.3} steps"),
            Measure::RelativeL2 => format!("{x:.1e} rel"),
        }
    }
}

/// What one run kept, and the check of each stage.
pub struct Report {
    pub candidates: usize,
    pub kept: usize,
    pub stages: Vec<Stage>,
}

impl Report {
    /// Every stage within tolerance.
    pub fn passed(&self) -> bool {
        self.stages.iter().all(Stage::passed)
    }
}

impl fmt::Display for Report {
    /// The table (stage, reference, tolerance, error, verdict), the mismatches of the stages
    /// that failed, and the overall verdict.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
        let rows: Vec<[String; 5]> = self
            .stages
            .iter()
            .map(|s| {
                [
                    s.name.to_string(),
                    s.reference.to_string(),
                    s.value(s.tolerance),
                    s.value(s.error),
                    verdict(s.passed()).to_string(),
                ]
            })
            .collect();
        let head = ["stage", "checked against", "tolerance", "error", "verdict"].map(String::from);
        let width = |c: usize| {
            rows.iter()
                .chain([&head])
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..5).map(width).collect();
        for r in [&head].into_iter().chain(&rows) {
            let cells: Vec<String> = (0..5)
                .map(|c| format!("{:w$}", r[c], w = widths[c]))
                .collect();
            writeln!(f, "{}", cells.join("  ").trim_end())?;
        }
        writeln!(
            f,
            "\nreference:: is dusk::kernels::reference (kernels_gen/src/reference.rs), fed \
             each stage's inputs as the device made them"
        )?;
        for s in self.stages.iter().filter(|s| !s.note.is_empty()) {
            writeln!(f, "  {}: {}", s.name, s.note)?;
        }
        for s in self.stages.iter().filter(|s| !s.passed()) {
            let detail = s.detail.as_deref().unwrap_or("no detail");
            writeln!(f, "FAIL {}: {detail}", s.name)?;
        }
        let failed = self.stages.iter().filter(|s| !s.passed()).count();
        write!(
            f,
            "\n{}: {} of {} stages within tolerance",
            verdict(failed == 0),
            self.stages.len() - failed,
            self.stages.len()
        )
    }
}

/// Runs the pipeline on sequences of `seq_lens` tokens, top-p `p`, and checks each stage.
/// An error is a failure to run (an invalid argument, a device error); a stage out of
/// tolerance is a FAIL in the report.
pub fn run(
    dusk: &Dusk,
    seq_lens: &[usize],
    p: f64,
    seed: u64,
) -> Result<Report, Box<dyn std::error::Error>> {
    let dev = dusk.device();
    let mut rng = SmallRng::seed_from_u64(seed);
    let (num_q_heads, num_kv_heads, head_dim, page_size) =
        (NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE);
    let group = num_q_heads / num_kv_heads;
    let pages = PageTable::pages_needed(seq_lens, page_size);
    let table = PageTable::from_lengths(seq_lens, page_size, (0..pages as i32).rev().collect())?;
    let kv = KvShape {
        num_pages: pages.max(1),
        page_size,
        num_kv_heads,
        head_dim,
    };
    let rand_f16 = |rng: &mut SmallRng, n: usize, s: f32| -> Vec<f16> {
        (0..n)
            .map(|_| f16::from_f32(rng.random_range(-s..s)))
            .collect()
    };
    let k_host = rand_f16(&mut rng, kv.elements(), 1.0);
    let v_host = rand_f16(&mut rng, kv.elements(), 1.0);
    let q_host = rand_f16(&mut rng, seq_lens.len() * num_q_heads * head_dim, 8.0);
    let (k, v, q) = (
        dev.upload(&k_host)?,
        dev.upload(&v_host)?,
        dev.upload(&q_host)?,
    );

    // Select: a random half of each sequence's pages per KV head (the last page always).
    let mut chosen = vec![];
    for &n in seq_lens {
        let np = n.div_ceil(page_size);
        for _ in 0..num_kv_heads {
            let mut ps: Vec<usize> = (0..np)
                .filter(|i| *i + 1 == np || rng.random_bool(0.5))
                .collect();
            ps.sort();
            chosen.push(ps);
        }
    }
    let cand = TokenLists::from_pages(&table, page_size, num_kv_heads, &chosen);

    // Quantize K to INT4, then estimate: INT4 scores of every query head over its KV
    // head's candidates.
    let qk = dusk.quantize_k(&k, kv, BITS)?;
    let spgemv = SpgemvPlan::new(dusk, kv, num_q_heads, BITS, &table, &cand)?;
    let mut scores = dev.alloc::<f32>(spgemv.num_scores().max(1))?;
    spgemv.run(dusk, &q, &qk, &mut scores)?;

    // Prune: top-p per query head, the group's union per KV head.
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut prune = PrunePlan::new(
        dusk,
        &top_p::POLICY,
        &cand,
        group,
        scale,
        &[ParamValues::Uniform(p)],
    )?;
    prune.run(dusk, &scores)?;

    // Attend: group varlen over the pruner's lists, copied on the device into the plan's.
    let spec = AttentionSpec {
        kv,
        batch: seq_lens.len(),
        num_q_heads,
        mode: AttentionMode::GroupVarlen,
        max_tokens: cand.max_row_len().max(1),
        sm_scale: Some(scale),
        sparq: false,
        dtype: DType::F16,
    };
    let attn = AttentionPlan::new(dusk, spec)?;
    let mut meta = attn.device_meta(
        dusk,
        &table,
        dev.alloc::<i32>(prune.sel_indptr().len())?,
        dev.alloc::<i32>(prune.sel_indices().len())?,
    )?;
    let (ip, ix) = meta
        .lists_mut()
        .ok_or("the group-varlen attention plan has no token lists to fill")?;
    ip.copy_from(prune.sel_indptr())?;
    ix.copy_from(prune.sel_indices())?;
    let rows = seq_lens.len() * num_q_heads;
    let mut out = dev.alloc::<f16>(rows * head_dim)?;
    let mut lse = dev.alloc::<f32>(rows)?;
    attn.run(dusk, &q, &k, &v, &meta, None, &mut out, &mut lse)?;

    // Check each stage on the host.
    let got_qk = QuantizedRows {
        packed: qk.packed.download()?,
        scale: qk.scale.download()?,
        zero: qk.zero.download()?,
    };
    let s_host = scores.download()?;
    let sel_ip = prune.sel_indptr().download()?;
    let sel = prune.sel_indices().download()?;
    let kept: Vec<Vec<i32>> = (0..cand.rows())
        .map(|r| sel[sel_ip[r] as usize..sel_ip[r + 1] as usize].to_vec())
        .collect();
    let per_q: Vec<Vec<i32>> = (0..rows)
        .map(|qr| kept[(qr / num_q_heads) * num_kv_heads + (qr % num_q_heads) / group].clone())
        .collect();
    let f = |x: &[f16]| x.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
    let (want_out, _) = reference::attention(
        &f(&q_host),
        &f(&k_host),
        &f(&v_host),
        num_q_heads,
        &kv,
        &table,
        &per_q,
        scale as f64,
        None,
    );
    let want_scores = reference::spgemv(&q_host, num_q_heads, &got_qk, BITS, &kv, &table, &cand);
    let got_out = f(&out.download()?);
    let stages = vec![
        check_select(&table, &chosen, &cand),
        check_quantize(&got_qk, &reference::quantize(&k_host, &kv, BITS)),
        Stage {
            name: "estimate (INT4 SpGEMV)",
            reference: "reference::spgemv (f64, the same INT4 codes)",
            measure: Measure::RelativeL2,
            note: "relative L2 error |got - ref| / |ref| over every score",
            tolerance: 1e-3,
            error: reference::rel_error(&s_host[..want_scores.len()], &want_scores),
            detail: largest_difference(&s_host, &want_scores, |i| format!("score {i}")),
        },
        check_prune(&cand, group, &s_host, scale as f64, p, &kept),
        Stage {
            name: "attend (kept tokens)",
            reference: "reference::attention (f64, the same kept tokens)",
            measure: Measure::RelativeL2,
            note: "relative L2 error over every output row (f16 outputs)",
            tolerance: 2e-3,
            error: reference::rel_error(&got_out, &want_out),
            detail: largest_difference(&got_out, &want_out, |i| {
                let r = i / head_dim;
                format!(
                    "sequence {}, query head {}, element {}",
                    r / num_q_heads,
                    r % num_q_heads,
                    i % head_dim
                )
            }),
        },
    ];
    Ok(Report {
        candidates: cand.indices.len(),
        kept: kept.iter().map(Vec::len).sum(),
        stages,
    })
}

/// Where `got` is furthest from `want` (a NaN first), named by `at`.
fn largest_difference(got: &[f32], want: &[f64], at: impl Fn(usize) -> String) -> Option<String> {
    let diff = |i: usize| {
        let d = (got[i] as f64 - want[i]).abs();
        if d.is_nan() {
            f64::INFINITY
        } else {
            d
        }
    };
    let i = (0..want.len()).max_by(|a, b| diff(*a).total_cmp(&diff(*b)))?;
    Some(format!(
        "largest difference at {}: {} against {:.6}",
        at(i),
        got[i],
        want[i]
    ))
}

/// The candidates against the chosen pages' tokens, listed on the host: the positions of
/// the sequence whose page was chosen.
pub fn check_select(table: &PageTable, chosen: &[Vec<usize>], cand: &TokenLists) -> Stage {
    let (mut wrong, mut detail) = (0, None);
    for (r, pages) in chosen.iter().enumerate() {
        let n = table.seq_len(r / NUM_KV_HEADS, PAGE_SIZE) as i32;
        let want: BTreeSet<i32> = (0..n)
            .filter(|t| pages.contains(&(*t as usize / PAGE_SIZE)))
            .collect();
        let got = cand.row(r);
        let differ = want
            .symmetric_difference(&got.iter().copied().collect())
            .count()
            .max(usize::from(!got.is_sorted_by(|a, b| a < b)));
        if differ > 0 && detail.is_none() {
            detail = Some(format!(
                "candidate row {r}: {} tokens, {} expected",
                got.len(),
                want.len()
            ));
        }
        wrong += differ;
    }
    Stage {
        name: "select (pages to tokens)",
        reference: "the chosen pages' tokens, listed on the host",
        measure: Measure::Count("tokens"),
        note: "",
        tolerance: 0.0,
        error: wrong as f64,
        detail,
    }
}

/// The device's codes against the host quantizer's (`reference::quantize`, the kernel's f32
/// steps): the largest difference of a dequantized value, in steps. The GPU may round a
/// value that lies on a rounding boundary the other way (one step).
pub fn check_quantize(got: &QuantizedRows, want: &QuantizedRows) -> Stage {
    let (mut worst, mut detail) = (0.0f64, None);
    for r in 0..want.scale.len() {
        let step = want.scale[r].to_f64().max(f64::MIN_POSITIVE);
        for i in 0..HEAD_DIM {
            let d = (reference::dequant(got, HEAD_DIM, BITS, r, i)
                - reference::dequant(want, HEAD_DIM, BITS, r, i))
            .abs()
                / step;
            if d > worst || d.is_nan() {
                worst = d;
                detail = Some(format!("K row {r}, element {i}: {d} steps off"));
            }
        }
    }
    Stage {
        name: "quantize K to INT4",
        reference: "reference::quantize (the kernel's f32 steps)",
        measure: Measure::Steps,
        note: "the largest difference of a dequantized value; 1 step, as the GPU may \
               round a value on a rounding boundary the other way",
        tolerance: 1.0,
        error: worst,
        detail,
    }
}

/// Each KV head's kept tokens against the union over its query heads of the sort-based
/// top-p oracle, in f64 over the same INT4 scores: the tokens that differ, but for those
/// whose weight lies within float rounding of the cut (`reference::top_p_ambiguous`).
pub fn check_prune(
    cand: &TokenLists,
    group: usize,
    scores: &[f32],
    scale: f64,
    p: f64,
    kept: &[Vec<i32>],
) -> Stage {
    let (mut wrong, mut detail) = (0, None);
    for (r, kept) in kept.iter().enumerate() {
        let row = cand.row(r);
        let start = cand.indptr[r] as usize;
        let n = row.len();
        let (mut union, mut unsure) = (vec![false; n], vec![false; n]);
        for g in 0..group {
            let w = reference::softmax(&scores[start * group + g * n..][..n], scale);
            let (o, a) = (
                reference::top_p_oracle(&w, p),
                reference::top_p_ambiguous(&w, p),
            );
            for j in 0..n {
                union[j] |= o[j];
                unsure[j] |= a[j];
            }
        }
        if !kept.is_sorted_by(|a, b| a < b) {
            wrong += 1;
            detail.get_or_insert(format!("kept row {r}: not strictly ascending"));
        }
        let mut is_kept = vec![false; n];
        for t in kept {
            match row.binary_search(t) {
                Ok(j) => is_kept[j] = true,
                Err(_) => {
                    wrong += 1;
                    detail.get_or_insert(format!("candidate row {r}: kept {t}, no candidate"));
                }
            }
        }
        for j in (0..n).filter(|j| is_kept[*j] != union[*j] && !unsure[*j]) {
            wrong += 1;
            detail.get_or_insert(format!(
                "candidate row {r}: token {} kept {}, oracle {}",
                row[j], is_kept[j], union[j]
            ));
        }
    }
    Stage {
        name: "prune (top-p)",
        reference: "reference::top_p_oracle (f64 sort), group union",
        measure: Measure::Count("tokens"),
        note: "tokens kept or dropped against the oracle, but for those within float \
               rounding of the cut",
        tolerance: 0.0,
        error: wrong as f64,
        detail,
    }
}
