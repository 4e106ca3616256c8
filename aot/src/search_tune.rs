//! The fused top-p threshold search as a tuning problem: rows of attention-like logits
//! (several sets when one is smaller than twice L2, rotated between timed runs), the
//! sort-based oracle on sampled rows, and one [`Candidate`] per config of its space
//! (block held in registers, warps; the streaming search's warps).

use crate::bundle::ir_hash;
use crate::config_text::ConfigText;
use crate::space::{self, Limits, TuneKey};
use crate::tune::{space_hash_of, Candidate, DeviceId, Rejection, TuneCache};
use crate::Result;
use dusk_kernels::ops::Dusk;
use dusk_kernels::paged::TokenLists;
use dusk_kernels::policies::top_p;
use dusk_kernels::prune::{ParamValues, PrunePlan};
use dusk_kernels::reference::{check_kept, softmax, top_p_oracle};
use dusk_kernels::threshold::{self, SearchConfig};
use dusk_runtime::{Buffer, Measured};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// `rows` candidate rows (batch x heads, MHA) of `len` candidates each, top-p with `p`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SearchShape {
    pub rows: usize,
    pub len: usize,
    pub p: f64,
}

impl SearchShape {
    /// Tuning key: rows and candidates per row bucketed.
    pub fn key(&self) -> TuneKey {
        TuneKey::new(
            "threshold_search",
            &[("group", 1)],
            &[("rows", self.rows), ("budget", self.len)],
        )
    }

    pub fn case_name(&self) -> String {
        format!("topp_rows{}_n{}_p{}", self.rows, self.len, self.p)
    }

    /// Bytes a search must read: the scores.
    pub fn bytes(&self) -> usize {
        self.rows * self.len * 4
    }

    /// The configs of the space that fit, and the pruned ones with why.
    pub fn space(&self, limits: &Limits) -> (Vec<SearchConfig>, Vec<(SearchConfig, String)>) {
        space::prune(space::search(self.len, 1), limits, space::search_fit)
    }

    /// The fastest config `dusk tune search` recorded in `cache` for this shape's bucket on
    /// `dev`, if any, with the space it was tuned over unchanged: what an engine passes to
    /// `PrunePlan::with_config`.
    ///
    /// ```
    /// use dusk_aot::search_tune::SearchShape;
    /// use dusk_aot::space::Limits;
    /// use dusk_aot::tune::{DeviceId, TuneCache};
    /// let shape = SearchShape { rows: 2048, len: 8192, p: 0.9 };
    /// let dev = DeviceId::of(&dusk_runtime::Device::cpu());
    /// assert_eq!(shape.tuned(&TuneCache::in_memory(), &dev, &Limits::H100), None);
    /// ```
    pub fn tuned(
        &self,
        cache: &TuneCache,
        dev: &DeviceId,
        limits: &Limits,
    ) -> Option<SearchConfig> {
        let (configs, _) = self.space(limits);
        let hash = space_hash_of(configs.iter().map(|c| {
            (
                search_hash(c).unwrap_or_else(|e| e),
                label(c),
                config_json(c),
            )
        }));
        let rec = cache.get(&TuneCache::key(&hash, dev, &self.key().to_string()))?;
        configs.get(rec.best?).copied()
    }
}

/// The kernel hash of the top-p search in `cfg` (or why it does not build).
fn search_hash(cfg: &SearchConfig) -> Result<String, String> {
    let ir = threshold::build(&top_p::POLICY, cfg).map_err(|e| e.to_string())?;
    Ok(ir_hash(&ir))
}

/// How reports and tuning records name a config: its [`ConfigText`] text,
/// `block=2048,num_warps=4,stream=true,pivots=1,...` (every field but the shape's group),
/// which `gpu-check threshold --config` reads back.
pub fn label(c: &SearchConfig) -> String {
    c.to_text()
}

/// A search config as JSON.
pub fn config_json(c: &SearchConfig) -> serde_json::Value {
    json!({"block": c.block, "group": c.group, "num_warps": c.num_warps, "stream": c.stream})
}

fn normal(rng: &mut SmallRng) -> f32 {
    let (u, v): (f32, f32) = (rng.random_range(1e-7..1.0), rng.random());
    (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
}

/// Inputs on the device and the rows the check compares.
pub struct SearchProblem<'d> {
    dusk: &'d Dusk,
    pub shape: SearchShape,
    cand: TokenLists,
    sets: Vec<Buffer<f32>>,
    /// (row, its logits) of up to 8 sampled rows of the first set.
    sample: Vec<(usize, Vec<f32>)>,
}

const SCALE: f32 = 0.088_388_35; // 1 / sqrt(128)

