//! Ahead-of-time bundles: a directory of PTX files and a `manifest.json` that says, for
//! each kernel, its PTX entry, its parameters, how to size its grid and the configuration
//! it was compiled for. [`Bundle::open`] reads one with no LLVM and no CUDA toolkit;
//! [`Bundle::load`] makes its kernels launchable on a [`Device`], and
//! [`Bundle::load_in_current_context`] on the caller's own CUDA context and streams (the
//! path of the C ABI, `dusk-capi`).
//!
//! The manifest (format 1), one entry per kernel and configuration:
//!
//! ```json
//! { "format": 1, "generator": "dusk 0.1.0, LLVM 19.1.7",
//!   "target": { "arch": "sm_90a", "ptx_isa": "8.0" },
//!   "kernels": [ { "name": "quantize_k4_d128", "entry": "quantize_k4",
//!     "ptx": "quantize_k4_d128.ptx", "family": "quantize_k", "ir_hash": "…",
//!     "params": [ { "name": "k", "type": "ptr<f16>" }, { "name": "num_rows", "type": "i32" } ],
//!     "launch": { "num_warps": 4, "inputs": [],
//!                 "grid": [ [ { "input": "num_rows", "div": 16 } ], [], [] ] },
//!     "config": { "head_dim": 128, "bits": 4 }, "tuning": [] } ] }
//! ```
//!
//! Grid dimension `i` is the product over `grid[i]` of `ceil(value / div)` (1 when empty),
//! where each `input` names a scalar parameter of the kernel or one of the launch-only
//! `inputs` (such as the longest candidate list), given at launch after the arguments.
//!
//! Reading a bundle and checking arguments works anywhere:
//!
//! ```
//! use dusk_runtime::{Arg, Bundle, Device};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = std::env::temp_dir().join(format!("dusk-bundle-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! # std::fs::write(dir.join("manifest.json"), r#"{"format":1,"generator":"doc",
//! #   "target":{"arch":"sm_90a","ptx_isa":"8.0"},"kernels":[{"name":"fill","entry":"fill",
//! #   "ptx":"fill.ptx","family":"fill","ir_hash":"0","params":[{"name":"x","type":"ptr<f32>"},
//! #   {"name":"n","type":"i32"}],"launch":{"num_warps":4,"inputs":[],
//! #   "grid":[[{"input":"n","div":128}],[],[]]},"config":{}}]}"#)?;
//! # std::fs::write(dir.join("fill.ptx"), ".visible .entry fill(\n")?;
//! let bundle = Bundle::open(&dir)?;
//! let fill = bundle.kernel("fill")?;
//! assert_eq!(fill.launch.threads(), 128);
//! let x = Device::cpu().alloc::<f32>(1000)?;
//! let args = [Arg::from(&x), Arg::I32(1000)];
//! bundle.check_args("fill", &args)?;
//! assert_eq!(bundle.grid("fill", &args, &[])?, [8, 1, 1]);
//! // An sm_90a bundle runs on Hopper only.
//! assert!(bundle.check_arch(Some((9, 0))).is_ok());
//! assert!(bundle.check_arch(Some((8, 0))).is_err());
//! // A wrong element type is refused before anything runs.
//! let y = Device::cpu().alloc::<i32>(1000)?;
//! assert!(bundle.check_args("fill", &[Arg::from(&y), Arg::I32(1000)]).is_err());
//! # Ok(()) }
//! ```

use crate::device::Device;
use crate::error::{driver, Result, RuntimeError};
use crate::kernel::{Arg, LoadedKernel};
use cudarc::driver::sys;
use dusk_compiler::{DType, KernelBuilder};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The manifest format this runtime reads.
pub const FORMAT: u32 = 1;

/// `manifest.json`: what a bundle holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// What wrote the bundle (dusk and LLVM versions).
    pub generator: String,
    pub target: BundleTarget,
    pub kernels: Vec<KernelEntry>,
}

/// The architecture and PTX ISA every PTX file of the bundle was written for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BundleTarget {
    /// `sm_90a` or `sm_80`.
    pub arch: String,
    /// `major.minor`: a driver must read at least this PTX ISA.
    pub ptx_isa: String,
}

