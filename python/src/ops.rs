//! The Python API: `quantize_k`, the page-table converters, and the plans (`SpgemvPlan`,
//! `PrunePlan`, `AttentionPlan`) in FlashInfer's convention: `plan(...)` on host metadata
//! (validated, uploaded, kernels loaded; may synchronise), then `run(...)` as often as
//! wanted: it checks the tensors it is given, borrows their memory and queues the
//! launches on the caller's stream, allocating nothing and never synchronising.

use crate::context::{context, expect_on, host_i32, parse_device, resolve_stream, Ctx};
use crate::errors::{invalid, OrPy};
use crate::tensor::{expect_disjoint, Array, Place, Tensor};
use dusk_compiler::DType;
use dusk_kernels::attention_ops::{
    AttentionMeta, AttentionMode, AttentionPlan as Attn, AttentionSpec, AttentionTuning,
};
use dusk_kernels::engines::{self, CsrPages, EngineTable};
use dusk_kernels::ops::{QuantizedK, SpgemvPlan as Spgemv};
use dusk_kernels::paged::{KvShape, PageTable, TokenLists};
use dusk_kernels::policies;
use dusk_kernels::prune::{ParamValues, PrunePlan as Prune};
use dusk_kernels::threshold::Policy;
use dusk_runtime::cudarc::driver::sys::CUstream;
use dusk_runtime::{Buffer, Device, Element, Replay, RuntimeError};
use half::{bf16, f16};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PySequence};
use std::sync::{Arc, Mutex};

/// Runs `f` with this thread's launches on `stream` (the GPU), or as it is (the CPU).
pub(crate) fn on_stream<R>(ctx: &Ctx, stream: Option<u64>, f: impl FnOnce() -> R) -> R {
    match stream {
        // SAFETY: `stream` is the caller's (or its framework's current) stream of this
        // device's primary context, which PyTorch and CuPy share with dusk; the plans'
        // own buffers were made ready (synchronised) when they were planned.
        Some(s) => unsafe { ctx.device().with_stream(s as usize as CUstream, f) },
        None => f(),
    }
}

/// Runs `call` (a plan's launches) as one graph launch when the plan has a [`Replay`]
/// (see `Device::replay`), else as it is.
fn replayed<E: From<RuntimeError>>(
    dev: &Device,
    replay: Option<&mut Replay>,
    call: impl FnOnce() -> Result<(), E>,
) -> Result<(), E> {
    match replay {
        Some(r) => dev.replay(r, call),
        None => call(),
    }
}

/// Where `obj` lives, asked cheaply (`__dlpack_device__`), before its stream is known.
fn probe_place(obj: &Bound<'_, PyAny>, name: &'static str) -> PyResult<Place> {
    if let Ok(a) = obj.cast::<Array>() {
        let (t, i) = a
            .call_method0("__dlpack_device__")?
            .extract::<(i32, i32)>()?;
        return Ok(if t == 2 {
            Place::Cuda(i as usize)
        } else {
            Place::Cpu
        });
    }
    if obj.hasattr("__dlpack_device__")? {
        let (t, i): (i32, i32) = obj.call_method0("__dlpack_device__")?.extract()?;
        return match t {
            1 => Ok(Place::Cpu),
            2 => Ok(Place::Cuda(i.max(0) as usize)),
            other => Err(invalid(
                name,
                "a tensor in CPU or CUDA device memory",
                format!("DLPack device type {other}"),
            )),
        };
    }
    // Read the tensor itself: an error names what it lacks.
    Ok(Tensor::new(obj, name, None)?.place)
}

/// The context and stream of a call without a plan, from its first tensor's device.
fn call_context(
    py: Python<'_>,
    first: &Bound<'_, PyAny>,
    name: &'static str,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<(Arc<Ctx>, Option<u64>)> {
    let place = probe_place(first, name)?;
    let ctx = context(place)?;
    let stream = resolve_stream(py, place, stream)?;
    Ok((ctx, stream))
}

/// Reads each `(object, name)` as a tensor on `ctx`'s device.
pub(crate) fn tensors<'py>(
    ctx: &Ctx,
    stream: Option<u64>,
    args: &[(&Bound<'py, PyAny>, &'static str)],
) -> PyResult<Vec<Tensor<'py>>> {
    args.iter()
        .map(|(o, n)| {
            let t = Tensor::new(o, n, stream)?;
            expect_on(&t, ctx.place)?;
            expect_aligned(&t)?;
            Ok(t)
        })
        .collect()
}

/// The alignment the kernels' vector loads and stores need of a GPU tensor's address: 16
/// bytes for data (K and V rows, codes, queries, outputs), the element's for int32 and int64
/// metadata (read one element at a time). A misaligned address would be a fault on the GPU
/// that ends the CUDA context; on the CPU the interpreter needs none.
fn expect_aligned(t: &Tensor) -> PyResult<()> {
    let need = match (t.place, t.dtype) {
        (Place::Cpu, _) => return Ok(()),
        (_, DType::I32 | DType::I64) => t.dtype.size_bytes() as u64,
        _ => 16,
    };
    if t.numel() > 0 && !t.addr.is_multiple_of(need) {
        return Err(invalid(
            t.name,
            format!("a tensor whose data starts at a multiple of {need} bytes"),
            format!("address {:#x} ({})", t.addr, t.describe()),
        ));
    }
    Ok(())
}

/// Outputs (`ts[first_output..]`): writable, and sharing memory with no other tensor of
/// the call.
pub(crate) fn check_outputs(ts: &[Tensor], first_output: usize) -> PyResult<()> {
    for o in &ts[first_output..] {
        o.expect_writable()?;
        expect_disjoint((o, o.numel()), ts.iter().map(|t| (t, t.numel())))?;
    }
    Ok(())
}

/// Quantizes a K cache to 4- or 8-bit codes, per token and head (`scale = (max - min) /
/// 15` or `/ 255`, `zero = min`, both f16; two 4-bit codes a byte, low nibble first), into
/// the caller's tensors:
///
/// - `k`: float16 `[num_pages, page_size, num_kv_heads, head_dim]` (NHD pages, the
///   engine's);
/// - `packed`: uint8 `[num_pages, num_kv_heads, page_size, head_dim * bits / 8]`, dusk's
///   head-major copy: one KV head's page is one contiguous block (its last dimension gives
///   `bits`);
/// - `scale`, `zero`: float16 `[num_pages, num_kv_heads, page_size]`.
///
/// One launch on the caller's stream; nothing is allocated.
#[pyfunction]
#[pyo3(signature = (k, packed, scale, zero, *, stream=None))]
pub fn quantize_k(
    py: Python<'_>,
    k: &Bound<'_, PyAny>,
    packed: &Bound<'_, PyAny>,
    scale: &Bound<'_, PyAny>,
    zero: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let (ctx, stream) = call_context(py, k, "k", stream)?;
    let ts = tensors(
        &ctx,
        stream,
        &[
            (k, "k"),
            (packed, "packed"),
            (scale, "scale"),
            (zero, "zero"),
        ],
    )?;
    let [kt, pt, st, zt] = &ts[..] else {
        unreachable!()
    };
    let &[pages, page_size, heads, d] = kt.expect_rank(
        DType::F16,
        4,
        "[num_pages, page_size, num_kv_heads, head_dim]",
    )?
    else {
        unreachable!()
    };
    kt.expect_contiguous()?;
    let row_bytes = pt.shape.last().copied().unwrap_or(0);
    let bits = if d > 0 && row_bytes * 8 == d * 4 {
        4
    } else if d > 0 && row_bytes == d {
        8
    } else {
        return Err(invalid(
            "packed",
            format!(
                "uint8[{pages}, {page_size}, {heads}, {}] (4 bits) or [.., {d}] (8 bits)",
                d / 2
            ),
            pt.describe(),
        ));
    };
    pt.expect(DType::U8, &[pages, heads, page_size, d * bits / 8])?;
    st.expect(DType::F16, &[pages, heads, page_size])?;
    zt.expect(DType::F16, &[pages, heads, page_size])?;
    check_outputs(&ts, 1)?;
    let kv = KvShape {
        num_pages: pages,
        page_size,
        num_kv_heads: heads,
        head_dim: d,
    };
    let dev = ctx.device();
    // SAFETY: each tensor was checked to be contiguous with the shape borrowed, and lives
    // until this call returns, after the launch has been queued (GPU) or run (CPU).
    let (kb, mut qk) = unsafe {
        (
            kt.borrow::<f16>(dev)?,
            QuantizedK {
                packed: pt.borrow(dev)?,
                scale: st.borrow(dev)?,
                zero: zt.borrow(dev)?,
                kv,
                bits: bits as u32,
            },
        )
    };
    on_stream(&ctx, stream, || ctx.dusk.quantize_k_into(&kb, &mut qk)).py_err()
}

