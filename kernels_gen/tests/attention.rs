//! Varlen paged decode attention through the CPU interpreter against the f64 reference:
//! every mode, head_dim 64/128/256, MHA and GQA, rows split into several chunks, empty rows,
//! one-token rows, skewed lengths, partly filled last pages, SparQ's transform, bf16; and
//! the errors bad metadata gets before anything is launched. A property test draws random
//! shapes, modes, chunk sizes and budgets.

use dusk_compiler::DType;
use dusk_kernels::attention_ops;
use dusk_kernels::attention_ops::{
    AttentionMode, AttentionPlan, AttentionSpec, AttentionTuning, SparqMix,
};
use dusk_kernels::ops::Dusk;
use dusk_kernels::paged::{KvShape, PageTable, TokenLists};
use dusk_kernels::reference;
use dusk_kernels::reference::HalfFloat;
use dusk_kernels::timeline::TIMELINE_WORDS;
use dusk_runtime::Device;
use half::{bf16, f16};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

#[path = "support/inputs.rs"]
mod inputs;
use inputs::*;

fn table_for(seq_lens: &[usize], page_size: usize, rng: &mut SmallRng) -> (PageTable, usize) {
    let total = PageTable::pages_needed(seq_lens, page_size);
    let mut ids: Vec<i32> = (0..total as i32).collect();
    ids.shuffle(rng);
    (
        PageTable::from_lengths(seq_lens, page_size, ids).unwrap(),
        total.max(1),
    )
}

/// Random ascending lists, one per (batch, `heads_per_batch` row), of lengths drawn from
/// `lens` in turn (clamped to the sequence).
fn random_lists(
    rng: &mut SmallRng,
    table: &PageTable,
    page_size: usize,
    heads_per_batch: usize,
    lens: &[usize],
) -> TokenLists {
    let mut indptr = vec![0i32];
    let mut indices = vec![];
    for r in 0..table.batch() * heads_per_batch {
        let n = table.seq_len(r / heads_per_batch, page_size);
        let want = lens[r % lens.len()].min(n);
        let mut all: Vec<i32> = (0..n as i32).collect();
        all.shuffle(rng);
        let mut row = all[..want].to_vec();
        row.sort_unstable();
        indices.extend(row);
        indptr.push(indices.len() as i32);
    }
    TokenLists { indptr, indices }
}

struct Case<'a> {
    seqs: &'a [usize],
    kv_heads: usize,
    group: usize,
    head_dim: usize,
    page_size: usize,
    mode: AttentionMode,
    /// List lengths (cycled over rows); ignored in dense mode.
    lens: &'a [usize],
    /// Tokens per work item (small, so rows split into several chunks).
    chunk: usize,
    sparq: bool,
    /// GQA on the CUDA cores (the tensor cores are the default for groups of 2 to 8).
    cuda_cores: bool,
    /// A row's chunks next to each other in the grid.
    chunk_fastest: bool,
    /// Token lists: programs of the balanced split (0: the plan's default).
    programs: u32,
    /// Token lists: what a row start counts as in the balanced split.
    row_tokens: u32,
    /// K and V of one more tile brought into L2 a step early (the pipeline one stage
    /// deeper).
    l2_prefetch: bool,
    /// Partials the merge combines a step.
    merge_chunks: usize,
    /// Token lists: the split merges (the last piece of a row), no merge launch.
    fused_merge: bool,
    /// Tensor cores: K and V staged through this many tiles of shared memory (0: through
    /// registers).
    stages: usize,
    /// Programs an SM asked of ptxas (0: the plan's choice); the tensor-core split then
    /// reads the group's queries from shared memory each step.
    programs_per_sm: u32,
}

