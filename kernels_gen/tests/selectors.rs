//! The selectors through the CPU interpreter against their host references
//! (`selectors::reference`): Quest's state, scores, pages and token lists on fresh random
//! inputs with the outputs poisoned first, the shared top-k on its own (ties, signed zeros,
//! infinities, NaN, streamed rows), the edge cases, and the error paths.

use dusk_kernels::ops::Dusk;
use dusk_kernels::paged::{KvShape, PageTable, TokenLists};
use dusk_kernels::selectors::reference::{
    page_token_lists, quest_scores, quest_update, row_flagged, select_items, top_k_row,
};
use dusk_kernels::selectors::{
    Budget, Items, Keep, PageUpdates, QuestOptions, QuestPlan, SelectorPlan, SelectorState,
    TopKConfig, TopKPlan, QUEST,
};
use half::f16;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[path = "support/inputs.rs"]
mod inputs;
use inputs::*;

/// K on the grid with every page a copy of one of three pages: whole pages tie exactly.
fn tied_pages(rng: &mut SmallRng, kv: &KvShape) -> Vec<f16> {
    let per_page = kv.page_size * kv.num_kv_heads * kv.head_dim;
    let templates = grid_values(rng, 3 * per_page, 32, 0.125);
    (0..kv.elements())
        .map(|i| {
            let (page, at) = (i / per_page, i % per_page);
            templates[(page % 3) * per_page + at]
        })
        .collect()
}

/// What one Quest run gave.
struct Got {
    scores: Vec<f32>,
    pages: Vec<Vec<usize>>,
    lists: TokenLists,
    flags: Vec<i32>,
}

fn download(plan: &SelectorPlan) -> Got {
    let shape = plan.shape();
    let scores = plan.scores().download().unwrap();
    let sel_pages = plan.sel_pages().download().unwrap();
    let page_ptr = plan.sel_page_indptr().download().unwrap();
    assert_eq!(page_ptr, shape.sel_item_indptr);
    let pages = page_ptr
        .windows(2)
        .map(|w| {
            sel_pages[w[0] as usize..w[1] as usize]
                .iter()
                .map(|p| *p as usize)
                .collect()
        })
        .collect();
    let indptr = plan.sel_indptr().download().unwrap();
    assert_eq!(indptr, shape.sel_indptr);
    let mut indices = plan.sel_indices().download().unwrap();
    indices.truncate(*indptr.last().unwrap() as usize);
    let mut flags = plan.flags().download().unwrap();
    flags.truncate(shape.rows());
    Got {
        scores,
        pages,
        lists: TokenLists { indptr, indices },
        flags,
    }
}

