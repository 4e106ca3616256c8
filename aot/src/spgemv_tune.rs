//! `spgemv_quant` as a tuning problem: a shape, random inputs for it on a device (several
//! copies when one is smaller than twice L2, rotated between timed runs), the host
//! reference on sampled rows, and one [`Candidate`] per config of its space.

use crate::config_text::ConfigText;
use crate::space::{self, Limits, TuneKey};
use crate::stock::{spgemv_config_json, spgemv_name};
use crate::tune::{space_hash_of, Candidate, DeviceId, Rejection, TuneCache};
use crate::Result;
use dusk_kernels::ops::{Dusk, QuantizedK, SpgemvPlan};
use dusk_kernels::paged::{KvShape, PageTable, TokenLists};
use dusk_kernels::reference::{self, QuantizedRows};
use dusk_kernels::spgemv::{self, SpgemvConfig};
use dusk_runtime::{Buffer, Measured};
use half::f16;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, RngCore, SeedableRng};

/// Largest relative error (‖got - want‖ / ‖want‖ over the sampled rows) a config may have.
pub const TOLERANCE: f64 = 1e-3;

/// A `spgemv_quant` shape: pages of 16 tokens, every sequence `context` long.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpgemvShape {
    pub batch: usize,
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub context: usize,
    pub bits: u32,
    /// Fraction of each row's pages that are candidates (1: every token; 0.25 as after a
    /// Quest selection of N/4).
    pub page_frac: f64,
}

impl SpgemvShape {
    pub fn group(&self) -> usize {
        self.num_q_heads / self.num_kv_heads
    }

    /// Candidates per row.
    pub fn budget(&self) -> usize {
        ((self.context as f64 * self.page_frac) as usize).max(1)
    }

    /// The tuning key: head_dim, group and bits exactly; batch, heads, context and budget
    /// bucketed.
    pub fn key(&self) -> TuneKey {
        TuneKey::new(
            "spgemv_quant",
            &[
                ("head_dim", self.head_dim),
                ("group", self.group()),
                ("bits", self.bits as usize),
            ],
            &[
                ("batch", self.batch),
                ("q_heads", self.num_q_heads),
                ("context", self.context),
                ("budget", self.budget()),
            ],
        )
    }

    /// A case name for result files: `spgemv_int4_b32_h32x8_ctx32768_all`.
    pub fn case_name(&self) -> String {
        format!(
            "spgemv_int{}_b{}_h{}x{}_ctx{}_{}",
            self.bits,
            self.batch,
            self.num_q_heads,
            self.num_kv_heads,
            self.context,
            if self.page_frac >= 1.0 {
                "all".to_string()
            } else {
                format!("pages{}", (self.page_frac * 100.0).round())
            }
        )
    }

    /// The tuned config of this shape's bucket on `dev`, when `cache` holds one: what an
    /// engine passes to `SpgemvPlan::with_config`.
    ///
    /// ```
    /// use dusk_aot::space::Limits;
    /// use dusk_aot::spgemv_tune::SpgemvShape;
    /// use dusk_aot::tune::{DeviceId, TuneCache};
    /// let shape = SpgemvShape { batch: 32, num_q_heads: 32, num_kv_heads: 8, head_dim: 128,
    ///                           context: 32768, bits: 4, page_frac: 1.0 };
    /// let dev = DeviceId::of(&dusk_runtime::Device::cpu());
    /// let cfg = shape.tuned(&TuneCache::in_memory(), &dev, &Limits::H100);
    /// assert_eq!(cfg, None); // nothing tuned yet: the plan keeps its default
    /// ```
    pub fn tuned(
        &self,
        cache: &TuneCache,
        dev: &DeviceId,
        limits: &Limits,
    ) -> Option<SpgemvConfig> {
        let (configs, _) = self.space(limits);
        let hash = space_hash_of(configs.iter().map(|c| {
            let h = spgemv::build(c)
                .map(|k| crate::bundle::ir_hash(&k))
                .unwrap_or_else(|e| e.to_string());
            (h, label(c), candidate_config(c))
        }));
        let rec = cache.get(&TuneCache::key(&hash, dev, &self.key().to_string()))?;
        configs.get(rec.best?).copied()
    }

    /// The configs of this shape's space that fit `limits`, and the pruned ones with why.
    pub fn space(&self, limits: &Limits) -> (Vec<SpgemvConfig>, Vec<(SpgemvConfig, String)>) {
        space::prune(
            space::spgemv(self.head_dim, self.group(), self.bits),
            limits,
            space::spgemv_fit,
        )
    }
}

