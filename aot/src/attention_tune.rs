//! Dense paged decode attention (the split and merge kernels) as a tuning problem: a
//! shape, random f16 q, K and V on shuffled pages (several copies when one is smaller than
//! twice L2, rotated between timed runs), an f64 reference on sampled query rows, and one
//! [`Candidate`] per config of its space (tokens a step, warps, tiles prefetched, chunk).

use crate::bundle::ir_hash;
use crate::config_text::ConfigText;
use crate::space::{Fit, Limits, TuneKey};
use crate::tune::{space_hash_of, Candidate, DeviceId, Rejection, TuneCache};
use crate::Result;
use dusk_compiler::DType;
use dusk_kernels::attention::{self, SplitConfig, TokenSource};
use dusk_kernels::attention_ops::{
    AttentionMeta, AttentionMode, AttentionPlan, AttentionSpec, AttentionTuning,
};
use dusk_kernels::ops::Dusk;
use dusk_kernels::paged::{KvShape, PageTable};
use dusk_runtime::{Buffer, Measured};
use half::f16;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// Largest relative error of the outputs of the sampled rows (f16 outputs).
pub const TOLERANCE: f64 = 2e-3;

/// Dense decode attention: every sequence `context` tokens, pages of 16, f16.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    pub batch: usize,
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub context: usize,
}

impl AttentionShape {
    pub fn group(&self) -> usize {
        self.num_q_heads / self.num_kv_heads
    }

    pub fn key(&self) -> TuneKey {
        TuneKey::new(
            "attention_dense",
            &[("head_dim", self.head_dim), ("group", self.group())],
            &[
                ("batch", self.batch),
                ("q_heads", self.num_q_heads),
                ("context", self.context),
            ],
        )
    }

    pub fn case_name(&self) -> String {
        format!(
            "dense_b{}_h{}x{}_ctx{}",
            self.batch, self.num_q_heads, self.num_kv_heads, self.context
        )
    }

    /// The fastest tuning `dusk tune attention` recorded in `cache` for this shape's bucket
    /// on `dev` (a GPU of `num_sms` multiprocessors), if any, with the space it was tuned
    /// over unchanged: what an engine gives `AttentionPlan::with_tuning`.
    ///
    /// ```
    /// use dusk_aot::attention_tune::AttentionShape;
    /// use dusk_aot::space::Limits;
    /// use dusk_aot::tune::{DeviceId, TuneCache};
    /// let shape = AttentionShape { batch: 32, num_q_heads: 32, num_kv_heads: 8,
    ///                              head_dim: 128, context: 32768 };
    /// let dev = DeviceId::of(&dusk_runtime::Device::cpu());
    /// assert_eq!(shape.tuned(&TuneCache::in_memory(), &dev, &Limits::H100, 132), None);
    /// ```
    pub fn tuned(
        &self,
        cache: &TuneCache,
        dev: &DeviceId,
        limits: &Limits,
        num_sms: usize,
    ) -> Option<AttentionTuning> {
        let (configs, _) = self.space(limits, num_sms);
        let hash = space_hash_of(configs.iter().map(|t| {
            (
                split_hash(self, t).unwrap_or_else(|e| e),
                label(t),
                config_json(t),
            )
        }));
        let rec = cache.get(&TuneCache::key(&hash, dev, &self.key().to_string()))?;
        configs.get(rec.best?).copied()
    }

    /// Bytes a run must read: K and V of every token.
    pub fn bytes(&self) -> usize {
        2 * self.batch * self.context * self.num_kv_heads * self.head_dim * 2
    }

    fn spec(&self) -> AttentionSpec {
        AttentionSpec {
            kv: KvShape {
                num_pages: (self.batch * self.context.div_ceil(16)).max(1),
                page_size: 16,
                num_kv_heads: self.num_kv_heads,
                head_dim: self.head_dim,
            },
            batch: self.batch,
            num_q_heads: self.num_q_heads,
            mode: AttentionMode::Dense,
            max_tokens: self.context,
            sm_scale: None,
            sparq: false,
            dtype: DType::F16,
        }
    }

