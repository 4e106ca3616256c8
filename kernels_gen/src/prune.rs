//! The pruner's host side: a plan that validates a candidate selection and a policy's
//! parameters once, compiles the fused threshold search, and sizes every buffer; its `run`
//! launches the search (which writes the CSR list itself) with no allocation and no host
//! sync, so it can sit in a captured decode step. Scores in (as `spgemv_quant` writes them), compacted
//! CSR token lists out.
//!
//! ```
//! use dusk_kernels::ops::Dusk;
//! use dusk_kernels::paged::TokenLists;
//! use dusk_kernels::policies::top_p;
//! use dusk_kernels::prune::{ParamValues, PrunePlan};
//! use dusk_runtime::Device;
//!
//! # fn main() -> Result<(), dusk_kernels::DuskError> {
//! let dusk = Dusk::new(Device::best())?; // the GPU, or the interpreter without one
//! // One candidate row (a KV head's selection) of 5 tokens, scored for 1 query head.
//! let cand = TokenLists { indptr: vec![0, 5], indices: vec![3, 8, 9, 20, 31] };
//! let mut plan = PrunePlan::new(&dusk, &top_p::POLICY, &cand, 1, 1.0, &[ParamValues::Uniform(0.9)])?;
//! let scores = dusk.device().upload(&[4.0f32, 0.0, 3.5, -2.0, 1.0])?;
//! plan.run(&dusk, &scores)?;
//! let kept = plan.sel_indices().download()?;
//! let n = plan.sel_indptr().download()?[1] as usize;
//! assert_eq!(&kept[..n], &[3, 9]); // weights 0.60 + 0.36 >= 0.9; positions ascending
//!
//! // Bad input is a typed error before anything runs.
//! assert!(PrunePlan::new(&dusk, &top_p::POLICY, &cand, 1, 1.0, &[ParamValues::Uniform(1.5)]).is_err());
//! # Ok(()) }
//! ```

use crate::error::{ensure, invalid, Result};
use crate::ops::Dusk;
use crate::paged::TokenLists;
use crate::threshold::{self, Policy, SearchConfig, MAX_BLOCK};
use dusk_compiler::DType;
use dusk_runtime::{Arg, Buffer, LoadedKernel};
use std::sync::Arc;

/// A policy parameter's values: one for every row, or one per query row (head).
#[derive(Clone, Debug, PartialEq)]
pub enum ParamValues {
    Uniform(f64),
    PerRow(Vec<f64>),
}

/// A parameter's values on the device, typed as the policy declares.
enum ParamBuffer {
    F32(Buffer<f32>),
    I32(Buffer<i32>),
}

/// A validated, compiled threshold search over a fixed candidate selection.
///
/// The candidates may instead come from a previous stage on the device
/// ([`PrunePlan::with_device_lists`]): their row offsets are fixed when the plan is made,
/// their positions are given to each [`PrunePlan::run_lists`]. The search only copies
/// positions (it never addresses memory with them), so bad ones are kept or dropped as
/// any other value would be.
pub struct PrunePlan {
    policy: Policy,
    cfg: SearchConfig,
    rows: usize,
    nnz: usize,
    scale_log2e: f32,
    search: Arc<LoadedKernel>,
    cand_indptr: Buffer<i32>,
    /// The candidates' positions, uploaded by the plan; `None` when a previous stage writes
    /// them on the device (given to `run_lists`).
    cand_indices: Option<Buffer<i32>>,
    params: Vec<ParamBuffer>,
    /// Each candidate's weight, for a streaming search that keeps them in global memory
    /// ([`SearchConfig::uses_work`]).
    work: Option<Buffer<f32>>,
    /// For the streaming search: a tile a query row for the candidates of its last steps.
    scratch: Option<Buffer<f32>>,
    /// With [`SearchConfig::split_heads`]: three words a query row handed to the row's
    /// last program, and each row's arrivals (zero between launches).
    exchange: Option<(Buffer<f32>, Buffer<i32>)>,
    /// The rows' look-back words and the arrival counter (zero between launches).
    prefix: Buffer<i32>,
    budget: Buffer<i32>,
    kept_mass: Buffer<f32>,
    flags: Buffer<i32>,
    sel_indptr: Buffer<i32>,
    sel_indices: Buffer<i32>,
    /// With [`SearchConfig::timeline`]: each row's record of the last run.
    timeline: Option<Buffer<i64>>,
}

