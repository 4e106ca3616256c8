//! Tensors in and out without copies.
//!
//! In: anything with `__dlpack__` (NumPy, PyTorch, CuPy, JAX) or `__cuda_array_interface__`
//! (PyTorch, CuPy, Numba), and dusk's own [`Array`]. [`Tensor`] reads the producer's
//! address, shape, strides and element type, and keeps the producer's object (and the
//! DLPack capsule, whose destructor releases the producer's hold) alive as long as it
//! lives; [`Tensor::borrow`] then hands the runtime a buffer over that very memory.
//!
//! Out: [`Array`], a view of memory dusk owns (a plan's outputs), exported through
//! `__dlpack__` and, on the GPU, `__cuda_array_interface__`: `numpy.from_dlpack(a)` and
//! `torch.from_dlpack(a)` read it in place.

use crate::errors::invalid;
use dusk_compiler::DType;
use dusk_runtime::{Buffer, Device, Element};
use pyo3::exceptions::{PyAttributeError, PyBufferError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use std::any::Any;
use std::ffi::{c_void, CStr};
use std::sync::Arc;

/// Where a tensor lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Place {
    Cpu,
    Cuda(usize),
}

impl Place {
    pub fn describe(&self) -> String {
        match self {
            Place::Cpu => "cpu".into(),
            Place::Cuda(i) => format!("cuda:{i}"),
        }
    }
}

// DLPack (dlpack.h, v1.0), as laid out in memory.
#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}
#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}
#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}
#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}
#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}
#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;
const FLAG_READ_ONLY: u64 = 1;
const LEGACY: &CStr = c"dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";

fn dtype_of(code: u8, bits: u8, lanes: u16) -> Option<DType> {
    if lanes != 1 {
        return None;
    }
    Some(match (code, bits) {
        (0, 32) => DType::I32,
        (0, 64) => DType::I64,
        (1, 8) => DType::U8,
        (2, 16) => DType::F16,
        (2, 32) => DType::F32,
        (4, 16) => DType::BF16,
        _ => return None,
    })
}

fn dl_dtype(d: DType) -> DLDataType {
    let (code, bits) = match d {
        DType::I32 => (0, 32),
        DType::I64 => (0, 64),
        DType::U8 => (1, 8),
        DType::F16 => (2, 16),
        DType::F32 => (2, 32),
        DType::BF16 => (4, 16),
        DType::Bool => (6, 8),
    };
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

/// The NumPy-style name of an element type (`float16`, `int32`, ...).
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
        DType::F16 => "float16",
        DType::F32 => "float32",
        DType::BF16 => "bfloat16",
        DType::Bool => "bool",
    }
}

/// The most dimensions a tensor may have (no entry point takes more than 4).
pub const MAX_RANK: usize = 8;

/// A tensor's shape or strides, held inline so that reading a tensor allocates nothing (a
/// run reads several tensors on every call).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Dims<T> {
    len: usize,
    v: [T; MAX_RANK],
}

impl<T: Copy + Default> Dims<T> {
    /// `n` values, the `i`th from `each(i)`; an error naming `name` when `n` is more than
    /// [`MAX_RANK`].
    pub fn try_from_fn(
        name: &str,
        n: usize,
        mut each: impl FnMut(usize) -> PyResult<T>,
    ) -> PyResult<Self> {
        if n > MAX_RANK {
            return Err(invalid(
                name,
                format!("a tensor of at most {MAX_RANK} dimensions"),
                format!("{n} dimensions"),
            ));
        }
        let mut v = [T::default(); MAX_RANK];
        for (i, o) in v[..n].iter_mut().enumerate() {
            *o = each(i)?;
        }
        Ok(Dims { len: n, v })
    }

    /// The values of `xs` (see [`Dims::try_from_fn`]).
    pub fn from_slice(name: &str, xs: &[T]) -> PyResult<Self> {
        Self::try_from_fn(name, xs.len(), |i| Ok(xs[i]))
    }
}

