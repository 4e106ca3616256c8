//! A pipeline planned once for maxima, stepped on a page table the device holds: a decode
//! loop with growing lengths and the append inside the step, each step against the f64
//! reference and a host-table plan (`pipeline::replay`); a bad table kept in bounds; the
//! errors of the device-table mode. Through the interpreter (and a graph replay when a GPU
//! is present; `gpu-check pipeline` runs it on the device machine).

use dusk_compiler::DType;
use dusk_kernels::engines::CsrPages;
use dusk_kernels::ops::Dusk;
use dusk_kernels::paged::{KvShape, PageTable};
use dusk_kernels::pipeline::replay::{case_pipeline, check_loop, LoopCase, LoopSelect};
use dusk_kernels::pipeline::{
    Attend, PipelineBuilder, PipelineShape, Prune, Select, SparqSelect, StepLimits,
};
use dusk_kernels::selectors::{Budget, SparqOptions};
use dusk_runtime::Device;
use half::f16;

#[path = "support/inputs.rs"]
mod inputs;
use inputs::*;

#[path = "support/centroid.rs"]
mod centroid;

#[test]
fn a_decode_loop_on_a_device_table_equals_the_reference_and_host_tables() {
    let dusk = dusk();
    let case = LoopCase::default();
    let report = check_loop(&dusk, &case).unwrap();
    assert_eq!(report.steps, 4);
    // 31 -> 33 and 48 -> 49 start pages; 20 -> 24 and 31 -> 35 stay under the budget of
    // 48 (dense, 2 rows each a step).
    assert_eq!(report.pages_started, 2, "{report:?}");
    assert_eq!(report.dense_rows, 4 * 2 * 2, "{report:?}");
}

#[test]
fn quest_alone_by_a_fraction_on_a_device_table_equals_the_reference() {
    let dusk = dusk();
    let case = LoopCase {
        lens: vec![60, 15, 33],
        steps: 3,
        select: LoopSelect::Quest(Budget::Fraction(0.5)),
        top_p: None,
        max_tokens: 80,
        seed: 7,
        ..LoopCase::default()
    };
    let report = check_loop(&dusk, &case).unwrap();
    assert_eq!((report.steps, report.pages_started), (3, 1), "{report:?}");
}

#[test]
fn full_then_top_p_on_a_device_table_equals_the_reference() {
    // Every token a candidate: the sizing launch writes each row's positions where its
    // offsets put them, the sequences growing (31 -> 34 and 48 -> 51 start pages).
    let dusk = dusk();
    let case = LoopCase {
        lens: vec![70, 31, 48],
        steps: 3,
        select: LoopSelect::Full,
        max_tokens: 96,
        seed: 11,
        ..LoopCase::default()
    };
    let report = check_loop(&dusk, &case).unwrap();
    assert_eq!((report.steps, report.pages_started), (3, 2), "{report:?}");
    assert_eq!(report.dense_rows, 0, "{report:?}");
}

#[test]
fn double_sparsity_then_top_p_on_a_device_table_equals_the_reference() {
    // DS's budget over tokens sized on the device (a quarter of each growing sequence),
    // its labels of each new token written by the step's append.
    let dusk = dusk();
    let case = LoopCase {
        lens: vec![70, 31, 48],
        steps: 3,
        select: LoopSelect::Ds(Budget::Fraction(0.25)),
        max_tokens: 96,
        seed: 12,
        ..LoopCase::default()
    };
    let report = check_loop(&dusk, &case).unwrap();
    assert_eq!((report.steps, report.pages_started), (3, 2), "{report:?}");
}

