//! Typed device buffers. A [`Buffer<T>`] is a typed handle over an untyped allocation
//! ([`AnyBuffer`]), so launches can take buffers of any element type in one argument list
//! and check each against the kernel's pointer parameters.
//!
//! A buffer either owns its memory ([`Device::alloc`], [`Device::upload`]) or borrows
//! memory someone else owns ([`Device::borrow_host`], [`Device::borrow_device`]): an
//! array of NumPy's, a tensor of PyTorch's, reached without a copy. Kernels read and
//! write a borrowed buffer's memory in place; dropping it frees nothing.

use crate::device::{Backend, Device, Gpu};
use crate::error::{driver, Result, RuntimeError};
use cudarc::driver::{result, sys, CudaSlice, DevicePtr, DeviceRepr};
use dusk_compiler::DType;
use half::{bf16, f16};
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

mod sealed {
    pub trait Sealed {}
}

/// A type a buffer can hold, with the IR element type it matches. Implemented for
/// `f16`, `bf16`, `f32`, `i32`, `i64` and `u8`; sealed, since the runtime moves these
/// values as raw bytes.
pub trait Element:
    sealed::Sealed + DeviceRepr + Copy + Default + PartialEq + fmt::Debug + Send + Sync + 'static
{
    /// The IR element type of a pointer parameter this buffer can be passed to.
    const DTYPE: DType;
    #[doc(hidden)]
    fn write_le(self, out: &mut [u8]);
    #[doc(hidden)]
    fn read_le(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $d;
            fn write_le(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                let mut b = [0u8; std::mem::size_of::<$t>()];
                b.copy_from_slice(bytes);
                <$t>::from_le_bytes(b)
            }
        }
    };
}
element!(u8, DType::U8);
element!(i32, DType::I32);
element!(i64, DType::I64);
element!(f16, DType::F16);
element!(bf16, DType::BF16);
element!(f32, DType::F32);

/// An allocation on some device, of `len` elements of `dtype`, with its type erased.
/// Launch arguments refer to buffers through this.
pub struct AnyBuffer {
    pub(crate) dtype: DType,
    pub(crate) len: usize,
    pub(crate) storage: Storage,
}

pub(crate) enum Storage {
    /// Bytes in host memory, owned or borrowed. The mutex lets a launch write through a
    /// shared reference (as a GPU kernel may) and keeps the buffer `Sync`.
    Cpu(Mutex<HostBytes>),
    /// Device memory, at least one byte (CUDA refuses empty allocations), allocated on
    /// its device's stream.
    Gpu(CudaSlice<u8>),
    /// Device memory of the device `gpu` that someone else allocated and frees.
    GpuBorrowed {
        ptr: sys::CUdeviceptr,
        gpu: Arc<Gpu>,
    },
}

/// The bytes of a CPU buffer: its own, or `len` bytes at `ptr` that the creator of a
/// borrowed buffer vouched for ([`Device::borrow_host`]).
pub(crate) enum HostBytes {
    Owned(Vec<u8>),
    Borrowed { ptr: NonNull<u8>, len: usize },
}

// SAFETY: a borrowed region is only reached through the buffer's mutex, and the caller of
// `Device::borrow_host` promised it stays valid, and untouched by others, while the buffer
// is used (the same promise a `&mut [u8]` carries across threads).
unsafe impl Send for HostBytes {}

impl Deref for HostBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            HostBytes::Owned(v) => v,
            // SAFETY: `ptr` holds `len` valid bytes (the contract of `borrow_host`).
            HostBytes::Borrowed { ptr, len } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), *len)
            },
        }
    }
}

impl DerefMut for HostBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            HostBytes::Owned(v) => v,
            // SAFETY: as above, and the region is writable.
            HostBytes::Borrowed { ptr, len } => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), *len)
            },
        }
    }
}