    /// The space: the default (for a GPU of `num_sms` multiprocessors; the tensor-core
    /// kernel for GQA groups) first, then the CUDA-core kernel at tokens a step x warps in
    /// (8, 4), (16, 4), (16, 8), (32, 4), (32, 8) with 1 or 2 tiles prefetched, and the
    /// default with half and twice the chunk; split into the
    /// configs that fit `limits` and the pruned ones with why.
    pub fn space(
        &self,
        limits: &Limits,
        num_sms: usize,
    ) -> (Vec<AttentionTuning>, Vec<(AttentionTuning, String)>) {
        let default = AttentionTuning::for_spec(&self.spec(), num_sms);
        let mut all = vec![default];
        for (block_tokens, num_warps) in [(8, 4), (16, 4), (16, 8), (32, 4), (32, 8)] {
            for prefetch in [1, 2] {
                let chunk = default.chunk_tokens.div_ceil(block_tokens) * block_tokens;
                // The CUDA-core kernel: the tensor-core one takes 8 tokens on one warp.
                all.push(AttentionTuning {
                    block_tokens,
                    num_warps,
                    prefetch,
                    chunk_tokens: chunk,
                    tensor_cores: false,
                    ..default
                });
            }
        }
        for chunk in [default.chunk_tokens / 2, default.chunk_tokens * 2] {
            if chunk >= 2 * default.block_tokens && chunk.is_multiple_of(default.block_tokens) {
                all.push(AttentionTuning {
                    chunk_tokens: chunk,
                    ..default
                });
            }
        }
        let mut uniq: Vec<AttentionTuning> = vec![];
        for t in all {
            if !uniq.contains(&t) {
                uniq.push(t);
            }
        }
        let (mut kept, mut pruned) = (vec![], vec![]);
        for t in uniq {
            match self.fit(&t).check(limits) {
                Ok(()) => kept.push(t),
                Err(why) => pruned.push((t, why)),
            }
        }
        (kept, pruned)
    }

    /// Each program keeps an f32 accumulator of `[tokens, head_dim]` per query head of the
    /// group and `1 + prefetch` tiles of K and V in flight.
    pub fn fit(&self, t: &AttentionTuning) -> Fit {
        let threads = t.num_warps * 32;
        let tile = (t.block_tokens * self.head_dim) as u32;
        let acc = (self.group() as u32 * tile).div_ceil(threads);
        let tiles = ((1 + t.prefetch as u32) * tile).div_ceil(threads);
        Fit {
            threads,
            regs_per_thread: acc + tiles + 48,
            smem_bytes: 4 * t.num_warps * self.group() as u32 * 2,
            min_programs_per_sm: t.min_programs_per_sm,
        }
    }
}

/// How reports and tuning records name a tuning: its [`ConfigText`] text, every field
/// (`block_tokens=8,num_warps=4,chunk_tokens=512,...`), which `gpu-check attention
/// --config` reads back.
pub fn label(t: &AttentionTuning) -> String {
    t.to_text()
}

/// The kernel hash of the dense split kernel `t` builds for `shape` (or why it does not
/// build).
fn split_hash(shape: &AttentionShape, t: &AttentionTuning) -> Result<String, String> {
    let split = attention::build_split(&SplitConfig {
        head_dim: shape.head_dim,
        page_size: 16,
        group: shape.group(),
        dtype: DType::F16,
        source: TokenSource::Dense,
        block_tokens: t.block_tokens,
        num_warps: t.num_warps,
        vector_bytes: t.vector_bytes,
        prefetch: t.prefetch,
        min_programs_per_sm: t.min_programs_per_sm,
        stages: t.stages,
        l2_prefetch: t.l2_prefetch,
        tensor_cores: t.tensor_cores,
        chunk_fastest: t.chunk_fastest,
        balanced: false,
        fused_merge: false,
        row_signals: false,
        partial_dtype: DType::F32,
        stream_kv: false,
        sparq: false,
        merge_chunks: t.merge_chunks,
        timeline: false,
        checked_table: false,
    })
    .map_err(|e| e.to_string())?;
    Ok(ir_hash(&split))
}

