//! The stock kernels of the committed bundle (`kernels_gen/bundle/`): a few representative
//! configurations of each family, head_dim 128, pages of 16 tokens, 4-bit K codes.
//!
//! | name | kernel | grid |
//! |---|---|---|
//! | `quantize_k4_d128` | [`dusk_kernels::quantize`]: K `[pages, page_size, kv_heads, 128]` f16 (the engine's layout) to the head-major INT4 copy, codes `[pages, kv_heads, page_size, 64]` u8 and scale, zero `[pages, kv_heads, page_size]` f16; 16 rows of the copy a program | `ceil(num_rows / 16)` |
//! | `spgemv_prepare_q_d128_b4` | query to 15-bit fixed point | `q_rows` |
//! | `spgemv_quant_dp2a_d128_g1_b4_t64_w2_o14` | SpGEMV over the head-major INT4 copy `quantize_k4_d128` writes, MHA default (`dp2a`) | `rows, ceil(max_row_len / 64)` |
//! | `spgemv_quant_mma_d128_g4_b4_t64_w4_o0_x16_l2` | SpGEMV, GQA 4 default (tensor cores; 16 tiles of 64 tokens a program, the next tile's codes prefetched into L2) | `rows, ceil(max_row_len / 1024)` |
//! | `threshold_top_p_t2048_g1_w4_h_r_l2` | top-p search, rows of any length (streamed in tiles of 2048 on 4 warps, the weights recomputed from the scores in each pass, L2 prefetches a tile ahead, the first step from a histogram of the weights, a focused row's few candidates from the cut up listed for its compaction; the default beyond 8192 candidates), the kept positions written as one CSR list | `rows` |
//! | `threshold_top_p_s1024_g1_w2_h_l2` | top-p search, rows up to 8192 candidates (weights staged in shared memory, tiles of 1024 on 2 warps, L2 prefetches a tile ahead, the first step from a histogram; the default there) | `rows` |
//! | `attn_split_lists_d128_g4_f16` | group varlen attention over token lists, GQA 4 (tensor cores), balanced split, each written piece counted at its row's counter | `programs` |
//! | `attn_merge_lists_d128_f16` | its merge by log-sum-exp, each row as soon as its pieces are in (`counters`: `rows + q_rows` i32, zeroed once, kept across launches) | `q_rows` |
//! | `attn_split_dense_d128_g4_f16` | dense paged decode attention, GQA 4, chunks of `chunk_tokens` | `rows, chunks` (= its `max_chunks`) |
//! | `attn_merge_dense_d128_f16` | its merge | `q_rows` |
//! | `attn_split_dense_d128_g4_f16_l2` | the same split bringing the next tile into L2 early, the plans' default for chunks of up to 256 tokens (small batches); merged by `attn_merge_dense_d128_f16` | `rows, chunks` |
//! | `attn_split_dense_d128_g4_f16[_l2]_ct` | the two dense splits reading a page table written on the device (`AttentionPlan::for_device_table`), clamped as they read it: offsets into the table, the last page's length into a page, page ids into the cache (two more scalars, `num_pages` and `num_page_entries`) | `rows, chunks` |
//! | `attn_split_dense_d128_g4_f16[_l2]_fm[_ct]` | the dense splits merging inside the split (`AttentionTuning::fused_merge`: the last chunk of a row merges it, one launch a run; `out`, `lse` and `counters`, i32 `[rows]` zeroed once, follow `part_lse`), over a host or a device page table | `rows, chunks` |
//!
//! | `spgemv_quant_mma_d128_g8_b4_t64_*` | the SpGEMV for GQA groups of 8: the default and the two tilings `fit_grid` picks for small grids | `rows, ceil(max_row_len / program tokens)` |
//! | family `pipeline` | every other kernel the Python package's pipelines load at these shapes ([`plan_offered_pipelines`]: Quest + top-p, Quest alone, Full + top-p, Double Sparsity + top-p, SparQ with its mix, group varlen, GQA groups 1, 4 and 8, and the append of their state): Quest's, DS's and SparQ's update and score kernels, the selectors' top-k, the top-p searches for groups, the dense fallback's merge, the append, attention over lists for groups 1 and 8; named as their IR | `grid_x, grid_y, grid_z`, as the plan sizes it |
//!
//! `rows` is the number of candidate (token-list) rows (batch x KV heads), `q_rows` the
//! query rows (batch x query heads), `max_row_len` the longest candidate row. The
//! attention split over token lists takes any grid: as many programs as fit on the GPU
//! at once is fastest (the SMs times the programs an SM holds, as
//! `cuOccupancyMaxActiveBlocksPerMultiprocessor` reports); its partial buffers hold
//! `(programs + rows) x group` rows (`part_o` of head_dim f16 values each, `part_lse` one
//! f32),
//! and the merge is given the same `programs` (see `dusk_kernels::attention`).