/// The CSR page table's outputs: `kv_indptr` `[batch + 1]`, `kv_page_indices` (at least
/// `batch * max_pages`), `kv_last_page_len` `[batch]`, all int32.
/// An engine's int32 table of rows (`[rows, row_len]`, rows possibly spaced apart: a slice
/// of a larger table): its shape, and the elements it spans from its first.
fn engine_table(t: &Tensor) -> PyResult<(EngineTable, usize)> {
    let row_stride = t.expect_rows(DType::I32)?;
    let (rows, row_len) = (t.shape[0], t.shape[1]);
    let extent = if rows == 0 {
        0
    } else {
        (rows - 1) * row_stride + row_len
    };
    let shape = EngineTable {
        rows,
        row_stride,
        row_len,
    };
    Ok((shape, extent))
}

/// The converters' outputs: writable, and sharing memory with no input (each given with
/// the elements it is read over) and no other output.
fn expect_disjoint_outputs(inputs: &[(&Tensor, usize)], outputs: &[Tensor]) -> PyResult<()> {
    for o in outputs {
        o.expect_writable()?;
        let all = inputs
            .iter()
            .copied()
            .chain(outputs.iter().map(|t| (t, t.numel())));
        expect_disjoint((o, o.numel()), all)?;
    }
    Ok(())
}

fn csr_outputs<'py>(
    ts: &'py [Tensor<'py>],
    dev: &dusk_runtime::Device,
    batch: usize,
    max_pages: usize,
) -> PyResult<CsrPages> {
    let [.., ip, pi, lp] = ts else { unreachable!() };
    ip.expect(DType::I32, &[batch + 1])?;
    let [cap] = pi.expect_rank(DType::I32, 1, "[batch * max_pages]")? else {
        unreachable!()
    };
    if *cap < batch * max_pages {
        return Err(invalid(
            "kv_page_indices",
            format!("int32[{}] or longer (batch x max_pages)", batch * max_pages),
            pi.describe(),
        ));
    }
    pi.expect_contiguous()?;
    lp.expect(DType::I32, &[batch])?;
    // SAFETY: checked shapes; the tensors outlive the launch's queueing (see the callers).
    unsafe {
        Ok(CsrPages {
            kv_indptr: ip.borrow(dev)?,
            kv_page_indices: pi.borrow(dev)?,
            kv_last_page_len: lp.borrow(dev)?,
        })
    }
}

fn int32_index(t: &Tensor, what: &str) -> PyResult<usize> {
    if t.dtype != DType::I32 {
        return Err(invalid(
            t.name,
            format!(
                "an int32 tensor ({what}; convert with .to(torch.int32) or .astype(numpy.int32))"
            ),
            t.describe(),
        ));
    }
    let [n] = t.expect_rank(DType::I32, 1, what)? else {
        unreachable!()
    };
    t.expect_contiguous()?;
    Ok(*n)
}

/// vLLM's paged metadata to dusk's CSR page table, on the device (graph-safe: fixed-size
/// outputs, no host sync):
///
/// - `block_table`: int32 `[rows, max_pages]` (rows may be spaced apart: a slice of
///   vLLM's persistent table), row `b` the pages of sequence `b`;
/// - `seq_lens`: int32 `[batch]` (batch <= rows), tokens per sequence;
/// - outputs: `kv_indptr` int32 `[batch + 1]`, `kv_page_indices` int32 `[batch *
///   max_pages]` (entries past `kv_indptr[batch]` untouched), `kv_last_page_len` int32
///   `[batch]`.
///
/// `num_pages`: the cache's pages (ids are clamped into range; a sequence longer than
/// `max_pages` pages is cut; a bad table gives a wrong answer, never a bad access).
#[pyfunction]
#[pyo3(signature = (block_table, seq_lens, kv_indptr, kv_page_indices, kv_last_page_len, *, page_size, num_pages, stream=None))]
#[allow(clippy::too_many_arguments)]
pub fn vllm_to_csr(
    py: Python<'_>,
    block_table: &Bound<'_, PyAny>,
    seq_lens: &Bound<'_, PyAny>,
    kv_indptr: &Bound<'_, PyAny>,
    kv_page_indices: &Bound<'_, PyAny>,
    kv_last_page_len: &Bound<'_, PyAny>,
    page_size: usize,
    num_pages: usize,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let (ctx, stream) = call_context(py, block_table, "block_table", stream)?;
    let ts = tensors(
        &ctx,
        stream,
        &[
            (block_table, "block_table"),
            (seq_lens, "seq_lens"),
            (kv_indptr, "kv_indptr"),
            (kv_page_indices, "kv_page_indices"),
            (kv_last_page_len, "kv_last_page_len"),
        ],
    )?;
    let (bt, sl) = (&ts[0], &ts[1]);
    let (shape, extent) = engine_table(bt)?;
    let batch = int32_index(sl, "[batch], tokens per sequence")?;
    expect_disjoint_outputs(&[(bt, extent), (sl, batch)], &ts[2..])?;
    let dev = ctx.device();
    let mut out = csr_outputs(&ts, dev, batch, shape.row_len)?;
    // SAFETY: the table spans `extent` elements (checked layout); seq_lens is contiguous.
    let (table, lens) = unsafe { (bt.borrow_n::<i32>(dev, extent)?, sl.borrow::<i32>(dev)?) };
    on_stream(&ctx, stream, || {
        engines::vllm_to_csr(
            &ctx.dusk, &table, shape, &lens, page_size, num_pages, &mut out,
        )
    })
    .py_err()
}

