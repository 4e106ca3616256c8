//! Writing bundles: PTX per kernel and configuration, `manifest.json`, and `dusk.h`.
//!
//! The manifest's format is [`dusk_runtime::bundle`]'s; a bundle written here is read by
//! [`dusk_runtime::Bundle::open`], and by the C ABI (`dusk-capi`) through the header.

use crate::tune::TuneCache;
use crate::{fnv_hex, io, Result};
use dusk_compiler::codegen::{compile_cached, Source, Target};
use dusk_compiler::print::print_kernel;
use dusk_compiler::Kernel;
use dusk_runtime::bundle::{
    BundleTarget, GridFactor, KernelEntry, LaunchRule, Manifest, ParamEntry, FORMAT,
};
use std::fmt::Write as _;
use std::path::Path;

/// A kernel to put in a bundle: its IR, the name it is known by, how to size its grid and
/// the configuration it was built for.
#[derive(Clone, Debug)]
pub struct BundleKernel {
    /// Unique in the bundle, a C identifier: the C function is `dusk_<name>`.
    pub name: String,
    pub family: String,
    pub kernel: Kernel,
    /// Launch-only grid inputs (not kernel parameters), in launch order.
    pub inputs: Vec<String>,
    pub grid: [Vec<GridFactor>; 3],
    pub config: serde_json::Map<String, serde_json::Value>,
}

/// `ceil(input / div)`, a grid factor.
pub fn factor(input: &str, div: usize) -> GridFactor {
    GridFactor {
        input: input.into(),
        div: div as u32,
    }
}

/// How a kernel's PTX was obtained while writing (for timing reports).
#[derive(Clone, Debug)]
pub struct Written {
    pub name: String,
    pub source: Source,
}

/// The FNV-1a hash of a kernel's printed IR (the manifest's `ir_hash`).
pub fn ir_hash(kernel: &Kernel) -> String {
    fnv_hex(&print_kernel(kernel))
}

/// A parameter's type as the manifest names it (`ptr<f16>`, `i32`): its IR spelling.
fn param_type(k: &Kernel, i: usize) -> String {
    k.params[i].ty.ir_name()
}

/// The generator string: dusk's and LLVM's versions.
pub fn generator() -> String {
    let (a, b, c) = dusk_compiler::codegen::llvm_version();
    format!("dusk {}, LLVM {a}.{b}.{c}", env!("CARGO_PKG_VERSION"))
}

/// The manifest of `kernels` for `target`, with the results of `tuning` whose kernel hash
/// matches a kernel's.
pub fn manifest(target: &Target, kernels: &[BundleKernel], tuning: Option<&TuneCache>) -> Manifest {
    Manifest {
        format: FORMAT,
        generator: generator(),
        target: BundleTarget {
            arch: target.arch_name(),
            ptx_isa: format!("{}.{}", target.ptx_isa.0, target.ptx_isa.1),
        },
        kernels: kernels
            .iter()
            .map(|b| {
                let hash = ir_hash(&b.kernel);
                KernelEntry {
                    name: b.name.clone(),
                    entry: b.kernel.name.clone(),
                    ptx: format!("{}.ptx", b.name),
                    family: b.family.clone(),
                    params: (0..b.kernel.params.len())
                        .map(|i| ParamEntry {
                            name: b.kernel.params[i].name.clone(),
                            ty: param_type(&b.kernel, i),
                        })
                        .collect(),
                    launch: LaunchRule {
                        num_warps: b.kernel.num_warps,
                        inputs: b.inputs.clone(),
                        grid: b.grid.clone(),
                    },
                    config: b.config.clone(),
                    tuning: tuning.map(|t| t.results_for(&hash)).unwrap_or_default(),
                    ir_hash: hash,
                }
            })
            .collect(),
    }
}