#[test]
fn sparq_with_its_mix_on_a_device_table_equals_the_reference() {
    // SparQ's budget over tokens sized on the device, its copy paged as the cache (the
    // caller's table its block table), the append staging each new token, copying a slice
    // of the run before its own and adding V into its state: 31 -> 34 fills a run of 16 at
    // 32, whose first slices the next tokens copy.
    let dusk = dusk();
    let case = LoopCase {
        lens: vec![70, 31, 48],
        steps: 3,
        select: LoopSelect::Sparq(Budget::Tokens(24)),
        top_p: None,
        max_tokens: 96,
        seed: 13,
        ..LoopCase::default()
    };
    let report = check_loop(&dusk, &case).unwrap();
    assert_eq!((report.steps, report.pages_started), (3, 2), "{report:?}");
}

/// On a GPU (skipped without one): the step captured once and replayed each step equals
/// the eager step bit for bit.
#[test]
fn a_captured_decode_step_replays_new_lengths_on_a_gpu() {
    let Ok(gpu) = Device::gpu(0) else {
        eprintln!("skipped: no GPU ({})", Device::gpu(0).err().unwrap());
        return;
    };
    let dusk = Dusk::new(gpu).unwrap();
    let case = LoopCase {
        graph: true,
        ..LoopCase::default()
    };
    assert_eq!(check_loop(&dusk, &case).unwrap().replays, 4);
}

#[test]
fn a_bad_device_table_stays_in_bounds() {
    let dusk = dusk();
    let dev = dusk.device();
    let (kv, shape) = small_shape(12);
    let limits = StepLimits {
        batch: 3,
        max_tokens: 64,
        append: true,
    };
    let p = case_pipeline(&LoopCase::default()).unwrap();
    let mut plan = p.plan_device(&dusk, shape, limits).unwrap();
    let start = PageTable::from_lengths(&[40, 20, 7], 16, vec![3, 1, 4, 5, 9, 2]).unwrap();
    let mut k = dev.alloc::<f16>(kv.elements()).unwrap();
    let mut v = dev.alloc::<f16>(kv.elements()).unwrap();
    plan.prefill(&dusk, &k, None, &start).unwrap();
    let q = dev.upload(&vec![f16::from_f32(0.25); 3 * 8 * 64]).unwrap();
    let new = dev.upload(&vec![f16::from_f32(0.5); 3 * 2 * 64]).unwrap();
    let mut out = dev.alloc::<f16>(3 * 8 * 64).unwrap();
    let mut lse = dev.alloc::<f32>(3 * 8).unwrap();
    // Offsets past the page list and backwards, page ids out of range, a sequence longer
    // than max_tokens (9 pages of 16 > 64), a last-page length past page_size, an empty
    // sequence.
    let bad = CsrPages {
        kv_indptr: dev.upload(&[0, 9, 2, 2]).unwrap(),
        kv_page_indices: dev.upload(&[3, -1, 40, 5, 9, 2, 7, 8, 11]).unwrap(),
        kv_last_page_len: dev.upload(&[99, 3, 0]).unwrap(),
    };
    plan.decode_step(&dusk, &bad, None, &q, &mut k, &mut v, &mut out, &mut lse)
        .unwrap();
    let out = out.download().unwrap();
    assert!(out.iter().all(|x| x.is_finite()));
    // The empty sequences (2 -> 2, and the one after the backwards offset) read nothing.
    let lse = lse.download().unwrap();
    assert!(lse[16..].iter().all(|x| *x == f32::NEG_INFINITY), "{lse:?}");
    let budgets = plan.budgets().unwrap();
    assert!(
        budgets[0] as usize <= 64 && budgets[2..].iter().all(|b| *b == 0),
        "{budgets:?}"
    );
    // The append skips what it cannot place: no error, nothing out of bounds.
    let with_new = Some((&new, &new));
    plan.decode_step(
        &dusk,
        &bad,
        with_new,
        &q,
        &mut k,
        &mut v,
        &mut out_buf(&dusk),
        &mut lse_buf(&dusk),
    )
    .unwrap();
}

fn out_buf(dusk: &Dusk) -> dusk_runtime::Buffer<f16> {
    dusk.device().alloc(3 * 8 * 64).unwrap()
}

