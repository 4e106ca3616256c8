//! The cache append through the CPU interpreter: decode loops checked bit for bit against
//! the host and the whole-cache kernels (`cache::check`: the cache, the quantized copy and
//! Quest's state after every step's append equal what writing the tokens on the host, then
//! `quantize_k` and `quest_update` over every page, give), a page table on the device with
//! bad entries (skipped, nothing written out of place), the touched list feeding a page
//! selector's own update, and the error paths. Double Sparsity's labels and SparQ's state
//! written by the same launch are checked the same way (`ds_update`, `sparq_update`).

use dusk_kernels::cache::append::specialised_configs;
use dusk_kernels::cache::check::{check_decode, DecodeCase};
use dusk_kernels::cache::{AppendConfig, AppendParts, AppendPlan, AppendTargets};
use dusk_kernels::engines::CsrPages;
use dusk_kernels::ops::Dusk;
use dusk_kernels::paged::{KvShape, PageTable};
use dusk_kernels::selectors::{
    DsCalibration, DsState, PageUpdates, SelectorState, SparqBlocks, SparqState, QUEST,
};
use dusk_kernels::DuskError;
use dusk_runtime::Buffer;
use half::f16;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const INT4_QUEST: AppendParts = AppendParts {
    quantized: Some(4),
    quest: true,
    ds: None,
    sparq: false,
};

#[path = "support/inputs.rs"]
mod inputs;
use inputs::*;

#[test]
fn a_decode_loop_equals_the_host_and_the_whole_cache_kernels() {
    // Four sequences, one empty and one ending on a full page: every one starts a page
    // within the 20 steps, two of them twice.
    let r = check_decode(&dusk(), &DecodeCase::default()).unwrap();
    assert_eq!(r.tokens, 80);
    assert!(r.pages_started >= 6, "{r:?}");
}

#[test]
fn every_part_and_head_dim() {
    let dusk = dusk();
    let parts = [
        AppendParts::default(),
        AppendParts {
            quantized: Some(8),
            quest: false,
            ..AppendParts::default()
        },
        AppendParts {
            quantized: None,
            quest: true,
            ..AppendParts::default()
        },
        AppendParts {
            quantized: Some(8),
            quest: true,
            ..AppendParts::default()
        },
        INT4_QUEST,
    ];
    for (i, (d, parts)) in [64, 128, 256]
        .iter()
        .flat_map(|d| parts.map(|p| (*d, p)))
        .enumerate()
    {
        let case = DecodeCase {
            lens: vec![3, 31, 0],
            steps: 3,
            num_kv_heads: 3,
            head_dim: d,
            parts,
            seed: 7 + i as u64,
            ..DecodeCase::default()
        };
        check_decode(&dusk, &case).unwrap_or_else(|e| panic!("head_dim {d} {parts:?}: {e}"));
    }
}

/// Double Sparsity's labels and SparQ's state in the append: every label width and head_dim,
/// with and without a quantized copy; SparQ with blocks larger, equal and smaller than the
/// pages, and NaN in the new tokens.
#[test]
fn the_selectors_parts_equal_their_updates() {
    let dusk = dusk();
    let mut i = 0;
    for d in [64, 128, 256] {
        let mut parts: Vec<AppendParts> = [8, 16, 32]
            .iter()
            .map(|&r| AppendParts {
                quantized: (r == 16).then_some(4),
                ds: Some(r),
                ..AppendParts::default()
            })
            .collect();
        for quantized in [None, Some(8)] {
            parts.push(AppendParts {
                quantized,
                sparq: true,
                ..AppendParts::default()
            });
        }
        for parts in parts {
            for (block_size, nan) in [(32, false), (16, true), (8, false)] {
                i += 1;
                let case = DecodeCase {
                    lens: vec![3, 31, 0, 40],
                    steps: 10,
                    num_kv_heads: 2,
                    head_dim: d,
                    parts,
                    nan,
                    sparq_block_size: block_size,
                    seed: 100 + i,
                    ..DecodeCase::default()
                };
                check_decode(&dusk, &case)
                    .unwrap_or_else(|e| panic!("head_dim {d} {parts:?} blocks {block_size}: {e}"));
                if !parts.sparq {
                    break;
                }
            }
        }
    }
}