/// One kernel compiled for one configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelEntry {
    /// Unique in the bundle; the C ABI's function is `dusk_<name>`.
    pub name: String,
    /// The `.entry` in the PTX file.
    pub entry: String,
    /// The PTX file, relative to the bundle directory.
    pub ptx: String,
    /// The kernel family (`spgemv_quant`, `quantize_k`, ...) this is one configuration of.
    pub family: String,
    /// FNV-1a hash of the kernel's printed IR: the kernel part of tuning-cache keys.
    pub ir_hash: String,
    pub params: Vec<ParamEntry>,
    pub launch: LaunchRule,
    /// The configuration (constant generics, tiling), as the kernel family names them.
    pub config: serde_json::Map<String, serde_json::Value>,
    /// Tuning results recorded for this configuration, when the bundle was written with a
    /// tuning cache.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tuning: Vec<serde_json::Value>,
}

/// A kernel parameter: `ptr<f16>`, `ptr<u8>`, ... for buffers, `i32`, `i64`, `f32`, `u8`,
/// `i1` for scalars.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamEntry {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: String,
}

/// How a launch is shaped: threads per program and the grid formula.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LaunchRule {
    pub num_warps: u32,
    /// Launch-only values the grid needs besides the scalar parameters, given at launch in
    /// this order.
    pub inputs: Vec<String>,
    /// Per grid axis (x, y, z), the factors whose product is its size.
    pub grid: [Vec<GridFactor>; 3],
}

/// `ceil(input / div)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GridFactor {
    pub input: String,
    pub div: u32,
}

impl LaunchRule {
    /// Threads per program.
    pub fn threads(&self) -> u32 {
        self.num_warps * 32
    }
}

impl ParamEntry {
    /// The parameter's element type and whether it is a pointer.
    pub fn parse(&self) -> Option<(DType, bool)> {
        let (name, ptr) = match self
            .ty
            .strip_prefix("ptr<")
            .and_then(|s| s.strip_suffix('>'))
        {
            Some(inner) => (inner, true),
            None => (self.ty.as_str(), false),
        };
        let d = [
            DType::Bool,
            DType::U8,
            DType::I32,
            DType::I64,
            DType::F16,
            DType::BF16,
            DType::F32,
        ]
        .into_iter()
        .find(|d| d.name() == name)?;
        Some((d, ptr))
    }
}

/// A bundle read from disk: its manifest and every kernel's PTX text.
#[derive(Debug)]
pub struct Bundle {
    dir: PathBuf,
    manifest: Manifest,
    ptx: HashMap<String, Arc<str>>,
}

fn bad(dir: &Path, msg: impl Into<String>) -> RuntimeError {
    RuntimeError::Bundle {
        path: dir.display().to_string(),
        msg: msg.into(),
    }
}

