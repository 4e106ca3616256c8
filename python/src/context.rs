//! One `Dusk` (a device and the kernels loaded on it) per device, made on first use and
//! shared by every plan on that device; the stream a run launches on; host metadata.
//!
//! On the CPU kernels run through the interpreter. On a GPU they come from the stock
//! bundle built into the extension (`kernels_gen/bundle/`, sm_90a: Hopper), or from the
//! bundle directory named by `DUSK_BUNDLE` (e.g. one written by `cargo dusk compile
//! --target sm_80`, or with more kernels); no LLVM is linked, so a kernel the bundle lacks
//! raises `dusk.NotInBundle` when a plan is made (build with the `jit` feature to compile
//! such kernels instead).

use crate::errors::{invalid, OrPy};
use crate::tensor::{type_name, Place, Tensor};
use dusk_compiler::DType;
use dusk_kernels::ops::Dusk;
use dusk_runtime::{Bundle, Device};
use pyo3::prelude::*;
use pyo3::types::{PySequence, PyString};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

mod files {
    include!(concat!(env!("OUT_DIR"), "/bundle_files.rs"));
}

/// A device's `Dusk`.
pub struct Ctx {
    pub place: Place,
    pub dusk: Dusk,
}

impl Ctx {
    pub fn device(&self) -> &Device {
        self.dusk.device()
    }
}

/// The bundle GPU kernels come from: `DUSK_BUNDLE`'s directory, else the built-in one.
pub fn bundle() -> PyResult<Arc<Bundle>> {
    static BUNDLE: OnceLock<Arc<Bundle>> = OnceLock::new();
    if let Some(b) = BUNDLE.get() {
        return Ok(b.clone());
    }
    let b = match std::env::var_os("DUSK_BUNDLE") {
        Some(dir) => Bundle::open(dir).py_err()?,
        None => {
            let manifest = files::FILES
                .iter()
                .find(|(n, _)| *n == "manifest.json")
                .map(|(_, t)| *t)
                .unwrap_or("");
            Bundle::from_files("<built-in stock bundle>", manifest, |name| {
                files::FILES
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, t)| t.to_string())
                    .ok_or_else(|| format!("{name} is not built in"))
            })
            .py_err()?
        }
    };
    Ok(BUNDLE.get_or_init(|| Arc::new(b)).clone())
}

/// The context of `place`, made on first use.
pub fn context(place: Place) -> PyResult<Arc<Ctx>> {
    static CTXS: OnceLock<Mutex<HashMap<Place, Arc<Ctx>>>> = OnceLock::new();
    let map = CTXS.get_or_init(Default::default);
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = map.get(&place) {
        return Ok(c.clone());
    }
    let device = match place {
        Place::Cpu => Device::cpu(),
        Place::Cuda(i) => Device::gpu(i).py_err()?,
    };
    let dusk = Dusk::with_bundle(device, bundle()?).py_err()?;
    let c = Arc::new(Ctx { place, dusk });
    map.insert(place, c.clone());
    Ok(c)
}

/// A device argument: `"cpu"`, `"cuda"`, `"cuda:N"`, an int (a CUDA ordinal), or anything
/// whose `str()` is one of those (`torch.device`).
pub fn parse_device(obj: &Bound<'_, PyAny>) -> PyResult<Place> {
    if let Ok(i) = obj.extract::<usize>() {
        return Ok(Place::Cuda(i));
    }
    let s = if let Ok(s) = obj.cast::<PyString>() {
        s.to_string()
    } else {
        obj.str()?.to_string()
    };
    let s = s.trim();
    let place = match s {
        "cpu" => Some(Place::Cpu),
        "cuda" => Some(Place::Cuda(0)),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Place::Cuda),
    };
    place.ok_or_else(|| {
        invalid(
            "device",
            "\"cpu\", \"cuda\" or \"cuda:N\"",
            format!("{s:?}"),
        )
    })
}