fn check<T: HalfFloat>(seed: u64, c: &Case) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let dev = dusk.device();
    let (table, num_pages) = table_for(c.seqs, c.page_size, &mut rng);
    let kv = KvShape {
        num_pages,
        page_size: c.page_size,
        num_kv_heads: c.kv_heads,
        head_dim: c.head_dim,
    };
    let hq = c.kv_heads * c.group;
    let batch = c.seqs.len();
    let lists = match c.mode {
        AttentionMode::Dense => None,
        AttentionMode::HeadVarlen => Some(random_lists(&mut rng, &table, c.page_size, hq, c.lens)),
        _ => Some(random_lists(
            &mut rng,
            &table,
            c.page_size,
            c.kv_heads,
            c.lens,
        )),
    };
    let longest = match &lists {
        None => *c.seqs.iter().max().unwrap(),
        Some(l) => l.max_row_len(),
    };
    let spec = AttentionSpec {
        kv,
        batch,
        num_q_heads: hq,
        mode: c.mode,
        max_tokens: longest.max(1),
        sm_scale: None,
        sparq: c.sparq,
        dtype: T::DTYPE,
    };
    // Chunks are whole steps: `c.chunk` rounded up to the tiling's tokens a step.
    let plan = AttentionPlan::with_tuning(&dusk, spec, |t: &mut AttentionTuning| {
        if c.cuda_cores && t.tensor_cores {
            let (bt, w, f) = attention_ops::default_tiling(c.head_dim, c.group);
            (t.block_tokens, t.num_warps, t.prefetch, t.tensor_cores) = (bt, w, f, false);
        }
        t.chunk_fastest = c.chunk_fastest && matches!(c.mode, DENSE | PADDED);
        t.list_programs = c.programs;
        t.row_tokens = c.row_tokens;
        t.l2_prefetch = c.l2_prefetch;
        t.merge_chunks = c.merge_chunks;
        t.fused_merge = c.fused_merge;
        if c.programs_per_sm > 0 {
            t.min_programs_per_sm = c.programs_per_sm;
        }
        if c.stages > 0 && t.tensor_cores {
            (t.stages, t.stream_kv, t.l2_prefetch) = (c.stages, false, false);
        }
        t.chunk_tokens = c.chunk.div_ceil(t.block_tokens) * t.block_tokens
    })
    .unwrap();
    let meta = plan.upload_meta(&dusk, &table, lists.as_ref()).unwrap();
    let gen = |rng: &mut SmallRng, n: usize| -> Vec<T> {
        (0..n)
            .map(|_| T::from_f32(rng.random_range(-2.0f32..2.0)))
            .collect()
    };
    let (q, k, v) = (
        gen(&mut rng, batch * hq * c.head_dim),
        gen(&mut rng, kv.elements()),
        gen(&mut rng, kv.elements()),
    );
    let alpha: Vec<f32> = (0..batch * hq)
        .map(|_| rng.random_range(0.0..1.0))
        .collect();
    let v_mean = gen(&mut rng, batch * c.kv_heads * c.head_dim);
    let (qb, kb, vb) = (
        dev.upload(&q).unwrap(),
        dev.upload(&k).unwrap(),
        dev.upload(&v).unwrap(),
    );
    let (ab, vmb) = (dev.upload(&alpha).unwrap(), dev.upload(&v_mean).unwrap());
    let mut out = dev.upload(&vec![T::from_f32(f32::NAN); q.len()]).unwrap();
    let mut lse = dev.upload(&vec![f32::NAN; batch * hq]).unwrap();
    let mix = c.sparq.then_some(SparqMix {
        alpha: &ab,
        v_mean: &vmb,
    });
    plan.run(&dusk, &qb, &kb, &vb, &meta, mix, &mut out, &mut lse)
        .unwrap();
    let f = |x: &[T]| x.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
    let vm = f(&v_mean);
    let (want, want_lse) = reference::attention(
        &f(&q),
        &f(&k),
        &f(&v),
        hq,
        &kv,
        &table,
        &reference::per_query_rows(c.mode, &table, lists.as_ref(), &kv, hq),
        1.0 / (c.head_dim as f64).sqrt(),
        c.sparq.then_some((&alpha[..], &vm[..])),
    );
    let got = f(&out.download().unwrap());
    let got_lse = lse.download().unwrap();
    let err = reference::rel_error(&got, &want);
    let tol = if T::DTYPE == DType::BF16 { 1e-2 } else { 2e-3 };
    assert!(err < tol, "output rel err {err:.2e} (seed {seed})");
    for (r, (a, b)) in got_lse.iter().zip(&want_lse).enumerate() {
        if b.is_infinite() {
            assert!(
                *a == f32::NEG_INFINITY,
                "row {r}: lse {a}, want -inf (empty row)"
            );
            assert!(
                got[r * c.head_dim..(r + 1) * c.head_dim]
                    .iter()
                    .all(|x| c.sparq || *x == 0.0),
                "row {r}: an empty row must give zeros"
            );
        } else {
            assert!(
                (*a as f64 - b).abs() < 1e-3 * b.abs().max(1.0),
                "row {r}: lse {a}, want {b}"
            );
        }
    }
}

const DENSE: AttentionMode = AttentionMode::Dense;
const HEAD: AttentionMode = AttentionMode::HeadVarlen;
const GROUP: AttentionMode = AttentionMode::GroupVarlen;
const PADDED: AttentionMode = AttentionMode::Padded;