impl<'d> SearchProblem<'d> {
    /// Attention-like logits (a diffuse background, 1% heavy tokens) for `shape`.
    pub fn new(dusk: &'d Dusk, shape: SearchShape, seed: u64) -> Result<SearchProblem<'d>> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut indptr = vec![0i32];
        let mut indices = vec![];
        for _ in 0..shape.rows {
            indices.extend(0..shape.len as i32);
            indptr.push(indices.len() as i32);
        }
        let cand = TokenLists { indptr, indices };
        let copies = dusk.device().rotation_sets(shape.bytes());
        let mut sets = vec![];
        let mut sample = vec![];
        for c in 0..copies {
            let scores: Vec<f32> = (0..shape.rows * shape.len)
                .map(|_| normal(&mut rng) * 2.0 + if rng.random_bool(0.01) { 6.0 } else { 0.0 })
                .collect();
            if c == 0 {
                let n = 8.min(shape.rows);
                sample = (0..n)
                    .map(|i| {
                        let r = i * shape.rows / n;
                        (r, scores[r * shape.len..(r + 1) * shape.len].to_vec())
                    })
                    .collect();
            }
            sets.push(dusk.device().upload(&scores)?);
        }
        Ok(SearchProblem {
            dusk,
            shape,
            cand,
            sets,
            sample,
        })
    }

    /// One candidate per config.
    pub fn candidates(&self, configs: &[SearchConfig]) -> Vec<Box<dyn Candidate + '_>> {
        configs
            .iter()
            .map(|c| {
                Box::new(SearchCandidate {
                    problem: self,
                    cfg: *c,
                    plan: None,
                }) as Box<dyn Candidate>
            })
            .collect()
    }
}

struct SearchCandidate<'p> {
    problem: &'p SearchProblem<'p>,
    cfg: SearchConfig,
    plan: Option<PrunePlan>,
}

impl Candidate for SearchCandidate<'_> {
    fn label(&self) -> String {
        label(&self.cfg)
    }

    fn config(&self) -> serde_json::Value {
        config_json(&self.cfg)
    }

    fn kernel_hash(&self) -> Result<String, String> {
        search_hash(&self.cfg)
    }

    fn prepare(&mut self) -> Result<(), String> {
        let p = self.problem;
        let params = [ParamValues::Uniform(p.shape.p)];
        let plan =
            PrunePlan::with_config(p.dusk, &top_p::POLICY, &p.cand, self.cfg, SCALE, &params)
                .map_err(|e| e.to_string())?;
        self.plan = Some(plan);
        Ok(())
    }

    fn check(&mut self) -> Result<(), Rejection> {
        let p = self.problem;
        let Some(plan) = &mut self.plan else {
            return Err(Rejection::Failed("not prepared".into()));
        };
        let failed = |e: dusk_kernels::DuskError| Rejection::Failed(e.to_string());
        let rt = |e: dusk_runtime::RuntimeError| Rejection::Failed(e.to_string());
        plan.poison_outputs(p.dusk, 0xFF).map_err(failed)?;
        plan.run(p.dusk, &p.sets[0]).map_err(failed)?;
        let ip = plan.sel_indptr().download().map_err(rt)?;
        let sel = plan.sel_indices().download().map_err(rt)?;
        let pv = p.shape.p;
        for (r, logits) in &p.sample {
            let (lo, hi) = (ip[*r], ip[r + 1]);
            if lo < 0 || hi < lo || hi as usize > sel.len() {
                return Err(Rejection::Wrong(format!(
                    "row {r}: output range {lo}..{hi}"
                )));
            }
            let mut kept = vec![false; logits.len()];
            for &t in &sel[lo as usize..hi as usize] {
                match kept.get_mut(t as usize) {
                    Some(k) => *k = true,
                    None => return Err(Rejection::Wrong(format!("row {r}: position {t}"))),
                }
            }
            let w = softmax(logits, SCALE as f64);
            let oracle = top_p_oracle(&w, pv);
            check_kept(&w, &kept, &oracle, |b, a| {
                (b - pv).abs() < 1e-5 || (a - pv).abs() < 1e-5
            })
            .map_err(|e| Rejection::Wrong(format!("row {r}: {e}")))?;
        }
        Ok(())
    }

    fn time(&mut self) -> Result<Measured, String> {
        let p = self.problem;
        let Some(plan) = &mut self.plan else {
            return Err("not prepared".into());
        };
        let dev = p.dusk.device();
        let times = dev
            .time_calls(p.sets.len(), |i| {
                let s = &p.sets[i];
                plan.run(p.dusk, s)
            })
            .map_err(|e| e.to_string())?;
        Ok(times)
    }
}