impl<T> std::ops::Deref for Dims<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.v[..self.len]
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Dims<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.v[..self.len].fmt(f)
    }
}

/// A caller's tensor, read without a copy.
pub struct Tensor<'py> {
    /// The argument's name, for errors.
    pub name: &'static str,
    pub addr: u64,
    pub shape: Dims<usize>,
    /// In elements; C-contiguous ones when the producer gave none.
    pub strides: Dims<i64>,
    pub dtype: DType,
    pub place: Place,
    pub readonly: bool,
    /// The producer's object and the capsule: kept alive while the memory is used.
    _keep: (Bound<'py, PyAny>, Option<Bound<'py, PyAny>>),
}

impl<'py> Tensor<'py> {
    /// Reads `obj`. `stream`: the CUDA stream dusk will launch on, given to `__dlpack__`
    /// so that the producer orders its pending work before it (nothing is done when it is
    /// the producer's current stream).
    pub fn new(obj: &Bound<'py, PyAny>, name: &'static str, stream: Option<u64>) -> PyResult<Self> {
        if let Ok(a) = obj.cast::<Array>() {
            let a = a.get();
            return Ok(Tensor {
                name,
                addr: a.addr,
                shape: Dims::from_slice(name, &a.shape)?,
                strides: contiguous_strides(name, &a.shape)?,
                dtype: a.dtype,
                place: a.place,
                readonly: false,
                _keep: (obj.clone(), None),
            });
        }
        let py = obj.py();
        if let Some(torch) = torch(py)? {
            if torch.is_tensor(obj) {
                return Self::from_torch(obj, name, torch);
            }
        }
        if obj.hasattr("__dlpack__")? {
            return Self::from_dlpack(obj, name, stream);
        }
        if obj.hasattr("__cuda_array_interface__")? {
            return Self::from_cai(obj, name);
        }
        let _ = py;
        Err(invalid(
            name,
            "a tensor with __dlpack__ or __cuda_array_interface__ (a NumPy array, a torch, \
             CuPy or JAX tensor)",
            format!("a {}", type_name(obj)),
        ))
    }

