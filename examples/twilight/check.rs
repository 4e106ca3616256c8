//! Each pipeline against the f64 reference of the same algorithm, stage by stage
//! (`dusk::kernels::pipeline::reference`): the step run one stage at a time with every
//! intermediate and output poisoned first ([`run_staged`], on the device), then each
//! stage's output compared with the reference fed that stage's actual inputs, and the INT4
//! copy of K with the host quantizer ([`compare`], on the host: independent per pipeline,
//! so the job runs them side by side).

use super::centroid;
use super::methods::{Host, Method};
use dusk::kernels::paged::{KvShape, PageTable};
use dusk::kernels::pipeline::reference::{
    self as pref, GotStep, HostInputs, HostMix, HostPipeline, HostSelect, StageCheck,
};
use dusk::kernels::pipeline::{PipelinePlan, PipelineShape};
use dusk::kernels::reference::{self, QuantizedRows};
use dusk::kernels::selectors::{Keep, QuestOptions};
use dusk::kernels::synthetic::SyntheticCache;
use dusk::Dusk;
use half::f16;
use std::error::Error;

/// A batch's q, K and V on the host, with its cache shape and page table: what the
/// references read.
pub struct HostBatch {
    pub kv: KvShape,
    pub table: PageTable,
    pub num_q_heads: usize,
    pub q: Vec<f16>,
    pub k: Vec<f16>,
    pub v: Vec<f16>,
}

impl HostBatch {
    pub fn download(cache: &SyntheticCache) -> Result<HostBatch, Box<dyn Error>> {
        Ok(HostBatch {
            kv: cache.kv,
            table: cache.table.clone(),
            num_q_heads: cache.spec.num_q_heads,
            q: cache.q.download()?,
            k: cache.k.download()?,
            v: cache.v.download()?,
        })
    }

    fn inputs(&self) -> HostInputs<'_> {
        HostInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            kv: self.kv,
            num_q_heads: self.num_q_heads,
            table: &self.table,
        }
    }
}

/// A pipeline's shape over a synthetic batch (f16).
pub fn shape(cache: &SyntheticCache) -> PipelineShape {
    PipelineShape {
        kv: cache.kv,
        num_q_heads: cache.spec.num_q_heads,
        dtype: dusk::compiler::DType::F16,
    }
}

/// What a step run stage by stage wrote, downloaded: each stage's output and the INT4 copy
/// of K (with pruners).
pub struct Staged {
    got: GotStep,
    quantized: Option<QuantizedRows>,
}

/// Runs `plan` (prepared over `cache`) stage by stage, every intermediate and output
/// poisoned first, and downloads what each stage wrote.
pub fn run_staged(
    dusk: &Dusk,
    plan: &mut PipelinePlan,
    cache: &SyntheticCache,
) -> Result<Staged, Box<dyn Error>> {
    let dev = dusk.device();
    let mut out = dev.alloc::<f16>(cache.q.len())?;
    let mut lse = dev.alloc::<f32>(cache.q.len() / cache.kv.head_dim)?;
    plan.poison_outputs(dusk, 0xFF)?;
    dev.fill_bytes(&mut out, 0xFF)?;
    dev.fill_bytes(&mut lse, 0xFF)?;
    let (q, k, v) = (&cache.q, &cache.k, &cache.v);
    let got = pref::run_stages(dusk, plan, q, k, v, &mut out, &mut lse)?;
    let quantized = match plan.quantized_k() {
        Some(qk) => Some(QuantizedRows {
            packed: qk.packed.download()?,
            scale: qk.scale.download()?,
            zero: qk.zero.download()?,
        }),
        None => None,
    };
    Ok(Staged { got, quantized })
}

/// One pipeline's checks.
pub struct MethodCheck {
    pub method: String,
    pub stages: Vec<StageCheck>,
}

impl MethodCheck {
    /// Every stage within tolerance (a NaN error fails).
    pub fn passed(&self) -> bool {
        self.stages.iter().all(StageCheck::passed)
    }
}

impl Staged {
    /// The bits of the INT4 (or INT8) copy of K the step made, if it made one.
    pub fn quantized_bits(&self, method: &Method) -> Option<u32> {
        self.quantized.as_ref().map(|_| method.pipeline.bits())
    }
}

