//! `dusk.PipelinePlan`: a sparse-attention decode step (a selector, zero or more pruners,
//! an attention: `dusk_kernels::pipeline`) declared once, planned on host metadata, and run
//! on the caller's tensors in FlashInfer's plan/run convention, with the decode step's
//! append (`dusk_kernels::cache::AppendPlan`) keeping the pipeline's state current.

use crate::context::{context, parse_device, resolve_stream, Ctx};
use crate::errors::{invalid, to_py_renamed, OrPy};
use crate::ops::{
    after_callers_work, borrow_attention_args, check_outputs, device_i32s, no_plan, on_stream,
    page_table, parse_params, policy, replace_state, settle, tensors, LastStream,
};
use crate::tensor::{type_name, Array, Place, Tensor};
use dusk_compiler::DType;
use dusk_kernels::cache::AppendPlan;
use dusk_kernels::engines::CsrPages;
use dusk_kernels::paged::{KvShape, PageTable};
use dusk_kernels::pipeline::{
    Attend, DsSelect, Pipeline, PipelineBuilder, PipelinePlan as Plan, PipelineShape, Prune,
    Select, SparqSelect, StepLimits,
};
use dusk_kernels::selectors::{Budget, DsCalibration, DsOptions, SparqOptions};
use dusk_runtime::Buffer;
use half::f16;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PySequence, PyString};
use std::sync::{Arc, Mutex, MutexGuard};

/// A planned pipeline and what its runs need beside the caller's tensors.
struct PipeState {
    /// First: drops before the buffers (see [`LastStream`]).
    queued: LastStream,
    plan: Plan,
    table: Table,
    /// The log-sum-exp a step writes when the caller gives none.
    lse: Buffer<f32>,
    kv: KvShape,
    batch: usize,
    num_q_heads: usize,
}

/// Where a plan's page table lives.
enum Table {
    /// Host metadata, uploaded: the append of one token per sequence at its end.
    Host {
        append: Box<AppendPlan>,
        table: CsrPages,
    },
    /// The caller's int32 tensors on the device, borrowed (their objects kept alive), read
    /// by each step as they are then; the append is the plan's own.
    Device {
        table: CsrPages,
        _keep: Vec<Py<PyAny>>,
        /// This step's append also sized the step from the table: `step` need not again.
        sized: bool,
    },
}

/// A sparse-attention decode step as one plan: a selector, pruners run in turn, and an
/// attention.
///
/// Selectors (`select=`): `"full"` (every token); `"quest"` (Quest's pages: `budget` tokens,
/// an int, or a fraction of each sequence, a float in (0, 1]; `sink=True` keeps the first
/// page too); `"ds"` (Double Sparsity: `calibration`, the JSON text `dusk.calibrate_ds`
/// returns or its file's path; `budget` tokens; `sink` and `recent` tokens always kept);
/// `"sparq"` (SparQ: `r` components of q, 16 by default; `budget` its k tokens; `recent`
/// its local window; its transposed copy of K in blocks of `block_size` tokens, 256 by
/// default, `None` paged as the cache; `sparq_mix=True`, the default, mixes the output
/// with the mean of V as Algorithm 1 does, and takes no pruner). Pruners (`prune=`): a list
/// of `(policy, params)`: `"top_p"`, `"top_k"`, `"ratio_to_max"`, `"top_p_bounded"`, params
/// as `PrunePlan`'s. Attention (`attend=`): `"group_varlen"` (one list a KV head, the union
/// of its group's kept tokens), `"head_varlen"` (MHA only), `"dense"` (only with `"full"`
/// and no pruner). `bits`: the estimate's K codes (4 or 8); `dense_below`: sequences of at
/// most this many tokens attend to every token (default: a token budget, else 0).
///
/// `plan(...)` takes host CSR metadata (as `AttentionPlan.plan`) and sizes every buffer;
/// `prepare(k_cache, v_cache=None)` fills the INT4 copy of K and the selector's state from
/// the cache (after a prefill; SparQ's reads V too); each decode step, `replan(...)` with
/// the next table (each sequence's new token last; the state kept), `append(k_new, v_new,
/// k_cache, v_cache)` writes the step's token of every sequence into the cache, the INT4
/// copy and the selector's state in one launch, and `step(q, k_cache, v_cache, out)`
/// selects, estimates, prunes and attends. `append` and `step` queue on the caller's stream
/// with no allocation and no sync, so they can be captured in a CUDA graph. `budgets()`
/// gives the tokens each (sequence, KV head) attended to in the last step.
///
/// ```python
/// import numpy as np, dusk
/// p = dusk.PipelinePlan("cpu", select="quest", budget=0.5, prune=[("top_p", {"p": 0.9})],
///                       attend="group_varlen")
/// lens = [200, 90]                        # two sequences, pages of 16, consecutive pages
/// pages = [-(-n // 16) for n in lens]
/// p.plan(np.cumsum([0] + pages).astype(np.int32), np.arange(sum(pages), dtype=np.int32),
///        np.array([n - 16 * (m - 1) for n, m in zip(lens, pages)], np.int32),
///        num_qo_heads=8, num_kv_heads=2, head_dim=64, num_pages=sum(pages))
/// rng = np.random.default_rng(0)
/// k = rng.standard_normal((sum(pages), 16, 2, 64)).astype(np.float16)
/// v = rng.standard_normal(k.shape).astype(np.float16)
/// q = rng.standard_normal((2, 8, 64)).astype(np.float16)
/// out = np.empty_like(q)
/// p.prepare(k)
/// p.step(q, k, v, out)
/// assert len(p.budgets()) == 4            # tokens kept per (sequence, KV head)
/// ```
#[pyclass(module = "dusk", name = "PipelinePlan")]
pub struct PipelinePlanPy {
    ctx: Arc<Ctx>,
    pipeline: Pipeline,
    state: Option<Arc<Mutex<PipeState>>>,
}

