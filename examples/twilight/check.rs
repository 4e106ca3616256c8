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

/// Plans `method` over `cache` (a batch of its own), prepares it and runs it stage by
/// stage ([`run_staged`]).
pub fn plan_and_run_staged(
    dusk: &Dusk,
    method: &Method,
    cache: &SyntheticCache,
) -> Result<Staged, Box<dyn Error>> {
    let mut plan = method.pipeline.plan(dusk, shape(cache), &cache.table)?;
    plan.prepare_kv(dusk, &cache.k, &cache.v)?;
    run_staged(dusk, &mut plan, cache)
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

/// Compares what `method`'s step wrote on `batch` with the reference of its algorithm,
/// stage by stage.
pub fn compare(
    method: &Method,
    staged: &Staged,
    batch: &HostBatch,
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
        stages.push(check_quantize(
            got,
            &reference::quantize(k, kv, bits),
            kv,
            bits,
        ));
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
    let (mut worst, mut detail) = (0.0f64, None);
    for r in 0..want.scale.len() {
        let step = want.scale[r].to_f64().max(f64::MIN_POSITIVE);
        for i in 0..d {
            let diff = (reference::dequant(got, d, bits, r, i)
                - reference::dequant(want, d, bits, r, i))
            .abs()
                / step;
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