/// A config as JSON.
pub fn config_json(t: &AttentionTuning) -> serde_json::Value {
    json!({
        "block_tokens": t.block_tokens, "num_warps": t.num_warps, "chunk_tokens": t.chunk_tokens,
        "vector_bytes": t.vector_bytes, "prefetch": t.prefetch,
        "min_programs_per_sm": t.min_programs_per_sm, "tensor_cores": t.tensor_cores,
        "chunk_fastest": t.chunk_fastest, "l2_prefetch": t.l2_prefetch,
        "merge_chunks": t.merge_chunks,
    })
}

struct InputSet {
    q: Buffer<f16>,
    k: Buffer<f16>,
    v: Buffer<f16>,
}

/// Inputs on the device and the sampled rows' references.
pub struct AttentionProblem<'d> {
    dusk: &'d Dusk,
    pub shape: AttentionShape,
    table: PageTable,
    sets: Vec<InputSet>,
    /// (query row, its reference output) for up to 8 rows of the first set.
    want: Vec<(usize, Vec<f64>)>,
}

fn random_f16(rng: &mut SmallRng, n: usize) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(rng.random_range(-1.0f32..1.0)))
        .collect()
}

impl<'d> AttentionProblem<'d> {
    pub fn new(dusk: &'d Dusk, shape: AttentionShape, seed: u64) -> Result<AttentionProblem<'d>> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let spec = shape.spec();
        let lens = vec![shape.context; shape.batch];
        let total = PageTable::pages_needed(&lens, 16);
        let mut ids: Vec<i32> = (0..total as i32).collect();
        ids.shuffle(&mut rng);
        let table = PageTable::from_lengths(&lens, 16, ids)?;
        let (d, hkv) = (shape.head_dim, shape.num_kv_heads);
        let q_len = shape.batch * shape.num_q_heads * d;
        let kv_len = spec.kv.elements();
        let copies = dusk.device().rotation_sets(shape.bytes());
        let dev = dusk.device();
        let mut sets = vec![];
        let mut want = vec![];
        for c in 0..copies {
            let (q, k, v) = (
                random_f16(&mut rng, q_len),
                random_f16(&mut rng, kv_len),
                random_f16(&mut rng, kv_len),
            );
            if c == 0 {
                let rows = shape.batch * shape.num_q_heads;
                let n = 8.min(rows);
                let scale = 1.0 / (d as f64).sqrt();
                for i in 0..n {
                    let r = i * rows / n;
                    let (b, hq) = (r / shape.num_q_heads, r % shape.num_q_heads);
                    let h = hq / shape.group();
                    let qr = &q[r * d..(r + 1) * d];
                    let krow = |t: usize| {
                        let page = table.kv_page_indices[table.kv_indptr[b] as usize + t / 16];
                        (page as usize * 16 + t % 16) * hkv + h
                    };
                    let s: Vec<f64> = (0..shape.context)
                        .map(|t| {
                            let kr = &k[krow(t) * d..][..d];
                            scale * (0..d).map(|i| qr[i].to_f64() * kr[i].to_f64()).sum::<f64>()
                        })
                        .collect();
                    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    let mut o = vec![0.0; d];
                    for (t, w) in e.iter().enumerate() {
                        let vr = &v[krow(t) * d..][..d];
                        for i in 0..d {
                            o[i] += w / z * vr[i].to_f64();
                        }
                    }
                    want.push((r, o));
                }
            }
            sets.push(InputSet {
                q: dev.upload(&q)?,
                k: dev.upload(&k)?,
                v: dev.upload(&v)?,
            });
        }
        Ok(AttentionProblem {
            dusk,
            shape,
            table,
            sets,
            want,
        })
    }