impl PrunePlan {
    /// Plans `policy` over `cand` (one candidate row per (batch, KV head), positions
    /// ascending), for `group` query heads per row, softmax scale `scale` (usually
    /// `1/sqrt(head_dim)`), and the policy's parameters in its declared order.
    pub fn new(
        dusk: &Dusk,
        policy: &Policy,
        cand: &TokenLists,
        group: usize,
        scale: f32,
        params: &[ParamValues],
    ) -> Result<PrunePlan> {
        ensure!(
            (1..=64).contains(&group),
            "group",
            "1 to 64 query heads per candidate row",
            group,
        );
        ensure!(
            scale.is_finite() && scale > 0.0,
            "scale",
            "a finite positive softmax scale",
            scale,
        );
        check_lists(cand)?;
        let cfg = Self::default_config(&cand.indptr, group)?;
        Self::with_config(dusk, policy, cand, cfg, scale, params)
    }

    /// Plans `policy` over candidates that a previous stage writes on the device (e.g. a
    /// selector's lists): `cand_indptr` (one row per (batch, KV head)) is fixed now, the
    /// positions are given to each [`PrunePlan::run_lists`]. Otherwise as [`PrunePlan::new`].
    pub fn with_device_lists(
        dusk: &Dusk,
        policy: &Policy,
        cand_indptr: &[i32],
        group: usize,
        scale: f32,
        params: &[ParamValues],
    ) -> Result<PrunePlan> {
        check_indptr(cand_indptr)?;
        let cfg = Self::default_config(cand_indptr, group)?;
        Self::plan(dusk, policy, cand_indptr, None, cfg, scale, params)
    }

    /// [`SearchConfig::for_rows`] of the longest row, after checking `group` and the
    /// scores' count.
    fn default_config(indptr: &[i32], group: usize) -> Result<SearchConfig> {
        ensure!(
            (1..=64).contains(&group),
            "group",
            "1 to 64 query heads per candidate row",
            group,
        );
        let nnz = *indptr.last().expect("checked: non-empty") as usize;
        ensure!(
            nnz * group < i32::MAX as usize,
            "cand",
            "fewer than 2^31 scores (candidates x group)",
            nnz * group,
        );
        Ok(SearchConfig::for_rows(longest_row(indptr), group))
    }

    /// As [`PrunePlan::new`] with a chosen kernel configuration (for tuning).
    pub fn with_config(
        dusk: &Dusk,
        policy: &Policy,
        cand: &TokenLists,
        cfg: SearchConfig,
        scale: f32,
        params: &[ParamValues],
    ) -> Result<PrunePlan> {
        check_lists(cand)?;
        Self::plan(
            dusk,
            policy,
            &cand.indptr,
            Some(&cand.indices),
            cfg,
            scale,
            params,
        )
    }