/// How reports and tuning records name a config: its [`ConfigText`] text,
/// `block_tokens=64,num_warps=2,min_programs_per_sm=14,tensor_cores=false` (the shape's
/// head_dim, group and bits left out), which `gpu-check spgemv --config` reads back.
pub fn label(c: &SpgemvConfig) -> String {
    c.to_text()
}

/// A config as a tuning record names it: its fields and its bundle name.
fn candidate_config(c: &SpgemvConfig) -> serde_json::Value {
    let mut v = spgemv_config_json(c);
    v["name"] = spgemv_name(c).into();
    v
}

struct InputSet {
    q: Buffer<f16>,
    k: QuantizedK,
}

/// Inputs on the device for one shape, and what the reference needs on the host.
pub struct SpgemvProblem<'d> {
    dusk: &'d Dusk,
    pub shape: SpgemvShape,
    kv: KvShape,
    table: PageTable,
    cand: TokenLists,
    sets: Vec<InputSet>,
    host_q: Vec<f16>,
    host_k: QuantizedRows,
    /// Candidate rows the check compares (up to 8, spread over the batch), and their
    /// reference scores, computed on first use.
    sample: Vec<usize>,
    want: std::sync::OnceLock<Vec<f64>>,
    /// Bytes a run must move: codes, scale and zero (f16) and index of each candidate, and
    /// the scores.
    pub bytes: usize,
}

fn random_f16(rng: &mut SmallRng, n: usize, lo: f32, hi: f32) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(rng.random_range(lo..hi)))
        .collect()
}

impl<'d> SpgemvProblem<'d> {
    /// Random inputs for `shape` on `dusk`'s device (shuffled pages, random codes).
    pub fn new(dusk: &'d Dusk, shape: SpgemvShape, seed: u64) -> Result<SpgemvProblem<'d>> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let page_size = 16;
        let lens = vec![shape.context; shape.batch];
        let total = PageTable::pages_needed(&lens, page_size);
        let mut ids: Vec<i32> = (0..total as i32).collect();
        ids.shuffle(&mut rng);
        let table = PageTable::from_lengths(&lens, page_size, ids)?;
        let kv = KvShape {
            num_pages: total.max(1),
            page_size,
            num_kv_heads: shape.num_kv_heads,
            head_dim: shape.head_dim,
        };
        let cand = if shape.page_frac >= 1.0 {
            TokenLists::all_tokens(&table, page_size, shape.num_kv_heads)
        } else {
            let n = shape.context.div_ceil(page_size);
            let keep = ((n as f64 * shape.page_frac).round() as usize).clamp(1, n);
            let rows = shape.batch * shape.num_kv_heads;
            let pages: Vec<Vec<usize>> = (0..rows)
                .map(|_| {
                    let mut all: Vec<usize> = (0..n).collect();
                    all.shuffle(&mut rng);
                    let mut chosen = all[..keep].to_vec();
                    chosen.sort_unstable();
                    chosen
                })
                .collect();
            TokenLists::from_pages(&table, page_size, shape.num_kv_heads, &pages)
        };
        let rows = kv.rows();
        let row_bytes = shape.head_dim * shape.bits as usize / 8;
        let q_len = shape.batch * shape.num_q_heads * shape.head_dim;
        let nnz = cand.indices.len();
        let bytes = nnz * (row_bytes + 4 + 4) + nnz * shape.group() * 4;
        let copies = dusk.device().rotation_sets(bytes);
        let dev = dusk.device();
        let mut sets = vec![];
        let mut host = None;
        for _ in 0..copies {
            let mut packed = vec![0u8; rows * row_bytes];
            rng.fill_bytes(&mut packed);
            let qk = QuantizedRows {
                packed,
                scale: random_f16(&mut rng, rows, 0.01, 0.2),
                zero: random_f16(&mut rng, rows, -1.5, 0.0),
            };
            let q = random_f16(&mut rng, q_len, -2.0, 2.0);
            sets.push(InputSet {
                q: dev.upload(&q)?,
                k: QuantizedK {
                    packed: dev.upload(&qk.packed)?,
                    scale: dev.upload(&qk.scale)?,
                    zero: dev.upload(&qk.zero)?,
                    kv,
                    bits: shape.bits,
                },
            });
            host.get_or_insert((q, qk));
        }
        let (host_q, host_k) = host.expect("at least one input set");
        let n_rows = cand.rows();
        let sample: Vec<usize> = (0..8.min(n_rows))
            .map(|i| i * n_rows / 8.min(n_rows))
            .collect();
        Ok(SpgemvProblem {
            dusk,
            shape,
            kv,
            table,
            cand,
            sets,
            host_q,
            host_k,
            sample,
            want: std::sync::OnceLock::new(),
            bytes,
        })
    }