    /// A PyTorch tensor, read through its own accessors (a DLPack export costs about
    /// 15 us a tensor in torch 2.11, these about 0.4 together). Its data is taken as ready
    /// on the stream the call launches on (PyTorch's current one unless `stream=` says
    /// otherwise).
    fn from_torch(obj: &Bound<'py, PyAny>, name: &'static str, torch: &Torch) -> PyResult<Self> {
        let py = obj.py();
        let dtype_obj = obj.getattr(intern!(py, "dtype"))?;
        let dtype = torch
            .dtypes
            .iter()
            .find(|(d, _)| d.bind(py).is(&dtype_obj))
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                invalid(
                    name,
                    "float16, bfloat16, float32, int32, int64 or uint8 elements",
                    dtype_obj.str().map(|s| s.to_string()).unwrap_or_default(),
                )
            })?;
        let place = if obj.getattr(intern!(py, "is_cuda"))?.is_truthy()? {
            let device: i64 = obj.call_method0(intern!(py, "get_device"))?.extract()?;
            Place::Cuda(device.max(0) as usize)
        } else if obj.getattr(intern!(py, "is_cpu"))?.is_truthy()? {
            Place::Cpu
        } else {
            return Err(invalid(
                name,
                "a tensor in CPU or CUDA memory",
                format!("a tensor on {}", obj.getattr(intern!(py, "device"))?.str()?),
            ));
        };
        let shape = int_tuple(name, &obj.getattr(intern!(py, "shape"))?, |v| v.extract())?;
        // A contiguous tensor's strides follow from its shape: asking torch whether it is
        // costs half of asking for the strides (no tuple made).
        let strides = if obj
            .call_method0(intern!(py, "is_contiguous"))?
            .is_truthy()?
        {
            contiguous_strides(name, &shape)?
        } else {
            int_tuple(name, &obj.call_method0(intern!(py, "stride"))?, |v| {
                v.extract()
            })?
        };
        let addr: u64 = obj.call_method0(intern!(py, "data_ptr"))?.extract()?;
        Ok(Tensor {
            name,
            addr,
            shape,
            strides,
            dtype,
            place,
            readonly: false,
            _keep: (obj.clone(), None),
        })
    }

    fn from_dlpack(
        obj: &Bound<'py, PyAny>,
        name: &'static str,
        stream: Option<u64>,
    ) -> PyResult<Self> {
        let py = obj.py();
        let on_cuda = match obj.call_method0("__dlpack_device__") {
            Ok(d) => d
                .extract::<(i32, i32)>()
                .map(|(t, _)| t == KDL_CUDA)
                .unwrap_or(false),
            Err(_) => false,
        };
        let kwargs = PyDict::new(py);
        kwargs.set_item("max_version", (1, 0))?;
        if on_cuda {
            if let Some(s) = stream {
                // DLPack names the legacy default stream 1 (0 is ambiguous and refused).
                kwargs.set_item("stream", if s == 0 { 1 } else { s })?;
            }
        }
        let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
            Ok(c) => c,
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py) => {
                // A producer from before DLPack 1.0 takes no max_version.
                kwargs.del_item("max_version")?;
                obj.call_method("__dlpack__", (), Some(&kwargs))?
            }
            Err(e) => {
                return Err(invalid(
                    name,
                    "a tensor that can be exported through DLPack",
                    format!("a {} whose __dlpack__ raised {e}", type_name(obj)),
                ))
            }
        };
        let cap = capsule.as_ptr();
        // SAFETY: `cap` is a live object; the capsule checks accept any object.
        let (t, flags): (&DLTensor, u64) = unsafe {
            if ffi::PyCapsule_IsValid(cap, VERSIONED.as_ptr()) == 1 {
                let m = ffi::PyCapsule_GetPointer(cap, VERSIONED.as_ptr())
                    as *const DLManagedTensorVersioned;
                if (*m).version.major != 1 {
                    return Err(invalid(
                        name,
                        "a DLPack 1.x tensor",
                        format!("DLPack {}.{}", (*m).version.major, (*m).version.minor),
                    ));
                }
                (&(*m).dl_tensor, (*m).flags)
            } else if ffi::PyCapsule_IsValid(cap, LEGACY.as_ptr()) == 1 {
                let m = ffi::PyCapsule_GetPointer(cap, LEGACY.as_ptr()) as *const DLManagedTensor;
                (&(*m).dl_tensor, 0)
            } else {
                return Err(invalid(
                    name,
                    "a DLPack capsule from __dlpack__",
                    format!("{} from a {}", type_name(&capsule), type_name(obj)),
                ));
            }
        };
        let place = match t.device.device_type {
            KDL_CPU => Place::Cpu,
            KDL_CUDA => Place::Cuda(t.device.device_id.max(0) as usize),
            other => {
                return Err(invalid(
                    name,
                    "a tensor in CPU or CUDA device memory",
                    format!("DLPack device type {other}"),
                ))
            }
        };
        let dtype = dtype_of(t.dtype.code, t.dtype.bits, t.dtype.lanes).ok_or_else(|| {
            invalid(
                name,
                "float16, bfloat16, float32, int32, int64 or uint8 elements",
                format!(
                    "DLPack type code {} of {} bits x{}",
                    t.dtype.code, t.dtype.bits, t.dtype.lanes
                ),
            )
        })?;
        let ndim = t.ndim.max(0) as usize;
        // SAFETY: DLPack gives `ndim` shape entries, and `ndim` strides or none.
        let shape = Dims::try_from_fn(name, ndim, |i| {
            Ok(unsafe { *t.shape.add(i) }.max(0) as usize)
        })?;
        let strides = if t.strides.is_null() || ndim == 0 {
            contiguous_strides(name, &shape)?
        } else {
            // SAFETY: as above.
            Dims::try_from_fn(name, ndim, |i| Ok(unsafe { *t.strides.add(i) }))?
        };
        Ok(Tensor {
            name,
            addr: (t.data as u64).wrapping_add(t.byte_offset),
            shape,
            strides,
            dtype,
            place,
            readonly: flags & FLAG_READ_ONLY != 0,
            _keep: (obj.clone(), Some(capsule)),
        })
    }

    fn from_cai(obj: &Bound<'py, PyAny>, name: &'static str) -> PyResult<Self> {
        let cai = obj.getattr("__cuda_array_interface__")?;
        let bad = |what: &str| {
            invalid(
                name,
                "a valid __cuda_array_interface__",
                format!("a {} whose interface {what}", type_name(obj)),
            )
        };
        let shape: Vec<usize> = cai
            .get_item("shape")
            .and_then(|s| s.extract())
            .map_err(|_| bad("has no shape"))?;
        let typestr: String = cai
            .get_item("typestr")
            .and_then(|s| s.extract())
            .map_err(|_| bad("has no typestr"))?;
        let (addr, readonly): (u64, bool) = cai
            .get_item("data")
            .and_then(|s| s.extract())
            .map_err(|_| bad("has no data (address, read-only)"))?;
        let dtype =
            match typestr.trim_start_matches(['<', '|', '=']) {
                "f2" => DType::F16,
                "f4" => DType::F32,
                "i4" => DType::I32,
                "i8" => DType::I64,
                "u1" => DType::U8,
                _ => return Err(invalid(
                    name,
                    "float16, float32, int32, int64 or uint8 elements (bfloat16 through DLPack)",
                    format!("typestr {typestr:?}"),
                )),
            };
        let size = dtype.size_bytes() as i64;
        let strides = match cai.get_item("strides") {
            Ok(s) if !s.is_none() => {
                let bytes: Vec<i64> = s.extract().map_err(|_| bad("has bad strides"))?;
                if bytes.iter().any(|b| b % size != 0) {
                    return Err(bad("has strides that are not whole elements"));
                }
                bytes.iter().map(|b| b / size).collect()
            }
            _ => contiguous_strides(name, &shape)?.to_vec(),
        };
        // The device: the interface does not say; ask the driver where the address lives.
        let place = Place::Cuda(cuda_ordinal_of(addr).unwrap_or(0));
        Ok(Tensor {
            name,
            addr,
            strides: Dims::from_slice(name, &strides)?,
            shape: Dims::from_slice(name, &shape)?,
            dtype,
            place,
            readonly,
            _keep: (obj.clone(), None),
        })
    }

    /// The producer's object and capsule, to keep the memory alive past this call.
    pub fn keep_alive(&self) -> Vec<Py<PyAny>> {
        let mut v = vec![self._keep.0.clone().unbind()];
        v.extend(self._keep.1.iter().map(|c| c.clone().unbind()));
        v
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the elements lie in C order with no gaps (size-1 dimensions' strides do not
    /// matter).
    pub fn is_contiguous(&self) -> bool {
        let mut want = 1i64;
        for (n, s) in self.shape.iter().zip(self.strides.iter()).rev() {
            if *n != 1 && *s != want {
                return false;
            }
            want *= *n as i64;
        }
        true
    }

    /// `name: float16[2, 16]` as errors show a tensor.
    pub fn describe(&self) -> String {
        format!(
            "{}{:?} on {}",
            dtype_name(self.dtype),
            self.shape,
            self.place.describe()
        )
    }

    /// Checks element type, shape and C-contiguity.
    pub fn expect(&self, dtype: DType, shape: &[usize]) -> PyResult<()> {
        if self.dtype != dtype || *self.shape != *shape {
            return Err(invalid(
                self.name,
                format!("{}{shape:?}", dtype_name(dtype)),
                self.describe(),
            ));
        }
        self.expect_contiguous()
    }

    /// Checks the element type and rank; returns the shape.
    pub fn expect_rank(&self, dtype: DType, rank: usize, what: &str) -> PyResult<&[usize]> {
        if self.dtype != dtype || self.shape.len() != rank {
            return Err(invalid(
                self.name,
                format!("{} of rank {rank} ({what})", dtype_name(dtype)),
                self.describe(),
            ));
        }
        Ok(&self.shape)
    }

    pub fn expect_contiguous(&self) -> PyResult<()> {
        if !self.is_contiguous() {
            return Err(invalid(
                self.name,
                "a C-contiguous tensor",
                format!(
                    "strides {:?} (in elements) for shape {:?}",
                    self.strides, self.shape
                ),
            ));
        }
        Ok(())
    }

    /// A 2-D table whose rows may be spaced apart (a slice of a larger table): unit column
    /// stride, row stride at least the row length. Returns the row stride.
    pub fn expect_rows(&self, dtype: DType) -> PyResult<usize> {
        let [rows, cols] = self.expect_rank(dtype, 2, "a table of rows")? else {
            unreachable!()
        };
        let (s0, s1) = (self.strides[0], self.strides[1]);
        if *rows > 1 && (s0 < *cols as i64) || (*cols > 1 && s1 != 1) {
            return Err(invalid(
                self.name,
                "rows of consecutive elements (unit column stride, row stride at least the row length)",
                format!("strides {:?} for shape {:?}", self.strides, self.shape),
            ));
        }
        Ok(if *rows > 1 { s0 as usize } else { *cols })
    }

    /// Fails unless this tensor may be written.
    pub fn expect_writable(&self) -> PyResult<()> {
        if self.readonly {
            return Err(invalid(self.name, "a writable tensor", "a read-only one"));
        }
        Ok(())
    }

    /// The byte range the tensor spans (from its first element to past its last).
    pub fn span(&self, elements: usize) -> (u64, u64) {
        (
            self.addr,
            self.addr + (elements * self.dtype.size_bytes()) as u64,
        )
    }

    /// A buffer over the tensor's memory (`elements` from its first; the caller checked
    /// the layout), on `device`: the kernel reads and writes it in place.
    ///
    /// # Safety
    /// The tensor must span `elements` elements of `T`; the returned buffer must not
    /// outlive `self` (which keeps the memory alive) unless the memory is otherwise kept.
    pub unsafe fn borrow_n<T: Element>(
        &self,
        device: &Device,
        elements: usize,
    ) -> PyResult<Buffer<T>> {
        debug_assert_eq!(T::DTYPE, self.dtype);
        let r = unsafe {
            if device.is_gpu() {
                device.borrow_device::<T>(self.addr, elements)
            } else {
                device.borrow_host::<T>(self.addr as usize as *mut T, elements)
            }
        };
        r.map_err(crate::errors::runtime)
    }

    /// [`Tensor::borrow_n`] over every element (a contiguous tensor).
    ///
    /// # Safety
    /// As [`Tensor::borrow_n`].
    pub unsafe fn borrow<T: Element>(&self, device: &Device) -> PyResult<Buffer<T>> {
        unsafe { self.borrow_n(device, self.numel()) }
    }
}

/// What the PyTorch fast path needs, once PyTorch has been imported by the caller.
pub struct Torch {
    /// `torch.Tensor`, whose subclasses are read through the accessors below.
    tensor: Py<PyType>,
    dtypes: Vec<(Py<PyAny>, DType)>,
    /// `torch._C._cuda_getCurrentRawStream`, when this PyTorch has it.
    pub raw_stream: Option<Py<PyAny>>,
}

impl Torch {
    /// Whether `obj` is a `torch.Tensor` (or of a subclass), asked of its type's MRO
    /// directly rather than through torch's metaclass `__instancecheck__` (`isinstance`).
    fn is_tensor(&self, obj: &Bound<'_, PyAny>) -> bool {
        // SAFETY: both are live type objects.
        unsafe { ffi::PyType_IsSubtype(obj.get_type_ptr(), self.tensor.as_ptr().cast()) != 0 }
    }
}

/// PyTorch's types, if the caller has imported it (dusk never imports it itself).
pub fn torch(py: Python<'_>) -> PyResult<Option<&'static Torch>> {
    static TORCH: PyOnceLock<Torch> = PyOnceLock::new();
    if let Some(t) = TORCH.get(py) {
        return Ok(Some(t));
    }
    let modules = py
        .import(intern!(py, "sys"))?
        .getattr(intern!(py, "modules"))?;
    let Ok(torch) = modules.get_item("torch") else {
        return Ok(None);
    };
    let Ok(tensor) = torch
        .getattr("Tensor")
        .and_then(|t| Ok(t.cast_into::<PyType>()?))
    else {
        return Ok(None); // torch still importing
    };
    let mut dtypes = vec![];
    for (name, d) in [
        ("float16", DType::F16),
        ("bfloat16", DType::BF16),
        ("float32", DType::F32),
        ("int32", DType::I32),
        ("int64", DType::I64),
        ("uint8", DType::U8),
    ] {
        dtypes.push((torch.getattr(name)?.unbind(), d));
    }
    let raw_stream = torch
        .getattr("_C")
        .and_then(|c| c.getattr("_cuda_getCurrentRawStream"))
        .ok()
        .map(|f| f.unbind());
    Ok(Some(TORCH.get_or_init(py, || Torch {
        tensor: tensor.unbind(),
        dtypes,
        raw_stream,
    })))
}

/// The ints of a tuple (`torch.Size`, a stride tuple) of tensor `name`, each read by
/// `each`.
fn int_tuple<T: Copy + Default>(
    name: &str,
    obj: &Bound<'_, PyAny>,
    each: impl Fn(&Bound<'_, PyAny>) -> PyResult<T>,
) -> PyResult<Dims<T>> {
    let t = obj.cast::<PyTuple>()?;
    Dims::try_from_fn(name, t.len(), |i| each(&t.get_item(i)?))
}

/// The strides (in elements) of a C-contiguous tensor of `shape`, for tensor `name`.
pub fn contiguous_strides(name: &str, shape: &[usize]) -> PyResult<Dims<i64>> {
    let mut s = 1i64;
    let mut out = Dims::try_from_fn(name, shape.len(), |_| Ok(0i64))?;
    for i in (0..shape.len()).rev() {
        out.v[i] = s;
        s *= shape[i] as i64;
    }
    Ok(out)
}

pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    let t = obj.get_type();
    let module = t
        .getattr("__module__")
        .and_then(|m| m.extract::<String>())
        .unwrap_or_default();
    let name = t
        .getattr("__qualname__")
        .and_then(|m| m.extract::<String>())
        .unwrap_or_else(|_| "object".into());
    if module.is_empty() || module == "builtins" {
        name
    } else {
        format!("{module}.{name}")
    }
}

/// The CUDA device ordinal an address belongs to (`cuPointerGetAttribute`), if the driver
/// is loaded and knows it.
fn cuda_ordinal_of(addr: u64) -> Option<usize> {
    use dusk_runtime::cudarc::driver::sys;
    // SAFETY: probing for the library only.
    if !unsafe { sys::is_culib_present() } {
        return None;
    }
    let mut ordinal: i32 = -1;
    // SAFETY: writes one int; fails cleanly for unknown addresses.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            addr,
        )
    };
    (r == sys::CUresult::CUDA_SUCCESS && ordinal >= 0).then_some(ordinal as usize)
}