fn case(seqs: &[usize], kv_heads: usize, group: usize, d: usize, mode: AttentionMode) -> Case<'_> {
    Case {
        seqs,
        kv_heads,
        group,
        head_dim: d,
        page_size: 16,
        mode,
        lens: &[1],
        chunk: 32,
        sparq: false,
        cuda_cores: false,
        chunk_fastest: false,
        programs: 0,
        row_tokens: 16,
        l2_prefetch: false,
        // Several merge steps a row in the fixed cases (the property test draws 1 to 64).
        merge_chunks: 2,
        fused_merge: true,
        stages: 0,
        programs_per_sm: 0,
    }
}

#[test]
fn dense_mha_and_gqa_over_head_dims() {
    // The merge as a second launch, and inside the split (the last chunk of a row).
    for fused_merge in [false, true] {
        let c = |seqs, kv_heads, group, d| Case {
            fused_merge,
            ..case(seqs, kv_heads, group, d, DENSE)
        };
        check::<f16>(1, &c(&[37, 100, 1], 2, 1, 64));
        check::<f16>(2, &c(&[70, 16], 2, 4, 128));
        check::<f16>(3, &c(&[45], 1, 2, 256));
    }
}

#[test]
fn dense_one_chunk_per_row_and_partial_pages() {
    let c = Case {
        chunk: 128,
        page_size: 8,
        ..case(&[5, 129, 64], 1, 8, 64, DENSE)
    };
    check::<f16>(4, &c);
    // One step per chunk: the prefetched tiles all lie past the chunk.
    let c = Case {
        chunk: 8,
        lens: &[9, 1, 30],
        ..case(&[33, 17], 2, 2, 64, GROUP)
    };
    check::<f16>(11, &c);
}

#[test]
fn head_varlen_with_empty_single_and_skewed_rows() {
    let c = Case {
        lens: &[0, 1, 90, 3, 17],
        ..case(&[120, 95], 2, 2, 128, HEAD)
    };
    check::<f16>(5, &c);
}

#[test]
fn group_varlen_reads_the_union_once_per_group() {
    let c = Case {
        lens: &[60, 0, 1, 33],
        ..case(&[80, 64, 10], 2, 4, 64, GROUP)
    };
    check::<f16>(6, &c);
    let c = Case {
        lens: &[200, 5],
        ..case(&[230], 2, 8, 256, GROUP)
    };
    check::<f16>(7, &c);
}

/// K and V staged through shared memory by asynchronous copies: every mode, both head
/// dims and dtypes, rings of 2 to 6 stages (more stages than a chunk has tiles, chunks
/// ending inside a tile, empty lists). The interpreter lands a copy only when its group is
/// waited for, so a step reading a stage too early would read the ring's NaN fill.
#[test]
fn gqa_with_k_and_v_staged_in_shared_memory() {
    let staged = |c: Case<'static>, stages: usize| Case { stages, ..c };
    check::<f16>(21, &staged(case(&[70, 16, 1], 2, 4, 128, DENSE), 2));
    check::<f16>(22, &staged(case(&[100, 33], 1, 8, 64, DENSE), 3));
    let c = Case {
        chunk: 64,
        ..case(&[130, 47], 2, 2, 128, DENSE)
    };
    check::<f16>(23, &staged(c, 4));
    check::<bf16>(24, &staged(case(&[90, 20], 2, 4, 128, DENSE), 6));
    let c = Case {
        lens: &[60, 0, 1, 33],
        ..case(&[80, 64, 10], 2, 4, 128, GROUP)
    };
    check::<f16>(25, &staged(c, 3));
    let c = Case {
        lens: &[41, 7],
        fused_merge: false,
        ..case(&[80, 64], 2, 4, 64, GROUP)
    };
    check::<f16>(26, &staged(c, 4));
    let c = Case {
        lens: &[30, 0, 17],
        ..case(&[50, 40, 30], 2, 4, 128, PADDED)
    };
    check::<f16>(27, &staged(c, 3));
    let c = Case {
        sparq: true,
        lens: &[20, 9],
        ..case(&[50, 40], 2, 4, 128, GROUP)
    };
    check::<f16>(28, &staged(c, 2));
}

/// Under a register cap (as the plans ask for long dense chunks) the tensor-core split keeps
/// the group's queries in shared memory and reads them back each step: dense and token
/// lists, both head dims and dtypes, the merge inside the split or not. The interpreter
/// fills shared memory with NaN, so queries read before they are stored would show.
#[test]
fn gqa_queries_read_from_shared_memory_under_a_register_cap() {
    let capped = |c: Case<'static>| Case {
        programs_per_sm: 16,
        ..c
    };
    check::<f16>(31, &capped(case(&[70, 16, 1], 2, 4, 128, DENSE)));
    let c = Case {
        fused_merge: false,
        ..case(&[90, 20], 1, 2, 64, DENSE)
    };
    check::<bf16>(32, &capped(c));
    let c = Case {
        lens: &[60, 0, 1, 33],
        ..case(&[80, 64, 10], 2, 8, 128, GROUP)
    };
    check::<f16>(33, &capped(c));
}