struct Case {
    lens: Vec<usize>,
    num_kv_heads: usize,
    group: usize,
    head_dim: usize,
    budget: Budget,
    sink: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Inputs {
    /// On the grid: scores exact.
    Grid,
    /// On the grid, pages in three classes: scores exact, many ties.
    Tied,
    /// Continuous.
    Smooth,
}

/// Runs Quest on `case` with fresh inputs and checks every output against the references;
/// returns the run's outputs.
fn check_quest(dusk: &Dusk, rng: &mut SmallRng, case: &Case, inputs: Inputs) -> Got {
    let exact = inputs != Inputs::Smooth;
    let ps = 16;
    let pages = PageTable::pages_needed(&case.lens, ps) + 3;
    let kv = KvShape {
        num_pages: pages,
        page_size: ps,
        num_kv_heads: case.num_kv_heads,
        head_dim: case.head_dim,
    };
    let t = table(rng, &case.lens, ps, pages);
    let hq = case.num_kv_heads * case.group;
    let qn = case.lens.len() * hq * case.head_dim;
    let (k, q) = match inputs {
        Inputs::Grid => (
            grid_values(rng, kv.elements(), 32, 0.125),
            grid_values(rng, qn, 8, 0.25),
        ),
        Inputs::Tied => (tied_pages(rng, &kv), grid_values(rng, qn, 8, 0.25)),
        Inputs::Smooth => (smooth_values(rng, kv.elements()), smooth_values(rng, qn)),
    };
    let dev = dusk.device();
    let (kb, qb) = (dev.upload(&k).unwrap(), dev.upload(&q).unwrap());
    let opts = QuestOptions { sink: case.sink };
    let mut plan = QuestPlan::new(dusk, kv, hq, &t, case.budget, opts).unwrap();
    // Poison the state too: the update must write every value of the table's pages.
    let mut poisoned = plan.page_min().download().unwrap();
    poisoned.fill(f16::NAN);
    plan.state_mut()
        .f16_mut("page_min")
        .unwrap()
        .copy_from_host(&poisoned)
        .unwrap();
    plan.state_mut()
        .f16_mut("page_max")
        .unwrap()
        .copy_from_host(&poisoned)
        .unwrap();
    plan.update(dusk, &kb, &PageUpdates::all(dusk, &kv, &t).unwrap())
        .unwrap();
    plan.poison_outputs(dusk, 0xFF).unwrap();
    plan.select(dusk, &qb).unwrap();

    // State: equal to the reference on every page of the table.
    let (mut want_min, mut want_max) = (poisoned.clone(), poisoned.clone());
    let (up_pages, up_lens) = dusk_kernels::selectors::selector::table_pages(&t, ps, false);
    quest_update(&k, &kv, &up_pages, &up_lens, &mut want_min, &mut want_max);
    let (got_min, got_max) = (
        plan.page_min().download().unwrap(),
        plan.page_max().download().unwrap(),
    );
    let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got_min), bits(&want_min), "page_min");
    assert_eq!(bits(&got_max), bits(&want_max), "page_max");

    let got = download(&plan);
    let want_scores = quest_scores(&q, &want_min, &want_max, &kv, &t, hq);
    let n = want_scores.len();
    for (i, (g, w)) in got.scores[..n].iter().zip(&want_scores).enumerate() {
        if exact {
            assert_eq!(*g as f64, *w, "score {i}");
        } else {
            let tol = 1e-5 * (1.0 + w.abs()) * (case.group * case.head_dim) as f64;
            assert!((*g as f64 - w).abs() <= tol, "score {i}: {g} against {w}");
        }
    }
    // Pages: the sort-based top-k, on the reference's scores where those are exact, else
    // on the kernel's own (f32 sums in another order can swap near-ties).
    let keep = opts.keep();
    let on: Vec<f64> = if exact {
        want_scores.clone()
    } else {
        got.scores[..n].iter().map(|s| *s as f64).collect()
    };
    let want_pages = select_items(&on, plan.shape(), keep);
    assert_eq!(got.pages, want_pages, "pages");
    let want_lists = page_token_lists(&want_pages, &t, &kv);
    assert_eq!(got.lists, want_lists, "token lists");
    want_lists
        .validate("lists", &t, ps, kv.num_kv_heads)
        .unwrap();
    assert!(got.flags.iter().all(|f| *f == 0), "flags {:?}", got.flags);
    // Budgets: the budget's pages (at least the kept ones), everything when short.
    for (r, ps_row) in got.pages.iter().enumerate() {
        let b = r / kv.num_kv_heads;
        let len = case.lens[b];
        let n_pages = len.div_ceil(ps);
        let want_k = case
            .budget
            .tokens(len)
            .div_ceil(ps)
            .max(1 + case.sink as usize)
            .min(n_pages);
        assert_eq!(ps_row.len(), want_k, "row {r}");
        assert_eq!(
            ps_row.last(),
            Some(&(n_pages - 1)),
            "row {r} keeps its last page"
        );
        if case.sink {
            assert_eq!(ps_row.first(), Some(&0), "row {r} keeps its sink");
        }
    }
    got
}

#[test]
fn quest_matches_the_sort_based_reference() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(22);
    for (group, kv_heads, head_dim) in [(1, 2, 64), (4, 2, 128), (8, 1, 64), (2, 3, 256)] {
        for sink in [false, true] {
            for budget in [Budget::Tokens(100), Budget::Fraction(0.3)] {
                // Lengths: several pages with a partial last one, one page, one token,
                // shorter than the budget, whole pages.
                let lens = vec![
                    rng.random_range(200..400),
                    rng.random_range(1..16),
                    1,
                    90,
                    256,
                ];
                let case = Case {
                    lens,
                    num_kv_heads: kv_heads,
                    group,
                    head_dim,
                    budget,
                    sink,
                };
                check_quest(&dusk, &mut rng, &case, Inputs::Grid);
                check_quest(&dusk, &mut rng, &case, Inputs::Tied);
            }
        }
    }
}

#[test]
fn quest_on_continuous_inputs() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(7);
    for group in [1, 4, 8] {
        let case = Case {
            lens: vec![rng.random_range(300..600), rng.random_range(17..40)],
            num_kv_heads: 2,
            group,
            head_dim: 128,
            budget: Budget::Fraction(0.25),
            sink: group == 4,
        };
        check_quest(&dusk, &mut rng, &case, Inputs::Smooth);
    }
}