fn lse_buf(dusk: &Dusk) -> dusk_runtime::Buffer<f32> {
    dusk.device().alloc(3 * 8).unwrap()
}

#[test]
fn device_table_errors_name_the_argument() {
    let dusk = dusk();
    let dev = dusk.device();
    let (kv, shape) = small_shape(8);
    let limits = StepLimits {
        batch: 2,
        max_tokens: 64,
        append: false,
    };
    // SparQ with its copy in blocks of its own (a free list the host keeps).
    let sparq = SparqSelect {
        options: SparqOptions {
            r: 8,
            k: Budget::Tokens(32),
            window: 8,
        },
        block_size: Some(32),
    };
    let sparq = PipelineBuilder::new()
        .select(Select::Plugin(std::sync::Arc::new(sparq)))
        .attend(Attend::GroupVarlen)
        .build()
        .unwrap();
    assert_eq!(
        arg_of(sparq.plan_device(&dusk, shape, limits).err().unwrap()),
        "select"
    );
    let p = case_pipeline(&LoopCase::default()).unwrap();
    let zero = StepLimits { batch: 0, ..limits };
    assert_eq!(
        arg_of(p.plan_device(&dusk, shape, zero).err().unwrap()),
        "batch"
    );
    let none = StepLimits {
        max_tokens: 0,
        ..limits
    };
    assert_eq!(
        arg_of(p.plan_device(&dusk, shape, none).err().unwrap()),
        "max_tokens"
    );
    let mut plan = p.plan_device(&dusk, shape, limits).unwrap();
    let (mut k, mut v) = (
        dev.alloc(kv.elements()).unwrap(),
        dev.alloc(kv.elements()).unwrap(),
    );
    // Its table is on the device: `prefill` takes one, `prepare` has none.
    assert_eq!(arg_of(plan.prepare(&dusk, &k).unwrap_err()), "table");
    let wrong = CsrPages::alloc(&dusk, 3, 4).unwrap();
    let e = plan
        .run_table(&dusk, &wrong, None, &mut k, &mut v)
        .unwrap_err();
    assert_eq!(arg_of(e), "kv_indptr");
    // New tokens without an append planned.
    let table = CsrPages::alloc(&dusk, 2, 4).unwrap();
    let new = dev.alloc::<f16>(2 * 2 * 64).unwrap();
    let e = plan
        .run_table(&dusk, &table, Some((&new, &new)), &mut k, &mut v)
        .unwrap_err();
    assert_eq!(arg_of(e), "new");
    // A host-table plan has no device table.
    let host = p
        .plan(
            &dusk,
            shape,
            &PageTable::from_lengths(&[20, 30], 16, vec![0, 1, 2, 3]).unwrap(),
        )
        .unwrap();
    let mut host = host;
    let e = host
        .run_table(&dusk, &table, None, &mut k, &mut v)
        .unwrap_err();
    assert_eq!(arg_of(e), "table");
}

