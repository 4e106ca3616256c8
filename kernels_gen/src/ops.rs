//! Host entry points of the stock kernels: check every argument, compile (once per
//! process and device) and launch, on the GPU or through the interpreter.
//!
//! Work that can be done ahead is split from the launch, as serving engines do: a plan
//! validates and uploads the index metadata once; its `run` only checks buffer lengths
//! and launches, with no allocation and no host sync.

use crate::error::{ensure, invalid, DuskError, Result};
use crate::paged::{KvShape, PageTable, TokenLists};
use crate::quantize::{self, QuantizeConfig};
use crate::spgemv::{self, SpgemvConfig};
#[cfg(feature = "jit")]
use dusk_compiler::codegen::{self, Target};
use dusk_compiler::Kernel;
use dusk_runtime::bundle::KernelEntry;
use dusk_runtime::{Arg, Buffer, Bundle, Device, LoadedKernel};
use half::f16;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A device and the kernels loaded on it so far.
///
/// On a GPU a kernel's PTX comes from the bundle given to [`Dusk::with_bundle`] when the
/// bundle holds that kernel (the same IR: its manifest's `ir_hash`), and is otherwise
/// compiled through LLVM when first used (feature `jit`, on by default). Built without
/// `jit`, nothing links LLVM, and a kernel that the bundle lacks is an error
/// ([`DuskError::NotInBundle`]). On the CPU the interpreter runs the kernels' IR.
pub struct Dusk {
    device: Device,
    #[cfg(feature = "jit")]
    target: Option<Target>,
    bundle: Option<Arc<Bundle>>,
    loaded: Mutex<HashMap<String, Arc<LoadedKernel>>>,
}

impl Dusk {
    /// Kernels for `device`; on a GPU the target (sm_90a for Hopper, sm_80 otherwise) and
    /// PTX ISA come from the device and its driver. Without the `jit` feature a GPU needs
    /// a bundle: use [`Dusk::with_bundle`].
    pub fn new(device: Device) -> Result<Dusk> {
        check_compute_capability(&device)?;
        #[cfg(not(feature = "jit"))]
        if device.is_gpu() {
            return Err(invalid(
                "device",
                "the CPU, or a GPU with a bundle of its kernels (Dusk::with_bundle): \
                 dusk-kernels was built without the `jit` feature, so it cannot compile PTX",
                device.name(),
            ));
        }
        Ok(Dusk {
            #[cfg(feature = "jit")]
            target: jit_target(&device)?,
            device,
            bundle: None,
            loaded: Mutex::new(HashMap::new()),
        })
    }

    /// Kernels for `device` taken from `bundle` (ahead-of-time PTX: no LLVM, no CUDA
    /// toolkit) wherever it holds them; see [`Dusk`]. Fails when the bundle was written
    /// for another architecture than the GPU's (`sm_90a` runs on 9.0 only). On the CPU
    /// the bundle is kept but unused: the interpreter runs the IR.
    pub fn with_bundle(device: Device, bundle: Arc<Bundle>) -> Result<Dusk> {
        check_compute_capability(&device)?;
        if device.is_gpu() {
            bundle.check_arch(device.compute_capability())?;
        }
        Ok(Dusk {
            #[cfg(feature = "jit")]
            target: jit_target(&device)?,
            device,
            bundle: Some(bundle),
            loaded: Mutex::new(HashMap::new()),
        })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The bundle kernels are taken from first, if any.
    pub fn bundle(&self) -> Option<&Arc<Bundle>> {
        self.bundle.as_ref()
    }

    /// The PTX target kernels are compiled for (`None` on the CPU).
    #[cfg(feature = "jit")]
    pub fn target(&self) -> Option<Target> {
        self.target
    }

    /// A kernel of the caller's (from `#[kernel]` or the builder), compiled for this device
    /// (PTX cached in memory and on disk) and loaded, once per distinct kernel.
    pub fn load(&self, kernel: Kernel) -> Result<Arc<LoadedKernel>> {
        self.kernel(dusk_compiler::print::print_kernel(&kernel), || Ok(kernel))
    }

    /// The kernel made by `build`, compiled and loaded on first use.
    pub(crate) fn kernel(
        &self,
        key: String,
        build: impl FnOnce() -> std::result::Result<Kernel, dusk_compiler::CompileError>,
    ) -> Result<Arc<LoadedKernel>> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = loaded.get(&key) {
            return Ok(k.clone());
        }
        let ir = Arc::new(build()?);
        let ptx = if self.device.is_gpu() {
            Some(self.ptx_for(&ir)?)
        } else {
            None
        };
        let k = Arc::new(self.device.load_kernel(ir, ptx.as_deref())?);
        loaded.insert(key, k.clone());
        Ok(k)
    }