    /// One candidate per config.
    pub fn candidates(&self, configs: &[AttentionTuning]) -> Vec<Box<dyn Candidate + '_>> {
        configs
            .iter()
            .map(|t| {
                Box::new(AttentionCandidate {
                    problem: self,
                    tuning: *t,
                    state: None,
                }) as Box<dyn Candidate>
            })
            .collect()
    }
}

struct Prepared {
    plan: AttentionPlan,
    meta: AttentionMeta,
    out: Buffer<f16>,
    lse: Buffer<f32>,
}

struct AttentionCandidate<'p> {
    problem: &'p AttentionProblem<'p>,
    tuning: AttentionTuning,
    state: Option<Prepared>,
}

impl Candidate for AttentionCandidate<'_> {
    fn label(&self) -> String {
        label(&self.tuning)
    }

    fn config(&self) -> serde_json::Value {
        config_json(&self.tuning)
    }

    fn kernel_hash(&self) -> Result<String, String> {
        split_hash(&self.problem.shape, &self.tuning)
    }

    fn prepare(&mut self) -> Result<(), String> {
        let p = self.problem;
        let e = |e: dusk_kernels::DuskError| e.to_string();
        let t = self.tuning;
        let spec = p.shape.spec();
        let plan = AttentionPlan::with_tuning(p.dusk, spec, |x| *x = t).map_err(e)?;
        let meta = plan.upload_meta(p.dusk, &p.table, None).map_err(e)?;
        let dev = p.dusk.device();
        let rows = p.shape.batch * p.shape.num_q_heads;
        let rt = |e: dusk_runtime::RuntimeError| e.to_string();
        let out = dev.alloc::<f16>(rows * p.shape.head_dim).map_err(rt)?;
        let lse = dev.alloc::<f32>(rows).map_err(rt)?;
        self.state = Some(Prepared {
            plan,
            meta,
            out,
            lse,
        });
        Ok(())
    }

    fn check(&mut self) -> Result<(), Rejection> {
        let p = self.problem;
        let Some(s) = &mut self.state else {
            return Err(Rejection::Failed("not prepared".into()));
        };
        let rt = |e: dusk_runtime::RuntimeError| Rejection::Failed(e.to_string());
        let dev = p.dusk.device();
        dev.fill_bytes(&mut s.out, 0xFF).map_err(rt)?;
        let set = &p.sets[0];
        s.plan
            .run(
                p.dusk, &set.q, &set.k, &set.v, &s.meta, None, &mut s.out, &mut s.lse,
            )
            .map_err(|e| Rejection::Failed(e.to_string()))?;
        let got = s.out.download().map_err(rt)?;
        let d = p.shape.head_dim;
        let (mut num, mut den) = (0.0, 0.0);
        for (r, want) in &p.want {
            for i in 0..d {
                let g = got[r * d + i].to_f64();
                let g = if g.is_finite() { g } else { 1e30 };
                num += (g - want[i]).powi(2);
                den += want[i].powi(2);
            }
        }
        let err = (num / den.max(f64::MIN_POSITIVE)).sqrt();
        if err <= TOLERANCE {
            Ok(())
        } else {
            Err(Rejection::Wrong(format!(
                "relative error {err:.3e} on {} sampled rows (tolerance {TOLERANCE:.0e})",
                p.want.len()
            )))
        }
    }

    fn time(&mut self) -> Result<Measured, String> {
        let p = self.problem;
        let Some(s) = &mut self.state else {
            return Err("not prepared".into());
        };
        let dev = p.dusk.device();
        let times = dev
            .time_calls(p.sets.len(), |i| {
                let set = &p.sets[i];
                s.plan.run(
                    p.dusk, &set.q, &set.k, &set.v, &s.meta, None, &mut s.out, &mut s.lse,
                )
            })
            .map_err(|e| e.to_string())?;
        Ok(times)
    }
}