/// SGLang's paged metadata to dusk's CSR page table, on the device (graph-safe):
///
/// - `req_to_token`: int32 `[pool_rows, max_context]` (rows may be spaced apart), the KV
///   slot of each token of each request-pool row;
/// - `req_pool_indices`: int32 `[batch]`, the pool row of each sequence;
/// - `seq_lens`: int32 `[batch]`;
/// - outputs as [`vllm_to_csr`]'s, with `max_pages = max_context // page_size`.
///
/// Pages hold `page_size` consecutive slots (1, SGLang's default, makes each token a page):
/// page `j` of a sequence is `req_to_token[row, j * page_size] // page_size`. A pool row
/// outside the pool makes an empty sequence.
#[pyfunction]
#[pyo3(signature = (req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_page_indices, kv_last_page_len, *, num_pages, page_size=1, stream=None))]
#[allow(clippy::too_many_arguments)]
pub fn sglang_to_csr(
    py: Python<'_>,
    req_to_token: &Bound<'_, PyAny>,
    req_pool_indices: &Bound<'_, PyAny>,
    seq_lens: &Bound<'_, PyAny>,
    kv_indptr: &Bound<'_, PyAny>,
    kv_page_indices: &Bound<'_, PyAny>,
    kv_last_page_len: &Bound<'_, PyAny>,
    num_pages: usize,
    page_size: usize,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let (ctx, stream) = call_context(py, req_to_token, "req_to_token", stream)?;
    let ts = tensors(
        &ctx,
        stream,
        &[
            (req_to_token, "req_to_token"),
            (req_pool_indices, "req_pool_indices"),
            (seq_lens, "seq_lens"),
            (kv_indptr, "kv_indptr"),
            (kv_page_indices, "kv_page_indices"),
            (kv_last_page_len, "kv_last_page_len"),
        ],
    )?;
    let (rt, pi, sl) = (&ts[0], &ts[1], &ts[2]);
    let (shape, extent) = engine_table(rt)?;
    let batch = int32_index(sl, "[batch], tokens per sequence")?;
    let pool = int32_index(pi, "[batch], the pool row of each sequence")?;
    if pool != batch {
        return Err(invalid(
            "req_pool_indices",
            format!("int32[{batch}] (one per sequence of seq_lens)"),
            pi.describe(),
        ));
    }
    if page_size == 0 {
        return Err(invalid("page_size", "a power of two", 0));
    }
    let max_pages = shape.row_len / page_size;
    expect_disjoint_outputs(&[(rt, extent), (pi, batch), (sl, batch)], &ts[3..])?;
    let dev = ctx.device();
    let mut out = csr_outputs(&ts, dev, batch, max_pages)?;
    // SAFETY: as in `vllm_to_csr`.
    let (table, pool_b, lens) = unsafe {
        (
            rt.borrow_n::<i32>(dev, extent)?,
            pi.borrow::<i32>(dev)?,
            sl.borrow::<i32>(dev)?,
        )
    };
    on_stream(&ctx, stream, || {
        engines::sglang_to_csr(
            &ctx.dusk, &table, shape, &pool_b, &lens, page_size, num_pages, &mut out,
        )
    })
    .py_err()
}

/// Host metadata to a page table.
pub(crate) fn page_table(
    kv_indptr: &Bound<'_, PyAny>,
    kv_page_indices: &Bound<'_, PyAny>,
    kv_last_page_len: &Bound<'_, PyAny>,
) -> PyResult<PageTable> {
    Ok(PageTable {
        kv_indptr: host_i32(kv_indptr, "kv_indptr")?,
        kv_page_indices: host_i32(kv_page_indices, "kv_page_indices")?,
        kv_last_page_len: host_i32(kv_last_page_len, "kv_last_page_len")?,
    })
}

fn token_lists(
    indptr: &Bound<'_, PyAny>,
    indices: &Bound<'_, PyAny>,
    names: (&'static str, &'static str),
) -> PyResult<TokenLists> {
    Ok(TokenLists {
        indptr: host_i32(indptr, names.0)?,
        indices: host_i32(indices, names.1)?,
    })
}

pub(crate) fn no_plan() -> PyErr {
    crate::errors::simple(
        "DuskError",
        "run before plan: call plan(...) first".to_string(),
    )
}

/// Makes plan-time buffers (allocated and zeroed on the device's own stream) ready for
/// runs on any stream.
pub(crate) fn settle(ctx: &Ctx) -> PyResult<()> {
    ctx.device().synchronize().py_err()
}

/// Orders the device's own stream, where a plan's buffers are freed and new ones uploaded,
/// after the work queued so far on the caller's current stream
/// (`Device::order_after_launches`): a run still queued there never reads memory handed out
/// again (a plan per step, as FlashInfer's wrappers are used). Runs queued on another
/// stream given as `stream=` must be finished (or the plan kept) before planning again.
pub(crate) fn after_callers_work(py: Python<'_>, ctx: &Ctx) -> PyResult<()> {
    let stream = resolve_stream(py, ctx.place, None)?;
    on_stream(ctx, stream, || ctx.device().order_after_launches()).py_err()
}

/// Puts `new` in `slot` and drops the state it replaces after the caller's queued work
/// ([`after_callers_work`]).
pub(crate) fn replace_state<T>(
    py: Python<'_>,
    ctx: &Ctx,
    slot: &mut Option<T>,
    new: T,
) -> PyResult<()> {
    let old = slot.replace(new);
    if old.is_some() {
        after_callers_work(py, ctx)?;
    }
    drop(old);
    Ok(())
}

/// The stream a plan's runs were last queued on, kept as the first field of the plan's
/// state so that it drops first: dropping it orders the device's own stream after that
/// stream (`Device::order_after_launches`), and the state's buffers, dropped next, are
/// freed there only after the runs still queued (a plan dropped by Python right after its
/// run, or one whose runs went to a `stream=` of their own). Errors are ignored: a drop
/// cannot raise.
pub(crate) struct LastStream {
    ctx: Arc<Ctx>,
    stream: std::sync::atomic::AtomicU64,
}

impl LastStream {
    /// No stream used yet.
    const NONE: u64 = u64::MAX;

    pub(crate) fn new(ctx: &Arc<Ctx>) -> LastStream {
        LastStream {
            ctx: ctx.clone(),
            stream: std::sync::atomic::AtomicU64::new(Self::NONE),
        }
    }

