//! The plans' kernels as the committed bundle (`kernels_gen/bundle/`) holds them: a `Dusk`
//! made with the bundle finds, by IR hash, the PTX of every kernel a plan of the shapes
//! the bundle was written for builds, so a GPU build without LLVM (no `jit` feature: the
//! Python package) runs those plans. Checked on the CPU, where plans build the same IR.

use dusk_compiler::DType;
use dusk_kernels::attention_ops::{AttentionMode, AttentionPlan, AttentionSpec, AttentionTuning};
use dusk_kernels::engines::{self, CsrPages, EngineTable};
use dusk_kernels::ops::{Dusk, SpgemvPlan};
use dusk_kernels::paged::{KvShape, PageTable, TokenLists};
use dusk_kernels::policies::{top_k, top_p};
use dusk_kernels::prune::{ParamValues, PrunePlan};
use dusk_runtime::{Bundle, Device};
use half::f16;
use std::sync::Arc;

fn stock_bundle() -> Arc<Bundle> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/bundle");
    Arc::new(Bundle::open(dir).unwrap())
}

/// The names of the kernels `dusk` loaded that the bundle lacks.
fn missing(dusk: &Dusk) -> Vec<String> {
    let mut out: Vec<String> = dusk
        .loaded_kernels()
        .iter()
        .filter(|k| dusk.bundle_entry(k.ir()).is_none())
        .map(|k| k.name().to_string())
        .collect();
    out.sort();
    out
}

#[test]
fn the_stock_bundle_holds_the_kernels_of_its_shapes() {
    let dusk = Dusk::with_bundle(Device::cpu(), stock_bundle()).unwrap();
    let dev = dusk.device();
    let kv = KvShape {
        num_pages: 64,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 128,
    };
    let table = PageTable::from_lengths(&[300, 500], 16, (0..51).collect()).unwrap();
    let k = dev
        .upload(&vec![f16::from_f32(0.25); kv.elements()])
        .unwrap();
    // INT4 quantization, head_dim 128.
    let qk = dusk.quantize_k(&k, kv, 4).unwrap();
    let _ = qk;
    // The SpGEMV: GQA 8/2 (tensor cores) and MHA 2/2 (dp2a, with its query packing).
    let cand = TokenLists::all_tokens(&table, 16, 2);
    SpgemvPlan::new(&dusk, kv, 8, 4, &table, &cand).unwrap();
    SpgemvPlan::new(&dusk, kv, 2, 4, &table, &cand).unwrap();
    // Top-p over rows the search stages in shared memory, and over longer ones.
    let p = [ParamValues::Uniform(0.9)];
    PrunePlan::new(&dusk, &top_p::POLICY, &cand, 1, 0.1, &p).unwrap();
    let long = TokenLists::leading(&[20_000]);
    PrunePlan::new(&dusk, &top_p::POLICY, &long, 1, 0.1, &p).unwrap();
    // Attention, GQA group 4, f16: dense (chunks long enough that the default tuning takes
    // no L2 prefetch) and group lists.
    for (mode, max_tokens) in [
        (AttentionMode::Dense, 32768),
        (AttentionMode::GroupVarlen, 512),
    ] {
        let spec = AttentionSpec {
            kv,
            batch: 32,
            num_q_heads: 8,
            mode,
            max_tokens,
            sm_scale: None,
            sparq: false,
            dtype: DType::F16,
        };
        AttentionPlan::new(&dusk, spec).unwrap();
        // Dense over a page table the device writes (the Python package's device_table),
        // and merged inside the split (fused_merge), over either table.
        if mode == AttentionMode::Dense {
            AttentionPlan::for_device_table(&dusk, spec, |_| {}).unwrap();
            let fused = |t: &mut AttentionTuning| t.fused_merge = true;
            AttentionPlan::with_tuning(&dusk, spec, fused).unwrap();
            AttentionPlan::for_device_table(&dusk, spec, fused).unwrap();
        }
    }
    // The engine converters.
    let mut out = CsrPages::alloc(&dusk, 2, 4).unwrap();
    let table_rows = EngineTable {
        rows: 2,
        row_stride: 4,
        row_len: 4,
    };
    let lens = dev.upload(&[20i32, 3]).unwrap();
    let rows = dev.upload(&[0i32; 8]).unwrap();
    engines::vllm_to_csr(&dusk, &rows, table_rows, &lens, 16, 64, &mut out).unwrap();
    let pool = dev.upload(&[1i32, 0]).unwrap();
    engines::sglang_to_csr(&dusk, &rows, table_rows, &pool, &lens, 1, 64, &mut out).unwrap();
    assert_eq!(missing(&dusk), Vec::<String>::new());
    assert_eq!(dusk.loaded_kernels().len(), 15);

    // What it does not hold: another policy, another head_dim, dense attention of short
    // chunks (their default tuning prefetches into L2).
    PrunePlan::new(
        &dusk,
        &top_k::POLICY,
        &cand,
        1,
        0.1,
        &[ParamValues::Uniform(8.0)],
    )
    .unwrap();
    assert_eq!(missing(&dusk).len(), 1);
    assert!(
        missing(&dusk)[0].starts_with("threshold_top_k"),
        "{:?}",
        missing(&dusk)
    );
}