/// The CUDA-core GQA kernel stays a tuning option: the same cases as above on it.
#[test]
fn gqa_on_cuda_cores() {
    let fma = |c: Case<'static>| Case {
        cuda_cores: true,
        ..c
    };
    check::<f16>(2, &fma(case(&[70, 16], 2, 4, 128, DENSE)));
    let c = Case {
        lens: &[60, 0, 1, 33],
        ..case(&[80, 64, 10], 2, 4, 64, GROUP)
    };
    check::<f16>(6, &fma(c));
}

/// Chunks along the grid's first axis compute the same thing; so do a few programs each
/// taking a long segment of the token lists across several rows.
#[test]
fn chunk_fastest_grid_and_few_list_programs() {
    let c = Case {
        lens: &[90, 0, 1, 33, 0, 70],
        programs: 3,
        row_tokens: 40,
        ..case(&[100, 64, 10], 2, 4, 128, GROUP)
    };
    check::<f16>(12, &c);
    let c = Case {
        lens: &[90, 0, 1, 33],
        programs: 1,
        cuda_cores: true,
        ..case(&[100, 64], 2, 1, 64, HEAD)
    };
    check::<f16>(14, &c);
    let c = Case {
        chunk_fastest: true,
        ..case(&[37, 100, 1], 2, 1, 64, DENSE)
    };
    check::<f16>(13, &c);
}

#[test]
fn padded_baseline_matches_varlen() {
    let c = Case {
        lens: &[50, 2, 0, 31],
        ..case(&[64, 55], 2, 4, 128, PADDED)
    };
    check::<f16>(8, &c);
}

#[test]
fn sparq_output_transform() {
    let c = Case {
        lens: &[20, 7],
        sparq: true,
        ..case(&[40, 33], 2, 4, 64, GROUP)
    };
    check::<f16>(9, &c);
}

#[test]
fn bf16_inputs() {
    let c = Case {
        lens: &[40, 13],
        ..case(&[50, 21], 1, 4, 128, GROUP)
    };
    check::<bf16>(10, &c);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, .. ProptestConfig::default() })]
    /// Random shapes and budgets: 1 to 3 sequences of 0 to 150 tokens, 1 or 2 KV heads,
    /// groups of 1 to 8, every mode, chunks of 8 to 64 tokens, lists of random lengths
    /// (empty ones included), GQA on the tensor cores or the CUDA cores, either grid order
    /// (dense, padded), 1 to 3 list programs or the default, under a register cap or not.
    #[test]
    fn random_shapes_and_budgets(
        seed in 0u64..10_000,
        seqs in proptest::collection::vec(0usize..150, 1..4),
        kv_heads in 1usize..3,
        group_log in 0u32..4,
        wide in any::<bool>(),
        mode in 0usize..4,
        chunk_log in 3u32..7,
        lens in proptest::collection::vec(0usize..120, 1..6),
        cuda_cores in any::<bool>(),
        chunk_fastest in any::<bool>(),
        programs in 0u32..4,
        row_tokens in 0u32..40,
        l2_prefetch in any::<bool>(),
        merge_log in 0u32..7,
        fused_merge in any::<bool>(),
        stages in 0usize..7,
        capped in any::<bool>(),
    ) {
        prop_assume!(seqs.iter().any(|n| *n > 0));
        let c = Case {
            seqs: &seqs,
            kv_heads,
            group: 1 << group_log,
            head_dim: if wide { 128 } else { 64 },
            page_size: 16,
            mode: [DENSE, HEAD, GROUP, PADDED][mode],
            lens: &lens,
            chunk: 1 << chunk_log,
            sparq: false,
            cuda_cores,
            chunk_fastest,
            programs,
            row_tokens,
            l2_prefetch,
            merge_chunks: 1 << merge_log,
            fused_merge,
            // Where the tensor cores serve the case (1 stage is no ring: registers).
            stages: if stages == 1 { 0 } else { stages },
            programs_per_sm: if capped { 16 } else { 0 },
        };
        check::<f16>(seed, &c);
    }
}

fn small_plan(dusk: &Dusk, mode: AttentionMode, max_tokens: usize) -> (AttentionPlan, PageTable) {
    small_plan_tuned(dusk, mode, max_tokens, |_| {})
}

