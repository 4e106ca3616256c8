//! Typed device buffers. A [`Buffer<T>`] is a typed handle over an untyped allocation
//! ([`AnyBuffer`]), so launches can take buffers of any element type in one argument list
//! and check each against the kernel's pointer parameters.

use crate::device::{Backend, Device};
use crate::error::{driver, Result, RuntimeError};
use cudarc::driver::{result, CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr};
use dusk_compiler::DType;
use half::{bf16, f16};
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Mutex, MutexGuard};

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
    /// Bytes in host memory. The mutex lets a launch write through a shared reference
    /// (as a GPU kernel may) and keeps the buffer `Sync`.
    Cpu(Mutex<Vec<u8>>),
    /// Device memory, at least one byte (CUDA refuses empty allocations), allocated on
    /// its device's stream.
    Gpu(CudaSlice<u8>),
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
        matches!(self.storage, Storage::Gpu(_))
    }

    /// Whether this buffer was made by `device` (or a clone of it). CPU buffers belong to
    /// every CPU device.
    pub(crate) fn on(&self, device: &Device) -> bool {
        match (&self.storage, &device.backend) {
            (Storage::Cpu(_), Backend::Cpu) => true,
            (Storage::Gpu(s), Backend::Gpu(g)) => std::sync::Arc::ptr_eq(s.stream(), &g.stream),
            _ => false,
        }
    }

    pub(crate) fn describe_owner(&self) -> String {
        match &self.storage {
            Storage::Cpu(_) => "the CPU".into(),
            Storage::Gpu(s) => format!("GPU {} (another device handle)", s.ordinal()),
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
            Storage::Cpu(_) => None,
        }
    }

    /// The host bytes of a CPU buffer, locked.
    pub(crate) fn lock_cpu(&self) -> Option<MutexGuard<'_, Vec<u8>>> {
        match &self.storage {
            Storage::Cpu(m) => Some(m.lock().unwrap_or_else(|e| e.into_inner())),
            Storage::Gpu(_) => None,
        }
    }
}

impl fmt::Debug for AnyBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let place = match &self.storage {
            Storage::Cpu(_) => "cpu".to_string(),
            Storage::Gpu(s) => format!("gpu {}", s.ordinal()),
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
        match &self.raw.storage {
            Storage::Cpu(m) => {
                let bytes = m.lock().unwrap_or_else(|e| e.into_inner());
                Ok(bytes
                    .chunks_exact(std::mem::size_of::<T>())
                    .map(T::read_le)
                    .collect())
            }
            Storage::Gpu(s) => {
                let mut out = vec![T::default(); n];
                if n > 0 {
                    let stream = s.stream().clone();
                    // SAFETY: the allocation holds at least `n` values of `T` and every
                    // bit pattern is a valid `T` (all element types are plain numbers).
                    let view =
                        unsafe { s.transmute::<T>(n) }.expect("allocation holds len elements");
                    stream
                        .memcpy_dtoh(&view, &mut out)
                        .map_err(driver("cuMemcpyDtoHAsync"))?;
                    stream
                        .synchronize()
                        .map_err(driver("cuStreamSynchronize"))?;
                }
                Ok(out)
            }
        }
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
        match &mut self.raw.storage {
            Storage::Cpu(m) => {
                let bytes = m.get_mut().unwrap_or_else(|e| e.into_inner());
                write_host(data, bytes);
                Ok(())
            }
            Storage::Gpu(s) => {
                if data.is_empty() {
                    return Ok(());
                }
                let stream = s.stream().clone();
                // SAFETY: the allocation holds at least `len` values of `T`.
                let mut view = unsafe { s.transmute_mut::<T>(data.len()) }
                    .expect("allocation holds len elements");
                stream
                    .memcpy_htod(data, &mut view)
                    .map_err(driver("cuMemcpyHtoDAsync"))?;
                // The copy reads pageable host memory; wait so `data` may be reused at once.
                stream.synchronize().map_err(driver("cuStreamSynchronize"))
            }
        }
    }

    /// Copies `src` into this buffer, device to device (`cuMemcpyDtoDAsync` on the GPU,
    /// queued on the device's stream). Both must have the same length and live on the
    /// same device.
    pub fn copy_from(&mut self, src: &Buffer<T>) -> Result<()> {
        if src.raw.len != self.raw.len {
            return Err(RuntimeError::BufferMismatch {
                op: "copy_from",
                expected: format!("a source of {} {} values", self.raw.len, T::DTYPE.name()),
                found: format!("{} values", src.raw.len),
            });
        }
        let nbytes = self.raw.size_bytes();
        match (&mut self.raw.storage, &src.raw.storage) {
            (Storage::Cpu(d), Storage::Cpu(s)) => {
                let s = s.lock().unwrap_or_else(|e| e.into_inner());
                d.get_mut()
                    .unwrap_or_else(|e| e.into_inner())
                    .copy_from_slice(&s);
                Ok(())
            }
            (Storage::Gpu(d), Storage::Gpu(s))
                if std::sync::Arc::ptr_eq(d.stream(), s.stream()) =>
            {
                if nbytes == 0 {
                    return Ok(());
                }
                let stream = d.stream().clone();
                let src_view = s.slice(0..nbytes);
                let mut dst_view = d.slice_mut(0..nbytes);
                stream
                    .memcpy_dtod(&src_view, &mut dst_view)
                    .map_err(driver("cuMemcpyDtoDAsync"))
            }
            _ => Err(RuntimeError::WrongDevice {
                what: "the source of copy_from".into(),
                expected: self.raw.describe_owner(),
                found: src.raw.describe_owner(),
            }),
        }
    }
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
            Backend::Cpu => Storage::Cpu(Mutex::new(vec![0u8; nbytes])),
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
                        storage: Storage::Cpu(Mutex::new(bytes)),
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
    /// values it failed to write stand out (0xFF makes every float a NaN).
    pub fn fill_bytes<T: Element>(&self, buf: &mut Buffer<T>, byte: u8) -> Result<()> {
        buf.raw
            .check_on(self, || "the buffer given to fill_bytes".into())?;
        let nbytes = buf.raw.size_bytes();
        match &mut buf.raw.storage {
            Storage::Cpu(m) => {
                m.get_mut().unwrap_or_else(|e| e.into_inner()).fill(byte);
                Ok(())
            }
            Storage::Gpu(s) => {
                if nbytes == 0 {
                    return Ok(());
                }
                let stream = s.stream().clone();
                stream
                    .context()
                    .bind_to_thread()
                    .map_err(driver("cuCtxSetCurrent"))?;
                let (ptr, _no_event) = s.device_ptr_mut(&stream);
                // SAFETY: `ptr` holds at least `nbytes` bytes, allocated on `stream`, and
                // any byte pattern is a valid element.
                unsafe { result::memset_d8_async(ptr, byte, nbytes, stream.cu_stream()) }
                    .map_err(driver("cuMemsetD8Async"))
            }
        }
    }
}

impl<'a, T: Element> From<&'a Buffer<T>> for &'a AnyBuffer {
    fn from(b: &'a Buffer<T>) -> &'a AnyBuffer {
        &b.raw
    }
}