fn parse_budget(budget: Option<&Bound<'_, PyAny>>) -> PyResult<Budget> {
    let Some(b) = budget.filter(|b| !b.is_none()) else {
        return Err(invalid(
            "budget",
            "Quest's budget: tokens (an int) or a fraction of each sequence (a float)",
            "none",
        ));
    };
    if let Ok(t) = b.extract::<usize>() {
        return Ok(Budget::Tokens(t));
    }
    if let Ok(f) = b.extract::<f64>() {
        return Ok(Budget::Fraction(f));
    }
    Err(invalid(
        "budget",
        "tokens (an int) or a fraction of each sequence (a float)",
        type_name(b),
    ))
}

/// Double Sparsity's calibration: its JSON text, or the path (a `str` not starting with
/// `{`, or an `os.PathLike`) of its file.
fn parse_calibration(c: &Bound<'_, PyAny>) -> PyResult<DsCalibration> {
    let rename = |e| to_py_renamed(e, &[("path", "calibration")]);
    if let Ok(text) = c.extract::<String>() {
        if text.trim_start().starts_with('{') {
            return DsCalibration::from_json(&text).map_err(rename);
        }
        return DsCalibration::load(std::path::Path::new(&text)).map_err(rename);
    }
    match c.extract::<std::path::PathBuf>() {
        Ok(path) => DsCalibration::load(&path).map_err(rename),
        Err(_) => Err(invalid(
            "calibration",
            "its JSON text (a str) or the path of its file",
            type_name(c),
        )),
    }
}