#[test]
fn short_sequences_select_everything() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(3);
    let case = Case {
        lens: vec![5, 16, 17, 64, 100],
        num_kv_heads: 2,
        group: 4,
        head_dim: 64,
        budget: Budget::Tokens(128),
        sink: true,
    };
    let got = check_quest(&dusk, &mut rng, &case, Inputs::Tied);
    let t = PageTable::from_lengths(&case.lens, 16, (0..15).collect()).unwrap();
    assert_eq!(got.lists, TokenLists::all_tokens(&t, 16, 2));
}

#[test]
fn a_budget_of_one_page_keeps_the_last_and_the_sink() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(4);
    for sink in [false, true] {
        let case = Case {
            lens: vec![100, 33],
            num_kv_heads: 1,
            group: 1,
            head_dim: 64,
            budget: Budget::Tokens(1),
            sink,
        };
        let got = check_quest(&dusk, &mut rng, &case, Inputs::Tied);
        let want: Vec<Vec<usize>> = if sink {
            vec![vec![0, 6], vec![0, 2]]
        } else {
            vec![vec![6], vec![2]]
        };
        assert_eq!(got.pages, want);
    }
}

/// Rows longer than a tile stream through it, counted two bits a pass or by the radix
/// select's histogram; the result is the resident kernel's.
#[test]
fn streamed_rows_equal_resident_rows() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(5);
    let lens = [700 * 16 - 5, 300 * 16, 9];
    let kv = KvShape {
        num_pages: 1100,
        page_size: 16,
        num_kv_heads: 1,
        head_dim: 64,
    };
    let t = table(&mut rng, &lens, 16, kv.num_pages);
    let n: usize = PageTable::pages_needed(&lens, 16);
    // Scores on a coarse grid (many ties) plus a few signed zeros and infinities.
    let mut scores: Vec<f32> = (0..n)
        .map(|_| rng.random_range(-20..20) as f32 * 0.5)
        .collect();
    scores[3] = -0.0;
    scores[4] = 0.0;
    scores[10] = f32::INFINITY;
    scores[11] = f32::NEG_INFINITY;
    let sb = dusk.device().upload(&scores).unwrap();
    let keep = Keep { sink: 2, recent: 3 };
    let mut outs = vec![];
    for cfg in [
        TopKConfig {
            tile: 1024,
            num_warps: 4,
            resident: true,
            radix: false,
        },
        TopKConfig {
            tile: 256,
            num_warps: 1,
            resident: false,
            radix: false,
        },
        TopKConfig {
            tile: 256,
            num_warps: 1,
            resident: false,
            radix: true,
        },
    ] {
        let mut plan = TopKPlan::with_config(
            &dusk,
            &t,
            kv,
            Items::Pages,
            Budget::Fraction(0.4),
            keep,
            |c| *c = cfg,
        )
        .unwrap();
        plan.poison_outputs(&dusk, 0xFF).unwrap();
        plan.run(&dusk, &sb).unwrap();
        let items = plan.sel_items().download().unwrap();
        let indices = plan.sel_indices().download().unwrap();
        let flags = plan.flags().download().unwrap();
        let s64: Vec<f64> = scores.iter().map(|s| *s as f64).collect();
        let want = select_items(&s64, plan.shape(), keep);
        let ptr = &plan.shape().sel_item_indptr;
        for (r, w) in want.iter().enumerate() {
            let got: Vec<usize> = items[ptr[r] as usize..ptr[r + 1] as usize]
                .iter()
                .map(|x| *x as usize)
                .collect();
            assert_eq!(&got, w, "{cfg:?} row {r}");
        }
        let lists = page_token_lists(&want, &t, &kv);
        assert_eq!(
            &indices[..lists.indices.len()],
            &lists.indices[..],
            "{cfg:?}"
        );
        assert_eq!(flags, vec![1, 0, 0], "{cfg:?}: the infinities flag row 0");
        outs.push(indices);
    }
    assert_eq!(outs[0], outs[1]);
    assert_eq!(outs[0], outs[2]);
}

/// A row of 2048 pages keeping 512, on the default configuration (the size the GPU check
/// times).
#[test]
fn a_row_of_2048_pages_keeps_512() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(6);
    let kv = KvShape {
        num_pages: 2048,
        page_size: 16,
        num_kv_heads: 1,
        head_dim: 128,
    };
    let t = table(&mut rng, &[2048 * 16], 16, 2048);
    let scores: Vec<f32> = (0..2048).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let mut plan = TopKPlan::new(
        &dusk,
        &t,
        kv,
        Items::Pages,
        Budget::Tokens(512 * 16),
        Keep { sink: 1, recent: 1 },
    )
    .unwrap();
    assert_eq!(
        plan.config(),
        TopKConfig {
            tile: 2048,
            num_warps: 4,
            resident: true,
            radix: false,
        }
    );
    plan.poison_outputs(&dusk, 0xFF).unwrap();
    plan.run(&dusk, &dusk.device().upload(&scores).unwrap())
        .unwrap();
    let s64: Vec<f64> = scores.iter().map(|s| *s as f64).collect();
    let want = top_k_row(&s64, 512, Keep { sink: 1, recent: 1 });
    let got: Vec<usize> = plan
        .sel_items()
        .download()
        .unwrap()
        .iter()
        .map(|x| *x as usize)
        .collect();
    assert_eq!(got, want);
}

