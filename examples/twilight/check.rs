//! Each pipeline against the f64 reference of the same algorithm, stage by stage
//! (`dusk::kernels::pipeline::reference`): the step run one stage at a time with every
//! intermediate and output poisoned first, each stage's output compared with the
//! reference fed that stage's actual inputs; the INT4 copy of K against the host quantizer.

use super::centroid;
use super::methods::{Host, Method};
use dusk::kernels::paged::KvShape;
use dusk::kernels::pipeline::reference::{
    self as pref, HostInputs, HostMix, HostPipeline, HostSelect, StageCheck,
};
use dusk::kernels::pipeline::{PipelinePlan, PipelineShape};
use dusk::kernels::reference::{self, QuantizedRows};
use dusk::kernels::selectors::{Keep, QuestOptions};
use dusk::kernels::synthetic::SyntheticCache;
use dusk::Dusk;
use half::f16;
use std::error::Error;

/// A batch the checks run on: on the device, and its q, K and V on the host.
pub struct CheckBatch<'a> {
    pub cache: &'a SyntheticCache,
    pub q: Vec<f16>,
    pub k: Vec<f16>,
    pub v: Vec<f16>,
}

impl CheckBatch<'_> {
    pub fn new(cache: &SyntheticCache) -> Result<CheckBatch<'_>, Box<dyn Error>> {
        Ok(CheckBatch {
            cache,
            q: cache.q.download()?,
            k: cache.k.download()?,
            v: cache.v.download()?,
        })
    }

    pub fn shape(&self) -> PipelineShape {
        shape(self.cache)
    }

    fn host(&self) -> HostInputs<'_> {
        HostInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            kv: self.cache.kv,
            num_q_heads: self.cache.spec.num_q_heads,
            table: &self.cache.table,
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

/// Plans `method` over `batch` and checks it (see [`check_plan`]).
pub fn check(
    dusk: &Dusk,
    method: &Method,
    batch: &CheckBatch,
) -> Result<MethodCheck, Box<dyn Error>> {
    let mut plan = method
        .pipeline
        .plan(dusk, batch.shape(), &batch.cache.table)?;
    plan.prepare_kv(dusk, &batch.cache.k, &batch.cache.v)?;
    check_plan(dusk, method, &mut plan, batch)
}

/// Runs `plan` (prepared over `batch`) stage by stage, everything poisoned first, and
/// compares each stage with the reference.
pub fn check_plan(
    dusk: &Dusk,
    method: &Method,
    plan: &mut PipelinePlan,
    batch: &CheckBatch,
) -> Result<MethodCheck, Box<dyn Error>> {
    let dev = dusk.device();
    let c = batch.cache;
    let mut out = dev.alloc::<f16>(c.q.len())?;
    let mut lse = dev.alloc::<f32>(c.q.len() / c.kv.head_dim)?;
    plan.poison_outputs(dusk, 0xFF)?;
    dev.fill_bytes(&mut out, 0xFF)?;
    dev.fill_bytes(&mut lse, 0xFF)?;
    let got = pref::run_stages(dusk, plan, &c.q, &c.k, &c.v, &mut out, &mut lse)?;

    let (kv, table, hq) = (&c.kv, &c.table, c.spec.num_q_heads);
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
    let host = HostPipeline {
        select,
        prune: method.host_policies()?,
        bits: method.pipeline.bits(),
        dense_below: method.pipeline.dense_below(),
    };
    let mut stages = vec![];
    if let Some(qk) = plan.quantized_k() {
        let got_qk = QuantizedRows {
            packed: qk.packed.download()?,
            scale: qk.scale.download()?,
            zero: qk.zero.download()?,
        };
        let bits = method.pipeline.bits();
        stages.push(check_quantize(
            &got_qk,
            &reference::quantize(k, kv, bits),
            kv,
            bits,
        ));
    }
    stages.extend(pref::check(&host, &batch.host(), &got));
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