/// Writes the bundle of `kernels` for `target` into `dir` (created if needed): each
/// kernel's PTX (compiled, or from the compile cache), `manifest.json` and `dusk.h`.
pub fn write(
    dir: &Path,
    target: &Target,
    kernels: &[BundleKernel],
    tuning: Option<&TuneCache>,
) -> Result<Vec<Written>> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut written = Vec::new();
    for b in kernels {
        let (ptx, source) = compile_cached(&b.kernel, target)?;
        let path = dir.join(format!("{}.ptx", b.name));
        std::fs::write(&path, ptx.as_bytes()).map_err(io(&path))?;
        written.push(Written {
            name: b.name.clone(),
            source,
        });
    }
    let m = manifest(target, kernels, tuning);
    let path = dir.join("manifest.json");
    let json = serde_json::to_string_pretty(&m).expect("a manifest serialises");
    std::fs::write(&path, json + "\n").map_err(io(&path))?;
    let path = dir.join("dusk.h");
    std::fs::write(&path, c_header(&m)).map_err(io(&path))?;
    Ok(written)
}

fn c_type(ty: &str) -> &'static str {
    match ty {
        "i32" => "int32_t",
        "i64" => "int64_t",
        "f32" => "float",
        "u8" | "i1" => "uint8_t",
        _ => "CUdeviceptr",
    }
}

/// `dusk.h`: the C ABI of `dusk-capi` and one typed launcher per kernel of the manifest,
/// `dusk_<name>(CUstream, args..., grid inputs...)`.
pub fn c_header(m: &Manifest) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        r#"/* dusk.h: generated by {gen} for {arch} (PTX ISA {isa}). Do not edit.
 *
 * Link with libdusk_capi.so (the crate dusk-capi): it reads this directory's manifest.json
 * and PTX with no LLVM or CUDA toolkit. Kernels load into the CUDA context current on the
 * thread that calls dusk_init, and run on the stream each call is given. Every function
 * returns 0 on success; otherwise dusk_last_error() says what went wrong.
 */
#ifndef DUSK_H
#define DUSK_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {{
#endif
#ifndef __cuda_cuda_h__
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;
#endif

/* Loads the bundle in directory `bundle_dir` into the current CUDA context. */
int dusk_init(const char *bundle_dir);
/* Unloads it. */
void dusk_shutdown(void);
/* The message of this thread's last failed call ("" if none). */
const char *dusk_last_error(void);
/* Launches kernel `name` on `stream`: `args` points to each parameter's value in order,
 * `inputs` holds the launch-only grid inputs. The typed functions below call this. */
int dusk_launch(const char *name, CUstream stream, void **args, int num_args,
                const uint64_t *inputs, int num_inputs);
"#,
        gen = m.generator,
        arch = m.target.arch,
        isa = m.target.ptx_isa
    );
    for k in &m.kernels {
        let grid: Vec<String> = k
            .launch
            .grid
            .iter()
            .map(|fs| {
                if fs.is_empty() {
                    "1".into()
                } else {
                    fs.iter()
                        .map(|f| match f.div {
                            1 => f.input.clone(),
                            d => format!("ceil({} / {d})", f.input),
                        })
                        .collect::<Vec<_>>()
                        .join(" * ")
                }
            })
            .collect();
        let config = serde_json::Value::Object(k.config.clone()).to_string();
        let _ = writeln!(
            h,
            "\n/* {} ({}): {config}\n * grid ({}), {} threads a program. */",
            k.name,
            k.family,
            grid.join(", "),
            k.launch.threads()
        );
        let mut sig = vec!["CUstream stream".to_string()];
        sig.extend(
            k.params
                .iter()
                .map(|p| format!("{} {}", c_type(&p.ty), p.name)),
        );
        sig.extend(k.launch.inputs.iter().map(|i| format!("uint64_t {i}")));
        let args: Vec<String> = k.params.iter().map(|p| format!("&{}", p.name)).collect();
        let _ = writeln!(
            h,
            "static inline int dusk_{}({}) {{\n    void *args[] = {{{}}};",
            k.name,
            sig.join(", "),
            args.join(", ")
        );
        if k.launch.inputs.is_empty() {
            let _ = writeln!(h, "    const uint64_t *inputs = 0;");
        } else {
            let _ = writeln!(
                h,
                "    const uint64_t inputs[] = {{{}}};",
                k.launch.inputs.join(", ")
            );
        }
        let _ = writeln!(
            h,
            "    return dusk_launch(\"{}\", stream, args, {}, inputs, {});\n}}",
            k.name,
            k.params.len(),
            k.launch.inputs.len()
        );
    }
    h.push_str("\n#ifdef __cplusplus\n}\n#endif\n#endif /* DUSK_H */\n");
    h
}