fn small_plan_tuned(
    dusk: &Dusk,
    mode: AttentionMode,
    max_tokens: usize,
    tune: impl FnOnce(&mut AttentionTuning),
) -> (AttentionPlan, PageTable) {
    let kv = KvShape {
        num_pages: 8,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let table = PageTable::from_lengths(&[40, 20], 16, vec![0, 1, 2, 3, 4]).unwrap();
    let spec = AttentionSpec {
        kv,
        batch: 2,
        num_q_heads: 4,
        mode,
        max_tokens,
        sm_scale: None,
        sparq: false,
        dtype: DType::F16,
    };
    (AttentionPlan::with_tuning(dusk, spec, tune).unwrap(), table)
}

#[test]
fn bad_metadata_is_rejected_before_launch() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let (plan, table) = small_plan(&dusk, GROUP, 64);
    // A position past its sequence (sequence 1 has 20 tokens).
    let lists = TokenLists {
        indptr: vec![0, 1, 2, 3, 4],
        indices: vec![0, 39, 20, 3],
    };
    let e = plan.upload_meta(&dusk, &table, Some(&lists)).err().unwrap();
    assert_eq!(arg_of(e), "lists");
    // Negative positions.
    let lists = TokenLists {
        indptr: vec![0, 1, 2, 3, 4],
        indices: vec![0, -1, 2, 3],
    };
    assert_eq!(
        arg_of(plan.upload_meta(&dusk, &table, Some(&lists)).err().unwrap()),
        "lists"
    );
    // Rows for the wrong mode (per query head in a group plan).
    let lists = TokenLists::all_tokens(&table, 16, 4);
    assert_eq!(
        arg_of(plan.upload_meta(&dusk, &table, Some(&lists)).err().unwrap()),
        "lists"
    );
    // No lists at all.
    assert_eq!(
        arg_of(plan.upload_meta(&dusk, &table, None).err().unwrap()),
        "lists"
    );
    // A row over the planned budget.
    let (small, _) = small_plan(&dusk, GROUP, 8);
    let lists = TokenLists::all_tokens(&table, 16, 2);
    assert_eq!(
        arg_of(
            small
                .upload_meta(&dusk, &table, Some(&lists))
                .err()
                .unwrap()
        ),
        "lists"
    );
    // A page id outside the cache.
    let bad = PageTable {
        kv_page_indices: vec![0, 1, 9, 3, 4],
        ..table.clone()
    };
    let lists = TokenLists::all_tokens(&table, 16, 2);
    assert_eq!(
        arg_of(plan.upload_meta(&dusk, &bad, Some(&lists)).err().unwrap()),
        "kv_page_indices"
    );
    // A sequence longer than a dense plan's max_tokens.
    let (dense, _) = small_plan(&dusk, DENSE, 32);
    assert_eq!(
        arg_of(dense.upload_meta(&dusk, &table, None).err().unwrap()),
        "kv_last_page_len"
    );
}

#[test]
fn bad_shapes_are_rejected() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let (plan, table) = small_plan(&dusk, DENSE, 64);
    let meta = plan.upload_meta(&dusk, &table, None).unwrap();
    let dev = dusk.device();
    let kv = plan.spec().kv;
    let k = dev.alloc::<f16>(kv.elements()).unwrap();
    let q = dev.alloc::<f16>(2 * 4 * 64).unwrap();
    let mut out = dev.alloc::<f16>(2 * 4 * 64).unwrap();
    let mut lse = dev.alloc::<f32>(8).unwrap();
    let short = dev.alloc::<f16>(10).unwrap();
    let e = plan
        .run(&dusk, &short, &k, &k, &meta, None, &mut out, &mut lse)
        .err()
        .unwrap();
    assert_eq!(arg_of(e), "q");
    let mut bad_lse = dev.alloc::<f32>(3).unwrap();
    let e = plan
        .run(&dusk, &q, &k, &k, &meta, None, &mut out, &mut bad_lse)
        .err()
        .unwrap();
    assert_eq!(arg_of(e), "lse");
    // bf16 buffers to an f16 plan.
    let qb = dev.alloc::<bf16>(2 * 4 * 64).unwrap();
    let kb = dev.alloc::<bf16>(kv.elements()).unwrap();
    let mut ob = dev.alloc::<bf16>(2 * 4 * 64).unwrap();
    let e = plan
        .run(&dusk, &qb, &kb, &kb, &meta, None, &mut ob, &mut lse)
        .err()
        .unwrap();
    assert_eq!(arg_of(e), "q");
    // A group that is not a power of two, a head_dim without kernels.
    let spec = AttentionSpec {
        num_q_heads: 6,
        ..*plan.spec()
    };
    assert_eq!(
        arg_of(AttentionPlan::new(&dusk, spec).err().unwrap()),
        "num_q_heads"
    );
    let spec = AttentionSpec {
        kv: KvShape { head_dim: 96, ..kv },
        ..*plan.spec()
    };
    assert_eq!(
        arg_of(AttentionPlan::new(&dusk, spec).err().unwrap()),
        "head_dim"
    );
    let spec = AttentionSpec {
        sm_scale: Some(f32::NAN),
        ..*plan.spec()
    };
    assert_eq!(
        arg_of(AttentionPlan::new(&dusk, spec).err().unwrap()),
        "sm_scale"
    ); // Partial outputs in a type the merge does not add in.
    let e = AttentionPlan::with_tuning(&dusk, *plan.spec(), |t| t.partial_dtype = DType::I32);
    assert_eq!(arg_of(e.err().unwrap()), "partial_dtype");
}