use crate::bundle::{factor, BundleKernel};
use crate::Result;
use dusk_kernels::attention::{self, MergeConfig, SplitConfig, TokenSource};
use dusk_kernels::policies::top_p;
use dusk_kernels::quantize::{self, QuantizeConfig};
use dusk_kernels::spgemv::{self, SpgemvConfig};
use dusk_kernels::threshold::{self, SearchConfig};
use serde_json::{json, Map, Value};

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The bundle name of a `spgemv_quant` configuration. Programs of several tiles end in
/// `_x{tiles}` (and `_l2` with `l2_prefetch`); one tile adds nothing.
pub fn spgemv_name(c: &SpgemvConfig) -> String {
    let name = format!(
        "spgemv_quant_{}_d{}_g{}_b{}_t{}_w{}_o{}",
        if c.tensor_cores { "mma" } else { "dp2a" },
        c.head_dim,
        c.group,
        c.bits,
        c.block_tokens,
        c.num_warps,
        c.min_programs_per_sm
    );
    match (c.tiles, c.l2_prefetch) {
        (1, _) => name,
        (x, false) => format!("{name}_x{x}"),
        (x, true) => format!("{name}_x{x}_l2"),
    }
}

/// A `spgemv_quant` configuration as JSON (the manifest's `config`, tuning records).
/// `tiles` and `l2_prefetch` are written only for programs of several tiles, so one-tile
/// entries are as before.
pub fn spgemv_config_json(c: &SpgemvConfig) -> Value {
    let mut v = json!({
        "head_dim": c.head_dim, "page_size": c.page_size, "group": c.group, "bits": c.bits,
        "block_tokens": c.block_tokens, "num_warps": c.num_warps,
        "min_programs_per_sm": c.min_programs_per_sm, "tensor_cores": c.tensor_cores,
    });
    if c.tiles != 1 {
        v["tiles"] = c.tiles.into();
        v["l2_prefetch"] = c.l2_prefetch.into();
    }
    v
}

/// The scoring kernel of `cfg` as a bundle entry.
pub fn spgemv_kernel(cfg: &SpgemvConfig) -> Result<BundleKernel> {
    Ok(BundleKernel {
        name: spgemv_name(cfg),
        family: "spgemv_quant".into(),
        kernel: spgemv::build(cfg)?,
        inputs: vec!["rows".into(), "max_row_len".into()],
        grid: [
            vec![factor("rows", 1)],
            vec![factor("max_row_len", cfg.program_tokens())],
            vec![],
        ],
        config: obj(spgemv_config_json(cfg)),
    })
}

fn quantize_kernel(head_dim: usize, bits: u32) -> Result<BundleKernel> {
    let c = QuantizeConfig::new(head_dim, bits);
    Ok(BundleKernel {
        name: format!("quantize_k{bits}_d{head_dim}"),
        family: "quantize_k".into(),
        kernel: quantize::build(&c)?,
        inputs: vec![],
        grid: [vec![factor("num_rows", c.block_rows)], vec![], vec![]],
        config: obj(json!({"head_dim": head_dim, "bits": bits, "block_rows": c.block_rows})),
    })
}

fn prepare_q_kernel(head_dim: usize, bits: u32) -> Result<BundleKernel> {
    Ok(BundleKernel {
        name: format!("spgemv_prepare_q_d{head_dim}_b{bits}"),
        family: "spgemv_prepare_q".into(),
        kernel: spgemv::build_prepare_q(&SpgemvConfig::new(head_dim, 16, 1, bits))?,
        inputs: vec!["q_rows".into()],
        grid: [vec![factor("q_rows", 1)], vec![], vec![]],
        config: obj(json!({"head_dim": head_dim, "bits": bits})),
    })
}