    /// Records the stream a run is queued on (`None`: the CPU).
    pub(crate) fn note(&self, stream: Option<u64>) {
        if let Some(s) = stream {
            self.stream.store(s, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Drop for LastStream {
    fn drop(&mut self) {
        let s = *self.stream.get_mut();
        if s != Self::NONE {
            let _ = on_stream(&self.ctx, Some(s), || {
                self.ctx.device().order_after_launches()
            });
        }
    }
}

/// The quantized SpGEMV: estimated scores `q . dequant(k)` of each query head against its
/// KV head's candidate tokens, reading the INT4 (or INT8) codes of [`quantize_k`].
///
/// ```python
/// s = dusk.SpgemvPlan("cpu")
/// s.plan(kv_indptr, kv_page_indices, kv_last_page_len, cand_indptr, cand_indices,
///        num_qo_heads=8, num_kv_heads=2, head_dim=128, num_pages=64)
/// s.run(q, packed, scale, zero, scores)
/// ```
#[pyclass(module = "dusk", name = "SpgemvPlan")]
pub struct SpgemvPlanPy {
    ctx: Arc<Ctx>,
    state: Option<SpgemvState>,
}

struct SpgemvState {
    /// First: drops before the buffers (see [`LastStream`]).
    queued: LastStream,
    plan: Spgemv,
    kv: KvShape,
    batch: usize,
    num_q_heads: usize,
    bits: u32,
    /// The graph eager runs submit (`graph_launch`).
    replay: Option<Replay>,
}

#[pymethods]
impl SpgemvPlanPy {
    /// A plan for `device` (`"cpu"`, `"cuda"`, `"cuda:N"`, a `torch.device`).
    #[new]
    fn new(device: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(SpgemvPlanPy {
            ctx: context(parse_device(device)?)?,
            state: None,
        })
    }

    /// Validates and uploads the page table (int32 CSR: `kv_indptr [batch + 1]`,
    /// `kv_page_indices`, `kv_last_page_len [batch]`) and the candidates (CSR token lists,
    /// one row per (sequence, KV head), positions ascending), and loads the kernels. Host
    /// arrays (or int sequences); may synchronise. `graph_launch=True`: as
    /// `AttentionPlan.plan`'s (a run is two kernels: the query's preparation and the
    /// scores); off by default, since its two plain launches cost the host less than one
    /// graph launch (on an H200 machine 8.7-10.4 us a run against 9.3-12.7,
    /// benches/results/python_decode_run/host_overhead_a52908a*.json).
    #[pyo3(signature = (kv_indptr, kv_page_indices, kv_last_page_len, cand_indptr, cand_indices, *, num_qo_heads, num_kv_heads, head_dim, num_pages, page_size=16, bits=4, graph_launch=false))]
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &mut self,
        py: Python<'_>,
        kv_indptr: &Bound<'_, PyAny>,
        kv_page_indices: &Bound<'_, PyAny>,
        kv_last_page_len: &Bound<'_, PyAny>,
        cand_indptr: &Bound<'_, PyAny>,
        cand_indices: &Bound<'_, PyAny>,
        num_qo_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        num_pages: usize,
        page_size: usize,
        bits: u32,
        graph_launch: bool,
    ) -> PyResult<()> {
        let table = page_table(kv_indptr, kv_page_indices, kv_last_page_len)?;
        let cand = token_lists(cand_indptr, cand_indices, ("cand_indptr", "cand_indices"))?;
        let kv = KvShape {
            num_pages,
            page_size,
            num_kv_heads,
            head_dim,
        };
        let plan = Spgemv::new(&self.ctx.dusk, kv, num_qo_heads, bits, &table, &cand).py_err()?;
        settle(&self.ctx)?;
        replace_state(
            py,
            &self.ctx,
            &mut self.state,
            SpgemvState {
                queued: LastStream::new(&self.ctx),
                plan,
                kv,
                batch: table.batch(),
                num_q_heads: num_qo_heads,
                bits,
                replay: graph_launch.then(Replay::default),
            },
        )?;
        Ok(())
    }

    /// Length of the float32 `scores` a run writes: the candidates times the group
    /// (query heads per KV head). Row `r`'s block starts at `cand_indptr[r] * group`, one
    /// run of the row's candidates per query head of the group.
    #[getter]
    fn num_scores(&self) -> PyResult<usize> {
        Ok(self.state.as_ref().ok_or_else(no_plan)?.plan.num_scores())
    }

    #[getter]
    fn device(&self) -> String {
        self.ctx.place.describe()
    }

    /// Scores `q` (float16 `[batch, num_qo_heads, head_dim]`) against the candidates of
    /// the quantized cache (`packed`, `scale`, `zero` as [`quantize_k`] writes them) into
    /// `scores` (float32 `[num_scores]`). Queues the launches on the caller's stream (as
    /// one submission with `graph_launch`): no allocation, no sync.
    #[pyo3(signature = (q, packed, scale, zero, scores, *, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        py: Python<'_>,
        q: &Bound<'_, PyAny>,
        packed: &Bound<'_, PyAny>,
        scale: &Bound<'_, PyAny>,
        zero: &Bound<'_, PyAny>,
        scores: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let st = self.state.as_mut().ok_or_else(no_plan)?;
        let ctx = &self.ctx;
        let stream = resolve_stream(py, ctx.place, stream)?;
        let ts = tensors(
            ctx,
            stream,
            &[
                (q, "q"),
                (packed, "packed"),
                (scale, "scale"),
                (zero, "zero"),
                (scores, "scores"),
            ],
        )?;
        let [qt, pt, sct, zt, out] = &ts[..] else {
            unreachable!()
        };
        let kv = st.kv;
        qt.expect(DType::F16, &[st.batch, st.num_q_heads, kv.head_dim])?;
        // dusk's head-major copy (see `quantize_k`).
        let rows = [kv.num_pages, kv.num_kv_heads, kv.page_size];
        pt.expect(
            DType::U8,
            &[
                rows[0],
                rows[1],
                rows[2],
                kv.head_dim * st.bits as usize / 8,
            ],
        )?;
        sct.expect(DType::F16, &rows)?;
        zt.expect(DType::F16, &rows)?;
        out.expect(DType::F32, &[st.plan.num_scores()])?;
        check_outputs(&ts, 4)?;
        let dev = ctx.device();
        // SAFETY: shapes and layouts checked above; the tensors outlive the queueing.
        let (qb, qk, mut sb) = unsafe {
            (
                qt.borrow::<f16>(dev)?,
                QuantizedK {
                    packed: pt.borrow(dev)?,
                    scale: sct.borrow(dev)?,
                    zero: zt.borrow(dev)?,
                    kv,
                    bits: st.bits,
                },
                out.borrow::<f32>(dev)?,
            )
        };
        st.queued.note(stream);
        on_stream(ctx, stream, || {
            replayed(dev, st.replay.as_mut(), || {
                st.plan.run(&ctx.dusk, &qb, &qk, &mut sb)
            })
        })
        .py_err()
    }
}

/// The stock policies by name.
pub(crate) fn policy(name: &str) -> PyResult<&'static Policy> {
    Ok(match name {
        "top_p" => &policies::top_p::POLICY,
        "top_k" => &policies::top_k::POLICY,
        "ratio_to_max" => &policies::ratio_to_max::POLICY,
        "top_p_bounded" => &policies::top_p_bounded::POLICY,
        other => {
            return Err(invalid(
                "policy",
                "one of \"top_p\", \"top_k\", \"ratio_to_max\", \"top_p_bounded\"",
                format!("{other:?}"),
            ))
        }
    })
}

/// A parameter's values: a number (every query row), or one per query row (a sequence or a
/// host array).
fn param_values(v: &Bound<'_, PyAny>, name: &str) -> PyResult<ParamValues> {
    if let Ok(x) = v.extract::<f64>() {
        return Ok(ParamValues::Uniform(x));
    }
    let list = if v.hasattr("tolist")? {
        v.call_method0("tolist")?
    } else {
        v.clone()
    };
    if let Ok(seq) = list.cast::<PySequence>() {
        if let Ok(xs) = seq.extract::<Vec<f64>>() {
            return Ok(ParamValues::PerRow(xs));
        }
    }
    Err(invalid(
        "params",
        format!("a number or one number per query row for `{name}`"),
        crate::tensor::type_name(v),
    ))
}

/// `params`: a dict by name, or a sequence in the policy's order, of numbers or per-row
/// sequences.
pub(crate) fn parse_params(
    p: &Policy,
    params: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<ParamValues>> {
    let names: Vec<&str> = p.params.iter().map(|q| q.name).collect();
    let expected = || format!("{{{}}} for policy `{}`", names.join(", "), p.name);
    let Some(params) = params.filter(|x| !x.is_none()) else {
        if names.is_empty() {
            return Ok(vec![]);
        }
        return Err(invalid("params", expected(), "none"));
    };
    if let Ok(d) = params.cast::<PyDict>() {
        for k in d.keys() {
            let k: String = k.extract()?;
            if !names.contains(&k.as_str()) {
                return Err(invalid("params", expected(), format!("a value for {k:?}")));
            }
        }
        return names
            .iter()
            .map(|n| match d.get_item(n)? {
                Some(v) => param_values(&v, n),
                None => Err(invalid("params", expected(), format!("no value for {n:?}"))),
            })
            .collect();
    }
    if let Ok(x) = params.extract::<f64>() {
        if names.len() == 1 {
            return Ok(vec![ParamValues::Uniform(x)]);
        }
    }
    let seq = params
        .cast::<PySequence>()
        .map_err(|_| invalid("params", expected(), crate::tensor::type_name(params)))?;
    if seq.len()? != names.len() {
        return Err(invalid(
            "params",
            expected(),
            format!("{} values", seq.len()?),
        ));
    }
    names
        .iter()
        .enumerate()
        .map(|(i, n)| param_values(&seq.get_item(i)?, n))
        .collect()
}

struct PruneState {
    /// First: drops before the buffers (see [`LastStream`]).
    queued: LastStream,
    plan: Prune,
    policy: &'static Policy,
    rows: usize,
    group: usize,
    nnz: usize,
}

/// The fused threshold search: per query row, the softmax of the estimated scores and the
/// fewest heaviest candidates the policy keeps (`top_p`, `top_k`, `ratio_to_max`,
/// `top_p_bounded`), written as CSR token lists (ascending positions; a GQA group's rows
/// get the union of its heads' sets).
///
/// ```python
/// p = dusk.PrunePlan("cpu")
/// p.plan(cand_indptr, cand_indices, policy="top_p", params={"p": 0.9}, group=4, sm_scale=0.088)
/// p.run(scores)
/// kept = numpy.from_dlpack(p.sel_indices)[: numpy.from_dlpack(p.sel_indptr)[-1]]
/// ```
///
/// The outputs are the plan's own memory, exported without a copy (`dusk.Array`: DLPack,
/// and `__cuda_array_interface__` on the GPU): a run rewrites them in place.
#[pyclass(module = "dusk", name = "PrunePlan")]
pub struct PrunePlanPy {
    ctx: Arc<Ctx>,
    state: Option<Arc<Mutex<PruneState>>>,
}

impl PrunePlanPy {
    fn state(&self) -> PyResult<&Arc<Mutex<PruneState>>> {
        self.state.as_ref().ok_or_else(no_plan)
    }

    fn export(&self, pick: impl Fn(&PruneState) -> (u64, usize), dtype: DType) -> PyResult<Array> {
        let st = self.state()?;
        let (addr, len) = pick(&st.lock().unwrap_or_else(|e| e.into_inner()));
        Ok(Array::new(
            st.clone(),
            addr,
            vec![len],
            dtype,
            self.ctx.place,
        ))
    }
}

#[pymethods]
impl PrunePlanPy {
    #[new]
    fn new(device: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(PrunePlanPy {
            ctx: context(parse_device(device)?)?,
            state: None,
        })
    }

    /// Plans `policy` over the candidates (CSR token lists, one row per (sequence, KV
    /// head), positions ascending: the rows `SpgemvPlan` scored) for `group` query heads a
    /// row and softmax scale `sm_scale` (usually `1 / sqrt(head_dim)`). `params`: the
    /// policy's parameters, `{"p": 0.9}` (or `[0.9]`), each a number or one number per
    /// query row (`rows * group`, row-major). Host arrays; may synchronise.
    #[pyo3(signature = (cand_indptr, cand_indices, *, policy="top_p", params=None, group=1, sm_scale=1.0))]
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &mut self,
        py: Python<'_>,
        cand_indptr: &Bound<'_, PyAny>,
        cand_indices: &Bound<'_, PyAny>,
        policy: &str,
        params: Option<&Bound<'_, PyAny>>,
        group: usize,
        sm_scale: f32,
    ) -> PyResult<()> {
        let pol = self::policy(policy)?;
        let values = parse_params(pol, params)?;
        let cand = token_lists(cand_indptr, cand_indices, ("cand_indptr", "cand_indices"))?;
        let plan = Prune::new(&self.ctx.dusk, pol, &cand, group, sm_scale, &values)
            .map_err(|e| crate::errors::to_py_renamed(e, &[("scale", "sm_scale")]))?;
        settle(&self.ctx)?;
        replace_state(
            py,
            &self.ctx,
            &mut self.state,
            Arc::new(Mutex::new(PruneState {
                queued: LastStream::new(&self.ctx),
                plan,
                policy: pol,
                rows: cand.rows(),
                group,
                nnz: cand.indices.len(),
            })),
        )?;
        Ok(())
    }

    /// Replaces the policy's parameters (checked first; a host upload between runs).
    fn set_params(&self, params: &Bound<'_, PyAny>) -> PyResult<()> {
        let st = self.state()?;
        let mut st = st.lock().unwrap_or_else(|e| e.into_inner());
        let values = parse_params(st.policy, Some(params))?;
        st.plan.set_params(&self.ctx.dusk, &values).py_err()?;
        settle(&self.ctx)
    }

    /// Scores the search reads: candidates times the group.
    #[getter]
    fn num_scores(&self) -> PyResult<usize> {
        let st = self.state()?;
        let st = st.lock().unwrap_or_else(|e| e.into_inner());
        Ok(st.nnz * st.group)
    }

    #[getter]
    fn device(&self) -> String {
        self.ctx.place.describe()
    }

    /// Searches every query row of `scores` (float32, at least `num_scores`, laid out as
    /// `SpgemvPlan` writes them) and writes the kept lists. One launch on the caller's
    /// stream: no allocation, no sync.
    #[pyo3(signature = (scores, *, stream=None))]
    fn run(
        &self,
        py: Python<'_>,
        scores: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let st = self.state()?;
        let ctx = &self.ctx;
        let stream = resolve_stream(py, ctx.place, stream)?;
        let ts = tensors(ctx, stream, &[(scores, "scores")])?;
        let t = &ts[0];
        let [n] = t.expect_rank(DType::F32, 1, "[num_scores]")? else {
            unreachable!()
        };
        t.expect_contiguous()?;
        let mut st = st.lock().unwrap_or_else(|e| e.into_inner());
        let need = st.nnz * st.group;
        if *n < need {
            return Err(invalid(
                "scores",
                format!("float32[{need}] or longer (num_scores)"),
                t.describe(),
            ));
        }
        // SAFETY: a contiguous float32 tensor of `n` elements, alive past the queueing;
        // the plan's outputs are its own memory, which no input can be.
        let b = unsafe { t.borrow::<f32>(ctx.device())? };
        st.queued.note(stream);
        on_stream(ctx, stream, || st.plan.run(&ctx.dusk, &b)).py_err()
    }

    /// As `run`, with the kept lists written to the caller's int32 tensors on the plan's
    /// device instead of the plan's own: `sel_indptr` `[rows + 1]` and `sel_indices` (room
    /// for every candidate: at least `max(nnz, 1)`), e.g. the device lists an
    /// `AttentionPlan` planned with `device_lists=True` reads, so that no copy lies between
    /// the pruner and attention. Budgets, kept mass and flags still go to the plan's
    /// outputs. One launch on the caller's stream: no allocation, no sync.
    #[pyo3(signature = (scores, sel_indptr, sel_indices, *, stream=None))]
    fn run_into(
        &self,
        py: Python<'_>,
        scores: &Bound<'_, PyAny>,
        sel_indptr: &Bound<'_, PyAny>,
        sel_indices: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let st = self.state()?;
        let ctx = &self.ctx;
        let stream = resolve_stream(py, ctx.place, stream)?;
        let ts = tensors(
            ctx,
            stream,
            &[
                (scores, "scores"),
                (sel_indptr, "sel_indptr"),
                (sel_indices, "sel_indices"),
            ],
        )?;
        let [t, ip, ix] = &ts[..] else { unreachable!() };
        let [n] = t.expect_rank(DType::F32, 1, "[num_scores]")? else {
            unreachable!()
        };
        t.expect_contiguous()?;
        let mut st = st.lock().unwrap_or_else(|e| e.into_inner());
        let need = st.nnz * st.group;
        if *n < need {
            return Err(invalid(
                "scores",
                format!("float32[{need}] or longer (num_scores)"),
                t.describe(),
            ));
        }
        ip.expect(DType::I32, &[st.rows + 1])?;
        let room = st.nnz.max(1);
        let [cap] = ix.expect_rank(DType::I32, 1, "[capacity]")? else {
            unreachable!()
        };
        if *cap < room {
            return Err(invalid(
                "sel_indices",
                format!("int32[{room}] or longer (every candidate)"),
                ix.describe(),
            ));
        }
        ix.expect_contiguous()?;
        check_outputs(&ts, 1)?;
        let dev = ctx.device();
        // SAFETY: contiguous tensors of the checked types and lengths, alive past the
        // queueing; the outputs share memory with no input or each other (checked).
        let (b, mut a, mut c) = unsafe {
            (
                t.borrow::<f32>(dev)?,
                ip.borrow::<i32>(dev)?,
                ix.borrow::<i32>(dev)?,
            )
        };
        st.queued.note(stream);
        on_stream(ctx, stream, || {
            st.plan.run_into(&ctx.dusk, &b, &mut a, &mut c)
        })
        .py_err()
    }

    /// int32 `[rows + 1]`: where each candidate row's kept positions start.
    #[getter]
    fn sel_indptr(&self) -> PyResult<Array> {
        self.export(
            |s| (s.plan.sel_indptr().untyped().address(), s.rows + 1),
            DType::I32,
        )
    }

    /// int32 `[max(nnz, 1)]`: the kept positions, ascending within each row (capacity:
    /// every candidate; `sel_indptr[rows]` of them are used).
    #[getter]
    fn sel_indices(&self) -> PyResult<Array> {
        self.export(
            |s| {
                let b = s.plan.sel_indices();
                (b.untyped().address(), b.len())
            },
            DType::I32,
        )
    }

    /// int32 `[rows]`: kept candidates per row (the union over the group).
    #[getter]
    fn budgets(&self) -> PyResult<Array> {
        self.export(
            |s| (s.plan.budgets().untyped().address(), s.rows),
            DType::I32,
        )
    }

    /// float32 `[rows * group]`: the weight each query row kept.
    #[getter]
    fn kept_mass(&self) -> PyResult<Array> {
        self.export(
            |s| (s.plan.kept_mass().untyped().address(), s.rows * s.group),
            DType::F32,
        )
    }

    /// int32 `[rows * group]`: 1 where a query row's scores held NaN or infinity (it keeps
    /// every candidate).
    #[getter]
    fn flags(&self) -> PyResult<Array> {
        self.export(
            |s| (s.plan.flags().untyped().address(), s.rows * s.group),
            DType::I32,
        )
    }
}

struct AttentionState {
    /// First: drops before the buffers (see [`LastStream`]).
    queued: LastStream,
    plan: Attn,
    meta: AttentionMeta,
    spec: AttentionSpec,
    /// The log-sum-exp a run writes when the caller gives none.
    lse: Buffer<f32>,
    /// The graph eager runs submit (`graph_launch`).
    replay: Option<Replay>,
    /// Device tensors the metadata borrows (a device page table, device lists): their
    /// objects and capsules, kept alive.
    _borrowed: Vec<Py<PyAny>>,
}

/// Varlen paged decode attention: each query head over every token of its sequence
/// (`mode="dense"`), over its own token list (`"head"`), or over its KV head's list shared
/// by the group (`"group"`: K and V read once for the group), split into chunks and merged
/// (flash-decoding); out and the log-sum-exp of each query row.
///
/// ```python
/// a = dusk.AttentionPlan("cuda")
/// a.plan(kv_indptr, kv_page_indices, kv_last_page_len, num_qo_heads=32, num_kv_heads=8,
///        head_dim=128, page_size=16, num_pages=k_cache.shape[0])
/// a.run(q, k_cache, v_cache, out)
/// ```
#[pyclass(module = "dusk", name = "AttentionPlan")]
pub struct AttentionPlanPy {
    ctx: Arc<Ctx>,
    state: Option<AttentionState>,
}

fn parse_mode(mode: &str) -> PyResult<AttentionMode> {
    Ok(match mode {
        "dense" => AttentionMode::Dense,
        "head" => AttentionMode::HeadVarlen,
        "group" => AttentionMode::GroupVarlen,
        other => {
            return Err(invalid(
                "mode",
                "\"dense\", \"head\" (a list per query head) or \"group\" (a list per KV head)",
                format!("{other:?}"),
            ))
        }
    })
}

fn parse_dtype(dtype: &Bound<'_, PyAny>) -> PyResult<DType> {
    let s = dtype.str()?.to_string();
    match s.trim_start_matches("torch.") {
        "float16" | "half" => Ok(DType::F16),
        "bfloat16" => Ok(DType::BF16),
        other => Err(invalid(
            "dtype",
            "\"float16\" or \"bfloat16\"",
            format!("{other:?}"),
        )),
    }
}

/// Reads int32 metadata tensors on `ctx`'s device (rank 1, contiguous) for a plan to
/// borrow.
pub(crate) fn device_i32s<'py>(
    ctx: &Ctx,
    args: &[(&Bound<'py, PyAny>, &'static str)],
) -> PyResult<Vec<Tensor<'py>>> {
    let ts = tensors(ctx, None, args)?;
    for t in &ts {
        t.expect_rank(DType::I32, 1, "int32 entries")?;
        t.expect_contiguous()?;
    }
    Ok(ts)
}