impl Bundle {
    /// Reads `dir/manifest.json` and every PTX file it names, and checks that they agree:
    /// known format, unique names, parseable parameter types, the entry present in its
    /// PTX, grid inputs that name a scalar parameter or a launch input.
    pub fn open(dir: impl AsRef<Path>) -> Result<Bundle> {
        let dir = dir.as_ref();
        let path = dir.join("manifest.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| bad(dir, format!("cannot read {}: {e}", path.display())))?;
        Self::from_files(dir, &text, |name| {
            let file = dir.join(name);
            std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))
        })
    }

    /// A bundle whose manifest is `manifest` and whose PTX files `read` gives by name (as
    /// the manifest's `ptx` fields name them), with the checks of [`Bundle::open`]: for a
    /// bundle built into a program (`include_str!`) rather than read from a directory.
    /// `dir` is only how errors name it.
    pub fn from_files(
        dir: impl AsRef<Path>,
        manifest: &str,
        mut read: impl FnMut(&str) -> std::result::Result<String, String>,
    ) -> Result<Bundle> {
        let dir = dir.as_ref();
        let text = manifest;
        let manifest: Manifest = serde_json::from_str(text).map_err(|e| {
            bad(
                dir,
                format!("manifest.json is not a format-{FORMAT} manifest: {e}"),
            )
        })?;
        if manifest.format != FORMAT {
            return Err(bad(
                dir,
                format!(
                    "manifest format {} (this runtime reads {FORMAT})",
                    manifest.format
                ),
            ));
        }
        let mut ptx = HashMap::new();
        for k in &manifest.kernels {
            let kerr = |msg: String| bad(dir, format!("kernel `{}`: {msg}", k.name));
            for p in &k.params {
                if p.parse().is_none() {
                    return Err(kerr(format!(
                        "parameter `{}` has unknown type `{}`",
                        p.name, p.ty
                    )));
                }
            }
            for f in k.launch.grid.iter().flatten() {
                let scalar = k.params.iter().any(|p| {
                    p.name == f.input && p.parse().is_some_and(|(d, ptr)| !ptr && d.is_int())
                });
                if f.div == 0 || !(scalar || k.launch.inputs.contains(&f.input)) {
                    return Err(kerr(format!(
                        "grid factor {f:?} needs a divisor above 0 and an integer parameter or launch input"
                    )));
                }
            }
            if !(1..=32).contains(&k.launch.num_warps) {
                return Err(kerr(format!("{} warps per program", k.launch.num_warps)));
            }
            let text = read(&k.ptx).map_err(kerr)?;
            if !text
                .lines()
                .any(|l| l.contains(".entry") && l.contains(&format!("{}(", k.entry)))
            {
                return Err(kerr(format!("{} has no entry `{}`", k.ptx, k.entry)));
            }
            if ptx.insert(k.name.clone(), Arc::<str>::from(text)).is_some() {
                return Err(kerr("the name appears twice".into()));
            }
        }
        Ok(Bundle {
            dir: dir.to_path_buf(),
            manifest,
            ptx,
        })
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry of kernel `name`.
    pub fn kernel(&self, name: &str) -> Result<&KernelEntry> {
        self.manifest
            .kernels
            .iter()
            .find(|k| k.name == name)
            .ok_or_else(|| {
                bad(
                    &self.dir,
                    format!(
                        "no kernel `{name}` (it has: {})",
                        self.manifest
                            .kernels
                            .iter()
                            .map(|k| k.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })
    }

    /// The PTX text of kernel `name`.
    pub fn ptx(&self, name: &str) -> Result<&str> {
        self.kernel(name)?;
        Ok(&self.ptx[name])
    }

    /// Checks `args` against the parameters of kernel `name`: count, buffer or scalar,
    /// element type.
    pub fn check_args(&self, name: &str, args: &[Arg<'_>]) -> Result<()> {
        let k = self.kernel(name)?;
        if args.len() != k.params.len() {
            return Err(RuntimeError::ArgCount {
                kernel: name.into(),
                expected: k.params.len(),
                found: args.len(),
            });
        }
        for (index, (p, a)) in k.params.iter().zip(args).enumerate() {
            let ok = match (p.parse(), a) {
                (Some((d, true)), Arg::Buffer(b)) => b.dtype() == d,
                (Some((d, false)), a) => a.scalar_dtype() == Some(d),
                _ => false,
            };
            if !ok {
                return Err(RuntimeError::ArgMismatch {
                    kernel: name.into(),
                    index,
                    param: p.name.clone(),
                    expected: p.ty.clone(),
                    found: a.describe(),
                });
            }
        }
        Ok(())
    }

    /// The grid of kernel `name` for these arguments and launch-only `inputs` (in the
    /// order of `launch.inputs`).
    pub fn grid(&self, name: &str, args: &[Arg<'_>], inputs: &[u64]) -> Result<[u32; 3]> {
        let k = self.kernel(name)?;
        grid_of(k, inputs, |pname| {
            let i = k.params.iter().position(|p| p.name == pname)?;
            match args.get(i)? {
                Arg::I32(v) => Some(*v as i64),
                Arg::I64(v) => Some(*v),
                Arg::U8(v) => Some(*v as i64),
                _ => None,
            }
        })
    }

    /// Loads every kernel on `device` (a GPU: a bundle holds PTX only; on the CPU run the
    /// kernels' IR from `dusk-kernels` through the interpreter instead).
    pub fn load(&self, device: &Device) -> Result<LoadedBundle<'_>> {
        if !device.is_gpu() {
            return Err(bad(
                &self.dir,
                "a bundle holds PTX only and needs a GPU; on the CPU run the kernels' IR \
                 (dusk-kernels) through the interpreter",
            ));
        }
        self.check_arch(device.compute_capability())?;
        let mut kernels = HashMap::new();
        for k in &self.manifest.kernels {
            // The launch checks read the parameters and warps of the IR: a kernel with
            // this signature and no body stands in for it.
            let mut b = KernelBuilder::new(&k.entry);
            b.set_num_warps(k.launch.num_warps);
            for p in &k.params {
                match p.parse() {
                    Some((d, true)) => b.param_ptr(&p.name, d),
                    Some((d, false)) => b.param_scalar(&p.name, d),
                    None => unreachable!("checked by Bundle::open"),
                };
            }
            let ir = b
                .finish()
                .map_err(|e| bad(&self.dir, format!("kernel `{}`: {e}", k.name)))?;
            let loaded = device.load_kernel(Arc::new(ir), Some(&self.ptx[&k.name]))?;
            kernels.insert(k.name.clone(), loaded);
        }
        Ok(LoadedBundle {
            bundle: self,
            device: device.clone(),
            kernels,
        })
    }

    /// Fails unless a device of compute capability `cc` runs this bundle's architecture:
    /// `sm_90a` only on 9.0, `sm_XY` on X.Y or newer.
    pub fn check_arch(&self, cc: Option<(u32, u32)>) -> Result<()> {
        let arch = &self.manifest.target.arch;
        let digits: String = arch
            .strip_prefix("sm_")
            .unwrap_or("")
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        let want: u32 = digits
            .parse()
            .map_err(|_| bad(&self.dir, format!("unknown arch `{arch}`")))?;
        let specific = arch.ends_with('a');
        let Some((major, minor)) = cc else {
            return Ok(());
        };
        let have = major * 10 + minor;
        if (specific && have != want) || have < want {
            return Err(bad(
                &self.dir,
                format!(
                    "built for {arch}, but the GPU has compute capability {major}.{minor}; \
                     write a bundle for it (`dusk compile --target ...`)"
                ),
            ));
        }
        Ok(())
    }

    /// Loads every kernel into the CUDA context current on this thread, for launches on
    /// the caller's streams ([`RawBundle::launch`]).
    pub fn load_in_current_context(&self) -> Result<RawBundle> {
        let mut dev: sys::CUdevice = 0;
        // SAFETY: writes one device handle; fails cleanly when no context is current.
        unsafe { sys::cuCtxGetDevice(&mut dev) }
            .result()
            .map_err(driver("cuCtxGetDevice"))?;
        let attr = |a| {
            let mut v = 0i32;
            // SAFETY: writes one int for a valid device handle.
            unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) }
                .result()
                .map(|_| v.max(0) as u32)
                .map_err(driver("cuDeviceGetAttribute"))
        };
        use sys::CUdevice_attribute::*;
        let cc = (
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        self.check_arch(Some(cc))?;
        let mut kernels = HashMap::new();
        let mut modules = Vec::new();
        for k in &self.manifest.kernels {
            let src = CString::new(&*self.ptx[&k.name])
                .map_err(|_| bad(&self.dir, format!("{} contains a NUL byte", k.ptx)))?;
            let mut module: sys::CUmodule = std::ptr::null_mut();
            // SAFETY: `src` is NUL-terminated and outlives the call.
            unsafe { sys::cuModuleLoadData(&mut module, src.as_ptr().cast()) }
                .result()
                .map_err(driver("cuModuleLoadData"))?;
            modules.push(Module(module));
            let entry = CString::new(k.entry.as_str()).map_err(|_| {
                bad(
                    &self.dir,
                    format!("entry {:?} contains a NUL byte", k.entry),
                )
            })?;
            let mut func: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: `module` was just loaded; `entry` is NUL-terminated.
            unsafe { sys::cuModuleGetFunction(&mut func, module, entry.as_ptr()) }
                .result()
                .map_err(driver("cuModuleGetFunction"))?;
            kernels.insert(k.name.clone(), (k.clone(), Function(func)));
        }
        Ok(RawBundle { kernels, modules })
    }
}

fn grid_of(
    k: &KernelEntry,
    inputs: &[u64],
    scalar: impl Fn(&str) -> Option<i64>,
) -> Result<[u32; 3]> {
    if inputs.len() != k.launch.inputs.len() {
        return Err(RuntimeError::InvalidLaunch {
            kernel: k.name.clone(),
            msg: format!(
                "{} launch inputs ({}) expected, {} given",
                k.launch.inputs.len(),
                k.launch.inputs.join(", "),
                inputs.len()
            ),
        });
    }
    let mut grid = [1u32; 3];
    for (axis, factors) in k.launch.grid.iter().enumerate() {
        let mut n: u64 = 1;
        for f in factors {
            let v = match k.launch.inputs.iter().position(|i| *i == f.input) {
                Some(i) => inputs[i],
                None => {
                    let v = scalar(&f.input).unwrap_or(-1);
                    u64::try_from(v).map_err(|_| RuntimeError::InvalidLaunch {
                        kernel: k.name.clone(),
                        msg: format!("grid input `{}` is {v}, expected 0 or more", f.input),
                    })?
                }
            };
            n = n.saturating_mul(v.div_ceil(f.div as u64));
        }
        grid[axis] = u32::try_from(n).map_err(|_| RuntimeError::InvalidLaunch {
            kernel: k.name.clone(),
            msg: format!("grid axis {axis} would have {n} programs"),
        })?;
    }
    Ok(grid)
}

/// A bundle's kernels loaded on a [`Device`].
pub struct LoadedBundle<'a> {
    bundle: &'a Bundle,
    device: Device,
    kernels: HashMap<String, LoadedKernel>,
}

impl LoadedBundle<'_> {
    /// Launches kernel `name` on the device's stream: `args` in the order of its
    /// parameters, `inputs` the launch-only grid inputs. Everything is checked first.
    pub fn launch(&self, name: &str, args: &[Arg<'_>], inputs: &[u64]) -> Result<()> {
        self.bundle.check_args(name, args)?;
        let grid = self.bundle.grid(name, args, inputs)?;
        self.device.launch(&self.kernels[name], grid, args)
    }

    /// The loaded kernel `name` (registers, threads).
    pub fn kernel(&self, name: &str) -> Result<&LoadedKernel> {
        self.bundle.kernel(name)?;
        Ok(&self.kernels[name])
    }
}

struct Module(sys::CUmodule);
struct Function(sys::CUfunction);
// SAFETY: CUDA modules and functions are plain handles, usable from any thread whose
// current context is the one they were loaded in.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

/// A bundle's kernels loaded into a caller's CUDA context, launched on the caller's
/// streams. Dropping it unloads the modules (in whatever context is current).
pub struct RawBundle {
    kernels: HashMap<String, (KernelEntry, Function)>,
    modules: Vec<Module>,
}

impl RawBundle {
    /// The manifest entries of the loaded kernels.
    pub fn entries(&self) -> impl Iterator<Item = &KernelEntry> {
        self.kernels.values().map(|(k, _)| k)
    }

    /// Launches kernel `name` on `stream`.
    ///
    /// # Safety
    /// `args` must hold, for each parameter in order, a pointer to a value of the
    /// parameter's type (a `CUdeviceptr` for buffers) that is valid for the call; the
    /// buffers must be large enough for the launch, and the context this bundle was
    /// loaded in must be current.
    pub unsafe fn launch(
        &self,
        name: &str,
        stream: sys::CUstream,
        args: &[*mut c_void],
        inputs: &[u64],
    ) -> Result<()> {
        let (k, func) = self.kernels.get(name).ok_or_else(|| RuntimeError::Bundle {
            path: String::new(),
            msg: format!("no kernel `{name}` in the loaded bundle"),
        })?;
        if args.len() != k.params.len() {
            return Err(RuntimeError::ArgCount {
                kernel: name.into(),
                expected: k.params.len(),
                found: args.len(),
            });
        }
        let grid = grid_of(k, inputs, |pname| {
            let i = k.params.iter().position(|p| p.name == pname)?;
            let p = args[i];
            // SAFETY: the caller passes a pointer to a value of the parameter's type.
            Some(unsafe {
                match k.params[i].parse()?.0 {
                    DType::I32 => *(p as *const i32) as i64,
                    DType::I64 => *(p as *const i64),
                    DType::U8 => *(p as *const u8) as i64,
                    _ => return None,
                }
            })
        })?;
        if grid.contains(&0) {
            return Ok(());
        }
        let mut params: Vec<*mut c_void> = args.to_vec();
        // SAFETY: per this function's contract.
        unsafe {
            sys::cuLaunchKernel(
                func.0,
                grid[0],
                grid[1],
                grid[2],
                k.launch.threads(),
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(driver("cuLaunchKernel"))
    }
}

impl Drop for RawBundle {
    fn drop(&mut self) {
        for m in &self.modules {
            // SAFETY: each module was loaded once and is unloaded once.
            unsafe { sys::cuModuleUnload(m.0) };
        }
    }
}