fn search_kernel(search: &SearchConfig) -> Result<BundleKernel> {
    let policy = &top_p::POLICY;
    Ok(BundleKernel {
        name: threshold::search_name(policy, search),
        family: "threshold_search".into(),
        kernel: threshold::build(policy, search)?,
        inputs: vec!["rows".into()],
        grid: [vec![factor("rows", 1)], vec![], vec![]],
        config: obj(json!({
            "policy": policy.name, "block": search.block, "group": search.group,
            "num_warps": search.num_warps, "stream": search.stream, "pivots": search.pivots,
            "shared": search.shared, "histogram": search.histogram,
            "recompute": search.recompute, "prefetch": search.prefetch,
            "min_programs_per_sm": search.min_programs_per_sm,
        })),
    })
}

/// The split and merge kernels of varlen attention as the plans build them for GQA groups
/// of `group` at `head_dim` in f16: over token lists (the balanced split) or dense.
fn attention_kernels(head_dim: usize, group: usize, lists: bool) -> Result<[BundleKernel; 2]> {
    let source = if lists {
        TokenSource::Lists
    } else {
        TokenSource::Dense
    };
    // With lists the merge takes each row once its pieces are in (row signals), as the
    // plans do: both kernels take the `counters` the caller keeps zeroed once. Partial
    // outputs in f16 and K and V read as a stream, as the plans' defaults for f16.
    // Dense: long chunks, so 16 programs an SM asked of ptxas, as the plans do.
    let programs_per_sm = dense_programs_per_sm(!lists, group);
    let split = SplitConfig {
        row_signals: lists,
        partial_dtype: dusk_compiler::DType::F16,
        stream_kv: true,
        min_programs_per_sm: programs_per_sm,
        ..SplitConfig::tensor_cores(head_dim, group, dusk_compiler::DType::F16, source)
    };
    let merge = MergeConfig {
        head_dim,
        dtype: dusk_compiler::DType::F16,
        sparq: false,
        block_chunks: 8,
        balanced: lists,
        row_signals: lists,
        partial_dtype: dusk_compiler::DType::F16,
        timeline: false,
    };
    let kind = if lists { "lists" } else { "dense" };
    let (inputs, grid) = if lists {
        (
            vec!["programs".into()],
            [vec![factor("programs", 1)], vec![], vec![]],
        )
    } else {
        (
            // The grid's second axis is the kernel's `max_chunks` (inputs and parameters
            // need different names in the C launchers).
            vec!["rows".into(), "chunks".into()],
            [vec![factor("rows", 1)], vec![factor("chunks", 1)], vec![]],
        )
    };
    let config = json!({
        "head_dim": head_dim, "page_size": 16, "group": group, "dtype": "f16",
        "source": kind, "block_tokens": 8, "num_warps": 1, "tensor_cores": true,
        "row_signals": lists, "partial_dtype": "f16", "stream_kv": true,
        "min_programs_per_sm": programs_per_sm,
    });
    Ok([
        BundleKernel {
            name: format!("attn_split_{kind}_d{head_dim}_g{group}_f16"),
            family: "attention_split".into(),
            kernel: attention::build_split(&split)?,
            inputs,
            grid,
            config: obj(config),
        },
        BundleKernel {
            name: format!("attn_merge_{kind}_d{head_dim}_f16"),
            family: "attention_merge".into(),
            kernel: attention::build_merge(&merge)?,
            inputs: vec!["q_rows".into()],
            grid: [vec![factor("q_rows", 1)], vec![], vec![]],
            config: obj(json!({
                "head_dim": head_dim, "dtype": "f16", "source": kind, "block_chunks": 8,
                "row_signals": lists, "partial_dtype": "f16",
            })),
        },
    ])
}

/// Programs an SM the plans ask of ptxas for a tensor-core split of `group` query heads:
/// 16 over long dense chunks (`long_dense`: those without the L2 prefetch) for groups of up
/// to 4 (`AttentionTuning::for_spec`), none otherwise.
fn dense_programs_per_sm(long_dense: bool, group: usize) -> u32 {
    if long_dense && group <= 4 {
        dusk_kernels::attention_ops::DENSE_LONG_PROGRAMS_PER_SM
    } else {
        0
    }
}