#[pymethods]
impl AttentionPlanPy {
    #[new]
    fn new(device: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(AttentionPlanPy {
            ctx: context(parse_device(device)?)?,
            state: None,
        })
    }

    /// Plans attention over a paged cache (`[num_pages, page_size, num_kv_heads,
    /// head_dim]` K and V, NHD) whose sequences' pages the int32 CSR metadata gives.
    ///
    /// By default the page table is host metadata, validated and copied now. With
    /// `device_table=True` it is three int32 tensors on the plan's device (`kv_indptr`
    /// `[batch + 1]`, `kv_page_indices` of any capacity, `kv_last_page_len` `[batch]`,
    /// e.g. what `vllm_to_csr` writes each step) that each run reads as they are then,
    /// never seen by the host: their memory is borrowed, not copied, and must stay valid;
    /// the kernels clamp what they read of them (a bad table gives a wrong answer, never an
    /// access outside the cache), so a captured step can convert the engine's table and
    /// attend with no host sync. `max_tokens` (the longest sequence a run may see; longer
    /// ones are cut) is then required.
    ///
    /// `mode`: `"dense"`, `"head"` or `"group"`. In the list modes `sel_indptr` and
    /// `sel_indices` give the token positions (CSR, one row per (sequence, query head) in
    /// `"head"`, per (sequence, KV head) in `"group"`, ascending): host lists, validated
    /// and copied now; or, with `device_lists=True` (required with a device table), tensors
    /// on the plan's device whose contents each run reads as they are then (what the
    /// pruner writes on the device; borrowed as the device table is; `max_tokens`, the
    /// longest row a run may see, is then required). `max_tokens` defaults to the longest
    /// sequence (dense) or list. `sm_scale` defaults to `1 / sqrt(head_dim)`.
    ///
    /// `fused_merge=True`: the chunks of a row are merged by the split's last program to
    /// finish one, so a run is one kernel instead of two; it costs GPU time at small
    /// batches (batch 1 GQA 8k: 30.0 us against 19.2 on an H100,
    /// benches/results/varlen_attention_run/89a5a91_sweep.json).
    ///
    /// `graph_launch=True` (the default): an eager run (outside a stream capture) submits
    /// its two kernels as one CUDA graph launch, recorded at the first run and patched with
    /// each run's tensors, rather than launching them one by one (the merge's launch, which
    /// lets it start early behind the split, costs the host the most): on an H200 machine
    /// 6.0-6.5 us a run at batch 1 against 11.5-12.5, the GPU time unchanged
    /// (python/benches/host_overhead.py, benches/results/python_decode_run/). Under a
    /// capture the kernels are launched as they are, so the caller's graph records them.
    /// May synchronise.
    #[pyo3(signature = (kv_indptr, kv_page_indices, kv_last_page_len, *, num_qo_heads, num_kv_heads, head_dim, page_size, num_pages, mode="dense", sel_indptr=None, sel_indices=None, device_lists=false, device_table=false, max_tokens=None, sm_scale=None, dtype=None, fused_merge=false, graph_launch=true))]
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
        page_size: usize,
        num_pages: usize,
        mode: &str,
        sel_indptr: Option<&Bound<'_, PyAny>>,
        sel_indices: Option<&Bound<'_, PyAny>>,
        device_lists: bool,
        device_table: bool,
        max_tokens: Option<usize>,
        sm_scale: Option<f32>,
        dtype: Option<&Bound<'_, PyAny>>,
        fused_merge: bool,
        graph_launch: bool,
    ) -> PyResult<()> {
        let ctx = self.ctx.clone();
        let mode = parse_mode(mode)?;
        let tune = |t: &mut AttentionTuning| t.fused_merge = fused_merge;
        let dtype = match dtype {
            Some(d) if !d.is_none() => parse_dtype(d)?,
            _ => DType::F16,
        };
        let kv = KvShape {
            num_pages,
            page_size,
            num_kv_heads,
            head_dim,
        };
        let lists = match (
            sel_indptr.filter(|x| !x.is_none()),
            sel_indices.filter(|x| !x.is_none()),
        ) {
            (Some(ip), Some(ix)) => Some((ip, ix)),
            (None, None) => None,
            _ => return Err(invalid("sel_indices", "both lists or neither", "one")),
        };
        match (mode, lists.is_some()) {
            (AttentionMode::Dense, true) => {
                return Err(invalid(
                    "sel_indptr",
                    "no token lists in dense mode",
                    "lists",
                ))
            }
            (m, false) if m != AttentionMode::Dense => {
                return Err(invalid(
                    "sel_indptr",
                    format!("token lists (sel_indptr and sel_indices) in {m:?} mode"),
                    "none",
                ))
            }
            _ => {}
        }
        let required = |what: &str| {
            max_tokens.ok_or_else(|| {
                invalid(
                    "max_tokens",
                    format!(
                        "the longest {what} a run may see (required with {what}s on the device)"
                    ),
                    "none",
                )
            })
        };
        let spec = |batch: usize, max_tokens: usize| AttentionSpec {
            kv,
            batch,
            num_q_heads: num_qo_heads,
            mode,
            max_tokens,
            sm_scale,
            sparq: false,
            dtype,
        };
        let mut borrowed = vec![];
        let dev = ctx.device();
        let (plan, meta, spec) = if device_table {
            let max_tokens = required("sequence")?;
            if lists.is_some() && !device_lists {
                return Err(invalid(
                    "sel_indptr",
                    "device lists (device_lists=True) with a device page table",
                    "host lists",
                ));
            }
            let tab = device_i32s(
                &ctx,
                &[
                    (kv_indptr, "kv_indptr"),
                    (kv_page_indices, "kv_page_indices"),
                    (kv_last_page_len, "kv_last_page_len"),
                ],
            )?;
            let batch = tab[0].numel().saturating_sub(1);
            let spec = spec(batch, max_tokens);
            let plan = Attn::for_device_table(&ctx.dusk, spec, tune).py_err()?;
            // SAFETY: contiguous int32 tensors of their lengths, whose objects (and
            // capsules) the plan keeps, so the memory outlives the meta.
            let [a, b, c] = unsafe {
                [
                    tab[0].borrow::<i32>(dev)?,
                    tab[1].borrow::<i32>(dev)?,
                    tab[2].borrow::<i32>(dev)?,
                ]
            };
            let dl = match lists {
                Some((ip, ix)) => {
                    let ls = device_i32s(&ctx, &[(ip, "sel_indptr"), (ix, "sel_indices")])?;
                    // SAFETY: as above.
                    let pair = unsafe { (ls[0].borrow::<i32>(dev)?, ls[1].borrow::<i32>(dev)?) };
                    borrowed.extend(ls.iter().flat_map(|t| t.keep_alive()));
                    Some(pair)
                }
                None => None,
            };
            borrowed.extend(tab.iter().flat_map(|t| t.keep_alive()));
            let meta = plan.device_table_meta(a, b, c, dl).py_err()?;
            (plan, meta, spec)
        } else {
            let table = page_table(kv_indptr, kv_page_indices, kv_last_page_len)?;
            let (plan, meta, spec) = match lists {
                None => {
                    let longest = (0..table.batch())
                        .map(|b| seq_len(&table, b, page_size))
                        .max()
                        .unwrap_or(0);
                    let spec = spec(table.batch(), max_tokens.unwrap_or(longest.max(1)));
                    let plan = Attn::with_tuning(&ctx.dusk, spec, tune).py_err()?;
                    let meta = plan.upload_meta(&ctx.dusk, &table, None).py_err()?;
                    (plan, meta, spec)
                }
                Some((ip, ix)) if device_lists => {
                    let spec = spec(table.batch(), required("list")?);
                    let plan = Attn::with_tuning(&ctx.dusk, spec, tune).py_err()?;
                    let rows = table.batch()
                        * if mode == AttentionMode::HeadVarlen {
                            num_qo_heads
                        } else {
                            num_kv_heads
                        };
                    let ts = device_i32s(&ctx, &[(ip, "sel_indptr"), (ix, "sel_indices")])?;
                    ts[0].expect(DType::I32, &[rows + 1])?;
                    // SAFETY: contiguous int32 tensors of their lengths; their objects (and
                    // capsules) are kept with the plan, so the memory outlives the meta.
                    let (a, b) = unsafe { (ts[0].borrow::<i32>(dev)?, ts[1].borrow::<i32>(dev)?) };
                    borrowed.extend(ts.iter().flat_map(|t| t.keep_alive()));
                    let meta = plan.device_meta(&ctx.dusk, &table, a, b).py_err()?;
                    (plan, meta, spec)
                }
                Some((ip, ix)) => {
                    let l = token_lists(ip, ix, ("sel_indptr", "sel_indices"))?;
                    let spec = spec(table.batch(), max_tokens.unwrap_or(l.max_row_len().max(1)));
                    let plan = Attn::with_tuning(&ctx.dusk, spec, tune).py_err()?;
                    let meta = plan.upload_meta(&ctx.dusk, &table, Some(&l)).py_err()?;
                    (plan, meta, spec)
                }
            };
            (plan, meta, spec)
        };
        let lse = dev.alloc::<f32>(spec.batch * spec.num_q_heads).py_err()?;
        settle(&ctx)?;
        replace_state(
            py,
            &self.ctx,
            &mut self.state,
            AttentionState {
                queued: LastStream::new(&self.ctx),
                plan,
                meta,
                spec,
                lse,
                replay: graph_launch.then(Replay::default),
                _borrowed: borrowed,
            },
        )?;
        Ok(())
    }

    #[getter]
    fn device(&self) -> String {
        self.ctx.place.describe()
    }

    /// Attention of `q` (`[batch, num_qo_heads, head_dim]`, the plan's dtype) over the
    /// cache `k_cache`, `v_cache` (`[num_pages, page_size, num_kv_heads, head_dim]`),
    /// written to `out` (like `q`) and, if given, `lse` (float32 `[batch, num_qo_heads]`,
    /// natural log; `-inf` for an empty row, whose output is zero). Queued on the caller's
    /// stream as one submission (see `plan`'s `graph_launch`): no allocation, no sync.
    #[pyo3(signature = (q, k_cache, v_cache, out, lse=None, *, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        py: Python<'_>,
        q: &Bound<'_, PyAny>,
        k_cache: &Bound<'_, PyAny>,
        v_cache: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        lse: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let ctx = self.ctx.clone();
        let st = self.state.as_mut().ok_or_else(no_plan)?;
        let stream = resolve_stream(py, ctx.place, stream)?;
        let args = [
            (q, "q"),
            (k_cache, "k_cache"),
            (v_cache, "v_cache"),
            (out, "out"),
        ];
        let ts = match lse.filter(|l| !l.is_none()) {
            Some(l) => tensors(
                &ctx,
                stream,
                &[args[0], args[1], args[2], args[3], (l, "lse")],
            )?,
            None => tensors(&ctx, stream, &args)?,
        };
        let spec = st.spec;
        let qshape = [spec.batch, spec.num_q_heads, spec.kv.head_dim];
        let cache = [
            spec.kv.num_pages,
            spec.kv.page_size,
            spec.kv.num_kv_heads,
            spec.kv.head_dim,
        ];
        ts[0].expect(spec.dtype, &qshape)?;
        ts[1].expect(spec.dtype, &cache)?;
        ts[2].expect(spec.dtype, &cache)?;
        ts[3].expect(spec.dtype, &qshape)?;
        if let Some(l) = ts.get(4) {
            l.expect(DType::F32, &[spec.batch, spec.num_q_heads])?;
        }
        check_outputs(&ts, 3)?;
        match spec.dtype {
            DType::BF16 => run_attention::<bf16>(&ctx, st, &ts, stream),
            _ => run_attention::<f16>(&ctx, st, &ts, stream),
        }
    }
}