/// Fails when output `out` shares memory with any of `others` (each as (tensor, elements)).
pub fn expect_disjoint<'a, 'py: 'a>(
    out: (&Tensor, usize),
    others: impl IntoIterator<Item = (&'a Tensor<'py>, usize)>,
) -> PyResult<()> {
    let (a0, a1) = out.0.span(out.1);
    for (t, n) in others {
        if std::ptr::eq(t, out.0) {
            continue;
        }
        let (b0, b1) = t.span(n);
        if a0 < b1 && b0 < a1 && a1 > a0 && b1 > b0 {
            return Err(invalid(
                out.0.name,
                format!("memory of its own (an output; it overlaps `{}`)", t.name),
                "a tensor sharing memory with an input or another output",
            ));
        }
    }
    Ok(())
}

/// A view of memory dusk owns (a plan's outputs): its address, shape and type, and what
/// keeps the memory alive. Read it in place with `numpy.from_dlpack`,
/// `torch.from_dlpack` or `cupy.from_dlpack`; on the GPU it also has
/// `__cuda_array_interface__`. Its contents change when the plan runs again.
#[pyclass(module = "dusk", frozen, name = "Array")]
pub struct Array {
    owner: Arc<dyn Any + Send + Sync>,
    addr: u64,
    shape: Vec<usize>,
    dtype: DType,
    place: Place,
}