/// The sizing launch alone, in blocks of 8 (so a sequence's pages span several blocks dealt
/// over its programs): every reader's copy of the clamped table and of the sizes, and every
/// row's token positions (a pipeline without a selector).
#[test]
fn the_sizing_launch_writes_every_readers_table_and_sizes() {
    use dusk_kernels::pipeline::table::step_table;
    let dusk = dusk();
    let dev = dusk.device();
    let k = dusk.load(step_table::build::<8>().unwrap()).unwrap();
    // Sequence 0: 40 pages (cut to max_pages 32, so its last page counts as full);
    // sequence 1: none; sequence 2: 3 pages, one id past the cache (45 pages).
    let mut ids: Vec<i32> = (0..40).collect();
    ids.extend([50, 1, 2]);
    let kv_indptr = dev.upload(&[0, 40, 40, 43]).unwrap();
    let kv_pages = dev.upload(&ids).unwrap();
    let kv_last = dev.upload(&[5, 0, 16]).unwrap();
    // Arbitrary budgets per length: the launch only looks them up.
    let items: Vec<i32> = (0..=32 * 16).map(|l| l / 10).collect();
    let tokens: Vec<i32> = (0..=32 * 16).map(|l| 2 * l).collect();
    let (items, tokens) = (dev.upload(&items).unwrap(), dev.upload(&tokens).unwrap());
    let a = |n: usize| dev.upload(&vec![-7i32; n]).unwrap();
    let ip = [a(4), a(4), a(4), a(4)];
    let tok = [a(4), a(4)];
    let pg = [a(96), a(96), a(96)];
    let (last, k_items, sel_items, dense) = (a(3), a(3), a(7), a(6));
    let sel = [a(7), a(7), a(7), a(7)];
    let all = a(2240 + 5);
    step_table::launch::<8>(
        dev,
        &k,
        [6, 1, 1],
        &kv_indptr,
        &kv_pages,
        &kv_last,
        &items,
        &tokens,
        &ip[0],
        &ip[1],
        &ip[2],
        &ip[3],
        &tok[0],
        &tok[1],
        &pg[0],
        &pg[1],
        &pg[2],
        &last,
        &k_items,
        &sel_items,
        &sel[0],
        &sel[1],
        &sel[2],
        &sel[3],
        &dense,
        &all,
        1,
        43,
        2,
        16,
        32,
        45,
        48,
    )
    .unwrap();
    // Lengths 512 (cut), 0, 48: kept items 51, 0, 4; tokens 1024, 0, 96.
    for b in &ip {
        assert_eq!(b.download().unwrap(), [0, 32, 32, 35]);
    }
    for b in &tok {
        assert_eq!(b.download().unwrap(), [0, 512, 512, 560]);
    }
    let mut want: Vec<i32> = (0..32).collect();
    want.extend([44, 1, 2]);
    want.resize(96, -7);
    for b in &pg {
        assert_eq!(b.download().unwrap(), want);
    }
    assert_eq!(last.download().unwrap(), [16, 0, 16]);
    assert_eq!(k_items.download().unwrap(), [51, 0, 4]);
    assert_eq!(
        sel_items.download().unwrap(),
        [0, 51, 102, 102, 102, 106, 110]
    );
    for b in &sel {
        assert_eq!(
            b.download().unwrap(),
            [0, 1024, 2048, 2048, 2048, 2144, 2240]
        );
    }
    assert_eq!(dense.download().unwrap(), [-1, -1, 0, 0, 48, 48]);
    // Every row's positions 0..tokens at its offset (rows 2 and 3 empty), nothing past.
    let mut want: Vec<i32> = [1024, 1024, 96, 96].iter().flat_map(|t| 0..*t).collect();
    want.resize(2245, -7);
    assert_eq!(all.download().unwrap(), want);
}