fn seq_len(t: &PageTable, b: usize, page_size: usize) -> usize {
    let pages = (t.kv_indptr[b + 1] - t.kv_indptr[b]).max(0) as usize;
    match pages {
        0 => 0,
        n => (n - 1) * page_size + t.kv_last_page_len[b].max(0) as usize,
    }
}

/// `q`, `k`, `v`, `out` and the optional `lse` of an attention call, borrowed.
pub(crate) type AttentionArgs<T> = (
    Buffer<T>,
    Buffer<T>,
    Buffer<T>,
    Buffer<T>,
    Option<Buffer<f32>>,
);

/// An attention call's tensors `[q, k, v, out, lse?]` as device buffers: `q`, `k`, `v` and
/// `out` of element `T`, the optional `lse` of f32.
///
/// # Safety
/// The caller checked each tensor's dtype, shape and layout, and keeps them alive until
/// the work using them is queued.
pub(crate) unsafe fn borrow_attention_args<T: Element>(
    ctx: &Ctx,
    ts: &[Tensor],
) -> PyResult<AttentionArgs<T>> {
    let dev = ctx.device();
    // SAFETY: the caller's promise, above.
    unsafe {
        let lse = match ts.get(4) {
            Some(l) => Some(l.borrow::<f32>(dev)?),
            None => None,
        };
        Ok((
            ts[0].borrow::<T>(dev)?,
            ts[1].borrow::<T>(dev)?,
            ts[2].borrow::<T>(dev)?,
            ts[3].borrow::<T>(dev)?,
            lse,
        ))
    }
}