/// Lists written on the device are not checked on the host: an `indptr` that runs past
/// the indices and positions outside the sequence must be skipped, never read through.
#[test]
fn device_lists_never_read_out_of_bounds() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    // With a merge launch (waiting for the whole split, or for each row's pieces) and with
    // the split merging rows.
    for (fused, signals) in [(false, false), (false, true), (true, false)] {
        let (plan, table) = small_plan_tuned(&dusk, GROUP, 64, |t| {
            t.fused_merge = fused;
            t.row_signals = signals;
        });
        // Every launch, whatever its lists, leaves the rows' counters settled.
        let settled = |plan: &AttentionPlan| assert!(plan.counters_settled().unwrap());
        let dev = dusk.device();
        let kv = plan.spec().kv;
        // Sequence 0 (40 tokens), KV heads 0 and 1; sequence 1 (20 tokens), heads 0 and 1.
        // Row 0 holds a position past its sequence (45); row 3 runs 60 entries past the buffer.
        let indices = vec![0, 7, 39, 45, 3, 19, 2];
        let lists = |indptr: &[i32]| {
            plan.device_meta(
                &dusk,
                &table,
                dev.upload(indptr).unwrap(),
                dev.upload(&indices).unwrap(),
            )
            .unwrap()
        };
        let meta = lists(&[0, 4, 5, 6, 66]);
        let mut rng = SmallRng::seed_from_u64(12);
        let gen = |rng: &mut SmallRng, n: usize| -> Vec<f16> {
            (0..n)
                .map(|_| f16::from_f32(rng.random_range(-2.0f32..2.0)))
                .collect()
        };
        let (q, k, v) = (
            gen(&mut rng, 2 * 4 * 64),
            gen(&mut rng, kv.elements()),
            gen(&mut rng, kv.elements()),
        );
        let mut out = dev.alloc::<f16>(q.len()).unwrap();
        let mut lse = dev.alloc::<f32>(8).unwrap();
        let (qb, kb, vb) = (
            dev.upload(&q).unwrap(),
            dev.upload(&k).unwrap(),
            dev.upload(&v).unwrap(),
        );
        plan.run(&dusk, &qb, &kb, &vb, &meta, None, &mut out, &mut lse)
            .unwrap();
        // What the kernel must have used: the in-range entries of each row.
        let clean = TokenLists {
            indptr: vec![0, 3, 4, 5, 6],
            indices: vec![0, 7, 39, 3, 19, 2],
        };
        let f = |x: &[f16]| x.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
        let (want, _) = reference::attention(
            &f(&q),
            &f(&k),
            &f(&v),
            4,
            &kv,
            &table,
            &reference::per_query_rows(GROUP, &table, Some(&clean), &kv, 4),
            1.0 / 8.0,
            None,
        );
        let err = reference::rel_error(&f(&out.download().unwrap()), &want);
        assert!(err < 2e-3, "rel err {err:.2e}");
        // Offsets that do not start at 0 and go backwards: wrong answers are allowed, reads
        // and writes outside the buffers are not (the interpreter checks every access).
        // Offsets near the ends of i32 made the piece arithmetic wrap into loops of
        // billions of steps before the split clamped them.
        for indptr in [
            vec![5, 9, 2, 7, 7],
            vec![3, 3, 1, 6, -4],
            vec![0, 7, 7, 7, 1 << 30],
            vec![1 << 30, 7, i32::MIN, 72, -(1 << 30)],
            vec![i32::MIN, 75, 1 << 30, 1 << 30, -10],
            vec![-6, i32::MAX, i32::MIN, -(1 << 30), 8],
        ] {
            let bad = lists(&indptr);
            plan.run(&dusk, &qb, &kb, &vb, &bad, None, &mut out, &mut lse)
                .unwrap();
            settled(&plan);
        }
        // Bad lists leave no state behind (the split's arrival counters): good lists after
        // them give the right answer again.
        let mut again = dev.alloc::<f16>(q.len()).unwrap();
        plan.run(&dusk, &qb, &kb, &vb, &meta, None, &mut again, &mut lse)
            .unwrap();
        let err = reference::rel_error(&f(&again.download().unwrap()), &want);
        assert!(err < 2e-3, "after bad lists: rel err {err:.2e}");
    }
}