impl Array {
    pub fn new(
        owner: Arc<dyn Any + Send + Sync>,
        addr: u64,
        shape: Vec<usize>,
        dtype: DType,
        place: Place,
    ) -> Array {
        Array {
            owner,
            addr,
            shape,
            dtype,
            place,
        }
    }
}

/// What a capsule's managed tensor owns: the shape and strides it points to, and the
/// memory's owner.
#[repr(C)]
struct Exported<M> {
    managed: M,
    shape: Vec<i64>,
    strides: Vec<i64>,
    _owner: Arc<dyn Any + Send + Sync>,
}

unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    // SAFETY: `m` is the first field of a boxed `Exported` made by `__dlpack__`, deleted once.
    drop(unsafe { Box::from_raw(m as *mut Exported<DLManagedTensor>) });
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    // SAFETY: as in `delete_legacy`.
    drop(unsafe { Box::from_raw(m as *mut Exported<DLManagedTensorVersioned>) });
}

/// Deletes a capsule's managed tensor if no consumer took it (renamed the capsule).
unsafe extern "C" fn capsule_destructor(cap: *mut ffi::PyObject) {
    // SAFETY: `cap` is the capsule being destroyed; an unconsumed one still has its name.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, VERSIONED.as_ptr()) == 1 {
            let m =
                ffi::PyCapsule_GetPointer(cap, VERSIONED.as_ptr()) as *mut DLManagedTensorVersioned;
            if let Some(d) = (*m).deleter {
                d(m);
            }
        } else if ffi::PyCapsule_IsValid(cap, LEGACY.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(cap, LEGACY.as_ptr()) as *mut DLManagedTensor;
            if let Some(d) = (*m).deleter {
                d(m);
            }
        } else {
            // Consumed: the consumer calls the deleter.
            ffi::PyErr_Clear();
        }
    }
}