/// `prune`: a sequence of `(policy, params)` pairs.
fn parse_prune(prune: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<Prune>> {
    let Some(prune) = prune.filter(|p| !p.is_none()) else {
        return Ok(vec![]);
    };
    let expected = "a list of (policy, params) pairs, e.g. [(\"top_p\", {\"p\": 0.95})]";
    if prune.is_instance_of::<PyString>() {
        return Err(invalid("prune", expected, type_name(prune)));
    }
    let seq = prune
        .cast::<PySequence>()
        .map_err(|_| invalid("prune", expected, type_name(prune)))?;
    let mut out = vec![];
    for item in seq.try_iter()? {
        let item = item?;
        let (name, params): (String, Bound<'_, PyAny>) = item
            .extract()
            .map_err(|_| invalid("prune", expected, type_name(&item)))?;
        let pol = policy(&name)?;
        out.push(Prune::new(pol, parse_params(pol, Some(&params))?));
    }
    Ok(out)
}

fn parse_attend(attend: &str) -> PyResult<Attend> {
    Ok(match attend {
        "group_varlen" => Attend::GroupVarlen,
        "head_varlen" => Attend::HeadVarlen,
        "dense" => Attend::Dense,
        other => {
            return Err(invalid(
                "attend",
                "\"group_varlen\", \"head_varlen\" or \"dense\"",
                format!("{other:?}"),
            ))
        }
    })
}

impl PipelinePlanPy {
    /// `plan(..., device_table=True)`.
    fn plan_on_device(
        &mut self,
        py: Python<'_>,
        meta: [&Bound<'_, PyAny>; 3],
        kv: KvShape,
        num_q_heads: usize,
        max_tokens: Option<usize>,
    ) -> PyResult<()> {
        let ctx = &self.ctx;
        let max_tokens = max_tokens.ok_or_else(|| {
            invalid(
                "max_tokens",
                "the longest sequence a step may see, with device_table=True",
                "none",
            )
        })?;
        let tab = device_i32s(
            ctx,
            &[
                (meta[0], "kv_indptr"),
                (meta[1], "kv_page_indices"),
                (meta[2], "kv_last_page_len"),
            ],
        )?;
        let batch = tab[0].numel().saturating_sub(1);
        let shape = PipelineShape {
            kv,
            num_q_heads,
            dtype: DType::F16,
        };
        let limits = StepLimits {
            batch,
            max_tokens,
            append: true,
        };
        let plan = self
            .pipeline
            .plan_device(&ctx.dusk, shape, limits)
            .map_err(|e| to_py_renamed(e, &[("batch", "kv_indptr")]))?;
        let dev = ctx.device();
        // SAFETY: contiguous int32 tensors of their lengths, whose objects (and capsules)
        // the state keeps, so the memory outlives the plan's use of it.
        let table = unsafe {
            CsrPages {
                kv_indptr: tab[0].borrow::<i32>(dev)?,
                kv_page_indices: tab[1].borrow::<i32>(dev)?,
                kv_last_page_len: tab[2].borrow::<i32>(dev)?,
            }
        };
        let lse = dev.alloc::<f32>((batch * num_q_heads).max(1)).py_err()?;
        settle(ctx)?;
        replace_state(
            py,
            &self.ctx,
            &mut self.state,
            Arc::new(Mutex::new(PipeState {
                queued: LastStream::new(&self.ctx),
                plan,
                table: Table::Device {
                    table,
                    _keep: tab.iter().flat_map(|t| t.keep_alive()).collect(),
                    sized: false,
                },
                lse,
                kv,
                batch,
                num_q_heads,
            })),
        )?;
        Ok(())
    }

    fn state(&self) -> PyResult<MutexGuard<'_, PipeState>> {
        let st = self.state.as_ref().ok_or_else(no_plan)?;
        Ok(st.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A view of a buffer the plan owns (`pick` gives its address and length).
    fn export(&self, pick: impl Fn(&PipeState) -> Option<(u64, usize)>) -> PyResult<Option<Array>> {
        let owner = self.state.as_ref().ok_or_else(no_plan)?;
        let picked = pick(&owner.lock().unwrap_or_else(|e| e.into_inner()));
        Ok(picked.map(|(addr, len)| {
            Array::new(owner.clone(), addr, vec![len], DType::I32, self.ctx.place)
        }))
    }
}

#[pymethods]
impl PipelinePlanPy {
    /// A pipeline for `device` (`"cpu"`, `"cuda"`, `"cuda:N"`, a `torch.device`), checked
    /// as a whole now (`InvalidArgument` naming `select`, `budget`, `sink`, `recent`,
    /// `calibration`, `r`, `block_size`, `sparq_mix`, `prune`, `params`, `attend`, `bits`).
    #[new]
    #[pyo3(signature = (device, *, select="quest", budget=None, sink=None, recent=0, calibration=None, r=None, block_size=Some(256), sparq_mix=None, prune=None, attend="group_varlen", bits=4, dense_below=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        device: &Bound<'_, PyAny>,
        select: &str,
        budget: Option<&Bound<'_, PyAny>>,
        sink: Option<&Bound<'_, PyAny>>,
        recent: usize,
        calibration: Option<&Bound<'_, PyAny>>,
        r: Option<usize>,
        block_size: Option<usize>,
        sparq_mix: Option<bool>,
        prune: Option<&Bound<'_, PyAny>>,
        attend: &str,
        bits: u32,
        dense_below: Option<usize>,
    ) -> PyResult<Self> {
        let ctx = context(parse_device(device)?)?;
        let given = |x: Option<&Bound<'_, PyAny>>| x.is_some_and(|x| !x.is_none());
        // Each selector's own arguments, refused with the others.
        let only = |arg: &str, is_set: bool, whose: &str| -> PyResult<()> {
            if is_set && !whose.split(',').any(|w| w == select) {
                let found = format!("it with select={select:?}");
                return Err(invalid(
                    arg,
                    format!("it only with select={whose:?}"),
                    found,
                ));
            }
            Ok(())
        };
        only("budget", given(budget), "quest,ds,sparq")?;
        only("sink", given(sink), "quest,ds")?;
        only("recent", recent > 0, "ds,sparq")?;
        only("calibration", given(calibration), "ds")?;
        only("r", r.is_some(), "sparq")?;
        only("sparq_mix", sparq_mix.is_some(), "sparq")?;
        let select = match select {
            "full" => Select::Full,
            "quest" => Select::Quest {
                budget: parse_budget(budget)?,
                sink: match sink {
                    Some(x) if !x.is_none() => x
                        .cast::<PyBool>()
                        .map_err(|_| {
                            invalid("sink", "a bool (Quest keeps the first page)", type_name(x))
                        })?
                        .is_true(),
                    _ => false,
                },
            },
            "ds" => {
                let Some(cal) = calibration.filter(|c| !c.is_none()) else {
                    return Err(invalid(
                        "calibration",
                        "Double Sparsity's calibration: its JSON text (dusk.calibrate_ds) or \
                         the path of its file",
                        "none",
                    ));
                };
                let sink = match sink {
                    Some(x) if !x.is_none() => x
                        .extract::<usize>()
                        .map_err(|_| invalid("sink", "tokens (an int >= 0)", type_name(x)))?,
                    _ => 0,
                };
                Select::Plugin(Arc::new(DsSelect {
                    calibration: parse_calibration(cal)?,
                    budget: parse_budget(budget)?,
                    options: DsOptions { sink, recent },
                }))
            }
            "sparq" => Select::Plugin(Arc::new(SparqSelect {
                options: SparqOptions {
                    r: r.unwrap_or(16),
                    k: parse_budget(budget)?,
                    window: recent,
                },
                block_size,
            })),
            other => {
                return Err(invalid(
                    "select",
                    "\"full\", \"quest\", \"ds\" or \"sparq\"",
                    format!("{other:?}"),
                ))
            }
        };
        let sparq = matches!(&select, Select::Plugin(f) if f.makes_sparq_mix());
        let mut b = PipelineBuilder::new()
            .select(select)
            .attend(parse_attend(attend)?)
            .bits(bits)
            .sparq_mix(sparq && sparq_mix.unwrap_or(true));
        for p in parse_prune(prune)? {
            b = b.prune(p);
        }
        if let Some(n) = dense_below {
            b = b.dense_below(n);
        }
        Ok(PipelinePlanPy {
            ctx,
            pipeline: b.build().py_err()?,
            state: None,
        })
    }

    /// Plans the pipeline over a paged cache (`[num_pages, page_size, num_kv_heads,
    /// head_dim]` K and V, float16) whose sequences the host int32 CSR metadata gives
    /// (`kv_indptr [batch + 1]`, `kv_page_indices`, `kv_last_page_len [batch]`: the table
    /// after this step's append, each sequence's new token its last): sizes every buffer
    /// and loads every kernel (`NotInBundle` on a GPU if the bundle lacks one). The INT4
    /// copy and the selector's state start zeroed: `prepare` fills them. May synchronise.
    ///
    /// `device_table=True` (Quest, Double Sparsity, SparQ with `block_size=None`, or Full:
    /// every token pruned, or dense attention): the three
    /// metadata are int32 tensors on the plan's device (`kv_indptr [batch + 1]`,
    /// `kv_page_indices` of any capacity, `kv_last_page_len [batch]`, e.g. what
    /// `vllm_to_csr` writes each step), borrowed, not copied: every buffer is sized for
    /// `batch` sequences of up to `max_tokens` tokens (required) and each `append` or `step`
    /// reads the table as it is then, on the device, so one captured graph replays a decode
    /// loop whose lengths grow (the kernels clamp what they read: a bad table gives a wrong
    /// answer, never an access out of bounds).
    #[pyo3(signature = (kv_indptr, kv_page_indices, kv_last_page_len, *, num_qo_heads, num_kv_heads, head_dim, num_pages, page_size=16, device_table=false, max_tokens=None))]
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &mut self,
        py: Python<'_>,
        kv_indptr: &Bound<'_, PyAny>,
        kv_page_indices: &Bound<'_, PyAny>,
        kv_last_page_len: &Bound<'_, PyAny>,
        num_qo_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        num_pages: usize,
        page_size: usize,
        device_table: bool,
        max_tokens: Option<usize>,
    ) -> PyResult<()> {
        if device_table {
            return self.plan_on_device(
                py,
                [kv_indptr, kv_page_indices, kv_last_page_len],
                KvShape {
                    num_pages,
                    page_size,
                    num_kv_heads,
                    head_dim,
                },
                num_qo_heads,
                max_tokens,
            );
        }
        if max_tokens.is_some() {
            return Err(invalid(
                "max_tokens",
                "none with a host table (its lengths size the plan)",
                "a number",
            ));
        }
        let table = page_table(kv_indptr, kv_page_indices, kv_last_page_len)?;
        let kv = KvShape {
            num_pages,
            page_size,
            num_kv_heads,
            head_dim,
        };
        let shape = PipelineShape {
            kv,
            num_q_heads: num_qo_heads,
            dtype: DType::F16,
        };
        let plan = self.pipeline.plan(&self.ctx.dusk, shape, &table).py_err()?;
        let state = Arc::new(Mutex::new(planned(
            &self.ctx,
            plan,
            &table,
            kv,
            num_qo_heads,
        )?));
        replace_state(py, &self.ctx, &mut self.state, state)
    }

    #[getter]
    fn device(&self) -> String {
        self.ctx.place.describe()
    }

    /// Fills the INT4 copy of K and the selector's state (Quest's pages, Double Sparsity's
    /// labels, SparQ's transposed K and sums of V) from the cache, every token of the
    /// plan's table, as after a prefill. SparQ's state reads V too: give `v_cache` for it.
    /// Waits for its own upload (the pages to rebuild), then queues on the caller's stream.
    #[pyo3(signature = (k_cache, v_cache=None, *, stream=None))]
    fn prepare(
        &self,
        py: Python<'_>,
        k_cache: &Bound<'_, PyAny>,
        v_cache: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let ctx = &self.ctx;
        let mut st = self.state()?;
        let stream = resolve_stream(py, ctx.place, stream)?;
        let mut args = vec![(k_cache, "k_cache")];
        if let Some(v) = v_cache.filter(|v| !v.is_none()) {
            args.push((v, "v_cache"));
        }
        let ts = tensors(ctx, stream, &args)?;
        for t in &ts {
            t.expect(DType::F16, &cache_shape(&st.kv))?;
        }
        // SAFETY: contiguous float16 tensors of the cache's shape, alive past the queueing.
        let k = unsafe { ts[0].borrow::<f16>(ctx.device())? };
        let v = match ts.get(1) {
            // SAFETY: as `k`.
            Some(t) => Some(unsafe { t.borrow::<f16>(ctx.device())? }),
            None => None,
        };
        let st = &mut *st;
        st.queued.note(stream);
        if let Table::Device { table, .. } = &st.table {
            // The sequences now on the device (a prefill is planned on the host: it may wait).
            let down = |b: &Buffer<i32>| b.download().py_err();
            let mut now = PageTable {
                kv_indptr: down(&table.kv_indptr)?,
                kv_page_indices: down(&table.kv_page_indices)?,
                kv_last_page_len: down(&table.kv_last_page_len)?,
            };
            let used = now.kv_indptr.last().copied().unwrap_or(0).max(0) as usize;
            now.kv_page_indices.truncate(used);
            now.validate(&st.kv).py_err()?;
            return on_stream(ctx, stream, || {
                st.plan.prefill(&ctx.dusk, &k, v.as_ref(), &now)
            })
            .map_err(|e| to_py_renamed(e, &[("k", "k_cache"), ("v", "v_cache")]));
        }
        on_stream(ctx, stream, || match &v {
            Some(v) => st.plan.prepare_kv(&ctx.dusk, &k, v),
            None => st.plan.prepare(&ctx.dusk, &k),
        })
        .map_err(|e| to_py_renamed(e, &[("k", "k_cache"), ("v", "v_cache")]))
    }

    /// The same pipeline over the next page table (host int32 CSR metadata, as `plan`'s:
    /// a decode step later, each sequence's new token last), keeping the INT4 copy and the
    /// selector's state: then `append` writes the new tokens into them and `step` runs over
    /// the longer sequences. Views of the plan's buffers (`selection`, `sel_indptr`,
    /// `sel_indices`) must be dropped first (their memory goes with the old table). On an
    /// error from the new table the plan is dropped: `plan` again. May synchronise.
    fn replan(
        &mut self,
        py: Python<'_>,
        kv_indptr: &Bound<'_, PyAny>,
        kv_page_indices: &Bound<'_, PyAny>,
        kv_last_page_len: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let table = page_table(kv_indptr, kv_page_indices, kv_last_page_len)?;
        if matches!(self.state()?.table, Table::Device { .. }) {
            return Err(crate::errors::simple(
                "DuskError",
                "replan on a plan made with device_table=True: it reads the table on the \
                 device at each step (write the next table into the same tensors)"
                    .to_string(),
            ));
        }
        let arc = self.state.take().ok_or_else(no_plan)?;
        let old = match Arc::try_unwrap(arc) {
            Ok(m) => m.into_inner().unwrap_or_else(|e| e.into_inner()),
            Err(arc) => {
                self.state = Some(arc);
                return Err(crate::errors::simple(
                    "DuskError",
                    "replan while a view of the plan's buffers (selection, sel_indptr, \
                     sel_indices) is alive: their memory goes with the old table; del them first"
                        .to_string(),
                ));
            }
        };
        let kv = old.kv;
        table.validate(&kv).py_err()?;
        let num_q_heads = old.num_q_heads;
        let dusk = &self.ctx.dusk;
        // What the new plan does not keep is freed on the device's own stream: after the
        // steps still queued on the caller's.
        after_callers_work(py, &self.ctx)?;
        let plan = old.plan.replan(dusk, &table).py_err()?;
        self.state = Some(Arc::new(Mutex::new(planned(
            &self.ctx,
            plan,
            &table,
            kv,
            num_q_heads,
        )?)));
        Ok(())
    }

    /// Writes one token per sequence, `k_new` and `v_new` (float16 `[batch, num_kv_heads,
    /// head_dim]`), at the last position of its pages in the plan's table: into
    /// `k_cache` and `v_cache`, the INT4 copy of K and Quest's page min and max, so the
    /// next `step` selects and estimates over it. One launch on the caller's stream: no
    /// allocation, no sync.
    #[pyo3(signature = (k_new, v_new, k_cache, v_cache, *, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn append(
        &self,
        py: Python<'_>,
        k_new: &Bound<'_, PyAny>,
        v_new: &Bound<'_, PyAny>,
        k_cache: &Bound<'_, PyAny>,
        v_cache: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let ctx = &self.ctx;
        let mut guard = self.state()?;
        let st = &mut *guard;
        let stream = resolve_stream(py, ctx.place, stream)?;
        let ts = tensors(
            ctx,
            stream,
            &[
                (k_new, "k_new"),
                (v_new, "v_new"),
                (k_cache, "k_cache"),
                (v_cache, "v_cache"),
            ],
        )?;
        let token = [st.batch, st.kv.num_kv_heads, st.kv.head_dim];
        ts[0].expect(DType::F16, &token)?;
        ts[1].expect(DType::F16, &token)?;
        ts[2].expect(DType::F16, &cache_shape(&st.kv))?;
        ts[3].expect(DType::F16, &cache_shape(&st.kv))?;
        check_outputs(&ts, 2)?;
        let dev = ctx.device();
        // SAFETY: contiguous float16 tensors of the checked shapes, alive past the
        // queueing; the caches share memory with no other argument (checked).
        let (kn, vn, mut kc, mut vc) = unsafe {
            (
                ts[0].borrow::<f16>(dev)?,
                ts[1].borrow::<f16>(dev)?,
                ts[2].borrow::<f16>(dev)?,
                ts[3].borrow::<f16>(dev)?,
            )
        };
        st.queued.note(stream);
        on_stream(ctx, stream, || match &mut st.table {
            Table::Host { append, table } => {
                let targets = st.plan.append_targets(&mut kc, &mut vc);
                append.run(&ctx.dusk, table, &kn, &vn, targets)
            }
            Table::Device { table, sized, .. } => {
                *sized = true;
                st.plan
                    .run_table(&ctx.dusk, table, Some((&kn, &vn)), &mut kc, &mut vc)
            }
        })
        .py_err()
    }

    /// One decode step: `q` (float16 `[batch, num_qo_heads, head_dim]`) over the cache,
    /// the selector's pages, the pruners' kept tokens, attention written to `out` (like
    /// `q`) and, if given, `lse` (float32 `[batch, num_qo_heads]`). Queued on the caller's
    /// stream: no allocation, no sync.
    #[pyo3(signature = (q, k_cache, v_cache, out, lse=None, *, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        py: Python<'_>,
        q: &Bound<'_, PyAny>,
        k_cache: &Bound<'_, PyAny>,
        v_cache: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        lse: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let ctx = &self.ctx;
        let mut guard = self.state()?;
        let st = &mut *guard;
        let stream = resolve_stream(py, ctx.place, stream)?;
        let mut args = vec![
            (q, "q"),
            (k_cache, "k_cache"),
            (v_cache, "v_cache"),
            (out, "out"),
        ];
        if let Some(l) = lse.filter(|l| !l.is_none()) {
            args.push((l, "lse"));
        }
        let ts = tensors(ctx, stream, &args)?;
        let qshape = [st.batch, st.num_q_heads, st.kv.head_dim];
        ts[0].expect(DType::F16, &qshape)?;
        ts[1].expect(DType::F16, &cache_shape(&st.kv))?;
        ts[2].expect(DType::F16, &cache_shape(&st.kv))?;
        ts[3].expect(DType::F16, &qshape)?;
        if let Some(l) = ts.get(4) {
            l.expect(DType::F32, &[st.batch, st.num_q_heads])?;
        }
        check_outputs(&ts, 3)?;
        // SAFETY: every tensor's dtype, shape and layout checked above; they outlive the
        // queueing; the outputs share memory with no input (checked).
        let (qb, mut kb, mut vb, mut ob, mut given) =
            unsafe { borrow_attention_args::<f16>(ctx, &ts)? };
        let lse = match given.as_mut() {
            Some(l) => l,
            None => &mut st.lse,
        };
        st.queued.note(stream);
        on_stream(ctx, stream, || {
            if let Table::Device { table, sized, .. } = &mut st.table {
                if !std::mem::take(sized) {
                    // Without new tokens the sizing launch only reads the table.
                    st.plan
                        .run_table(&ctx.dusk, table, None, &mut kb, &mut vb)?;
                }
            }
            st.plan.step(&ctx.dusk, &qb, &kb, &vb, &mut ob, lse)
        })
        .map_err(|e| to_py_renamed(e, &[("k", "k_cache"), ("v", "v_cache")]))
    }

    /// Tokens attention read in the last step, one per (sequence, KV head) (`batch *
    /// num_kv_heads`, the union over the group; a densely attended sequence's length). A
    /// download: it waits for the step.
    fn budgets(&self) -> PyResult<Vec<i32>> {
        self.state()?.plan.budgets().py_err()
    }

    /// Whether the step is dense attention alone (no selector nor pruner, or every
    /// sequence no longer than `dense_below`).
    #[getter]
    fn is_dense(&self) -> PyResult<bool> {
        Ok(self.state()?.plan.is_dense())
    }

    /// The candidates' row offsets (host ints, `batch * num_kv_heads + 1`): Quest's
    /// selection's (fixed by the plan: each row keeps its budget), or every token's.
    #[getter]
    fn candidate_indptr(&self) -> PyResult<Vec<i32>> {
        Ok(self.state()?.plan.candidate_indptr().to_vec())
    }

    /// int32: Quest's selected positions after the last step (rows at
    /// `candidate_indptr`, ascending within each row); `None` without a selector. The
    /// plan's memory, exported without a copy.
    #[getter]
    fn selection(&self) -> PyResult<Option<Array>> {
        self.export(|s| {
            let b = s.plan.selector()?.sel_indices();
            Some((b.untyped().address(), b.len()))
        })
    }

    /// int32 `[batch * num_kv_heads + 1]`: where each row of attention's lists starts,
    /// after the last step (`None` when the step is dense).
    #[getter]
    fn sel_indptr(&self) -> PyResult<Option<Array>> {
        self.export(|s| {
            let (ip, _) = s.plan.lists()?;
            Some((ip.untyped().address(), ip.len()))
        })
    }

    /// int32: the positions attention read in the last step, ascending within each row
    /// (`sel_indptr[-1]` of them used; `None` when the step is dense).
    #[getter]
    fn sel_indices(&self) -> PyResult<Option<Array>> {
        self.export(|s| {
            let (_, ix) = s.plan.lists()?;
            Some((ix.untyped().address(), ix.len()))
        })
    }
}