    /// One candidate per config.
    pub fn candidates(&self, configs: &[SpgemvConfig]) -> Vec<Box<dyn Candidate + '_>> {
        configs
            .iter()
            .map(|c| {
                Box::new(SpgemvCandidate {
                    problem: self,
                    cfg: *c,
                    plan: None,
                    scores: None,
                }) as Box<dyn Candidate>
            })
            .collect()
    }

    /// The reference scores of candidate row `r`, in the kernel's output layout for that
    /// row (`group` runs of the row's length).
    fn reference_row(&self, r: usize) -> Vec<f64> {
        let (kv, sh) = (&self.kv, &self.shape);
        let (b, h) = (r / kv.num_kv_heads, r % kv.num_kv_heads);
        let (group, d) = (sh.group(), sh.head_dim);
        let toks = self.cand.row(r);
        let mut out = vec![0.0; toks.len() * group];
        for (j, &pos) in toks.iter().enumerate() {
            let pos = pos as usize;
            let page = self.table.kv_page_indices
                [self.table.kv_indptr[b] as usize + pos / kv.page_size]
                as usize;
            let krow = kv.quantized_row(page, pos % kv.page_size, h);
            for g in 0..group {
                let qrow = &self.host_q[(b * sh.num_q_heads + h * group + g) * d..][..d];
                out[g * toks.len() + j] = (0..d)
                    .map(|i| {
                        qrow[i].to_f64() * reference::dequant(&self.host_k, d, sh.bits, krow, i)
                    })
                    .sum();
            }
        }
        out
    }
}

struct SpgemvCandidate<'p> {
    problem: &'p SpgemvProblem<'p>,
    cfg: SpgemvConfig,
    plan: Option<SpgemvPlan>,
    scores: Option<Buffer<f32>>,
}

impl Candidate for SpgemvCandidate<'_> {
    fn label(&self) -> String {
        label(&self.cfg)
    }

    fn config(&self) -> serde_json::Value {
        candidate_config(&self.cfg)
    }

    fn kernel_hash(&self) -> Result<String, String> {
        let ir = spgemv::build(&self.cfg).map_err(|e| e.to_string())?;
        Ok(crate::bundle::ir_hash(&ir))
    }

    fn prepare(&mut self) -> Result<(), String> {
        let p = self.problem;
        let cfg = self.cfg;
        let plan = SpgemvPlan::with_config(
            p.dusk,
            p.kv,
            p.shape.num_q_heads,
            p.shape.bits,
            &p.table,
            &p.cand,
            |c| *c = cfg,
        )
        .map_err(|e| e.to_string())?;
        self.scores = Some(
            p.dusk
                .device()
                .alloc::<f32>(plan.num_scores())
                .map_err(|e| e.to_string())?,
        );
        self.plan = Some(plan);
        Ok(())
    }

    fn check(&mut self) -> Result<(), Rejection> {
        let p = self.problem;
        let (Some(plan), Some(scores)) = (&self.plan, &mut self.scores) else {
            return Err(Rejection::Failed("not prepared".into()));
        };
        let failed = |e: dusk_runtime::RuntimeError| Rejection::Failed(e.to_string());
        let dev = p.dusk.device();
        dev.fill_bytes(scores, 0xFF).map_err(failed)?;
        let set = &p.sets[0];
        plan.run(p.dusk, &set.q, &set.k, scores)
            .map_err(|e| Rejection::Failed(e.to_string()))?;
        let got = scores.download().map_err(failed)?;
        let group = p.shape.group();
        let want = p
            .want
            .get_or_init(|| p.sample.iter().flat_map(|&r| p.reference_row(r)).collect());
        let mut got_s = vec![];
        for &r in &p.sample {
            let start = p.cand.indptr[r] as usize * group;
            got_s.extend_from_slice(&got[start..start + p.cand.row(r).len() * group]);
        }
        let err = reference::rel_error(&got_s, want);
        if err <= TOLERANCE {
            Ok(())
        } else {
            Err(Rejection::Wrong(format!(
                "relative error {err:.3e} on {} sampled rows (tolerance {TOLERANCE:.0e})",
                p.sample.len()
            )))
        }
    }

    fn time(&mut self) -> Result<Measured, String> {
        let p = self.problem;
        let (Some(plan), Some(scores)) = (&self.plan, &mut self.scores) else {
            return Err("not prepared".into());
        };
        let dev = p.dusk.device();
        let times = dev
            .time_calls(p.sets.len(), |i| {
                let set = &p.sets[i];
                plan.run(p.dusk, &set.q, &set.k, scores)
            })
            .map_err(|e| e.to_string())?;
        Ok(times)
    }
}