/// The stream a run launches on, as a `CUstream` address: `stream` when given (an int, or
/// an object with `cuda_stream` (torch) or `ptr` (CuPy)), else the current stream of
/// PyTorch or CuPy when the caller has imported them (torch first), else 0 (the legacy
/// default stream). None on the CPU.
pub fn resolve_stream(
    py: Python<'_>,
    place: Place,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<u64>> {
    let Place::Cuda(ordinal) = place else {
        return Ok(None);
    };
    if let Some(s) = stream.filter(|s| !s.is_none()) {
        // An int first: asking it for the attributes would raise (and build) two
        // AttributeErrors a call.
        if let Ok(v) = s.extract::<u64>() {
            return Ok(Some(v));
        }
        for attr in ["cuda_stream", "ptr"] {
            if let Ok(v) = s.getattr(attr) {
                return Ok(Some(v.extract()?));
            }
        }
        return s.extract::<u64>().map(Some).map_err(|_| {
            invalid(
                "stream",
                "a CUstream address (int), a torch.cuda.Stream or a cupy Stream",
                type_name(s),
            )
        });
    }
    if let Some(f) = crate::tensor::torch(py)?.and_then(|t| t.raw_stream.as_ref()) {
        return Ok(Some(f.bind(py).call1((ordinal,))?.extract()?));
    }
    let modules = py.import("sys")?.getattr("modules")?;
    if let Ok(torch) = modules.get_item("torch") {
        let cur = torch
            .getattr("cuda")?
            .call_method1("current_stream", (ordinal,))?;
        return Ok(Some(cur.getattr("cuda_stream")?.extract()?));
    }
    if let Ok(cupy) = modules.get_item("cupy") {
        let cur = cupy.getattr("cuda")?.call_method0("get_current_stream")?;
        return Ok(Some(cur.getattr("ptr")?.extract()?));
    }
    Ok(Some(0))
}

/// Fails unless `t` lives on `place`.
pub fn expect_on(t: &Tensor, place: Place) -> PyResult<()> {
    if t.place != place {
        return Err(invalid(
            t.name,
            format!("a tensor on {} (the plan's device)", place.describe()),
            t.describe(),
        ));
    }
    Ok(())
}

/// Host metadata (`kv_indptr`, token lists, ...): an int32 tensor on the CPU or a GPU (read
/// once, at plan time), or a sequence of ints.
pub fn host_i32(obj: &Bound<'_, PyAny>, name: &'static str) -> PyResult<Vec<i32>> {
    let is_tensor = obj.hasattr("__dlpack__")? || obj.hasattr("__cuda_array_interface__")?;
    if !is_tensor {
        if let Ok(seq) = obj.cast::<PySequence>() {
            let mut out = Vec::with_capacity(seq.len()?);
            for (i, v) in seq.try_iter()?.enumerate() {
                let v: i64 = v?.extract().map_err(|_| {
                    invalid(
                        name,
                        "a sequence of ints",
                        format!("a non-integer at index {i}"),
                    )
                })?;
                out.push(
                    i32::try_from(v)
                        .map_err(|_| invalid(name, "int32 values", format!("{v} at index {i}")))?,
                );
            }
            return Ok(out);
        }
    }
    let t = Tensor::new(obj, name, None)?;
    if t.dtype != DType::I32 || t.shape.len() != 1 {
        return Err(invalid(name, "an int32 tensor of rank 1", t.describe()));
    }
    t.expect_contiguous()?;
    let n = t.numel();
    match t.place {
        Place::Cpu => {
            if n == 0 {
                return Ok(vec![]);
            }
            // SAFETY: a contiguous int32 tensor of `n` elements, alive while `t` is.
            let s = unsafe { std::slice::from_raw_parts(t.addr as usize as *const i32, n) };
            Ok(s.to_vec())
        }
        Place::Cuda(_) => {
            let ctx = context(t.place)?;
            // The producer may still be writing it on its own stream: wait for the whole
            // context (plans are made on the host, where waiting is allowed).
            if let Some(s) = ctx.device().cuda_stream() {
                s.context().synchronize().py_err()?;
            }
            // SAFETY: as above, in device memory; the copy synchronises before returning.
            let b = unsafe { t.borrow_n::<i32>(ctx.device(), n)? };
            b.download().py_err()
        }
    }
}