/// The selectors' parts reject states of other shapes, a missing or unexpected state, a
/// block table of the wrong batch, and more than one selector in a plan.
#[test]
fn the_selectors_parts_reject_bad_state() {
    let dusk = dusk();
    let dev = dusk.device();
    let kv = KvShape {
        num_pages: 8,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let err = |r: Result<AppendPlan, DuskError>| arg_of(r.err().expect("an error"));
    let ds8 = AppendParts {
        ds: Some(8),
        ..AppendParts::default()
    };
    let sparq = AppendParts {
        sparq: true,
        ..AppendParts::default()
    };
    let ds12 = AppendParts {
        ds: Some(12),
        ..ds8
    };
    assert_eq!(err(AppendPlan::new(&dusk, kv, 2, ds12)), "ds");
    let both = AppendParts { sparq: true, ..ds8 };
    assert_eq!(err(AppendPlan::new(&dusk, kv, 2, both)), "parts");
    let with_quest = AppendParts {
        quest: true,
        ..sparq
    };
    assert_eq!(err(AppendPlan::new(&dusk, kv, 2, with_quest)), "parts");
    let rows4 = |c: &mut AppendConfig| c.rows_per_program = 4;
    let r = AppendPlan::with_config(&dusk, kv, 2, ds8, rows4);
    assert_eq!(err(r), "config"); // DS and SparQ: the default configuration only

    let lens_table = PageTable::from_lengths(&[5, 20], 16, vec![0, 1, 2]).unwrap();
    let n = 2 * 2 * 64;
    let new = dev.alloc::<f16>(n).unwrap();
    let mut k = dev.alloc::<f16>(kv.elements()).unwrap();
    let mut v = dev.alloc::<f16>(kv.elements()).unwrap();
    let channels = |r: usize| vec![(0..r).collect::<Vec<_>>(); 2];
    let cal = |r| DsCalibration::from_channels(64, &channels(r)).unwrap();
    let mut ds_state = DsState::new(&dusk, kv, &cal(8)).unwrap();
    let mut ds_r16 = DsState::new(&dusk, kv, &cal(16)).unwrap();
    let other = KvShape { num_pages: 9, ..kv };
    let mut ds_other = DsState::new(&dusk, other, &cal(8)).unwrap();
    let plan = AppendPlan::new(&dusk, kv, 2, ds8).unwrap();
    let table = plan.upload_table(&dusk, &lens_table).unwrap();
    let mut run = |ds: Option<&mut DsState>, sparq: Option<(&mut SparqState, &CsrPages)>| {
        let t = AppendTargets {
            k_cache: &mut k,
            v_cache: &mut v,
            quantized: None,
            quest: None,
            ds,
            sparq,
        };
        plan.run(&dusk, &table, &new, &new, t).err().map(arg_of)
    };
    assert_eq!(run(None, None), Some("ds"));
    assert_eq!(run(Some(&mut ds_r16), None), Some("ds"));
    assert_eq!(run(Some(&mut ds_other), None), Some("ds"));
    let pages = SparqBlocks::pages_of(&kv);
    let mut sp = SparqState::new(&dusk, kv, 2, pages).unwrap();
    assert_eq!(
        run(Some(&mut ds_state), Some((&mut sp, &table))),
        Some("sparq")
    );
    assert_eq!(run(Some(&mut ds_state), None), None);

    let plan = AppendPlan::new(&dusk, kv, 2, sparq).unwrap();
    let upload = |t: &PageTable| CsrPages {
        kv_indptr: dev.upload(&t.kv_indptr).unwrap(),
        kv_page_indices: dev.upload(&t.kv_page_indices).unwrap(),
        kv_last_page_len: dev.upload(&t.kv_last_page_len).unwrap(),
    };
    let one_seq = upload(&PageTable::from_lengths(&[5], 16, vec![0]).unwrap());
    let mut sp1 = SparqState::new(&dusk, kv, 1, pages).unwrap();
    let mut sp_other = SparqState::new(&dusk, other, 2, SparqBlocks::pages_of(&other)).unwrap();
    let mut run = |ds: Option<&mut DsState>, sparq: Option<(&mut SparqState, &CsrPages)>| {
        let t = AppendTargets {
            k_cache: &mut k,
            v_cache: &mut v,
            quantized: None,
            quest: None,
            ds,
            sparq,
        };
        plan.run(&dusk, &table, &new, &new, t).err().map(arg_of)
    };
    assert_eq!(run(None, None), Some("sparq"));
    assert_eq!(
        run(Some(&mut ds_state), Some((&mut sp, &table))),
        Some("ds")
    );
    assert_eq!(run(None, Some((&mut sp1, &table))), Some("sparq")); // 1 sequence, batch 2
    assert_eq!(run(None, Some((&mut sp_other, &table))), Some("sparq"));
    // A block table of 1 sequence for a batch of 2.
    assert_eq!(run(None, Some((&mut sp, &one_seq))), Some("sparq_blocks"));
    assert_eq!(run(None, Some((&mut sp, &table))), None);
}

/// The benchmark's step (`AppendBench`, what `gpu-check selectors` times) with each
/// selector's state: its touched list right for every sequence, the new tokens on every slot
/// of a page, SparQ's blocks of 256 scattered as the pages are.
#[test]
fn the_benchmark_step_with_each_selectors_state() {
    use dusk_kernels::cache::bench::{AppendBench, AppendCase};
    let dusk = dusk();
    for parts in [
        INT4_QUEST,
        AppendParts {
            quantized: Some(4),
            ds: Some(16),
            ..AppendParts::default()
        },
        AppendParts {
            quantized: Some(4),
            sparq: true,
            ..AppendParts::default()
        },
    ] {
        let case = AppendCase {
            batch: 17,
            context: 600,
            num_kv_heads: 2,
            parts,
            ..AppendCase::default()
        };
        let mut bench = AppendBench::new(&dusk, &case).unwrap();
        assert_eq!(bench.check(&dusk), Ok(17), "{parts:?}");
        assert!(bench.bytes() > bench.read_bytes());
    }
}

#[test]
fn every_compiled_configuration() {
    // Batch x KV heads of 5 x 3 rows: no configuration's programs divide it evenly.
    let dusk = dusk();
    for (i, config) in specialised_configs().into_iter().enumerate() {
        let case = DecodeCase {
            lens: vec![15, 1, 40, 0, 64],
            steps: 4,
            num_kv_heads: 3,
            head_dim: 128,
            config,
            seed: 100 + i as u64,
            ..DecodeCase::default()
        };
        check_decode(&dusk, &case).unwrap_or_else(|e| panic!("{config:?}: {e}"));
    }
}

#[test]
fn pages_of_one_token_and_of_many() {
    // Page size 1: every token starts a page (Quest's state is the token itself); page
    // size 64: the steps fill part of a page.
    let dusk = dusk();
    for (ps, lens) in [(1, vec![0, 5, 2]), (64, vec![63, 100, 1])] {
        let case = DecodeCase {
            lens,
            steps: 6,
            page_size: ps,
            ..DecodeCase::default()
        };
        let r = check_decode(&dusk, &case).unwrap_or_else(|e| panic!("page_size {ps}: {e}"));
        if ps == 1 {
            assert_eq!(r.pages_started, r.tokens);
        }
    }
}

#[test]
fn nan_in_the_new_tokens() {
    let case = DecodeCase {
        nan: true,
        steps: 24,
        seed: 0x4a4,
        ..DecodeCase::default()
    };
    check_decode(&dusk(), &case).unwrap();
}

/// A cache of `kv`'s shape with random K and V, its INT4 copy and Quest's state (random
/// values, not a real min/max: the check is that nothing of a skipped row changes them).
struct State {
    k: Buffer<f16>,
    v: Buffer<f16>,
    int4: dusk_kernels::ops::QuantizedK,
    quest: SelectorState,
}

fn random_f16(rng: &mut SmallRng, n: usize) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(rng.random_range(-2.0..2.0)))
        .collect()
}