/// The kernels of the stock bundle, in manifest order.
pub fn kernels() -> Result<Vec<BundleKernel>> {
    let base: Vec<BundleKernel> = vec![
        quantize_kernel(128, 4)?,
        prepare_q_kernel(128, 4)?,
        spgemv_kernel(&SpgemvConfig::new(128, 16, 1, 4))?,
        spgemv_kernel(&SpgemvConfig::new(128, 16, 4, 4))?,
        // What `SpgemvConfig::fit_grid` picks for GQA where 16 tiles a program would leave
        // the GPU short of programs (fewer than 4 an SM; here a GPU of one SM): 8 tiles (2
        // rows of 1024 candidates), then one tile on 2 warps (one row of one candidate).
        spgemv_kernel(&SpgemvConfig::new(128, 16, 4, 4).fit_grid(2, 1024, 1))?,
        spgemv_kernel(&SpgemvConfig::new(128, 16, 4, 4).fit_grid(1, 1, 1))?,
        search_kernel(&SearchConfig::for_rows(usize::MAX, 1))?,
        search_kernel(&SearchConfig::for_rows(8192, 1))?,
    ]
    .into_iter()
    .chain(attention_kernels(128, 4, true)?)
    .chain(attention_kernels(128, 4, false)?)
    .chain([dense_l2_prefetch_split(128, 4)?])
    .chain(dense_split_variants(128, 4)?)
    .chain(converter_kernels()?)
    .chain(fitted_spgemv(8)?)
    .collect();
    let more = pipeline_kernels(&base)?;
    Ok(base.into_iter().chain(more).collect())
}

/// The SpGEMV kernels for GQA groups of `group`: the default, and what
/// `SpgemvConfig::fit_grid` picks where 16 tiles a program would leave the GPU short of
/// programs (as the GQA 4 entries above).
fn fitted_spgemv(group: usize) -> Result<Vec<BundleKernel>> {
    let c = SpgemvConfig::new(128, 16, group, 4);
    [c, c.fit_grid(2, 1024, 1), c.fit_grid(1, 1, 1)]
        .iter()
        .map(spgemv_kernel)
        .collect()
}

/// The pipelines the Python package offers (`dusk.PipelinePlan`), planned at the stock
/// shapes with `dusk`, each with its decode step's append: Quest (N/4, and 512 tokens) +
/// top-p, Quest alone, Full + top-p, Double Sparsity (16 labels, N/4) + top-p, SparQ (r =
/// 16, N/8, its output mix; blocks of 256, or paged as the cache), over group varlen
/// attention, for head_dim 128,
/// pages of 16, f16 and GQA groups of 1, 4 and 8 (2 KV heads), on rows of Quest's N/4 at
/// 32k and shorter ones, and a batch mixing a densely attended sequence (the fallback's
/// merge); all but SparQ in blocks of its own on a device page table too. The kernels they
/// load are the ones the package needs.
pub fn plan_offered_pipelines(dusk: &dusk_kernels::ops::Dusk) -> Result<()> {
    use dusk_compiler::DType;
    use dusk_kernels::cache::AppendPlan;
    use dusk_kernels::paged::{KvShape, PageTable};
    use dusk_kernels::pipeline::{
        Attend, DsSelect, PipelineBuilder, PipelineShape, Prune, Select, SparqSelect, StepLimits,
    };
    use dusk_kernels::selectors::{Budget, DsCalibration, DsOptions, SparqOptions};
    use std::sync::Arc;

    let quest = |budget| Select::Quest {
        budget,
        sink: false,
    };
    // The kernels do not depend on which channels are the labels.
    let channels: Vec<usize> = (0..16).collect();
    let ds = Select::Plugin(Arc::new(DsSelect {
        calibration: DsCalibration::from_channels(128, &[channels.clone(), channels])?,
        budget: Budget::Fraction(0.25),
        options: DsOptions::default(),
    }));
    let sparq = |block_size| {
        Select::Plugin(Arc::new(SparqSelect {
            options: SparqOptions {
                r: 16,
                k: Budget::Fraction(0.125),
                window: 64,
            },
            block_size,
        }))
    };
    // (selector, top-p after it, SparQ's output mix, on a device page table too)
    let pipelines = [
        (quest(Budget::Fraction(0.25)), true, false, true),
        (quest(Budget::Tokens(512)), true, false, true),
        (quest(Budget::Fraction(0.25)), false, false, true),
        (Select::Full, true, false, true),
        (ds, true, false, true),
        (sparq(Some(256)), false, true, false),
        (sparq(None), false, true, true),
    ];
    for group in [1, 4, 8] {
        for lens in [vec![32768, 300], vec![2048, 1000], vec![4096, 200]] {
            let pages: usize = lens.iter().map(|n: &usize| n.div_ceil(16)).sum();
            let kv = KvShape {
                num_pages: pages,
                page_size: 16,
                num_kv_heads: 2,
                head_dim: 128,
            };
            let table = PageTable::from_lengths(&lens, 16, (0..pages as i32).collect())?;
            let shape = PipelineShape {
                kv,
                num_q_heads: 2 * group,
                dtype: DType::F16,
            };
            for (select, top_p, mix, device) in &pipelines {
                let mut b = PipelineBuilder::new()
                    .select(select.clone())
                    .attend(Attend::GroupVarlen)
                    .sparq_mix(*mix);
                if *top_p {
                    b = b.prune(Prune::top_p(0.95));
                }
                let pipeline = b.build()?;
                let plan = pipeline.plan(dusk, shape, &table)?;
                AppendPlan::new(dusk, kv, lens.len(), plan.append_parts())?;
                if *device {
                    let limits = StepLimits {
                        batch: lens.len(),
                        max_tokens: lens.iter().copied().max().unwrap_or(1),
                        append: true,
                    };
                    pipeline.plan_device(dusk, shape, limits)?;
                }
            }
        }
    }
    Ok(())
}