impl AnyBuffer {
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.len * self.dtype.size_bytes()
    }
    pub fn is_gpu(&self) -> bool {
        matches!(self.storage, Storage::Gpu(_) | Storage::GpuBorrowed { .. })
    }

    /// Whether the memory is borrowed ([`Device::borrow_host`], [`Device::borrow_device`])
    /// rather than owned.
    pub fn is_borrowed(&self) -> bool {
        match &self.storage {
            Storage::Cpu(m) => matches!(
                *m.lock().unwrap_or_else(|e| e.into_inner()),
                HostBytes::Borrowed { .. }
            ),
            Storage::Gpu(_) => false,
            Storage::GpuBorrowed { .. } => true,
        }
    }

    /// The address of the first element: a device address for a GPU buffer, a host
    /// address for a CPU one. It stays the same for the buffer's life, so it can be handed
    /// to other libraries (DLPack) that read or write the memory in place; anything they
    /// do must not overlap a launch that uses the buffer.
    pub fn address(&self) -> u64 {
        match &self.storage {
            Storage::Cpu(m) => m.lock().unwrap_or_else(|e| e.into_inner()).as_ptr() as u64,
            _ => self.device_ptr().unwrap_or(0),
        }
    }

    /// Whether this buffer was made by `device` (or a clone of it). CPU buffers belong to
    /// every CPU device.
    pub(crate) fn on(&self, device: &Device) -> bool {
        match (&self.storage, &device.backend) {
            (Storage::Cpu(_), Backend::Cpu) => true,
            (Storage::Gpu(s), Backend::Gpu(g)) => Arc::ptr_eq(s.stream(), &g.stream),
            (Storage::GpuBorrowed { gpu, .. }, Backend::Gpu(g)) => Arc::ptr_eq(gpu, g),
            _ => false,
        }
    }

    pub(crate) fn describe_owner(&self) -> String {
        match &self.storage {
            Storage::Cpu(_) => "the CPU".into(),
            Storage::Gpu(s) => format!("GPU {} (another device handle)", s.ordinal()),
            Storage::GpuBorrowed { gpu, .. } => {
                format!("GPU {} (another device handle)", gpu.ordinal)
            }
        }
    }

    /// Fails with [`RuntimeError::WrongDevice`] unless this buffer belongs to `device`.
    pub(crate) fn check_on(&self, device: &Device, what: impl FnOnce() -> String) -> Result<()> {
        if self.on(device) {
            Ok(())
        } else {
            Err(RuntimeError::WrongDevice {
                what: what(),
                expected: device.describe(),
                found: self.describe_owner(),
            })
        }
    }

    /// The device address (GPU buffers only).
    pub(crate) fn device_ptr(&self) -> Option<u64> {
        match &self.storage {
            Storage::Gpu(s) => {
                let (ptr, _no_event) = s.device_ptr(s.stream());
                Some(ptr)
            }
            Storage::GpuBorrowed { ptr, .. } => Some(*ptr),
            Storage::Cpu(_) => None,
        }
    }

    /// The device and the stream its copies are queued on (GPU buffers only).
    fn gpu_stream(&self) -> Option<(sys::CUdeviceptr, &Arc<cudarc::driver::CudaStream>)> {
        match &self.storage {
            Storage::Gpu(s) => Some((self.device_ptr()?, s.stream())),
            Storage::GpuBorrowed { ptr, gpu } => Some((*ptr, &gpu.stream)),
            Storage::Cpu(_) => None,
        }
    }

    /// The host bytes of a CPU buffer, locked.
    pub(crate) fn lock_cpu(&self) -> Option<MutexGuard<'_, HostBytes>> {
        match &self.storage {
            Storage::Cpu(m) => Some(m.lock().unwrap_or_else(|e| e.into_inner())),
            _ => None,
        }
    }
}

impl fmt::Debug for AnyBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let place = match &self.storage {
            Storage::Cpu(_) if self.is_borrowed() => "cpu (borrowed)".to_string(),
            Storage::Cpu(_) => "cpu".to_string(),
            Storage::Gpu(s) => format!("gpu {}", s.ordinal()),
            Storage::GpuBorrowed { gpu, .. } => format!("gpu {} (borrowed)", gpu.ordinal),
        };
        write!(f, "Buffer<{}>[{}] on {place}", self.dtype.name(), self.len)
    }
}

/// `len` elements of `T` on a device. Made by [`Device::alloc`] or [`Device::upload`];
/// read back with [`Buffer::download`]; passed to kernels with [`Arg::from`](crate::Arg).
pub struct Buffer<T: Element> {
    raw: AnyBuffer,
    _t: PhantomData<T>,
}