    /// Every kernel loaded so far (by the plans made with this `Dusk`), in no order.
    pub fn loaded_kernels(&self) -> Vec<Arc<LoadedKernel>> {
        let loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        loaded.values().cloned().collect()
    }

    /// The bundle's entry for `ir` (same entry name and `ir_hash`), if the bundle holds it.
    pub fn bundle_entry(&self, ir: &Kernel) -> Option<&KernelEntry> {
        let bundle = self.bundle.as_ref()?;
        let hash = ir_hash(&dusk_compiler::print::print_kernel(ir));
        bundle
            .manifest()
            .kernels
            .iter()
            .find(|k| k.ir_hash == hash && k.entry == ir.name)
    }

    /// The PTX of `ir`: the bundle's when it holds this IR, else compiled (`jit`).
    fn ptx_for(&self, ir: &Kernel) -> Result<Arc<str>> {
        if let (Some(bundle), Some(entry)) = (&self.bundle, self.bundle_entry(ir)) {
            return Ok(Arc::from(bundle.ptx(&entry.name)?));
        }
        let hash = ir_hash(&dusk_compiler::print::print_kernel(ir));
        #[cfg(feature = "jit")]
        if let Some(t) = &self.target {
            return Ok(codegen::compile_cached(ir, t)?.0);
        }
        Err(DuskError::NotInBundle {
            kernel: ir.name.clone(),
            ir_hash: hash,
            bundle: self
                .bundle
                .as_ref()
                .map_or("none".into(), |b| b.dir().display().to_string()),
        })
    }

    /// Quantizes a K cache (f16, `kv` shape, the engine's layout) to `bits` (4 or 8) per
    /// value, into dusk's head-major copy (see [`QuantizedK`]).
    pub fn quantize_k(&self, k: &Buffer<f16>, kv: KvShape, bits: u32) -> Result<QuantizedK> {
        kv.validate()?;
        ensure!(matches!(bits, 4 | 8), "bits", "4 or 8", bits);
        let rows = kv.rows();
        let mut out = QuantizedK {
            packed: self
                .device
                .alloc::<u8>(rows * kv.head_dim * bits as usize / 8)?,
            scale: self.device.alloc::<f16>(rows)?,
            zero: self.device.alloc::<f16>(rows)?,
            kv,
            bits,
        };
        self.quantize_k_into(k, &mut out)?;
        Ok(out)
    }

    /// Quantizes `k` into an existing [`QuantizedK`] of the same shape (no allocation).
    pub fn quantize_k_into(&self, k: &Buffer<f16>, out: &mut QuantizedK) -> Result<()> {
        let kv = out.kv;
        kv.validate()?;
        ensure!(
            k.len() == kv.elements(),
            "k",
            format!("{} f16 values ({kv:?})", kv.elements()),
            k.len(),
        );
        out.check_lengths()?;
        let cfg = QuantizeConfig::new(kv.head_dim, out.bits);
        let kernel = self.kernel(format!("{cfg:?}"), || quantize::build(&cfg))?;
        let rows = kv.rows();
        ensure!(rows < i32::MAX as usize, "k", "fewer than 2^31 rows", rows);
        let grid = rows.div_ceil(cfg.block_rows) as u32;
        self.device.launch(
            &kernel,
            [grid, 1, 1],
            &[
                Arg::from(k),
                Arg::from(&out.packed),
                Arg::from(&out.scale),
                Arg::from(&out.zero),
                Arg::I32(rows as i32),
                Arg::I32(kv.num_kv_heads as i32),
                Arg::I32(kv.page_size as i32),
            ],
        )?;
        Ok(())
    }
}