    /// The plan of checked candidate offsets (`indices` uploaded when given).
    #[allow(clippy::too_many_arguments)]
    fn plan(
        dusk: &Dusk,
        policy: &Policy,
        indptr: &[i32],
        indices: Option<&[i32]>,
        cfg: SearchConfig,
        scale: f32,
        params: &[ParamValues],
    ) -> Result<PrunePlan> {
        ensure!(
            scale.is_finite() && scale > 0.0,
            "scale",
            "a finite positive softmax scale",
            scale,
        );
        let longest = longest_row(indptr);
        let fits = cfg.stream || cfg.block >= longest;
        ensure!(
            cfg.block.is_power_of_two()
                && (threshold::MIN_BLOCK..=MAX_BLOCK).contains(&cfg.block)
                && fits,
            "cfg.block",
            format!(
                "a power of two in {}..={MAX_BLOCK}, at least the longest row ({longest}) unless streaming",
                threshold::MIN_BLOCK
            ),
            cfg.block,
        );
        ensure!(
            [1, 2, 4, 8, 16, 32].contains(&cfg.num_warps)
                && cfg.block >= 32 * 4 * cfg.num_warps as usize,
            "cfg.num_warps",
            "1 to 32 (a power of two) with block >= 128 x num_warps",
            cfg.num_warps,
        );
        ensure!(
            !cfg.shared || (cfg.stream && longest <= cfg.staged_capacity()),
            "cfg.shared",
            format!(
                "streaming rows of at most {} candidates for group {} (the longest row: {longest})",
                cfg.staged_capacity(),
                cfg.group
            ),
            cfg.shared,
        );
        ensure!(
            !cfg.split_heads || (cfg.stream && cfg.group > 1 && !cfg.timeline),
            "cfg.split_heads",
            "a streaming search of groups of 2 or more query heads, without a timeline",
            cfg.split_heads,
        );
        ensure!(
            !cfg.histogram || longest <= threshold::HISTOGRAM_MAX_ROW,
            "cfg.histogram",
            format!(
                "rows of at most {} candidates (the longest row: {longest})",
                threshold::HISTOGRAM_MAX_ROW
            ),
            cfg.histogram,
        );
        ensure!(
            cfg.stream || !cfg.timeline,
            "cfg.timeline",
            "a streaming search (the rows held in registers keep no timeline)",
            cfg.timeline,
        );
        ensure!(
            (1..=4).contains(&cfg.pivots),
            "cfg.pivots",
            "1 to 4 points a search step",
            cfg.pivots,
        );
        ensure!(
            (1..=64).contains(&cfg.group),
            "cfg.group",
            "1 to 64 query heads per candidate row",
            cfg.group,
        );
        let rows = indptr.len() - 1;
        let device = dusk.device();
        let nnz = *indptr.last().expect("checked: non-empty") as usize;
        ensure!(
            nnz <= threshold::OUTPUT_MAX_TOTAL,
            "cand",
            format!("at most {} candidates in all", threshold::OUTPUT_MAX_TOTAL),
            nnz,
        );
        let search = dusk.load(threshold::build(policy, &cfg)?)?;
        let mut plan = PrunePlan {
            policy: *policy,
            cfg,
            rows,
            nnz,
            scale_log2e: scale * std::f32::consts::LOG2_E,
            search,
            cand_indptr: device.upload(indptr)?,
            cand_indices: indices.map(|ix| device.upload(&padded(ix))).transpose()?,
            params: vec![],
            work: if cfg.uses_work() {
                Some(device.alloc((nnz * cfg.group).max(1))?)
            } else {
                None
            },
            scratch: if cfg.stream {
                Some(device.alloc((rows * cfg.group * cfg.block).max(1))?)
            } else {
                None
            },
            exchange: if cfg.split_heads {
                Some((
                    device.alloc((rows * cfg.group * 3).max(1))?,
                    device.upload(&vec![0i32; rows.max(1)])?,
                ))
            } else {
                None
            },
            prefix: device.upload(&vec![0i32; rows + 1])?,
            budget: device.alloc(rows.max(1))?,
            kept_mass: device.alloc((rows * cfg.group).max(1))?,
            flags: device.alloc((rows * cfg.group).max(1))?,
            sel_indptr: device.alloc(rows + 1)?,
            sel_indices: device.alloc(nnz.max(1))?,
            timeline: if cfg.timeline {
                Some(device.upload(&vec![0i64; rows.max(1) * crate::timeline::TIMELINE_WORDS])?)
            } else {
                None
            },
        };
        plan.set_params(dusk, params)?;
        Ok(plan)
    }