/// The timeline (a diagnosis option) changes nothing in the results, and every record
/// says its program started, searched, stepped and ended in that order.
#[test]
fn timeline_records_each_program_in_order() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let dev = dusk.device();
    let run = |timeline: bool| {
        let (plan, table) = small_plan_tuned(&dusk, GROUP, 64, |t| {
            t.timeline = timeline;
            t.list_programs = 3;
        });
        let kv = plan.spec().kv;
        let mut rng = SmallRng::seed_from_u64(5);
        let lists = random_lists(&mut rng, &table, 16, 2, &[30, 2, 17, 9]);
        let meta = plan.upload_meta(&dusk, &table, Some(&lists)).unwrap();
        let gen = |n: usize| -> Vec<f16> {
            (0..n)
                .map(|i| f16::from_f32(((i * 7919) % 97) as f32 / 50.0 - 1.0))
                .collect()
        };
        let (qb, kb) = (
            dev.upload(&gen(2 * 4 * 64)).unwrap(),
            dev.upload(&gen(kv.elements())).unwrap(),
        );
        let mut out = dev.alloc::<f16>(2 * 4 * 64).unwrap();
        let mut lse = dev.alloc::<f32>(8).unwrap();
        plan.run(&dusk, &qb, &kb, &kb, &meta, None, &mut out, &mut lse)
            .unwrap();
        let words = plan.timeline().map(|t| t.download().unwrap());
        (out.download().unwrap(), words, plan.grid()[0] as usize)
    };
    let (plain, none, _) = run(false);
    assert!(none.is_none());
    let (timed, words, programs) = run(true);
    assert_eq!(plain, timed);
    let words = words.expect("a timeline");
    assert_eq!(words.len(), (programs + 8) * TIMELINE_WORDS);
    let mut busy = 0;
    for (p, r) in words.chunks(TIMELINE_WORDS).enumerate() {
        if p < programs && r[3] == 0 {
            // No segment (segments are at least 64 entries): a start and nothing else.
            assert!(r[0] > 0 && r[1] == 0 && r[2] == 0, "split {p}: {r:?}");
        } else if p < programs {
            // start <= searched <= first step <= end.
            assert!(
                r[0] <= r[1] && r[1] <= r[2] && r[2] <= r[3],
                "split {p}: {r:?}"
            );
            busy += 1;
        } else {
            assert!(r[0] > 0 && r[0] <= r[1] && r[1] <= r[2], "merge {p}: {r:?}");
        }
    }
    assert!(busy > 0);
}