/// A K cache quantized by [`Dusk::quantize_k`], in dusk's own head-major layout (not the
/// engine's): packed codes `[num_pages, num_kv_heads, page_size, head_dim * bits / 8]` and
/// f16 scale and zero `[num_pages, num_kv_heads, page_size]`, so that one KV head's page is
/// one contiguous block. Token slot `s` of page `p` for KV head `h` is row
/// `(p * num_kv_heads + h) * page_size + s` ([`KvShape::quantized_row`]); the f16 cache it
/// came from keeps the engine's `[num_pages, page_size, num_kv_heads, head_dim]`.
pub struct QuantizedK {
    pub packed: Buffer<u8>,
    pub scale: Buffer<f16>,
    pub zero: Buffer<f16>,
    pub kv: KvShape,
    pub bits: u32,
}

impl QuantizedK {
    /// Checks the buffers' lengths against `kv` and `bits`.
    pub(crate) fn check_lengths(&self) -> Result<()> {
        let rows = self.kv.rows();
        let bytes = rows * self.kv.head_dim * self.bits as usize / 8;
        ensure!(matches!(self.bits, 4 | 8), "bits", "4 or 8", self.bits);
        ensure!(
            self.packed.len() == bytes,
            "packed",
            format!("{bytes} bytes"),
            self.packed.len(),
        );
        ensure!(
            self.scale.len() == rows,
            "scale",
            format!("{rows} values"),
            self.scale.len(),
        );
        ensure!(
            self.zero.len() == rows,
            "zero",
            format!("{rows} values"),
            self.zero.len(),
        );
        Ok(())
    }
}

/// A validated `spgemv_quant` launch: shapes, page table and candidate lists checked and
/// uploaded once. [`SpgemvPlan::run`] may then be called for every decode step.
///
/// The candidates may instead come from a previous stage on the device
/// ([`SpgemvPlan::with_device_lists`]): their row offsets are known when the plan is made
/// (a selector's `sel_indptr` is fixed by its plan), their positions are written on the
/// device each step and given to [`SpgemvPlan::run_lists`]. Those positions are not read
/// on the host; the kernel scores a position outside its sequence's pages against page
/// 0's row (a wrong score, never a read outside the cache).
pub struct SpgemvPlan {
    kernel: Arc<LoadedKernel>,
    config: SpgemvConfig,
    /// For the `dp2a` kernel: the query in fixed point, made at each run.
    fixed_q: Option<FixedQuery>,
    kv: KvShape,
    batch: usize,
    num_q_heads: usize,
    bits: u32,
    kv_indptr: Buffer<i32>,
    kv_page_indices: Buffer<i32>,
    cand_indptr: Buffer<i32>,
    /// The candidates' positions, uploaded by the plan; `None` when a previous stage writes
    /// them on the device (given to `run_lists`).
    cand_indices: Option<Buffer<i32>>,
    /// Candidates in all (`cand_indptr`'s last entry).
    nnz: usize,
    num_scores: usize,
    grid: [u32; 3],
}

/// The `prepare_q` kernel and the buffers it fills.
struct FixedQuery {
    kernel: Arc<LoadedKernel>,
    qpack: Buffer<i32>,
    qscale: Buffer<f32>,
    qsum: Buffer<f32>,
}

impl SpgemvPlan {
    /// Plans scoring `num_q_heads` query heads per sequence against `cand`'s tokens of a
    /// K cache quantized to `bits`.
    pub fn new(
        dusk: &Dusk,
        kv: KvShape,
        num_q_heads: usize,
        bits: u32,
        table: &PageTable,
        cand: &TokenLists,
    ) -> Result<SpgemvPlan> {
        Self::with_config(dusk, kv, num_q_heads, bits, table, cand, |_| {})
    }

    /// As [`SpgemvPlan::new`], with `tune` changing the default [`SpgemvConfig`] (tiling,
    /// occupancy request, tensor cores) before it is checked and compiled. On a GPU the
    /// default it is given has its tiles fitted to the candidates' grid
    /// ([`SpgemvConfig::fit_grid`]).
    pub fn with_config(
        dusk: &Dusk,
        kv: KvShape,
        num_q_heads: usize,
        bits: u32,
        table: &PageTable,
        cand: &TokenLists,
        tune: impl FnOnce(&mut SpgemvConfig),
    ) -> Result<SpgemvPlan> {
        kv.validate()?;
        table.validate(&kv)?;
        cand.validate("cand", table, kv.page_size, kv.num_kv_heads)?;
        Self::plan(
            dusk,
            kv,
            num_q_heads,
            bits,
            table,
            &cand.indptr,
            Some(&cand.indices),
            tune,
        )
    }