fn random_state(dusk: &Dusk, rng: &mut SmallRng, kv: KvShape) -> State {
    let dev = dusk.device();
    let k = dev.upload(&random_f16(rng, kv.elements())).unwrap();
    let v = dev.upload(&random_f16(rng, kv.elements())).unwrap();
    let int4 = dusk.quantize_k(&k, kv, 4).unwrap();
    let mut quest = SelectorState::new(dusk, &QUEST, kv).unwrap();
    let n = kv.num_pages * kv.num_kv_heads * kv.head_dim;
    for name in ["page_min", "page_max"] {
        let values = random_f16(rng, n);
        quest
            .f16_mut(name)
            .unwrap()
            .copy_from_host(&values)
            .unwrap();
    }
    State { k, v, int4, quest }
}

fn targets(s: &mut State) -> AppendTargets<'_> {
    AppendTargets {
        k_cache: &mut s.k,
        v_cache: &mut s.v,
        quantized: Some(&mut s.int4),
        quest: Some(&mut s.quest),
        ds: None,
        sparq: None,
    }
}

fn snapshot(s: &State) -> Vec<Vec<u16>> {
    let f = |b: &Buffer<f16>| b.download().unwrap().iter().map(|x| x.to_bits()).collect();
    let packed = s
        .int4
        .packed
        .download()
        .unwrap()
        .iter()
        .map(|x| *x as u16)
        .collect();
    vec![
        f(&s.k),
        f(&s.v),
        packed,
        f(&s.int4.scale),
        f(&s.int4.zero),
        f(s.quest.f16("page_min").unwrap()),
        f(s.quest.f16("page_max").unwrap()),
    ]
}