    /// Replaces the policy's parameters (checked first; nothing changes on an error).
    pub fn set_params(&mut self, dusk: &Dusk, params: &[ParamValues]) -> Result<()> {
        let spec = self.policy.params;
        ensure!(
            params.len() == spec.len(),
            "params",
            format!(
                "{} values for policy `{}` ({})",
                spec.len(),
                self.policy.name,
                spec.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
            ),
            params.len(),
        );
        let qrows = self.rows * self.cfg.group;
        let mut host = vec![];
        for (p, v) in spec.iter().zip(params) {
            let vals = match v {
                ParamValues::Uniform(x) => vec![*x; qrows],
                ParamValues::PerRow(xs) => {
                    ensure!(
                        xs.len() == qrows,
                        "params",
                        format!("{qrows} values of `{}` (one per query row)", p.name),
                        xs.len(),
                    );
                    xs.clone()
                }
            };
            if p.dtype == DType::I32 {
                // An i32 parameter given 16.5 would be truncated on the device: refuse it.
                let integral =
                    |x: f64| x.fract() == 0.0 && (i32::MIN as f64..=i32::MAX as f64).contains(&x);
                if let Some(bad) = vals.iter().find(|x| !integral(**x)) {
                    return Err(invalid(
                        "params",
                        format!(
                            "an integer for `{}` (an i32 parameter of policy `{}`)",
                            p.name, self.policy.name
                        ),
                        bad,
                    ));
                }
            }
            if let Some(bad) = vals.iter().find(|x| !(p.check)(**x)) {
                return Err(invalid(
                    "params",
                    format!("`{}` with {}", p.name, p.expected),
                    bad,
                ));
            }
            host.push((p.dtype, vals));
        }
        let device = dusk.device();
        let mut bufs = vec![];
        for (d, vals) in host {
            bufs.push(match d {
                DType::I32 => ParamBuffer::I32(
                    device.upload(&padded(&vals.iter().map(|x| *x as i32).collect::<Vec<_>>()))?,
                ),
                _ => ParamBuffer::F32(
                    device.upload(&padded(&vals.iter().map(|x| *x as f32).collect::<Vec<_>>()))?,
                ),
            });
        }
        self.params = bufs;
        Ok(())
    }

    /// Fills every output with `byte`: checks poison the outputs first to prove that a run
    /// writes each value it reports.
    pub fn poison_outputs(&mut self, dusk: &Dusk, byte: u8) -> Result<()> {
        let d = dusk.device();
        d.fill_bytes(&mut self.sel_indptr, byte)?;
        d.fill_bytes(&mut self.sel_indices, byte)?;
        d.fill_bytes(&mut self.budget, byte)?;
        d.fill_bytes(&mut self.kept_mass, byte)?;
        d.fill_bytes(&mut self.flags, byte)?;
        Ok(())
    }

    /// Scores the plan reads: candidates times the group.
    pub fn num_scores(&self) -> usize {
        self.nnz * self.cfg.group
    }

    /// The kernel configuration in use.
    pub fn config(&self) -> SearchConfig {
        self.cfg
    }

    /// With [`SearchConfig::timeline`], the last run's records:
    /// [`crate::timeline::TIMELINE_WORDS`] i64 words a row, `[start, pass 1 done, pass 2 done, budget known, place found, end,
    /// SM, 0]`, clocks in nanoseconds (`%globaltimer`).
    pub fn timeline(&self) -> Option<&Buffer<i64>> {
        self.timeline.as_ref()
    }

    /// Searches every query row of `scores` and writes the kept positions: one launch.
    /// For a plan holding its own candidates ([`PrunePlan::new`]).
    pub fn run(&mut self, dusk: &Dusk, scores: &Buffer<f32>) -> Result<()> {
        let ix = self.own_candidates()?;
        self.launch(dusk, scores, ix, &self.sel_indptr, &self.sel_indices)
    }

    /// As [`PrunePlan::run`], with the kept positions written to the caller's buffers
    /// instead of the plan's (`sel_indptr`: rows + 1 entries, `sel_indices`: room for every
    /// candidate), e.g. the device lists an attention plan reads, so that no copy lies
    /// between the two. Budgets, kept mass and flags still go to the plan's.
    pub fn run_into(
        &mut self,
        dusk: &Dusk,
        scores: &Buffer<f32>,
        sel_indptr: &mut Buffer<i32>,
        sel_indices: &mut Buffer<i32>,
    ) -> Result<()> {
        let ix = self.own_candidates()?;
        self.check_out(sel_indptr, sel_indices)?;
        self.launch(dusk, scores, ix, sel_indptr, sel_indices)
    }

    /// As [`PrunePlan::run`] over the positions a previous stage wrote at `cand_indices`
    /// (at least the plan's `cand_indptr[rows]` of them), for a plan made with
    /// [`PrunePlan::with_device_lists`].
    pub fn run_lists(
        &mut self,
        dusk: &Dusk,
        scores: &Buffer<f32>,
        cand_indices: &Buffer<i32>,
    ) -> Result<()> {
        self.check_device_lists(cand_indices)?;
        self.launch(
            dusk,
            scores,
            cand_indices,
            &self.sel_indptr,
            &self.sel_indices,
        )
    }