/// Double Sparsity's calibration from sample queries `q` (`[samples, num_qo_heads,
/// head_dim]`) and keys `k` (`[samples, num_kv_heads, head_dim]`), float16 or float32 host
/// arrays (NumPy, or a tensor's `.cpu()`): per KV head, the `r` channels with the largest
/// mean `|q_c * k_c|` over the samples and the group's query heads. Returns its JSON text,
/// which `PipelinePlan(select="ds", calibration=...)` takes (save it to reuse it).
///
/// ```python
/// import numpy as np, dusk
/// rng = np.random.default_rng(0)
/// q = rng.standard_normal((32, 8, 64)).astype(np.float16)   # 32 samples, 8 query heads
/// k = rng.standard_normal((32, 2, 64)).astype(np.float16)   # their keys, 2 KV heads
/// cal = dusk.calibrate_ds(q, k, r=16)
/// p = dusk.PipelinePlan("cpu", select="ds", calibration=cal, budget=0.25)
/// ```
#[pyfunction]
#[pyo3(signature = (q, k, *, r=16))]
pub fn calibrate_ds(q: &Bound<'_, PyAny>, k: &Bound<'_, PyAny>, r: usize) -> PyResult<String> {
    let host = |obj: &Bound<'_, PyAny>, name: &'static str| -> PyResult<(Vec<f64>, [usize; 3])> {
        let t = Tensor::new(obj, name, None)?;
        if t.place != Place::Cpu {
            return Err(invalid(
                name,
                "a host array (NumPy, or a tensor's .cpu())",
                t.describe(),
            ));
        }
        t.expect_contiguous()?;
        let dims: [usize; 3] = match &*t.shape {
            [a, b, c] => [*a, *b, *c],
            _ => return Err(invalid(name, "an array of rank 3", t.describe())),
        };
        let n = t.numel();
        // SAFETY: a contiguous host array of `n` elements of `t.dtype`, alive while `t` is.
        let values = unsafe {
            match t.dtype {
                DType::F16 => std::slice::from_raw_parts(t.addr as usize as *const f16, n)
                    .iter()
                    .map(|x| x.to_f64())
                    .collect(),
                DType::F32 => std::slice::from_raw_parts(t.addr as usize as *const f32, n)
                    .iter()
                    .map(|x| *x as f64)
                    .collect(),
                _ => return Err(invalid(name, "float16 or float32", t.describe())),
            }
        };
        Ok((values, dims))
    };
    let (qv, [sq, hq, d]) = host(q, "q")?;
    let (kv, [sk, hkv, dk]) = host(k, "k")?;
    if (sk, dk) != (sq, d) {
        return Err(invalid(
            "k",
            format!("[{sq}, num_kv_heads, {d}] (q's samples and head_dim)"),
            format!("[{sk}, {hkv}, {dk}]"),
        ));
    }
    let cal = DsCalibration::calibrate(&qv, &kv, hq, hkv, d, r)
        .map_err(|e| to_py_renamed(e, &[("num_q_heads", "q"), ("num_kv_heads", "k")]))?;
    Ok(cal.to_json())
}

/// A plan for `table` with what its runs need: the append for the table's batch, the
/// table on the device, a log-sum-exp buffer.
fn planned(
    ctx: &Arc<Ctx>,
    plan: Plan,
    table: &PageTable,
    kv: KvShape,
    num_q_heads: usize,
) -> PyResult<PipeState> {
    let dusk = &ctx.dusk;
    let append = AppendPlan::new(dusk, kv, table.batch(), plan.append_parts()).py_err()?;
    let csr = append.upload_table(dusk, table).py_err()?;
    let lse = ctx
        .device()
        .alloc::<f32>((table.batch() * num_q_heads).max(1))
        .py_err()?;
    settle(ctx)?;
    Ok(PipeState {
        queued: LastStream::new(ctx),
        plan,
        table: Table::Host {
            append: Box::new(append),
            table: csr,
        },
        lse,
        kv,
        batch: table.batch(),
        num_q_heads,
    })
}

fn cache_shape(kv: &KvShape) -> [usize; 4] {
    [kv.num_pages, kv.page_size, kv.num_kv_heads, kv.head_dim]
}