/// A user's page selector (the centroid) on a device table, the append inside the step: its
/// state is updated over the pages the append touched (a second launch), and each step's
/// lists equal a host-table plan's whose state is rebuilt from the whole cache.
#[test]
fn a_users_selector_on_a_device_table_follows_the_appends() {
    use dusk_kernels::selectors::Keep;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;
    let dusk = dusk();
    let dev = dusk.device();
    let mut rng = SmallRng::seed_from_u64(21);
    let (kv, shape) = small_shape(16);
    let p = PipelineBuilder::new()
        .select(Select::Pages {
            selector: centroid::CENTROID,
            budget: Budget::Tokens(40),
            keep: Keep { sink: 1, recent: 1 },
        })
        .prune(Prune::top_p(0.85))
        .attend(Attend::GroupVarlen)
        .build()
        .unwrap();
    let limits = StepLimits {
        batch: 2,
        max_tokens: 128,
        append: true,
    };
    let mut plan = p.plan_device(&dusk, shape, limits).unwrap();
    let mut k = dev
        .upload(&grid_values(&mut rng, kv.elements(), 32, 0.125))
        .unwrap();
    let mut v = dev
        .upload(&grid_values(&mut rng, kv.elements(), 32, 0.125))
        .unwrap();
    let mut pages = vec![vec![3, 9, 4, 0, 12, 14], vec![7, 1]];
    let mut lens = [80usize, 31];
    let table_of = |lens: &[usize], pages: &[Vec<i32>]| {
        let ids = pages
            .iter()
            .zip(lens)
            .flat_map(|(p, l)| p[..l.div_ceil(16)].to_vec());
        PageTable::from_lengths(lens, 16, ids.collect()).unwrap()
    };
    plan.prefill(&dusk, &k, None, &table_of(&lens, &pages))
        .unwrap();
    pages[1].push(5);
    let mut table = CsrPages::alloc(&dusk, 2, 8).unwrap();
    let q = dev
        .upload(&grid_values(&mut rng, 2 * 8 * 64, 8, 0.25))
        .unwrap();
    let (mut out, mut lse) = (out_buf2(&dusk), dev.alloc::<f32>(16).unwrap());
    let mut host: Option<dusk_kernels::pipeline::PipelinePlan> = None;
    for _ in 0..3 {
        lens = [lens[0] + 1, lens[1] + 1];
        let t = table_of(&lens, &pages);
        let mut ids = t.kv_page_indices.clone();
        ids.resize(16, 0);
        table.kv_indptr.copy_from_host(&t.kv_indptr).unwrap();
        table.kv_page_indices.copy_from_host(&ids).unwrap();
        table
            .kv_last_page_len
            .copy_from_host(&t.kv_last_page_len)
            .unwrap();
        let new = dev
            .upload(&grid_values(&mut rng, 2 * 2 * 64, 32, 0.125))
            .unwrap();
        plan.poison_outputs(&dusk, 0xFF).unwrap();
        plan.decode_step(
            &dusk,
            &table,
            Some((&new, &new)),
            &q,
            &mut k,
            &mut v,
            &mut out,
            &mut lse,
        )
        .unwrap();
        let mut hp = match host.take() {
            Some(h) => h.replan(&dusk, &t).unwrap(),
            None => p.plan(&dusk, shape, &t).unwrap(),
        };
        hp.prepare(&dusk, &k).unwrap();
        hp.step(
            &dusk,
            &q,
            &k,
            &v,
            &mut out_buf2(&dusk),
            &mut dev.alloc(16).unwrap(),
        )
        .unwrap();
        assert_eq!(
            plan.budgets().unwrap(),
            hp.budgets().unwrap(),
            "lengths {lens:?}"
        );
        let lists = |pl: &dusk_kernels::pipeline::PipelinePlan| {
            let (ip, ix) = pl.lists().unwrap();
            let ip = ip.download().unwrap();
            let mut ix = ix.download().unwrap();
            ix.truncate(*ip.last().unwrap() as usize);
            (ip, ix)
        };
        assert_eq!(lists(&plan), lists(&hp), "lengths {lens:?}");
        host = Some(hp);
    }
    // 80 -> 81 took page 14 and 32 -> 33 page 5, their centroids made by the updates over
    // the pages the appends touched.
    assert_eq!(lens, [83, 34]);
}

fn out_buf2(dusk: &Dusk) -> dusk_runtime::Buffer<f16> {
    dusk.device().alloc(2 * 8 * 64).unwrap()
}

/// `num_pages` pages of 16 tokens, 2 KV heads of 64, 8 query heads (groups of 4), f16.
fn small_shape(num_pages: usize) -> (KvShape, PipelineShape) {
    let kv = KvShape {
        num_pages,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let shape = PipelineShape {
        kv,
        num_q_heads: 8,
        dtype: DType::F16,
    };
    (kv, shape)
}