    /// As [`PrunePlan::run_lists`], writing the kept lists into `sel_indptr` (rows + 1
    /// entries) and `sel_indices` (room for every candidate) instead of the plan's own:
    /// where the next stage reads them (an attention plan's device lists), with no copy.
    /// The budgets, kept mass and flags stay the plan's.
    pub fn run_lists_into(
        &mut self,
        dusk: &Dusk,
        scores: &Buffer<f32>,
        cand_indices: &Buffer<i32>,
        sel_indptr: &Buffer<i32>,
        sel_indices: &Buffer<i32>,
    ) -> Result<()> {
        self.check_device_lists(cand_indices)?;
        self.check_out(sel_indptr, sel_indices)?;
        self.launch(dusk, scores, cand_indices, sel_indptr, sel_indices)
    }

    /// The candidates a plan made with [`PrunePlan::new`] holds.
    fn own_candidates(&self) -> Result<&Buffer<i32>> {
        self.cand_indices.as_ref().ok_or_else(|| {
            invalid(
                "cand_indices",
                "the positions of the device lists this plan was made for (run_lists)",
                "none",
            )
        })
    }

    /// Output lists of the caller's: rows + 1 offsets, room for every candidate.
    fn check_out(&self, sel_indptr: &Buffer<i32>, sel_indices: &Buffer<i32>) -> Result<()> {
        ensure!(
            sel_indptr.len() == self.rows + 1,
            "sel_indptr",
            format!("{} entries (rows + 1)", self.rows + 1),
            sel_indptr.len(),
        );
        ensure!(
            sel_indices.len() >= self.nnz.max(1),
            "sel_indices",
            format!("room for {} positions (every candidate)", self.nnz.max(1)),
            sel_indices.len(),
        );
        Ok(())
    }

    /// As [`PrunePlan::run_lists_into`] with the row offsets too taken from the device:
    /// those an earlier pruner of a pipeline wrote, each row no longer than the plan's row
    /// and in all no more than its candidates. Crate-internal: the offsets are trusted, as
    /// only dusk's own pruner writes them.
    pub(crate) fn run_csr_into(
        &mut self,
        dusk: &Dusk,
        scores: &Buffer<f32>,
        cand_indptr: &Buffer<i32>,
        cand_indices: &Buffer<i32>,
        out: Option<(&Buffer<i32>, &Buffer<i32>)>,
    ) -> Result<()> {
        self.check_device_lists(cand_indices)?;
        ensure!(
            cand_indptr.len() == self.rows + 1,
            "cand_indptr",
            format!("{} offsets (rows + 1)", self.rows + 1),
            cand_indptr.len(),
        );
        let (ip, ix) = out.unwrap_or((&self.sel_indptr, &self.sel_indices));
        self.launch_with(dusk, scores, cand_indptr, cand_indices, ip, ix)
    }

    fn check_device_lists(&self, cand_indices: &Buffer<i32>) -> Result<()> {
        ensure!(
            self.cand_indices.is_none(),
            "cand_indices",
            "none: the plan holds its own candidates (run)",
            "device lists",
        );
        ensure!(
            cand_indices.len() >= self.nnz,
            "cand_indices",
            format!("at least {} positions (cand_indptr[rows])", self.nnz),
            cand_indices.len(),
        );
        Ok(())
    }

    fn launch(
        &self,
        dusk: &Dusk,
        scores: &Buffer<f32>,
        cand_indices: &Buffer<i32>,
        sel_indptr: &Buffer<i32>,
        sel_indices: &Buffer<i32>,
    ) -> Result<()> {
        let ip = &self.cand_indptr;
        self.launch_with(dusk, scores, ip, cand_indices, sel_indptr, sel_indices)
    }