fn run_attention<T: Element>(
    ctx: &Ctx,
    st: &mut AttentionState,
    ts: &[Tensor],
    stream: Option<u64>,
) -> PyResult<()> {
    // SAFETY: every tensor's dtype, shape and layout were checked by the caller; they
    // outlive the queueing.
    let (q, k, v, mut out, mut given) = unsafe { borrow_attention_args::<T>(ctx, ts)? };
    st.queued.note(stream);
    let AttentionState {
        plan,
        meta,
        replay,
        lse: own_lse,
        ..
    } = st;
    let lse = match given.as_mut() {
        Some(l) => l,
        None => own_lse,
    };
    on_stream(ctx, stream, || {
        replayed(ctx.device(), replay.as_mut(), || {
            plan.run(&ctx.dusk, &q, &k, &v, meta, None, &mut out, lse)
        })
    })
    .py_err()
}

/// The names of the stock bundle's kernels this build carries (or `DUSK_BUNDLE`'s), and
/// its target architecture.
#[pyfunction]
pub fn bundle_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let b = crate::context::bundle()?;
    let d = PyDict::new(py);
    d.set_item("arch", &b.manifest().target.arch)?;
    d.set_item("ptx_isa", &b.manifest().target.ptx_isa)?;
    d.set_item("generator", &b.manifest().generator)?;
    d.set_item("dir", b.dir().display().to_string())?;
    let names: Vec<&str> = b
        .manifest()
        .kernels
        .iter()
        .map(|k| k.name.as_str())
        .collect();
    d.set_item("kernels", names)?;
    Ok(d)
}