/// Compares what `method`'s step wrote on `batch` with the reference of its algorithm,
/// stage by stage; `quantized` is the host quantizer's copy of `batch`'s K at the
/// pipeline's bits (made once for all pipelines), needed when the step made one.
pub fn compare(
    method: &Method,
    staged: &Staged,
    batch: &HostBatch,
    quantized: Option<&QuantizedRows>,
) -> Result<MethodCheck, Box<dyn Error>> {
    let (kv, table, hq) = (&batch.kv, &batch.table, batch.num_q_heads);
    let (q, k, v) = (&batch.q[..], &batch.k[..], &batch.v[..]);
    let (scores, logits, v_mean);
    let select = match &method.host {
        Host::Full => HostSelect::Full,
        Host::Quest(budget) => {
            scores = pref::quest_page_scores(q, k, kv, table, hq);
            HostSelect::Pages {
                scores: &scores,
                budget: *budget,
                keep: QuestOptions { sink: false }.keep(),
            }
        }
        Host::Centroid(budget, keep) => {
            scores = centroid::page_scores(q, k, kv, table, hq);
            HostSelect::Pages {
                scores: &scores,
                budget: *budget,
                keep: *keep,
            }
        }
        Host::Ds(ds) => {
            scores = pref::ds_token_scores(q, k, kv, table, hq, &ds.calibration);
            HostSelect::Tokens {
                scores: &scores,
                budget: ds.budget,
                keep: ds.options.keep(),
                mix: None,
            }
        }
        Host::Sparq(s) => {
            let (token_scores, row_logits) =
                pref::sparq_token_scores(q, k, kv, table, hq, s.options.r);
            scores = token_scores;
            logits = row_logits;
            v_mean = pref::v_means(v, kv, table);
            HostSelect::Tokens {
                scores: &scores,
                budget: s.options.k,
                keep: Keep {
                    sink: 0,
                    recent: s.options.window,
                },
                mix: Some(HostMix {
                    logits: &logits,
                    v_mean: &v_mean,
                }),
            }
        }
    };
    let bits = method.pipeline.bits();
    let host = HostPipeline {
        select,
        prune: method.host_policies()?,
        bits,
        dense_below: method.pipeline.dense_below(),
    };
    let mut stages = vec![];
    if let Some(got) = &staged.quantized {
        let want = quantized.ok_or("no host quantizer's copy of K given to compare")?;
        stages.push(check_quantize(got, want, kv, bits));
    }
    stages.extend(pref::check(&host, &batch.inputs(), &staged.got));
    Ok(MethodCheck {
        method: method.name.clone(),
        stages,
    })
}

/// The device's codes against the host quantizer's (`reference::quantize`, the kernel's
/// f32 steps): the largest difference of a dequantized value, in steps; 1 step allowed, as
/// the GPU may round a value lying on a rounding boundary the other way.
pub fn check_quantize(
    got: &QuantizedRows,
    want: &QuantizedRows,
    kv: &KvShape,
    bits: u32,
) -> StageCheck {
    let d = kv.head_dim;
    let row_bytes = d * bits as usize / 8;
    let (mut worst, mut detail) = (0.0f64, None);
    if got.scale.len() != want.scale.len() || got.packed.len() != want.packed.len() {
        return StageCheck {
            stage: "quantize (steps)",
            error: f64::INFINITY,
            tolerance: 1.0,
            detail: Some(format!(
                "{} rows, {} expected",
                got.scale.len(),
                want.scale.len()
            )),
        };
    }
    let rows = (got.packed.chunks(row_bytes.max(1))).zip(want.packed.chunks(row_bytes.max(1)));
    for (r, (g, w)) in rows.enumerate() {
        // Each side's dequantized value, as `reference::dequant` makes it.
        let (gs, gz) = (got.scale[r].to_f64(), got.zero[r].to_f64());
        let (ws, wz) = (want.scale[r].to_f64(), want.zero[r].to_f64());
        let step = ws.max(f64::MIN_POSITIVE);
        for i in 0..d {
            let a = reference::code(g, i, bits) as f64 * gs + gz;
            let b = reference::code(w, i, bits) as f64 * ws + wz;
            let diff = (a - b).abs() / step;
            if diff > worst || diff.is_nan() {
                worst = if diff.is_nan() { f64::INFINITY } else { diff };
                detail = Some(format!("K row {r}, element {i}: {diff} steps off"));
            }
        }
    }
    StageCheck {
        stage: "quantize (steps)",
        error: worst,
        tolerance: 1.0,
        detail,
    }
}
