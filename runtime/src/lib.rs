//! dusk-runtime: loads dusk's PTX through the CUDA driver and launches it, or runs the
//! same kernels' IR on the CPU through the interpreter when there is no GPU.
//!
//! The CUDA driver is loaded at run time (cudarc's dynamic loading), so this crate builds
//! with no CUDA installed, and every call returns a [`RuntimeError`] rather than panicking
//! when no GPU or driver is present. It never links LLVM.
//!
//! - [`Device`]: a GPU ([`Device::gpu`]) or the CPU ([`Device::cpu`]); [`Device::best`]
//!   picks GPU 0 when usable.
//! - [`Buffer<T>`]: typed device memory for the [`Element`] types (`f16`, `bf16`, `f32`,
//!   `i32`, `i64`, `u8`): [`Device::alloc`], [`Device::upload`], [`Buffer::download`],
//!   [`Buffer::copy_from`] (device to device), [`Device::fill_bytes`] (poisoning).
//! - [`LoadedKernel`]: [`Device::load_kernel`] from the IR and, on the GPU, its PTX;
//!   [`Device::launch`] checks every [`Arg`] against the kernel's parameters first.
//! - [`Bundle`]: ahead-of-time PTX and a manifest, loaded with no LLVM ([`bundle`]).
//! - Graphs: [`Device::capture`] records the work a closure queues (a decode step) as a
//!   CUDA graph, [`Graph::replay`] runs it again over whatever its buffers then hold;
//!   [`Device::replay`] submits one eager call's launches (a plan's `run`) as one graph
//!   launch, patched with each call's arguments.
//! - Timing: the harness every benchmark and the tuner use ([`Device::time_calls`]: inputs
//!   rotated past twice the L2, calls captured in a CUDA graph and replayed), and [`median`].
//!
//! Buffers round-trip on any device:
//!
//! ```
//! use dusk_runtime::Device;
//! use half::f16;
//!
//! let dev = Device::cpu();
//! let x = dev.upload(&[f16::from_f32(1.5), f16::from_f32(-2.0)])?;
//! assert_eq!(x.download()?, vec![f16::from_f32(1.5), f16::from_f32(-2.0)]);
//!
//! let mut y = dev.alloc::<f16>(2)?;
//! y.copy_from(&x)?;
//! dev.fill_bytes(&mut y, 0xFF)?;
//! assert!(y.download()?.iter().all(|v| v.is_nan()));
//! # Ok::<(), dusk_runtime::RuntimeError>(())
//! ```
//!
//! Launching a kernel compiled to PTX (needs a GPU; on the CPU pass `None` for the PTX):
//!
//! ```no_run
//! use dusk_compiler::{DType, KernelBuilder};
//! use dusk_runtime::{Arg, Device};
//! use std::sync::Arc;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let ptx = String::new();
//! let mut b = KernelBuilder::new("scale");
//! let x = b.param_ptr("x", DType::F32);
//! let n = b.param_scalar("n", DType::I32);
//! // ... the kernel body ...
//! let ir = Arc::new(b.finish()?);
//! let dev = Device::best();
//! let kernel = dev.load_kernel(ir, dev.is_gpu().then_some(ptx.as_str()))?;
//! let buf = dev.upload(&vec![1.0f32; 4096])?;
//! dev.launch(&kernel, [32, 1, 1], &[Arg::from(&buf), Arg::I32(4096)])?;
//! let t = dev.time_calls(1, |_| dev.launch(&kernel, [32, 1, 1], &[Arg::from(&buf), Arg::I32(4096)]))?;
//! println!("{:.1} us a call ({})", t.median_us(), t.timing);
//! # Ok(()) }
//! ```

mod buffer;
pub mod bundle;
mod device;
mod error;
mod graph;
mod kernel;
mod launch;
mod replay;
mod timing;

pub use buffer::{AnyBuffer, Buffer, Element};
pub use bundle::{Bundle, LoadedBundle, Manifest, RawBundle};
pub use device::Device;
pub use error::{Result, RuntimeError};
pub use graph::Graph;
pub use kernel::{Arg, LoadedKernel};
pub use replay::Replay;
pub use timing::{median, rotation_sets, Measured, TimeConfig, Timing};

/// The cudarc version this crate is built on, for callers that use
/// [`Device::cuda_stream`].
pub use cudarc;