impl<T: Element> fmt::Debug for Buffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.raw.fmt(f)
    }
}

impl<T: Element> Buffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.raw.len
    }
    pub fn is_empty(&self) -> bool {
        self.raw.len == 0
    }
    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.raw.size_bytes()
    }
    pub fn dtype(&self) -> DType {
        T::DTYPE
    }
    pub fn is_gpu(&self) -> bool {
        self.raw.is_gpu()
    }
    /// The type-erased buffer, as launch arguments hold it.
    pub fn untyped(&self) -> &AnyBuffer {
        &self.raw
    }

    /// Copies the buffer to the host. On the GPU this waits for all work queued before it
    /// on the device's stream, and reports errors raised by earlier kernels.
    pub fn download(&self) -> Result<Vec<T>> {
        let n = self.raw.len;
        if let Some(bytes) = self.raw.lock_cpu() {
            return Ok(bytes
                .chunks_exact(std::mem::size_of::<T>())
                .map(T::read_le)
                .collect());
        }
        let mut out = vec![T::default(); n];
        if n > 0 {
            let (ptr, stream) = self.raw.gpu_stream().expect("a GPU buffer");
            bind(stream)?;
            // SAFETY: the allocation holds at least `n` values of `T`, every bit pattern is
            // a valid `T` (all element types are plain numbers), and `out` lives until the
            // stream is synchronised below.
            unsafe { result::memcpy_dtoh_async(&mut out, ptr, stream.cu_stream()) }
                .map_err(driver("cuMemcpyDtoHAsync"))?;
            stream
                .synchronize()
                .map_err(driver("cuStreamSynchronize"))?;
        }
        Ok(out)
    }

    /// Overwrites the buffer with `data`, which must have exactly `len` elements.
    pub fn copy_from_host(&mut self, data: &[T]) -> Result<()> {
        if data.len() != self.raw.len {
            return Err(RuntimeError::BufferMismatch {
                op: "copy_from_host",
                expected: format!("{} {} values", self.raw.len, T::DTYPE.name()),
                found: format!("{} values", data.len()),
            });
        }
        if let Some(mut bytes) = self.raw.lock_cpu() {
            write_host(data, &mut bytes);
            return Ok(());
        }
        if data.is_empty() {
            return Ok(());
        }
        let (ptr, stream) = self.raw.gpu_stream().expect("a GPU buffer");
        bind(stream)?;
        // SAFETY: the allocation holds at least `len` values of `T`; `data` outlives the
        // copy (the stream is synchronised below).
        unsafe { result::memcpy_htod_async(ptr, data, stream.cu_stream()) }
            .map_err(driver("cuMemcpyHtoDAsync"))?;
        // The copy reads pageable host memory; wait so `data` may be reused at once.
        stream.synchronize().map_err(driver("cuStreamSynchronize"))
    }

    /// Copies `src` into this buffer, device to device (`cuMemcpyDtoDAsync` on the GPU,
    /// queued where this thread's launches go: the device's stream, or the caller's inside
    /// `Device::with_stream`, so that it is ordered with the kernels around it). Both must
    /// have the same length and live on the same device.
    pub fn copy_from(&mut self, src: &Buffer<T>) -> Result<()> {
        if src.raw.len != self.raw.len {
            return Err(RuntimeError::BufferMismatch {
                op: "copy_from",
                expected: format!("a source of {} {} values", self.raw.len, T::DTYPE.name()),
                found: format!("{} values", src.raw.len),
            });
        }
        let nbytes = self.raw.size_bytes();
        let wrong = |d: &AnyBuffer, s: &AnyBuffer| RuntimeError::WrongDevice {
            what: "the source of copy_from".into(),
            expected: d.describe_owner(),
            found: s.describe_owner(),
        };
        match (self.raw.gpu_stream(), src.raw.gpu_stream()) {
            (None, None) => {
                // Through a copy: the two may be borrowed views of the same memory.
                let from = src.raw.lock_cpu().expect("a CPU buffer").to_vec();
                self.raw
                    .lock_cpu()
                    .expect("a CPU buffer")
                    .copy_from_slice(&from);
                Ok(())
            }
            (Some((dst, stream)), Some((from, src_stream))) if same_device(stream, src_stream) => {
                if nbytes == 0 {
                    return Ok(());
                }
                bind(stream)?;
                // Where this thread's launches go: a step's copy between two of its
                // buffers is ordered with its kernels on the caller's stream.
                let queue = crate::device::launch_stream_of(stream);
                // SAFETY: both allocations hold at least `nbytes` bytes, on one device.
                unsafe { result::memcpy_dtod_async(dst, from, nbytes, queue) }
                    .map_err(driver("cuMemcpyDtoDAsync"))
            }
            _ => Err(wrong(&self.raw, &src.raw)),
        }
    }
}