#[test]
fn bad_entries_of_a_device_table_are_skipped() {
    let dusk = dusk();
    let dev = dusk.device();
    let mut rng = SmallRng::seed_from_u64(0xbad);
    let kv = KvShape {
        num_pages: 12,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let batch = 7;
    let plan = AppendPlan::new(&dusk, kv, batch, INT4_QUEST).unwrap();
    // Sequence 0 is sound (page 4, slot 2); then a page id past the cache, a negative page
    // id, an empty sequence, a last page of 0 tokens, one of page_size + 1 tokens, and
    // offsets past kv_page_indices.
    let table = CsrPages {
        kv_indptr: dev.upload(&[0, 1, 2, 3, 3, 4, 5, 99]).unwrap(),
        kv_page_indices: dev.upload(&[4, 12 + 5, -3, 7, 8]).unwrap(),
        kv_last_page_len: dev.upload(&[3, 2, 2, 1, 0, 17, 1]).unwrap(),
    };
    let k_new = dev.upload(&random_f16(&mut rng, batch * 2 * 64)).unwrap();
    let v_new = dev.upload(&random_f16(&mut rng, batch * 2 * 64)).unwrap();

    // What sequence 0 alone does, on a copy of the same state through a sound table.
    let mut rng_copy = SmallRng::seed_from_u64(7);
    let mut want = random_state(&dusk, &mut rng_copy, kv);
    let mut rng_copy = SmallRng::seed_from_u64(7);
    let mut got = random_state(&dusk, &mut rng_copy, kv);
    let one = AppendPlan::new(&dusk, kv, 1, INT4_QUEST).unwrap();
    let sound = one
        .upload_table(&dusk, &PageTable::from_lengths(&[3], 16, vec![4]).unwrap())
        .unwrap();
    let first = |b: &Buffer<f16>| dev.upload(&b.download().unwrap()[..2 * 64]).unwrap();
    one.run(
        &dusk,
        &sound,
        &first(&k_new),
        &first(&v_new),
        targets(&mut want),
    )
    .unwrap();
    assert_ne!(
        snapshot(&want),
        snapshot(&got),
        "sequence 0 writes something"
    );

    plan.run(&dusk, &table, &k_new, &v_new, targets(&mut got))
        .unwrap();
    assert_eq!(snapshot(&got), snapshot(&want));
    let pages = plan.touched().pages().download().unwrap();
    let lens = plan.touched().lens().download().unwrap();
    assert_eq!(pages, [4, -1, -1, -1, -1, -1, -1]);
    assert_eq!(lens, [3, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn the_touched_list_updates_a_page_selector_of_ones_own() {
    // The append without Quest, then Quest's own update kernel over the touched pages
    // (as a user's page selector would run), equals the append with Quest fused.
    let dusk = dusk();
    let dev = dusk.device();
    let mut rng = SmallRng::seed_from_u64(0x70c);
    let kv = KvShape {
        num_pages: 16,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    // Before the step: 16, 39 and 2 tokens; the step's tokens take a new page (1), the
    // 40th slot of page 7 and the 3rd of page 0.
    let before = PageTable::from_lengths(&[16, 39, 2], 16, vec![9, 14, 2, 7, 0]).unwrap();
    let table = PageTable::from_lengths(&[17, 40, 3], 16, vec![9, 1, 14, 2, 7, 0]).unwrap();
    let k_new = dev.upload(&random_f16(&mut rng, 3 * 2 * 64)).unwrap();
    let v_new = dev.upload(&random_f16(&mut rng, 3 * 2 * 64)).unwrap();
    let mut states = vec![];
    for parts in [AppendParts::default(), INT4_QUEST] {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut s = random_state(&dusk, &mut rng, kv);
        // Quest's state of the tokens before the step.
        s.quest
            .update(&dusk, &s.k, &PageUpdates::all(&dusk, &kv, &before).unwrap())
            .unwrap();
        let plan = AppendPlan::new(&dusk, kv, 3, parts).unwrap();
        let t = plan.upload_table(&dusk, &table).unwrap();
        let targets = AppendTargets {
            k_cache: &mut s.k,
            v_cache: &mut s.v,
            quantized: None,
            quest: parts.quest.then_some(&mut s.quest),
            ds: None,
            sparq: None,
        };
        let targets = AppendTargets {
            quantized: parts.quantized.map(|_| &mut s.int4),
            ..targets
        };
        plan.run(&dusk, &t, &k_new, &v_new, targets).unwrap();
        if !parts.quest {
            s.quest.update(&dusk, &s.k, plan.touched()).unwrap();
        }
        states.push(s);
    }
    let (two, one) = (snapshot(&states[0]), snapshot(&states[1]));
    assert!(
        two[5] == one[5] && two[6] == one[6],
        "Quest's state differs"
    );
    assert!(two[..2] == one[..2], "the cache differs");
}

#[test]
fn bad_arguments_are_typed_errors() {
    let dusk = dusk();
    let dev = dusk.device();
    let kv = KvShape {
        num_pages: 8,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let err = |r: Result<AppendPlan, DuskError>| arg_of(r.err().expect("an error"));
    assert_eq!(err(AppendPlan::new(&dusk, kv, 0, INT4_QUEST)), "batch");
    let three = AppendParts {
        quantized: Some(3),
        quest: false,
        ..AppendParts::default()
    };
    assert_eq!(err(AppendPlan::new(&dusk, kv, 2, three)), "quantized");
    let odd = KvShape { head_dim: 96, ..kv };
    assert_eq!(err(AppendPlan::new(&dusk, odd, 2, INT4_QUEST)), "head_dim");
    let tune = |c: &mut AppendConfig| c.rows_per_program = 3;
    let r = AppendPlan::with_config(&dusk, kv, 2, INT4_QUEST, tune);
    assert_eq!(err(r), "config");

    // The table after the append.
    let plan = AppendPlan::new(&dusk, kv, 2, INT4_QUEST).unwrap();
    let upload = |lens: &[usize], pages: Vec<i32>| {
        let t = PageTable::from_lengths(lens, 16, pages).unwrap();
        arg_of(plan.upload_table(&dusk, &t).err().expect("an error"))
    };
    assert_eq!(upload(&[5], vec![0]), "kv_indptr"); // batch 1, not 2
    assert_eq!(upload(&[5, 20], vec![0, 1, 8]), "kv_page_indices"); // page 8 of 8
    assert_eq!(upload(&[5, 0], vec![0]), "kv_indptr"); // an empty sequence
    let shared = PageTable {
        kv_indptr: vec![0, 1, 2],
        kv_page_indices: vec![3, 3],
        kv_last_page_len: vec![4, 5],
    };
    let r = plan.upload_table(&dusk, &shared);
    assert_eq!(arg_of(r.err().unwrap()), "kv_page_indices"); // one last page, two sequences
    let full = PageTable {
        kv_last_page_len: vec![4, 17],
        ..shared.clone()
    };
    let e = plan.upload_table(&dusk, &full).err().unwrap();
    assert!(e.to_string().contains("no room"), "{e}");
    assert_eq!(arg_of(e), "kv_last_page_len"); // a full last page and no new one

    // The run's buffers.
    let table = plan
        .upload_table(
            &dusk,
            &PageTable::from_lengths(&[5, 20], 16, vec![0, 1, 2]).unwrap(),
        )
        .unwrap();
    let n = 2 * 2 * 64;
    let good = dev.alloc::<f16>(n).unwrap();
    let short = dev.alloc::<f16>(n - 1).unwrap();
    let mut k = dev.alloc::<f16>(kv.elements()).unwrap();
    let mut v = dev.alloc::<f16>(kv.elements()).unwrap();
    let mut int4 = dusk.quantize_k(&k, kv, 4).unwrap();
    let mut int8 = dusk.quantize_k(&k, kv, 8).unwrap();
    let mut quest = SelectorState::new(&dusk, &QUEST, kv).unwrap();
    let other = KvShape { num_pages: 9, ..kv };
    let mut quest9 = SelectorState::new(&dusk, &QUEST, other).unwrap();
    let mut small_k = dev.alloc::<f16>(kv.elements() - 64).unwrap();

    macro_rules! run_err {
        ($table:expr, $kn:expr, $vn:expr, $kc:expr, $q:expr, $s:expr) => {{
            let t = AppendTargets {
                k_cache: $kc,
                v_cache: &mut v,
                quantized: $q,
                quest: $s,
                ds: None,
                sparq: None,
            };
            arg_of(
                plan.run(&dusk, $table, $kn, $vn, t)
                    .err()
                    .expect("an error"),
            )
        }};
    }
    assert_eq!(
        run_err!(
            &table,
            &short,
            &good,
            &mut k,
            Some(&mut int4),
            Some(&mut quest)
        ),
        "k_new"
    );
    assert_eq!(
        run_err!(
            &table,
            &good,
            &short,
            &mut k,
            Some(&mut int4),
            Some(&mut quest)
        ),
        "v_new"
    );
    assert_eq!(
        run_err!(
            &table,
            &good,
            &good,
            &mut small_k,
            Some(&mut int4),
            Some(&mut quest)
        ),
        "k_cache"
    );
    assert_eq!(
        run_err!(&table, &good, &good, &mut k, None, Some(&mut quest)),
        "quantized"
    );
    assert_eq!(
        run_err!(
            &table,
            &good,
            &good,
            &mut k,
            Some(&mut int8),
            Some(&mut quest)
        ),
        "quantized"
    );
    assert_eq!(
        run_err!(&table, &good, &good, &mut k, Some(&mut int4), None),
        "quest"
    );
    assert_eq!(
        run_err!(
            &table,
            &good,
            &good,
            &mut k,
            Some(&mut int4),
            Some(&mut quest9)
        ),
        "quest"
    );
    let no_parts = AppendPlan::new(&dusk, kv, 2, AppendParts::default()).unwrap();
    let t = AppendTargets {
        k_cache: &mut k,
        v_cache: &mut v,
        quantized: Some(&mut int4),
        quest: None,
        ds: None,
        sparq: None,
    };
    let r = no_parts.run(&dusk, &table, &good, &good, t);
    assert_eq!(arg_of(r.err().unwrap()), "quantized");
    let three = CsrPages {
        kv_indptr: dev.upload(&[0, 1, 2, 3]).unwrap(),
        kv_page_indices: dev.upload(&[0, 1, 2]).unwrap(),
        kv_last_page_len: dev.upload(&[1, 1, 1]).unwrap(),
    };
    assert_eq!(
        run_err!(
            &three,
            &good,
            &good,
            &mut k,
            Some(&mut int4),
            Some(&mut quest)
        ),
        "kv_indptr"
    );
    // And the sound call runs.
    let t = AppendTargets {
        k_cache: &mut k,
        v_cache: &mut v,
        quantized: Some(&mut int4),
        quest: Some(&mut quest),
        ds: None,
        sparq: None,
    };
    plan.run(&dusk, &table, &good, &good, t).unwrap();
}