/// Kernels loaded on `device` so far, each `(name, source)`: `"bundle"` (PTX from the
/// bundle), `"jit"` (compiled here), or `"interpreter"` (the CPU).
#[pyfunction]
pub fn loaded_kernels(device: &Bound<'_, PyAny>) -> PyResult<Vec<(String, &'static str)>> {
    let ctx = context(parse_device(device)?)?;
    let mut out: Vec<(String, &'static str)> = ctx
        .dusk
        .loaded_kernels()
        .iter()
        .map(|k| {
            let src = if !k.is_gpu() {
                "interpreter"
            } else if ctx.dusk.bundle_entry(k.ir()).is_some() {
                "bundle"
            } else {
                "jit"
            };
            (k.name().to_string(), src)
        })
        .collect();
    out.sort();
    Ok(out)
}

/// The address dusk reads and writes for `tensor` (a host address on the CPU, a device
/// address on the GPU), as the runtime's borrowed buffer reports it: the producer's own
/// (`tensor.data_ptr()` for PyTorch, `array.ctypes.data` for NumPy), since nothing is
/// copied.
#[pyfunction]
pub fn data_ptr(tensor: &Bound<'_, PyAny>) -> PyResult<u64> {
    let t = Tensor::new(tensor, "tensor", None)?;
    let ctx = context(t.place)?;
    let dev = ctx.device();
    let n = usize::from(t.numel() > 0);
    // SAFETY: at most the tensor's first byte, which it holds while `t` lives; nothing is
    // read or written through the buffer.
    let b = unsafe {
        if dev.is_gpu() {
            dev.borrow_device::<u8>(t.addr, n)
        } else {
            dev.borrow_host::<u8>(t.addr as usize as *mut u8, n)
        }
    }
    .py_err()?;
    Ok(if n == 0 {
        t.addr
    } else {
        b.untyped().address()
    })
}