    /// Plans scoring candidates that a previous stage writes on the device: `cand_indptr`
    /// (one row per (batch, KV head) of `table`) is fixed now, the positions are given to
    /// each [`SpgemvPlan::run_lists`].
    pub fn with_device_lists(
        dusk: &Dusk,
        kv: KvShape,
        num_q_heads: usize,
        bits: u32,
        table: &PageTable,
        cand_indptr: &[i32],
    ) -> Result<SpgemvPlan> {
        kv.validate()?;
        table.validate(&kv)?;
        TokenLists::validate_indptr(
            "cand_indptr",
            cand_indptr,
            table,
            kv.page_size,
            kv.num_kv_heads,
        )?;
        Self::plan(
            dusk,
            kv,
            num_q_heads,
            bits,
            table,
            cand_indptr,
            None,
            |_| {},
        )
    }

    /// The plan of checked candidates: `indices` uploaded when given.
    #[allow(clippy::too_many_arguments)]
    fn plan(
        dusk: &Dusk,
        kv: KvShape,
        num_q_heads: usize,
        bits: u32,
        table: &PageTable,
        indptr: &[i32],
        indices: Option<&[i32]>,
        tune: impl FnOnce(&mut SpgemvConfig),
    ) -> Result<SpgemvPlan> {
        ensure!(matches!(bits, 4 | 8), "bits", "4 or 8", bits);
        ensure!(
            num_q_heads > 0 && num_q_heads.is_multiple_of(kv.num_kv_heads),
            "num_q_heads",
            format!("a positive multiple of num_kv_heads ({})", kv.num_kv_heads),
            num_q_heads,
        );
        let group = num_q_heads / kv.num_kv_heads;
        ensure!(
            group.is_power_of_two() && group <= 16,
            "num_q_heads",
            "a group (q heads per KV head) of 1, 2, 4, 8 or 16",
            group,
        );
        let nnz = *indptr.last().expect("checked: rows + 1 entries") as usize;
        let num_scores = nnz * group;
        ensure!(
            num_scores < i32::MAX as usize,
            "cand",
            "fewer than 2^31 scores",
            num_scores,
        );
        let rows = indptr.len() - 1;
        let longest = indptr
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0);
        let mut cfg = SpgemvConfig::new(kv.head_dim, kv.page_size, group, bits);
        if let Some(sms) = dusk.device().num_sms() {
            cfg = cfg.fit_grid(rows, longest, sms as usize);
        }
        tune(&mut cfg);
        let (tokens, warps) = (cfg.block_tokens, cfg.num_warps);
        ensure!(
            tokens.is_power_of_two() && (16..=512).contains(&tokens),
            "block_tokens",
            "a power of two in 16..=512",
            tokens,
        );
        ensure!(
            warps.is_power_of_two() && (1..=16).contains(&warps),
            "num_warps",
            "1, 2, 4, 8 or 16",
            warps,
        );
        ensure!(
            (1..=64).contains(&cfg.tiles) && (cfg.tiles == 1 || cfg.tensor_cores),
            "tiles",
            "1 to 64, more than 1 only with tensor_cores",
            format!("{} (tensor_cores: {})", cfg.tiles, cfg.tensor_cores),
        );
        ensure!(
            !cfg.l2_prefetch || cfg.tiles > 1,
            "l2_prefetch",
            "false with one tile a program (nothing comes after it to prefetch)",
            format!("{} (tiles: {})", cfg.l2_prefetch, cfg.tiles),
        );
        if cfg.tensor_cores {
            ensure!(
                bits == 4 && (2..=8).contains(&group),
                "tensor_cores",
                "4-bit codes and 2 to 8 query heads per KV head",
                format!("{bits} bits, group {group}"),
            );
            ensure!(
                tokens.is_multiple_of(16 * warps as usize),
                "block_tokens",
                format!("a multiple of 16 per warp ({})", 16 * warps),
                tokens,
            );
        }
        ensure!(
            kv.page_size == 16,
            "page_size",
            "16 (the page size spgemv_quant is compiled for)",
            kv.page_size,
        );
        ensure!(
            spgemv::specialised(&cfg),
            "config",
            "a tiling compiled into dusk-kernels: the default, or for head_dim 128 and 4-bit \
             codes one the benchmark sweeps (see `SpgemvConfig`)",
            format!("{cfg:?}"),
        );
        let kernel = dusk.kernel(format!("{cfg:?}"), || spgemv::build(&cfg))?;
        let dev = dusk.device();
        let q_rows = table.batch() * num_q_heads;
        let fixed_q = if cfg.tensor_cores {
            None
        } else {
            let q_words = q_rows * spgemv::q_parts(bits) * spgemv::words_per_row(kv.head_dim, bits);
            Some(FixedQuery {
                kernel: dusk.kernel(format!("prepare_q {} {}", kv.head_dim, bits), || {
                    spgemv::build_prepare_q(&cfg)
                })?,
                qpack: dev.alloc(q_words)?,
                qscale: dev.alloc(q_rows)?,
                qsum: dev.alloc(q_rows)?,
            })
        };
        // A program scores `tiles` tiles of `block_tokens` candidates.
        let programs = longest.div_ceil(cfg.program_tokens()).max(1);
        ensure!(
            rows <= i32::MAX as usize && programs <= 65535,
            "cand",
            "at most 65535 * block_tokens * tiles tokens per row",
            longest,
        );
        Ok(SpgemvPlan {
            kernel,
            config: cfg,
            fixed_q,
            kv,
            batch: table.batch(),
            num_q_heads,
            bits,
            kv_indptr: dev.upload(&table.kv_indptr)?,
            kv_page_indices: dev.upload(&table.kv_page_indices)?,
            cand_indptr: dev.upload(indptr)?,
            cand_indices: indices.map(|ix| dev.upload(ix)).transpose()?,
            nnz,
            num_scores,
            grid: [rows as u32, programs as u32, 1],
        })
    }

    /// The configuration the plan compiled.
    pub fn config(&self) -> &SpgemvConfig {
        &self.config
    }

    /// Length of the f32 score buffer `run` fills.
    pub fn num_scores(&self) -> usize {
        self.num_scores
    }

    /// The page table and candidate offsets the plan reads (`kv_indptr`,
    /// `kv_page_indices`, `cand_indptr`), for a pipeline step that rewrites them on the
    /// device (`pipeline::table`).
    pub(crate) fn table_buffers(&self) -> [&Buffer<i32>; 3] {
        [&self.kv_indptr, &self.kv_page_indices, &self.cand_indptr]
    }

    /// Scores `q` (f16 `[batch, num_q_heads, head_dim]`) against `k`'s candidates (the
    /// plan's own: made with [`SpgemvPlan::new`]).
    pub fn run(
        &self,
        dusk: &Dusk,
        q: &Buffer<f16>,
        k: &QuantizedK,
        scores: &mut Buffer<f32>,
    ) -> Result<()> {
        let ix = self.cand_indices.as_ref().ok_or_else(|| {
            invalid(
                "cand_indices",
                "the positions of the device lists this plan was made for (run_lists)",
                "none",
            )
        })?;
        self.launch(dusk, q, k, ix, scores)
    }

    /// Scores `q` against the candidates a previous stage wrote on the device at
    /// `cand_indices` (positions, at least the plan's `cand_indptr[rows]` of them), for a
    /// plan made with [`SpgemvPlan::with_device_lists`]. No allocation, no sync.
    pub fn run_lists(
        &self,
        dusk: &Dusk,
        q: &Buffer<f16>,
        k: &QuantizedK,
        cand_indices: &Buffer<i32>,
        scores: &mut Buffer<f32>,
    ) -> Result<()> {
        ensure!(
            self.cand_indices.is_none(),
            "cand_indices",
            "none: the plan holds its own candidates (run)",
            "device lists",
        );
        ensure!(
            cand_indices.len() >= self.nnz,
            "cand_indices",
            format!("at least {} positions (cand_indptr[rows])", self.nnz),
            cand_indices.len(),
        );
        self.launch(dusk, q, k, cand_indices, scores)
    }

    /// As [`SpgemvPlan::run_lists`] with the row offsets too taken from the device: those
    /// an earlier pruner of a pipeline wrote, each row no longer than the plan's row and
    /// in all no more than its candidates (the scores land inside `scores`). Crate-internal:
    /// the offsets are trusted, as only dusk's own pruner writes them.
    pub(crate) fn run_csr(
        &self,
        dusk: &Dusk,
        q: &Buffer<f16>,
        k: &QuantizedK,
        cand_indptr: &Buffer<i32>,
        cand_indices: &Buffer<i32>,
        scores: &mut Buffer<f32>,
    ) -> Result<()> {
        ensure!(
            cand_indptr.len() == self.cand_indptr.len(),
            "cand_indptr",
            format!("{} offsets (rows + 1)", self.cand_indptr.len()),
            cand_indptr.len(),
        );
        self.launch_with(dusk, q, k, cand_indptr, cand_indices, scores)
    }

    fn launch(
        &self,
        dusk: &Dusk,
        q: &Buffer<f16>,
        k: &QuantizedK,
        cand_indices: &Buffer<i32>,
        scores: &mut Buffer<f32>,
    ) -> Result<()> {
        self.launch_with(dusk, q, k, &self.cand_indptr, cand_indices, scores)
    }

    fn launch_with(
        &self,
        dusk: &Dusk,
        q: &Buffer<f16>,
        k: &QuantizedK,
        cand_indptr: &Buffer<i32>,
        cand_indices: &Buffer<i32>,
        scores: &mut Buffer<f32>,
    ) -> Result<()> {
        let qlen = self.batch * self.num_q_heads * self.kv.head_dim;
        ensure!(
            q.len() == qlen,
            "q",
            format!("{qlen} f16 values (batch x q heads x head_dim)"),
            q.len(),
        );
        ensure!(
            k.kv == self.kv,
            "k",
            format!("a cache of shape {:?}", self.kv),
            format!("{:?}", k.kv),
        );
        ensure!(
            k.bits == self.bits,
            "k",
            format!("{}-bit codes", self.bits),
            format!("{}-bit codes", k.bits),
        );
        k.check_lengths()?;
        ensure!(
            scores.len() == self.num_scores,
            "scores",
            format!("{} f32 values", self.num_scores),
            scores.len(),
        );
        let mut args: Vec<Arg> = match &self.fixed_q {
            Some(f) => {
                let q_rows = (self.batch * self.num_q_heads) as u32;
                let prep = [
                    Arg::from(q),
                    Arg::from(&f.qpack),
                    Arg::from(&f.qscale),
                    Arg::from(&f.qsum),
                ];
                dusk.device().launch(&f.kernel, [q_rows, 1, 1], &prep)?;
                vec![
                    Arg::from(&f.qpack),
                    Arg::from(&f.qscale),
                    Arg::from(&f.qsum),
                ]
            }
            None => vec![Arg::from(q)],
        };
        args.extend([
            Arg::from(&k.packed),
            Arg::from(&k.scale),
            Arg::from(&k.zero),
            Arg::from(&self.kv_indptr),
            Arg::from(&self.kv_page_indices),
            Arg::from(cand_indptr),
            Arg::from(cand_indices),
            Arg::from(&*scores),
            Arg::I32(self.kv.num_kv_heads as i32),
        ]);
        dusk.device().launch(&self.kernel, self.grid, &args)?;
        Ok(())
    }
}

/// The architectures dusk's kernels need: compute capability 8.0 or newer.
fn check_compute_capability(device: &Device) -> Result<()> {
    match device.compute_capability() {
        Some((major, minor)) if major < 8 => Err(invalid(
            "device",
            "compute capability 8.0 or newer",
            format!("{major}.{minor}"),
        )),
        _ => Ok(()),
    }
}

/// The target kernels are compiled for on `device` (sm_90a for Hopper, sm_80 otherwise),
/// with the PTX ISA its driver reads; `None` on the CPU.
#[cfg(feature = "jit")]
fn jit_target(device: &Device) -> Result<Option<Target>> {
    if !device.is_gpu() {
        return Ok(None);
    }
    let base = match device.compute_capability().unwrap_or((8, 0)) {
        (9, 0) => Target::sm90a(),
        _ => Target::sm80(),
    };
    let driver = device.driver_version().unwrap_or((12, 0));
    Ok(Some(base.for_driver(driver)?))
}

/// A kernel's identity in a bundle manifest (`ir_hash`): FNV-1a (64 bits) of its printed
/// IR, as 16 hex digits (what `dusk_aot::bundle::ir_hash` writes).
pub fn ir_hash(printed_ir: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in printed_ir.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}
