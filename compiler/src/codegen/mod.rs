//! NVPTX code generation through LLVM 19 (inkwell): tile IR to PTX text.
//!
//! The stages, in order: verify, fuse reductions, analyze axes (for vector widths), assign layouts, lower
//! each op to per-thread LLVM IR (`lower`), optimize with LLVM's O3 pipeline, and emit
//! PTX for the target. [`compile_stages`] returns each stage's text for inspection.

pub mod cache;
mod lower;

pub use cache::{compile_cached, Source};

use crate::ir::Kernel;
use crate::passes::{axis, fuse, layout};
use crate::print::print_kernel;
use crate::verify::verify;
use crate::CompileError;
use inkwell::context::Context;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target as LlvmTarget, TargetMachine,
    TargetTriple,
};
use inkwell::OptimizationLevel;

/// A GPU architecture and the PTX ISA version to write for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// Compute capability times ten: 90 or 80.
    pub sm: u32,
    /// `sm_90a`: Hopper's architecture-specific features (loads only on sm_90 devices).
    pub arch_specific: bool,
    /// PTX ISA version (major, minor).
    pub ptx_isa: (u32, u32),
}

/// The newest PTX ISA LLVM 19 writes.
const LLVM_MAX_PTX: (u32, u32) = (8, 5);

impl Target {
    /// Hopper (H100, H200), the default.
    pub fn sm90a() -> Target {
        Target {
            sm: 90,
            arch_specific: true,
            ptx_isa: (8, 0),
        }
    }
    /// Ampere (A100).
    pub fn sm80() -> Target {
        Target {
            sm: 80,
            arch_specific: false,
            ptx_isa: (7, 0),
        }
    }
    /// Parses `sm_90a`, `sm_90` or `sm_80`.
    pub fn parse(name: &str) -> Option<Target> {
        match name {
            "sm_90a" => Some(Target::sm90a()),
            "sm_90" => Some(Target {
                sm: 90,
                arch_specific: false,
                ptx_isa: (7, 8),
            }),
            "sm_80" => Some(Target::sm80()),
            _ => None,
        }
    }
    /// `sm_90a` or `sm_80`, as ptxas and LLVM name it.
    pub fn arch_name(&self) -> String {
        format!(
            "sm_{}{}",
            self.sm,
            if self.arch_specific { "a" } else { "" }
        )
    }
    /// The same target writing the newest PTX ISA that both LLVM and a driver of CUDA
    /// version `driver` (major, minor) accept: a PTX ISA newer than the driver fails to load.
    pub fn for_driver(self, driver: (u32, u32)) -> Result<Target, CompileError> {
        let isa = ptx_isa_for_driver(driver).min(LLVM_MAX_PTX);
        let needed = Target {
            ptx_isa: (0, 0),
            ..self
        }
        .minimum_isa();
        if isa < needed {
            return Err(CompileError::Codegen {
                kernel: String::new(),
                msg: format!(
                    "{} needs PTX ISA {}.{}, but a CUDA {}.{} driver reads at most {}.{}",
                    self.arch_name(),
                    needed.0,
                    needed.1,
                    driver.0,
                    driver.1,
                    isa.0,
                    isa.1
                ),
            });
        }
        Ok(Target {
            ptx_isa: isa,
            ..self
        })
    }
    fn minimum_isa(&self) -> (u32, u32) {
        match (self.sm, self.arch_specific) {
            (90, true) => (8, 0),
            (90, false) => (7, 8),
            _ => (7, 0),
        }
    }
}

impl Default for Target {
    fn default() -> Self {
        Target::sm90a()
    }
}

/// The PTX ISA a CUDA driver of version (major, minor) understands.
pub fn ptx_isa_for_driver(driver: (u32, u32)) -> (u32, u32) {
    match driver {
        (m, _) if m >= 13 => (9, 0),
        (12, n) if n >= 9 => (8, 8),
        (12, 8) => (8, 7),
        (12, n) if n >= 5 => (8, 5),
        (12, n) => (8, n),
        (11, n) => (7, n.min(8)),
        _ => (6, 0),
    }
}

/// Each stage's output for one kernel, for `--emit` and debugging.
#[derive(Clone, Debug)]
pub struct Stages {
    pub ir: String,
    /// The IR after `fuse_reductions`.
    pub fused_ir: String,
    pub layouts: String,
    pub llvm_unoptimized: String,
    pub llvm_optimized: String,
    pub ptx: String,
}

/// The version of the LLVM this crate links (major, minor, patch).
pub fn llvm_version() -> (u32, u32, u32) {
    inkwell::support::get_llvm_version()
}

/// Compiles a kernel to PTX text.
pub fn compile(kernel: &Kernel, target: &Target) -> Result<String, CompileError> {
    compile_stages(kernel, target).map(|s| s.ptx)
}

/// Compiles a kernel, keeping the text of every stage.
pub fn compile_stages(kernel: &Kernel, target: &Target) -> Result<Stages, CompileError> {
    let err = |msg: String| CompileError::Codegen {
        kernel: kernel.name.clone(),
        msg,
    };
    verify(kernel)?;
    let original = kernel;
    let fused = fuse::fuse_reductions(kernel);
    verify(&fused)?;
    let kernel = &fused;
    let axes = axis::analyze(kernel);
    let layouts = layout::assign(kernel);
    let mut layout_text: Vec<String> = layouts
        .of
        .iter()
        .map(|(v, l)| format!("%{} : {} : {:?}", v.0, kernel.ty(*v).ir_name(), l))
        .collect();
    layout_text.sort();

    LlvmTarget::initialize_nvptx(&InitializationConfig::default());
    let triple = TargetTriple::create("nvptx64-nvidia-cuda");
    let llvm_target = LlvmTarget::from_triple(&triple)
        .map_err(|e| err(format!("no NVPTX target in LLVM: {e}")))?;
    let features = format!("+ptx{}{}", target.ptx_isa.0, target.ptx_isa.1);
    let machine = llvm_target
        .create_target_machine(
            &triple,
            &target.arch_name(),
            &features,
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| {
            err(format!(
                "LLVM cannot target {} with {features}",
                target.arch_name()
            ))
        })?;

    let ctx = Context::create();
    let module = lower::lower(&ctx, kernel, &axes, &layouts, &machine, target.sm)?;
    let llvm_unoptimized = module.print_to_string().to_string();
    module
        .verify()
        .map_err(|e| err(format!("invalid LLVM IR: {e}")))?;
    module
        .run_passes("default<O3>", &machine, PassBuilderOptions::create())
        .map_err(|e| err(format!("LLVM optimization failed: {e}")))?;
    let llvm_optimized = module.print_to_string().to_string();
    let buf = machine
        .write_to_memory_buffer(&module, FileType::Assembly)
        .map_err(|e| err(format!("PTX emission failed: {e}")))?;
    let ptx = String::from_utf8_lossy(buf.as_slice())
        .trim_end_matches('\0')
        .to_string();
    Ok(Stages {
        ir: print_kernel(original),
        fused_ir: print_kernel(kernel),
        layouts: layout_text.join("\n"),
        llvm_unoptimized,
        llvm_optimized,
        ptx,
    })
}

/// Keeps `TargetMachine` in the lowering's signature without re-exporting inkwell.
pub(crate) type Machine = TargetMachine;