/// Makes the stream's context current on this thread (raw driver calls need it).
fn bind(stream: &cudarc::driver::CudaStream) -> Result<()> {
    stream
        .context()
        .bind_to_thread()
        .map_err(driver("cuCtxSetCurrent"))
}

fn same_device(a: &Arc<cudarc::driver::CudaStream>, b: &Arc<cudarc::driver::CudaStream>) -> bool {
    Arc::ptr_eq(a, b)
}

fn write_host<T: Element>(data: &[T], bytes: &mut [u8]) {
    for (v, out) in data
        .iter()
        .zip(bytes.chunks_exact_mut(std::mem::size_of::<T>()))
    {
        v.write_le(out);
    }
}

fn byte_size<T: Element>(len: usize) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or(RuntimeError::BufferTooLarge {
            len,
            dtype: T::DTYPE,
        })
}

impl Device {
    /// A buffer of `len` zeroed elements.
    pub fn alloc<T: Element>(&self, len: usize) -> Result<Buffer<T>> {
        let nbytes = byte_size::<T>(len)?;
        let storage = match &self.backend {
            Backend::Cpu => Storage::Cpu(Mutex::new(HostBytes::Owned(vec![0u8; nbytes]))),
            Backend::Gpu(g) => Storage::Gpu(
                g.stream
                    .alloc_zeros::<u8>(nbytes.max(1))
                    .map_err(driver("cuMemAllocAsync"))?,
            ),
        };
        Ok(Buffer {
            raw: AnyBuffer {
                dtype: T::DTYPE,
                len,
                storage,
            },
            _t: PhantomData,
        })
    }

    /// A buffer holding a copy of `data`.
    pub fn upload<T: Element>(&self, data: &[T]) -> Result<Buffer<T>> {
        match &self.backend {
            Backend::Cpu => {
                let mut bytes = vec![0u8; byte_size::<T>(data.len())?];
                write_host(data, &mut bytes);
                Ok(Buffer {
                    raw: AnyBuffer {
                        dtype: T::DTYPE,
                        len: data.len(),
                        storage: Storage::Cpu(Mutex::new(HostBytes::Owned(bytes))),
                    },
                    _t: PhantomData,
                })
            }
            Backend::Gpu(g) => {
                let nbytes = byte_size::<T>(data.len())?;
                // SAFETY: every byte is written by the copy below before any read (an
                // empty buffer's one padding byte is never read).
                let slice = unsafe { g.stream.alloc::<u8>(nbytes.max(1)) }
                    .map_err(driver("cuMemAllocAsync"))?;
                let mut buf = Buffer {
                    raw: AnyBuffer {
                        dtype: T::DTYPE,
                        len: data.len(),
                        storage: Storage::Gpu(slice),
                    },
                    _t: PhantomData,
                };
                buf.copy_from_host(data)?;
                Ok(buf)
            }
        }
    }

    /// Sets every byte of `buf` to `byte`: poisons outputs before a kernel runs, so
    /// values it failed to write stand out (0xFF makes every float a NaN), or clears a
    /// sum before kernels add into it. Queued where this thread's launches go (the
    /// caller's stream under [`Device::with_stream`]), so it is ordered with the kernels
    /// around it.
    pub fn fill_bytes<T: Element>(&self, buf: &mut Buffer<T>, byte: u8) -> Result<()> {
        buf.raw
            .check_on(self, || "the buffer given to fill_bytes".into())?;
        let nbytes = buf.raw.size_bytes();
        if let Some(mut bytes) = buf.raw.lock_cpu() {
            bytes.fill(byte);
            return Ok(());
        }
        if nbytes == 0 {
            return Ok(());
        }
        let (ptr, stream) = buf.raw.gpu_stream().expect("a GPU buffer");
        bind(stream)?;
        let queue = self.launch_stream().unwrap_or(stream.cu_stream());
        // SAFETY: `ptr` holds at least `nbytes` bytes on the stream's device (the buffer is
        // this device's, checked), and any byte pattern is a valid element.
        unsafe { result::memset_d8_async(ptr, byte, nbytes, queue) }
            .map_err(driver("cuMemsetD8Async"))
    }