/// The kernels [`plan_offered_pipelines`] loads that `base` lacks (Quest's update and
/// score, the selectors' top-k, the top-p search for GQA groups, the dense fallback's
/// merge, the append, attention for other groups): planned on the CPU, whose interpreter
/// loads the IR a GPU plan would. Each is launched with its grid given (`grid_x`,
/// `grid_y`, `grid_z`), as its plan sizes it; named as its IR, in lower case.
fn pipeline_kernels(base: &[BundleKernel]) -> Result<Vec<BundleKernel>> {
    use dusk_compiler::print::print_kernel;
    let dusk = dusk_kernels::ops::Dusk::new(dusk_runtime::Device::cpu())?;
    plan_offered_pipelines(&dusk)?;
    let mut seen: std::collections::HashSet<String> =
        base.iter().map(|k| print_kernel(&k.kernel)).collect();
    let mut kernels: Vec<(String, dusk_compiler::ir::Kernel)> = dusk
        .loaded_kernels()
        .into_iter()
        .map(|k| (print_kernel(k.ir()), (**k.ir()).clone()))
        .collect();
    kernels.sort_by(|a, b| (&a.1.name, &a.0).cmp(&(&b.1.name, &b.0)));
    // Plans key kernels by more than their IR (so one IR may load twice), and one IR name
    // may be built with other launch constants: each IR once, a second IR of a name `_2`.
    kernels.retain(|(text, _)| seen.insert(text.clone()));
    let mut names = std::collections::HashMap::<String, usize>::new();
    let axes = ["grid_x", "grid_y", "grid_z"];
    Ok(kernels
        .into_iter()
        .map(|(_, kernel)| {
            let base = kernel.name.to_lowercase();
            let n = names.entry(base.clone()).or_insert(0);
            *n += 1;
            BundleKernel {
                name: if *n == 1 { base } else { format!("{base}_{n}") },
                family: "pipeline".into(),
                inputs: axes.iter().map(|a| a.to_string()).collect(),
                grid: axes.map(|a| vec![factor(a, 1)]),
                config: obj(json!({ "ir_name": kernel.name })),
                kernel,
            }
        })
        .collect())
}

/// The dense split as the plans build it for short chunks (small batches): the next
/// tile's K and V brought into L2 a step early (`AttentionTuning::l2_prefetch`). Launched
/// like `attn_split_dense_*`, whose merge it shares.
fn dense_l2_prefetch_split(head_dim: usize, group: usize) -> Result<BundleKernel> {
    let [mut split, _] = attention_kernels(head_dim, group, false)?;
    let cfg = SplitConfig {
        partial_dtype: dusk_compiler::DType::F16,
        stream_kv: true,
        l2_prefetch: true,
        ..SplitConfig::tensor_cores(
            head_dim,
            group,
            dusk_compiler::DType::F16,
            TokenSource::Dense,
        )
    };
    split.name.push_str("_l2");
    split.kernel = attention::build_split(&cfg)?;
    split.config.insert("l2_prefetch".into(), true.into());
    split.config.insert("min_programs_per_sm".into(), 0.into());
    Ok(split)
}