    fn launch_with(
        &self,
        dusk: &Dusk,
        scores: &Buffer<f32>,
        cand_indptr: &Buffer<i32>,
        cand_indices: &Buffer<i32>,
        sel_indptr: &Buffer<i32>,
        sel_indices: &Buffer<i32>,
    ) -> Result<()> {
        ensure!(
            scores.len() >= self.num_scores(),
            "scores",
            format!("at least {} scores", self.num_scores()),
            scores.len(),
        );
        if self.rows == 0 {
            return Ok(());
        }
        let device = dusk.device();
        let mut args = vec![Arg::from(scores)];
        args.extend(self.work.iter().chain(&self.scratch).map(Arg::from));
        if let Some((exchange, arrivals)) = &self.exchange {
            args.extend([Arg::from(exchange), Arg::from(arrivals)]);
        }
        args.extend([Arg::from(cand_indptr), Arg::from(cand_indices)]);
        for p in &self.params {
            args.push(match p {
                ParamBuffer::F32(b) => Arg::from(b),
                ParamBuffer::I32(b) => Arg::from(b),
            });
        }
        args.extend([
            Arg::F32(self.scale_log2e),
            Arg::from(sel_indptr),
            Arg::from(sel_indices),
            Arg::from(&self.prefix),
            Arg::from(&self.budget),
            Arg::from(&self.kept_mass),
            Arg::from(&self.flags),
        ]);
        args.extend(self.timeline.iter().map(Arg::from));
        // Split: a program a query head, a row's heads one after another.
        let programs = self.rows
            * if self.cfg.split_heads {
                self.cfg.group
            } else {
                1
            };
        device.launch(&self.search, [programs as u32, 1, 1], &args)?;
        Ok(())
    }

    /// The candidates' row offsets the plan reads (of a plan made with device lists), for a
    /// pipeline step that rewrites them on the device (`pipeline::table`).
    pub(crate) fn cand_indptr(&self) -> &Buffer<i32> {
        &self.cand_indptr
    }

    /// The kept positions' CSR row pointers (one row per candidate row, rows + 1 entries).
    pub fn sel_indptr(&self) -> &Buffer<i32> {
        &self.sel_indptr
    }
    /// The kept positions, ascending within each row (capacity: every candidate).
    pub fn sel_indices(&self) -> &Buffer<i32> {
        &self.sel_indices
    }
    /// Kept candidates per candidate row (the union over the group); -1 for a row whose
    /// place in the list was not found (its search waits for the rows before it, which run
    /// first: not seen).
    pub fn budgets(&self) -> &Buffer<i32> {
        &self.budget
    }
    /// The weight each query row kept (1 for rows marked invalid).
    pub fn kept_mass(&self) -> &Buffer<f32> {
        &self.kept_mass
    }
    /// 1 where a query row's logits held NaN or infinity (it keeps every candidate).
    pub fn flags(&self) -> &Buffer<i32> {
        &self.flags
    }
}

/// The CSR structure, and positions ascending within each row (the output keeps their order).
fn check_lists(cand: &TokenLists) -> Result<()> {
    check_indptr(&cand.indptr)?;
    let nnz = *cand.indptr.last().expect("non-empty") as usize;
    ensure!(
        nnz == cand.indices.len(),
        "cand",
        format!("{nnz} indices (indptr[rows])"),
        cand.indices.len(),
    );
    for r in 0..cand.rows() {
        let row = cand.row(r);
        if let Some(w) = row.windows(2).find(|w| w[0] >= w[1]) {
            return Err(invalid(
                "cand",
                format!("ascending token positions in row {r}"),
                format!("{} then {}", w[0], w[1]),
            ));
        }
        if let Some(t) = row.iter().find(|t| **t < 0) {
            return Err(invalid("cand", "non-negative token positions", t));
        }
    }
    Ok(())
}

/// Row offsets from 0, non-decreasing.
fn check_indptr(indptr: &[i32]) -> Result<()> {
    ensure!(
        !indptr.is_empty() && indptr[0] == 0,
        "cand",
        "indptr starting at 0",
        format!("{:?}", indptr.first()),
    );
    for w in indptr.windows(2) {
        ensure!(
            w[0] <= w[1],
            "cand",
            "non-decreasing indptr",
            format!("{} then {}", w[0], w[1]),
        );
    }
    Ok(())
}

/// The most candidates in one row.
fn longest_row(indptr: &[i32]) -> usize {
    indptr
        .windows(2)
        .map(|w| (w[1] - w[0]) as usize)
        .max()
        .unwrap_or(0)
}

/// A device buffer needs at least one element.
fn padded<T: Copy + Default>(v: &[T]) -> Vec<T> {
    if v.is_empty() {
        vec![T::default()]
    } else {
        v.to_vec()
    }
}