#[pymethods]
impl Array {
    /// A DLPack capsule over the memory (no copy). `max_version` (1, 0) or later gives a
    /// versioned capsule; `stream` is accepted and not needed (the data is ready on the
    /// stream the plan ran on).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = stream;
        let here = self.__dlpack_device__();
        if let Some(d) = dl_device {
            if d != here {
                return Err(PyBufferError::new_err(format!(
                    "dusk.Array lives on DLPack device {here:?}, {d:?} was asked for"
                )));
            }
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "dusk.Array is exported in place only (copy=True is not supported)",
            ));
        }
        let shape: Vec<i64> = self.shape.iter().map(|&n| n as i64).collect();
        let strides = contiguous_strides("array", &self.shape)?.to_vec();
        let tensor = |shape: *mut i64, strides: *mut i64| DLTensor {
            data: self.addr as usize as *mut c_void,
            device: DLDevice {
                device_type: here.0,
                device_id: here.1,
            },
            ndim: self.shape.len() as i32,
            dtype: dl_dtype(self.dtype),
            shape,
            strides,
            byte_offset: 0,
        };
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        let (ptr, name): (*mut c_void, &CStr) = if versioned {
            let mut b = Box::new(Exported {
                managed: DLManagedTensorVersioned {
                    version: DLPackVersion { major: 1, minor: 0 },
                    manager_ctx: std::ptr::null_mut(),
                    deleter: Some(delete_versioned),
                    flags: 0,
                    dl_tensor: tensor(std::ptr::null_mut(), std::ptr::null_mut()),
                },
                shape,
                strides,
                _owner: self.owner.clone(),
            });
            b.managed.dl_tensor.shape = b.shape.as_mut_ptr();
            b.managed.dl_tensor.strides = b.strides.as_mut_ptr();
            let p = Box::into_raw(b);
            // SAFETY: `p` is live; its context is itself.
            unsafe { (*p).managed.manager_ctx = p.cast() };
            (p.cast(), VERSIONED)
        } else {
            let mut b = Box::new(Exported {
                managed: DLManagedTensor {
                    dl_tensor: tensor(std::ptr::null_mut(), std::ptr::null_mut()),
                    manager_ctx: std::ptr::null_mut(),
                    deleter: Some(delete_legacy),
                },
                shape,
                strides,
                _owner: self.owner.clone(),
            });
            b.managed.dl_tensor.shape = b.shape.as_mut_ptr();
            b.managed.dl_tensor.strides = b.strides.as_mut_ptr();
            let p = Box::into_raw(b);
            // SAFETY: as above.
            unsafe { (*p).managed.manager_ctx = p.cast() };
            (p.cast(), LEGACY)
        };
        // SAFETY: `ptr` is a managed tensor that the destructor (or the consumer) deletes
        // once; `name` is static.
        let cap = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(capsule_destructor)) };
        if cap.is_null() {
            // SAFETY: the capsule was not made: the tensor is still ours to delete.
            unsafe {
                if versioned {
                    delete_versioned(ptr.cast());
                } else {
                    delete_legacy(ptr.cast());
                }
            }
            return Err(PyErr::fetch(py));
        }
        // SAFETY: a new reference just returned by the C API.
        Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind())
    }

    /// `(device type, device id)`: (1, 0) for the CPU, (2, ordinal) for a CUDA GPU.
    fn __dlpack_device__(&self) -> (i32, i32) {
        match self.place {
            Place::Cpu => (KDL_CPU, 0),
            Place::Cuda(i) => (KDL_CUDA, i as i32),
        }
    }

    /// The CUDA array interface (version 3), for arrays on a GPU.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.place == Place::Cpu {
            return Err(PyAttributeError::new_err(
                "a dusk.Array on the CPU has no __cuda_array_interface__ (use DLPack)",
            ));
        }
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        let typestr = match self.dtype {
            DType::F16 => "<f2",
            DType::F32 => "<f4",
            DType::I32 => "<i4",
            DType::I64 => "<i8",
            DType::U8 => "|u1",
            DType::BF16 | DType::Bool => "|V2",
        };
        d.set_item("typestr", typestr)?;
        d.set_item("data", (self.addr, false))?;
        d.set_item("strides", py.None())?;
        d.set_item("version", 3)?;
        d.set_item("stream", py.None())?;
        Ok(d)
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// The element type's NumPy name (`int32`, `float32`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        dtype_name(self.dtype)
    }

    /// `cpu` or `cuda:N`.
    #[getter]
    fn device(&self) -> String {
        self.place.describe()
    }

    /// The address of the first element (host or device).
    #[getter]
    fn data_ptr(&self) -> u64 {
        self.addr
    }

    fn __len__(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    fn __repr__(&self) -> String {
        format!(
            "dusk.Array({}{:?} on {})",
            dtype_name(self.dtype),
            self.shape,
            self.place.describe()
        )
    }
}