/// The dense split's other variants the plans build: bounds-checking a page table the
/// device writes (`_ct`: `AttentionPlan::for_device_table`, an engine's table converted on
/// the device each step, never seen by the host; two more scalars, `num_pages` and
/// `num_page_entries`), and merging inside the split (`_fm`: `AttentionTuning::fused_merge`,
/// the last chunk of a row merges it, so a run is one launch; `part_lse` is followed by
/// `out`, `lse` and `counters`, i32 `[rows]` zeroed once and left zero by every launch),
/// each with and without the L2 prefetch. Launched like `attn_split_dense_*`; the `_fm`
/// ones need no merge launch, the others are merged by `attn_merge_dense_d128_f16`.
fn dense_split_variants(head_dim: usize, group: usize) -> Result<Vec<BundleKernel>> {
    let [plain, _] = attention_kernels(head_dim, group, false)?;
    let base = SplitConfig {
        partial_dtype: dusk_compiler::DType::F16,
        stream_kv: true,
        ..SplitConfig::tensor_cores(
            head_dim,
            group,
            dusk_compiler::DType::F16,
            TokenSource::Dense,
        )
    };
    let mut out = vec![];
    for (fused_merge, checked_table) in [(false, true), (true, false), (true, true)] {
        for l2_prefetch in [false, true] {
            let mut k = BundleKernel {
                name: plain.name.clone(),
                family: plain.family.clone(),
                kernel: attention::build_split(&SplitConfig {
                    l2_prefetch,
                    fused_merge,
                    checked_table,
                    min_programs_per_sm: dense_programs_per_sm(!l2_prefetch, group),
                    ..base
                })?,
                inputs: plain.inputs.clone(),
                grid: plain.grid.clone(),
                config: plain.config.clone(),
            };
            k.config.insert(
                "min_programs_per_sm".into(),
                dense_programs_per_sm(!l2_prefetch, group).into(),
            );
            for (on, suffix, key) in [
                (l2_prefetch, "_l2", "l2_prefetch"),
                (fused_merge, "_fm", "fused_merge"),
                (checked_table, "_ct", "checked_table"),
            ] {
                if on {
                    k.name.push_str(suffix);
                    k.config.insert(key.into(), true.into());
                }
            }
            out.push(k);
        }
    }
    Ok(out)
}

/// The engine converters (`dusk_kernels::engines`): vLLM's and SGLang's page tables to
/// CSR. Grid: one program a sequence (`batch`, a launch input) by `max_pages` in blocks.
fn converter_kernels() -> Result<Vec<BundleKernel>> {
    use dusk_kernels::engines::{self, BLOCK_PAGES};
    let grid = || {
        [
            vec![factor("batch", 1)],
            vec![factor("max_pages", BLOCK_PAGES)],
            vec![],
        ]
    };
    let config = || obj(json!({ "block_pages": BLOCK_PAGES }));
    Ok(vec![
        BundleKernel {
            name: "vllm_to_csr".into(),
            family: "engines".into(),
            kernel: engines::build_block_table()?,
            inputs: vec!["batch".into()],
            grid: grid(),
            config: config(),
        },
        BundleKernel {
            name: "sglang_to_csr".into(),
            family: "engines".into(),
            kernel: engines::build_req_to_token()?,
            inputs: vec!["batch".into()],
            grid: grid(),
            config: config(),
        },
    ])
}

/// Every configuration of the stock families this crate can bundle: quantization and
/// query preparation for head_dim 64, 128, 256 and 4 or 8 bits, every `spgemv_quant`
/// specialisation, and the top-p search's defaults for rows of 1k to 32k candidates, for
/// groups 1 and 4, and attention's split and merge over token lists and dense for
/// head_dim 64 and 128 and GQA groups of 2, 4 and 8 (`dusk compile --all`). Each kernel
/// once: several row lengths share a search default, and the merge does not depend on
/// the group.
pub fn all_kernels() -> Result<Vec<BundleKernel>> {
    let mut out = vec![];
    for d in [64, 128, 256] {
        for bits in [4, 8] {
            out.push(quantize_kernel(d, bits)?);
            out.push(prepare_q_kernel(d, bits)?);
        }
    }
    for c in spgemv::specialised_configs() {
        out.push(spgemv_kernel(&c)?);
    }
    for group in [1, 4] {
        for len in [1024, 2048, 4096, 8192, 32768] {
            out.push(search_kernel(&SearchConfig::for_rows(len, group))?);
        }
    }
    for d in [64, 128] {
        for group in [2, 4, 8] {
            for lists in [true, false] {
                out.extend(attention_kernels(d, group, lists)?);
            }
        }
    }
    out.extend(converter_kernels()?);
    let mut seen = std::collections::HashSet::new();
    out.retain(|k| seen.insert(k.name.clone()));
    Ok(out)
}