/// Per-token rows (what Double Sparsity and SparQ end with): ties by index, NaN last and
/// flagged, the window kept.
#[test]
fn top_k_over_tokens() {
    let dusk = dusk();
    let kv = KvShape {
        num_pages: 4,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let t = PageTable::from_lengths(&[20, 7], 16, vec![3, 0, 2]).unwrap();
    let mut rng = SmallRng::seed_from_u64(8);
    let mut scores: Vec<f32> = (0..54).map(|_| rng.random_range(0..4) as f32).collect();
    scores[5] = f32::NAN; // row 0 (sequence 0, head 0)
    scores[40 + 1] = f32::NAN; // row 2 (sequence 1, head 0)
    let keep = Keep { sink: 0, recent: 2 };
    let mut plan = TopKPlan::new(&dusk, &t, kv, Items::Tokens, Budget::Tokens(6), keep).unwrap();
    plan.poison_outputs(&dusk, 0xFF).unwrap();
    plan.run(&dusk, &dusk.device().upload(&scores).unwrap())
        .unwrap();
    let s64: Vec<f64> = scores.iter().map(|s| *s as f64).collect();
    let want = select_items(&s64, plan.shape(), keep);
    let indptr = plan.sel_indptr().download().unwrap();
    assert_eq!(indptr, [0, 6, 12, 18, 24]);
    let got = plan.sel_indices().download().unwrap();
    let flat: Vec<i32> = want.iter().flatten().map(|x| *x as i32).collect();
    assert_eq!(got, flat);
    assert!(want[0].contains(&18) && want[0].contains(&19));
    let flags = plan.flags().download().unwrap();
    let want_flags: Vec<i32> = (0..4)
        .map(|r| {
            let (b, h) = (r / 2, r % 2);
            let (first, n) = if b == 0 { (0, 20) } else { (20, 7) };
            let base = first * 2 + h * n;
            row_flagged(&s64[base..base + n]) as i32
        })
        .collect();
    assert_eq!(flags, want_flags);
    assert_eq!(flags, [1, 0, 1, 0]);
}

/// The radix select over token rows longer than its tile: ties (scores on a grid), NaN
/// and infinities, negative zeros, rows within one octave and rows of one value, budgets
/// from 1 token to every token but one, each row's window kept; the same items and flags
/// as the sort.
#[test]
fn the_radix_select_equals_the_sort() {
    let dusk = dusk();
    let kv = KvShape {
        num_pages: 85,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let lens = [1000, 300, 37];
    let t = PageTable::from_lengths(&lens, 16, (0..85).collect()).unwrap();
    let mut rng = SmallRng::seed_from_u64(11);
    let n: usize = lens.iter().sum::<usize>() * 2;
    // Wide rows (NaN and infinities: the digits start at the top bit), rows within one
    // octave (they start low, the last digit shorter), rows of one value (ties only).
    // And rows whose keys differ in bits 20-22, 7 and 0-1 only: the digits start at bit 15,
    // the last one (bits 0-6) shorter than eight bits, ties everywhere.
    let cases = [
        (1usize, 0),
        (17, 0),
        (299, 0),
        (999, 0),
        (40, 1),
        (250, 1),
        (9, 2),
        (33, 3),
        (400, 3),
    ];
    for (case, (budget, kind)) in cases.into_iter().enumerate() {
        let mut scores: Vec<f32> = (0..n)
            .map(|_| match (kind, rng.random_range(0..10)) {
                (0, 0) => -0.0,
                (0, 1) => rng.random_range(-3..3) as f32 * 1e-39, // denormals
                (0, _) => rng.random_range(-40..40) as f32 * 0.25,
                (1, _) => 1.0 + rng.random_range(0..64) as f32 / 64.0,
                (2, _) => 3.5,
                _ => f32::from_bits(
                    0x3F80_0000
                        | (rng.random_range(0..8u32) << 20)
                        | (rng.random_range(0..2u32) << 7)
                        | rng.random_range(0..4u32),
                ),
            })
            .collect();
        if kind == 0 {
            scores[case * 7] = f32::NAN;
            scores[2000 + case] = f32::INFINITY;
            scores[2100 + case] = f32::NEG_INFINITY;
        }
        let keep = Keep { sink: 1, recent: 3 };
        let mut plan = TopKPlan::with_config(
            &dusk,
            &t,
            kv,
            Items::Tokens,
            Budget::Tokens(budget),
            keep,
            |c| {
                *c = TopKConfig {
                    tile: 256,
                    num_warps: 1,
                    resident: false,
                    radix: true,
                };
            },
        )
        .unwrap();
        plan.poison_outputs(&dusk, 0xFF).unwrap();
        plan.run(&dusk, &dusk.device().upload(&scores).unwrap())
            .unwrap();
        let s64: Vec<f64> = scores.iter().map(|s| *s as f64).collect();
        let want = select_items(&s64, plan.shape(), keep);
        let flat: Vec<i32> = want.iter().flatten().map(|x| *x as i32).collect();
        let got = plan.sel_indices().download().unwrap();
        assert_eq!(&got[..flat.len()], &flat[..], "budget {budget}");
        let mut want_flags = vec![];
        let mut first = 0;
        for len in lens {
            for h in 0..2 {
                let base = first * 2 + h * len;
                want_flags.push(row_flagged(&s64[base..base + len]) as i32);
            }
            first += len;
        }
        let flags = plan.flags().download().unwrap();
        assert_eq!(flags, want_flags, "budget {budget}");
    }
}

/// A NaN in one sequence's q flags that sequence's rows, selects only positions inside it,
/// and leaves the other rows as the reference has them.
#[test]
fn nan_in_q_is_flagged() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(9);
    let lens = [150, 90];
    let kv = KvShape {
        num_pages: 20,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let t = table(&mut rng, &lens, 16, 20);
    let k = grid_values(&mut rng, kv.elements(), 32, 0.125);
    let mut q = grid_values(&mut rng, 2 * 8 * 64, 8, 0.25);
    q[3 * 64 + 17] = f16::NAN; // sequence 0, query head 3: KV head 0's group
    let dev = dusk.device();
    let mut plan = QuestPlan::new(
        &dusk,
        kv,
        8,
        &t,
        Budget::Tokens(48),
        QuestOptions::default(),
    )
    .unwrap();
    plan.update(
        &dusk,
        &dev.upload(&k).unwrap(),
        &PageUpdates::all(&dusk, &kv, &t).unwrap(),
    )
    .unwrap();
    plan.poison_outputs(&dusk, 0xFF).unwrap();
    plan.select(&dusk, &dev.upload(&q).unwrap()).unwrap();
    let got = download(&plan);
    assert_eq!(got.flags, [1, 0, 0, 0]);
    got.lists.validate("lists", &t, 16, 2).unwrap();
    let (mut mn, mut mx) = (vec![f16::ZERO; 20 * 2 * 64], vec![f16::ZERO; 20 * 2 * 64]);
    let (p, l) = dusk_kernels::selectors::selector::table_pages(&t, 16, false);
    quest_update(&k, &kv, &p, &l, &mut mn, &mut mx);
    let want = quest_scores(&q, &mn, &mx, &kv, &t, 8);
    let want_pages = select_items(&want, plan.shape(), Keep { sink: 0, recent: 1 });
    assert_eq!(&got.pages[1..], &want_pages[1..]);
    // The NaN row keeps its last page and the lowest-numbered others (every score NaN).
    assert_eq!(got.pages[0], [0, 1, 9]);
}

/// Updating the last pages after they change (a decode step's append) brings the state
/// back to the reference; entries written on the device that are out of range are skipped.
#[test]
fn updates_of_written_pages() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(10);
    let kv = KvShape {
        num_pages: 12,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let t = table(&mut rng, &[40, 17, 64], 16, 12);
    let mut k = grid_values(&mut rng, kv.elements(), 32, 0.125);
    let dev = dusk.device();
    let mut state = SelectorState::new(&dusk, &QUEST, kv).unwrap();
    state
        .update(
            &dusk,
            &dev.upload(&k).unwrap(),
            &PageUpdates::all(&dusk, &kv, &t).unwrap(),
        )
        .unwrap();
    // Change every token of the cache; only the last pages are recomputed.
    let (mut mn, mut mx) = (vec![f16::ZERO; 12 * 2 * 64], vec![f16::ZERO; 12 * 2 * 64]);
    let (p, l) = dusk_kernels::selectors::selector::table_pages(&t, 16, false);
    quest_update(&k, &kv, &p, &l, &mut mn, &mut mx);
    for x in k.iter_mut() {
        *x = f16::from_f32(x.to_f32() * 0.5 + 0.25);
    }
    let kb = dev.upload(&k).unwrap();
    state
        .update(
            &dusk,
            &kb,
            &PageUpdates::last_pages(&dusk, &kv, &t).unwrap(),
        )
        .unwrap();
    let (lp, ll) = dusk_kernels::selectors::selector::table_pages(&t, 16, true);
    assert_eq!(lp.len(), 3);
    quest_update(&k, &kv, &lp, &ll, &mut mn, &mut mx);
    assert_eq!(state.f16("page_min").unwrap().download().unwrap(), mn);
    assert_eq!(state.f16("page_max").unwrap().download().unwrap(), mx);
    // Device-written entries: an id out of range, a length of 0 and one past the page are
    // skipped; the good entry is applied.
    for x in k.iter_mut() {
        *x = f16::from_f32(x.to_f32() - 1.0);
    }
    let kb = dev.upload(&k).unwrap();
    let pages = dev.upload(&[12, -1, lp[0], lp[1], lp[2]]).unwrap();
    let lens = dev.upload(&[16, 16, 0, 17, ll[2]]).unwrap();
    let updates = PageUpdates::from_device(pages, lens).unwrap();
    state.update(&dusk, &kb, &updates).unwrap();
    quest_update(&k, &kv, &lp[2..], &ll[2..], &mut mn, &mut mx);
    assert_eq!(state.f16("page_min").unwrap().download().unwrap(), mn);
    assert_eq!(state.f16("page_max").unwrap().download().unwrap(), mx);
    // The state carries into the next step's plan.
    let plan =
        QuestPlan::with_state(&dusk, state, 4, &t, Budget::Tokens(16), Default::default()).unwrap();
    assert_eq!(plan.page_max().download().unwrap(), mx);
}

#[test]
fn bad_arguments_are_typed_errors() {
    let dusk = dusk();
    let kv = KvShape {
        num_pages: 6,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let t = PageTable::from_lengths(&[40, 20], 16, vec![0, 1, 2, 3, 4]).unwrap();
    let opts = QuestOptions::default();
    let plan = |kv: KvShape, hq: usize, t: &PageTable, b: Budget| {
        QuestPlan::new(&dusk, kv, hq, t, b, opts).map(|_| ())
    };
    let ok = plan(kv, 4, &t, Budget::Tokens(32));
    assert!(ok.is_ok(), "{ok:?}");
    assert_eq!(
        arg_of(plan(kv, 4, &t, Budget::Tokens(0)).unwrap_err()),
        "budget"
    );
    for f in [0.0, -0.5, 1.5, f64::NAN] {
        assert_eq!(
            arg_of(plan(kv, 4, &t, Budget::Fraction(f)).unwrap_err()),
            "budget"
        );
    }
    let empty = PageTable::from_lengths(&[40, 0], 16, vec![0, 1, 2]).unwrap();
    let e = plan(kv, 4, &empty, Budget::Tokens(32)).unwrap_err();
    assert!(e.to_string().contains("sequence 1 empty"), "{e}");
    assert_eq!(arg_of(e), "kv_indptr");
    let d96 = KvShape { head_dim: 96, ..kv };
    assert_eq!(
        arg_of(plan(d96, 4, &t, Budget::Tokens(32)).unwrap_err()),
        "head_dim"
    );
    assert_eq!(
        arg_of(plan(kv, 3, &t, Budget::Tokens(32)).unwrap_err()),
        "num_q_heads"
    );
    // A group of 32 query heads a KV head: no score kernel.
    assert_eq!(
        arg_of(plan(kv, 64, &t, Budget::Tokens(32)).unwrap_err()),
        "num_q_heads"
    );
    let far = PageTable {
        kv_page_indices: vec![0, 1, 6, 3, 4],
        ..t.clone()
    };
    assert_eq!(
        arg_of(plan(kv, 4, &far, Budget::Tokens(32)).unwrap_err()),
        "kv_page_indices"
    );

    let mut p = QuestPlan::new(&dusk, kv, 4, &t, Budget::Tokens(32), opts).unwrap();
    let dev = dusk.device();
    let q_short = dev.upload(&vec![f16::ZERO; 2 * 4 * 64 - 1]).unwrap();
    assert_eq!(arg_of(p.select(&dusk, &q_short).unwrap_err()), "q");
    let k_short = dev.upload(&vec![f16::ZERO; kv.elements() - 64]).unwrap();
    let all = PageUpdates::all(&dusk, &kv, &t).unwrap();
    assert_eq!(arg_of(p.update(&dusk, &k_short, &all).unwrap_err()), "k");
    let up = |pages: &[i32], lens: &[i32]| PageUpdates::new(&dusk, &kv, pages, lens).map(|_| ());
    assert_eq!(arg_of(up(&[6], &[16]).unwrap_err()), "pages");
    assert_eq!(arg_of(up(&[-1], &[16]).unwrap_err()), "pages");
    assert_eq!(arg_of(up(&[2, 2], &[16, 16]).unwrap_err()), "pages");
    assert_eq!(arg_of(up(&[2], &[0]).unwrap_err()), "lens");
    assert_eq!(arg_of(up(&[2], &[17]).unwrap_err()), "lens");
    assert_eq!(arg_of(up(&[2, 3], &[16]).unwrap_err()), "lens");
    let scores = dev.alloc::<f32>(3).unwrap();
    let mut tk = TopKPlan::new(
        &dusk,
        &t,
        kv,
        Items::Pages,
        Budget::Tokens(16),
        Keep { sink: 0, recent: 1 },
    )
    .unwrap();
    assert_eq!(arg_of(tk.run(&dusk, &scores).unwrap_err()), "scores");
    let no_recent = TopKPlan::new(
        &dusk,
        &t,
        kv,
        Items::Pages,
        Budget::Tokens(16),
        Keep { sink: 1, recent: 0 },
    );
    assert_eq!(arg_of(no_recent.err().unwrap()), "keep.recent");
    let small_tile = TopKPlan::with_config(
        &dusk,
        &t,
        kv,
        Items::Tokens,
        Budget::Tokens(8),
        Keep { sink: 0, recent: 0 },
        |c| {
            *c = TopKConfig {
                tile: 256,
                num_warps: 1,
                resident: true,
                radix: false,
            };
        },
    );
    assert!(small_tile.is_ok());
    let long = PageTable::from_lengths(&[300], 1, (0..300).collect());
    let kv1 = KvShape {
        num_pages: 300,
        page_size: 1,
        ..kv
    };
    let too_long = TopKPlan::with_config(
        &dusk,
        &long.unwrap(),
        kv1,
        Items::Pages,
        Budget::Tokens(8),
        Keep { sink: 0, recent: 1 },
        |c| {
            *c = TopKConfig {
                tile: 256,
                num_warps: 1,
                resident: true,
                radix: false,
            };
        },
    );
    assert_eq!(arg_of(too_long.err().unwrap()), "config");
}

#[path = "support/centroid.rs"]
mod centroid;

#[test]
fn a_selector_of_ones_own() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(11);
    let lens = [300, 40, 7];
    let kv = KvShape {
        num_pages: 30,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let t = table(&mut rng, &lens, 16, 30);
    let k = smooth_values(&mut rng, kv.elements());
    let q = smooth_values(&mut rng, 3 * 8 * 64);
    let dev = dusk.device();
    let mut state = SelectorState::new(&dusk, &centroid::CENTROID, kv).unwrap();
    state
        .update(
            &dusk,
            &dev.upload(&k).unwrap(),
            &PageUpdates::all(&dusk, &kv, &t).unwrap(),
        )
        .unwrap();
    let keep = Keep { sink: 1, recent: 1 };
    let mut plan = SelectorPlan::new(&dusk, state, 8, &t, Budget::Tokens(64), keep).unwrap();
    plan.poison_outputs(&dusk, 0xFF).unwrap();
    plan.select(&dusk, &dev.upload(&q).unwrap()).unwrap();
    // The state: each page's mean, to f16.
    let mean = plan.state().f16("mean").unwrap().download().unwrap();
    let (pages, plens) = dusk_kernels::selectors::selector::table_pages(&t, 16, false);
    for (&p, &len) in pages.iter().zip(&plens) {
        for h in 0..2 {
            for c in 0..64 {
                let want: f64 = (0..len as usize)
                    .map(|s| k[kv.k_row(p as usize, s, h) * 64 + c].to_f64())
                    .sum::<f64>()
                    / len as f64;
                let got = mean[(p as usize * 2 + h) * 64 + c].to_f64();
                assert!(
                    (got - want).abs() <= 1e-3 * (1.0 + want.abs()),
                    "{got} {want}"
                );
            }
        }
    }
    // Scores from that state in f64; pages and lists from the kernel's own scores.
    let got = download(&plan);
    for b in 0..3 {
        let first = t.kv_indptr[b] as usize;
        let n = t.kv_indptr[b + 1] as usize - first;
        for h in 0..2 {
            for j in 0..n {
                let st = (t.kv_page_indices[first + j] as usize * 2 + h) * 64;
                let want: f64 = (0..4)
                    .flat_map(|g| (0..64).map(move |c| (g, c)))
                    .map(|(g, c)| {
                        q[((b * 2 + h) * 4 + g) * 64 + c].to_f64() * mean[st + c].to_f64()
                    })
                    .sum();
                let g = got.scores[first * 2 + h * n + j] as f64;
                assert!((g - want).abs() <= 1e-4 * (1.0 + want.abs()), "{g} {want}");
            }
        }
    }
    let on: Vec<f64> = got.scores[..t.kv_page_indices.len() * 2]
        .iter()
        .map(|s| *s as f64)
        .collect();
    let want_pages = select_items(&on, plan.shape(), keep);
    assert_eq!(got.pages, want_pages);
    assert_eq!(got.lists, page_token_lists(&want_pages, &t, &kv));
    // A head_dim it has no kernels for is an error naming it.
    let d128 = KvShape {
        head_dim: 128,
        ..kv
    };
    let e = SelectorState::new(&dusk, &centroid::CENTROID, d128)
        .err()
        .unwrap();
    assert_eq!(arg_of(e), "head_dim");
    // A group it has no score kernel for names num_q_heads.
    let state = SelectorState::new(&dusk, &centroid::CENTROID, kv).unwrap();
    let e = SelectorPlan::new(&dusk, state, 4, &t, Budget::Tokens(64), keep)
        .err()
        .unwrap();
    assert_eq!(arg_of(e), "num_q_heads");
}

/// Quest's score over rows of several programs, each walking its tiles (32 pages a tile at
/// head_dim 128; 563 pages a row, the last partial, so the last program ends inside a
/// tile): the stock walk of 8 tiles and the benchmark's others, each through the
/// benchmark's check against the sort-based reference.
#[test]
fn quest_score_walks_agree_on_long_rows() {
    use dusk_kernels::selectors::bench::{QuestBench, QuestCase};
    use dusk_kernels::selectors::quest::quest_walking;
    use dusk_kernels::selectors::Selector;
    const TILES_2: Selector = quest_walking::<2>();
    const TILES_16: Selector = quest_walking::<16>();
    let dusk = dusk();
    for selector in [&QUEST, &TILES_2, &TILES_16] {
        let case = QuestCase {
            batch: 2,
            context: 9000,
            num_q_heads: 8,
            num_kv_heads: 2,
            ..QuestCase::default()
        };
        let mut bench = QuestBench::with_selector(&dusk, &case, selector, |_| {}).unwrap();
        bench.check(&dusk, 2).unwrap();
    }
}

/// Quest's score and top-k fused in one launch (`quest_select`: the last of a row's
/// programs to arrive runs the row's top-k; a plan's default where it applies) selects what
/// the two launches do, on rows long enough for it (563 and 1126 pages: the top-k's tiles
/// of 1024 and 2048), with and without the sink. Each bench checks twice, its outputs
/// poisoned before each: a row whose arrivals were not set back would keep the poison the
/// second time. Then the same plans in two launches.
#[test]
fn quest_fused_selection_equals_the_reference() {
    use dusk_kernels::selectors::bench::{QuestBench, QuestCase};
    let dusk = dusk();
    for (context, sink, num_kv_heads) in [(9000, false, 2), (18000, true, 1)] {
        let case = QuestCase {
            batch: 2,
            context,
            num_q_heads: 8,
            num_kv_heads,
            sink,
            ..QuestCase::default()
        };
        let mut bench = QuestBench::new(&dusk, &case, |_| {}).unwrap();
        assert!(bench.is_fused(), "no fused kernel at {context}");
        for _ in 0..2 {
            bench.check(&dusk, 4).unwrap();
        }
        assert!(!bench.fuse(&dusk, false).unwrap());
        bench.check(&dusk, 4).unwrap();
    }
    // Rows of at most 512 pages take the top-k on one warp: no fused kernel for them.
    let case = QuestCase {
        batch: 2,
        context: 4000,
        num_q_heads: 8,
        num_kv_heads: 2,
        ..QuestCase::default()
    };
    let mut bench = QuestBench::new(&dusk, &case, |_| {}).unwrap();
    assert!(!bench.is_fused() && !bench.fuse(&dusk, true).unwrap());
    bench.check(&dusk, 2).unwrap();
    // A fused kernel that does not take the fused parameters is refused when the plan is
    // made, naming them.
    use dusk_kernels::selectors::Selector;
    const WRONG: Selector = Selector {
        fused: Some(|kv, group, _| (QUEST.score)(kv, group)),
        ..QUEST
    };
    let case = QuestCase {
        context: 9000,
        ..case
    };
    let Err(e) = QuestBench::with_selector(&dusk, &case, &WRONG, |_| {}) else {
        panic!("a fused kernel without the fused parameters was taken");
    };
    let e = e.to_string();
    assert!(
        e.contains("selector") && e.contains("arrivals: Ptr<i32>"),
        "{e}"
    );
}