    /// A CPU buffer over `len` elements of host memory at `ptr`, which it borrows: kernels
    /// launched on the CPU read and write that memory in place (no copy), and dropping the
    /// buffer frees nothing. Fails on a GPU device, and when `ptr` is null (with `len > 0`)
    /// or not aligned for `T`.
    ///
    /// # Safety
    /// `ptr` must point to `len` initialised, writable elements that stay valid for as long
    /// as the buffer is used, and nothing else may read or write them while a launch or a
    /// copy uses the buffer. Two borrowed buffers may overlap; a launch given overlapping
    /// buffers refuses to run.
    pub unsafe fn borrow_host<T: Element>(&self, ptr: *mut T, len: usize) -> Result<Buffer<T>> {
        if self.is_gpu() {
            return Err(RuntimeError::WrongDevice {
                what: "host memory given to borrow_host".into(),
                expected: self.describe(),
                found: "the CPU".into(),
            });
        }
        let nbytes = byte_size::<T>(len)?;
        let bytes = if nbytes == 0 {
            HostBytes::Owned(Vec::new())
        } else {
            let Some(p) = NonNull::new(ptr.cast::<u8>()) else {
                return Err(borrow_error("a null pointer"));
            };
            if !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) {
                return Err(borrow_error(format!(
                    "address {ptr:p}, not aligned to {} bytes",
                    std::mem::align_of::<T>()
                )));
            }
            HostBytes::Borrowed {
                ptr: p,
                len: nbytes,
            }
        };
        Ok(Buffer {
            raw: AnyBuffer {
                dtype: T::DTYPE,
                len,
                storage: Storage::Cpu(Mutex::new(bytes)),
            },
            _t: PhantomData,
        })
    }

    /// A GPU buffer over `len` elements of device memory at address `ptr` (allocated by
    /// someone else, e.g. PyTorch), which it borrows: kernels read and write it in place,
    /// and dropping the buffer frees nothing. Fails on the CPU, and when `ptr` is 0 (with
    /// `len > 0`) or not aligned for `T`.
    ///
    /// # Safety
    /// `ptr` must be an allocation of this device's (primary) context holding `len`
    /// elements, valid for as long as work that uses the buffer may still run on the GPU.
    pub unsafe fn borrow_device<T: Element>(
        &self,
        ptr: sys::CUdeviceptr,
        len: usize,
    ) -> Result<Buffer<T>> {
        let Backend::Gpu(g) = &self.backend else {
            return Err(RuntimeError::WrongDevice {
                what: "device memory given to borrow_device".into(),
                expected: "a GPU".into(),
                found: self.describe(),
            });
        };
        byte_size::<T>(len)?;
        if len > 0 && ptr == 0 {
            return Err(borrow_error("a null device address"));
        }
        if !ptr.is_multiple_of(std::mem::align_of::<T>() as u64) {
            return Err(borrow_error(format!(
                "device address {ptr:#x}, not aligned to {} bytes",
                std::mem::align_of::<T>()
            )));
        }
        Ok(Buffer {
            raw: AnyBuffer {
                dtype: T::DTYPE,
                len,
                storage: Storage::GpuBorrowed {
                    ptr,
                    gpu: g.clone(),
                },
            },
            _t: PhantomData,
        })
    }
}

fn borrow_error(found: impl Into<String>) -> RuntimeError {
    RuntimeError::BufferMismatch {
        op: "borrow",
        expected: "a non-null address aligned for the element type".into(),
        found: found.into(),
    }
}

impl<'a, T: Element> From<&'a Buffer<T>> for &'a AnyBuffer {
    fn from(b: &'a Buffer<T>) -> &'a AnyBuffer {
        &b.raw
    }
}