/// A page table the device writes (`AttentionPlan::for_device_table`): read as it is at each
/// run, equal to the host-checked table when it is valid, and clamped by the split when it
/// is not (offsets outside the table or backwards, last pages of 0 or too many tokens, page
/// ids outside the cache): wrong answers then, never an access outside a buffer (the
/// interpreter checks every one). Dense and group lists.
#[test]
fn device_page_tables_are_clamped() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let dev = dusk.device();
    for mode in [DENSE, GROUP] {
        let (host_plan, table) = small_plan(&dusk, mode, 64);
        let spec = *host_plan.spec();
        let plan = AttentionPlan::for_device_table(&dusk, spec, |_| {}).unwrap();
        // Dense also with the merge inside the split (what the Python package's
        // fused_merge plans run).
        let fused = AttentionPlan::for_device_table(&dusk, spec, |t| t.fused_merge = true).unwrap();
        let kv = spec.kv;
        let mut rng = SmallRng::seed_from_u64(31);
        let gen = |rng: &mut SmallRng, n: usize| -> Vec<f16> {
            (0..n)
                .map(|_| f16::from_f32(rng.random_range(-2.0f32..2.0)))
                .collect()
        };
        let (q, k, v) = (
            gen(&mut rng, 2 * 4 * 64),
            gen(&mut rng, kv.elements()),
            gen(&mut rng, kv.elements()),
        );
        let (qb, kb, vb) = (
            dev.upload(&q).unwrap(),
            dev.upload(&k).unwrap(),
            dev.upload(&v).unwrap(),
        );
        let lists = TokenLists {
            indptr: vec![0, 3, 5, 6, 8],
            indices: vec![0, 17, 39, 1, 2, 19, 5, 6],
        };
        let device_lists = || {
            (mode == GROUP).then(|| {
                (
                    dev.upload(&lists.indptr).unwrap(),
                    dev.upload(&lists.indices).unwrap(),
                )
            })
        };
        let meta_of = |indptr: &[i32], ids: &[i32], last: &[i32]| {
            plan.device_table_meta(
                dev.upload(indptr).unwrap(),
                dev.upload(ids).unwrap(),
                dev.upload(last).unwrap(),
                device_lists(),
            )
            .unwrap()
        };
        let run = |meta: &attention_ops::AttentionMeta| {
            let mut out = dev.upload(&vec![f16::from_f32(f32::NAN); q.len()]).unwrap();
            let mut lse = dev.alloc::<f32>(8).unwrap();
            plan.run(&dusk, &qb, &kb, &vb, meta, None, &mut out, &mut lse)
                .unwrap();
            out.download().unwrap()
        };
        // A valid table, with spare capacity past its entries (as a converter's output).
        let mut ids = table.kv_page_indices.clone();
        ids.extend([-7, 1 << 20, 3]);
        let good = run(&meta_of(&table.kv_indptr, &ids, &table.kv_last_page_len));
        let host_meta = host_plan
            .upload_meta(&dusk, &table, (mode == GROUP).then_some(&lists))
            .unwrap();
        let want = run(&host_meta);
        assert_eq!(
            good, want,
            "{mode:?}: a device table against the same host table"
        );
        let f = |x: &[f16]| x.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
        let (reference_out, _) = reference::attention(
            &f(&q),
            &f(&k),
            &f(&v),
            4,
            &kv,
            &table,
            &reference::per_query_rows(mode, &table, (mode == GROUP).then_some(&lists), &kv, 4),
            1.0 / 8.0,
            None,
        );
        let err = reference::rel_error(&f(&good), &reference_out);
        assert!(err < 2e-3, "{mode:?}: rel err {err:.2e}");
        let meta = meta_of(&table.kv_indptr, &ids, &table.kv_last_page_len);
        let mut out = dev.alloc::<f16>(q.len()).unwrap();
        let mut lse = dev.alloc::<f32>(8).unwrap();
        fused
            .run(&dusk, &qb, &kb, &vb, &meta, None, &mut out, &mut lse)
            .unwrap();
        let err = reference::rel_error(&f(&out.download().unwrap()), &reference_out);
        assert!(err < 2e-3, "{mode:?}, fused merge: rel err {err:.2e}");
        assert!(fused.counters_settled().unwrap());
        // Bad tables: every run completes inside its buffers.
        for (indptr, ids, last) in [
            (vec![0, 9, 2], vec![0, 1, 2, 3, 4], vec![16, 4]),
            (vec![-5, 3, 1 << 30], vec![0, 1, 2, 3, 4], vec![0, -3]),
            (
                vec![i32::MIN, i32::MAX, -1],
                vec![0, 1, 2, 3, 4],
                vec![i32::MAX, i32::MIN],
            ),
            (
                vec![0, 3, 5],
                vec![-1, 8, 1 << 30, i32::MIN, i32::MAX],
                vec![16, 16],
            ),
            (vec![4, 5, 5], vec![7], vec![100, 1]),
        ] {
            let out = run(&meta_of(&indptr, &ids, &last));
            assert_eq!(out.len(), q.len());
        }
        // Host-checked plans refuse device tables, and a device table's meta only runs on
        // its own kind of plan.
        let refused = host_plan
            .device_table_meta(
                dev.upload(&table.kv_indptr).unwrap(),
                dev.upload(&ids).unwrap(),
                dev.upload(&table.kv_last_page_len).unwrap(),
                device_lists(),
            )
            .err()
            .unwrap();
        assert_eq!(arg_of(refused), "kv_indptr");
        let meta = meta_of(&table.kv_indptr, &ids, &table.kv_last_page_len);
        let mut out = dev.alloc::<f16>(q.len()).unwrap();
        let mut lse = dev.alloc::<f32>(8).unwrap();
        let e = host_plan
            .run(&dusk, &qb, &kb, &vb, &meta, None, &mut out, &mut lse)
            .err()
            .unwrap();
        assert_eq!(arg_of(e), "meta");
        // Lengths that do not fit the plan's batch.
        let e = plan
            .device_table_meta(
                dev.upload(&[0, 3]).unwrap(),
                dev.upload(&ids).unwrap(),
                dev.upload(&table.kv_last_page_len).unwrap(),
                device_lists(),
            )
            .err()
            .unwrap();
        assert_eq!(arg_of(e), "kv_indptr");
    }
}
