//! Double Sparsity through the CPU interpreter against its host references
//! (`selectors::reference`): labels, token scores, the kept tokens and their lists on
//! fresh random inputs with the outputs (and the labels) poisoned first; the calibration
//! (its choice, its JSON, reproducibility); the label write as another kernel calls it; the
//! edge cases and the error paths.

use dusk_kernels::ops::Dusk;
use dusk_kernels::paged::{KvShape, PageTable, TokenLists};
use dusk_kernels::selectors::ds_kernels::{label_offset, write_token_labels};
use dusk_kernels::selectors::reference::{ds_labels, ds_scores, select_items};
use dusk_kernels::selectors::selector::table_pages;
use dusk_kernels::selectors::{Budget, DsCalibration, DsOptions, DsPlan, DsState, PageUpdates};
use dusk_macros::kernel;
use half::f16;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

#[path = "support/inputs.rs"]
mod inputs;
use inputs::*;

/// `r` distinct random channels in `0..head_dim` for each of `heads` KV heads, in random
/// order (the kernels take any order).
fn random_calibration(
    rng: &mut SmallRng,
    heads: usize,
    head_dim: usize,
    r: usize,
) -> DsCalibration {
    let lists: Vec<Vec<usize>> = (0..heads)
        .map(|_| {
            let mut c: Vec<usize> = (0..head_dim).collect();
            c.shuffle(rng);
            c.truncate(r);
            c
        })
        .collect();
    DsCalibration::from_channels(head_dim, &lists).unwrap()
}

/// What one DS run gave.
struct Got {
    scores: Vec<f32>,
    lists: TokenLists,
    flags: Vec<i32>,
}

fn download(plan: &DsPlan) -> Got {
    let shape = plan.shape();
    let indptr = plan.sel_indptr().download().unwrap();
    assert_eq!(indptr, shape.sel_indptr);
    let mut indices = plan.sel_indices().download().unwrap();
    indices.truncate(*indptr.last().unwrap() as usize);
    let mut flags = plan.flags().download().unwrap();
    flags.truncate(shape.rows());
    Got {
        scores: plan.scores().download().unwrap(),
        lists: TokenLists { indptr, indices },
        flags,
    }
}

/// Token lists from kept items (tokens: one item a token).
fn lists_of(items: &[Vec<usize>]) -> TokenLists {
    let mut indptr = vec![0i32];
    let mut indices = vec![];
    for row in items {
        indices.extend(row.iter().map(|t| *t as i32));
        indptr.push(indices.len() as i32);
    }
    TokenLists { indptr, indices }
}

struct Case {
    lens: Vec<usize>,
    page_size: usize,
    num_kv_heads: usize,
    group: usize,
    head_dim: usize,
    r: usize,
    budget: Budget,
    options: DsOptions,
}

/// Runs DS on `case` with fresh inputs (on the grid when `exact`) and checks every output
/// against the references; returns the run's outputs.
fn check_ds(dusk: &Dusk, rng: &mut SmallRng, case: &Case, exact: bool) -> Got {
    let ps = case.page_size;
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
    let (k, q) = if exact {
        (
            grid_values(rng, kv.elements(), 32, 0.125),
            grid_values(rng, qn, 8, 0.25),
        )
    } else {
        (smooth_values(rng, kv.elements()), smooth_values(rng, qn))
    };
    let cal = random_calibration(rng, case.num_kv_heads, case.head_dim, case.r);
    let dev = dusk.device();
    let (kb, qb) = (dev.upload(&k).unwrap(), dev.upload(&q).unwrap());
    let mut plan = DsPlan::new(dusk, kv, &cal, hq, &t, case.budget, case.options).unwrap();
    // Poison the labels: the update must write every label of the table's tokens.
    let mut labels = vec![f16::NAN; kv.rows() * case.r];
    plan.state_mut()
        .labels_mut()
        .copy_from_host(&labels)
        .unwrap();
    plan.update(dusk, &kb, &PageUpdates::all(dusk, &kv, &t).unwrap())
        .unwrap();
    plan.poison_outputs(dusk, 0xFF).unwrap();
    plan.select(dusk, &qb).unwrap();

    let (up_pages, up_lens) = table_pages(&t, ps, false);
    ds_labels(&k, &kv, &cal, &up_pages, &up_lens, &mut labels);
    let got_labels = plan.state().labels().download().unwrap();
    let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got_labels), bits(&labels), "labels");

    let got = download(&plan);
    let want = ds_scores(&q, &labels, &cal, &kv, &t, hq);
    assert_eq!(want.len(), plan.shape().num_scores());
    for (i, (g, w)) in got.scores.iter().zip(&want).enumerate() {
        if exact {
            assert_eq!(*g as f64, *w, "score {i}");
        } else {
            let tol = 1e-5 * (1.0 + w.abs()) * (case.group * case.r) as f64;
            assert!((*g as f64 - w).abs() <= tol, "score {i}: {g} against {w}");
        }
    }
    // Tokens: the sort-based top-k, on the reference's scores where those are exact, else
    // on the kernel's own (f32 sums in another order can swap near-ties).
    let keep = case.options.keep();
    let on: Vec<f64> = if exact {
        want
    } else {
        got.scores[..want.len()].iter().map(|s| *s as f64).collect()
    };
    let want_items = select_items(&on, plan.shape(), keep);
    assert_eq!(got.lists, lists_of(&want_items), "token lists");
    got.lists
        .validate("lists", &t, ps, kv.num_kv_heads)
        .unwrap();
    assert!(got.flags.iter().all(|f| *f == 0), "flags {:?}", got.flags);
    // Budgets: the budget's tokens (at least the kept ones), everything when short.
    for r in 0..got.lists.rows() {
        let len = case.lens[r / kv.num_kv_heads];
        let forced = (keep.sink + keep.recent).min(len);
        let want_k = case.budget.tokens(len).max(forced).min(len);
        let row = got.lists.row(r);
        assert_eq!(row.len(), want_k, "row {r}");
        for s in 0..keep.sink.min(len) {
            assert!(row.contains(&(s as i32)), "row {r} keeps sink token {s}");
        }
        for s in len.saturating_sub(keep.recent)..len {
            assert!(row.contains(&(s as i32)), "row {r} keeps recent token {s}");
        }
    }
    got
}

#[test]
fn ds_matches_the_sort_based_reference() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(22);
    let shapes = [
        (1, 2, 64, 8),
        (4, 2, 128, 16),
        (8, 1, 64, 32),
        (2, 3, 256, 16),
    ];
    for (group, kv_heads, head_dim, r) in shapes {
        for options in [DsOptions::default(), DsOptions { sink: 2, recent: 5 }] {
            for budget in [Budget::Tokens(37), Budget::Fraction(0.3)] {
                // Several pages with a partial last one, one partial page, one token,
                // shorter than the budget, whole pages (and one longer than a score tile).
                let lens = vec![
                    rng.random_range(200..400),
                    rng.random_range(2..16),
                    1,
                    30,
                    512,
                ];
                let case = Case {
                    lens,
                    page_size: 16,
                    num_kv_heads: kv_heads,
                    group,
                    head_dim,
                    r,
                    budget,
                    options,
                };
                check_ds(&dusk, &mut rng, &case, true);
            }
        }
    }
}

#[test]
fn ds_on_continuous_inputs_and_other_page_sizes() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(7);
    for (group, page_size) in [(1, 16), (4, 32), (8, 8)] {
        let case = Case {
            lens: vec![rng.random_range(300..600), rng.random_range(17..40)],
            page_size,
            num_kv_heads: 2,
            group,
            head_dim: 128,
            r: 16,
            budget: Budget::Fraction(0.25),
            options: DsOptions { sink: 1, recent: 8 },
        };
        check_ds(&dusk, &mut rng, &case, false);
    }
}

#[test]
fn short_sequences_and_one_page_select_everything() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(3);
    let case = Case {
        lens: vec![5, 16, 9, 64, 100],
        page_size: 16,
        num_kv_heads: 2,
        group: 4,
        head_dim: 64,
        r: 8,
        budget: Budget::Tokens(128),
        options: DsOptions { sink: 1, recent: 2 },
    };
    let got = check_ds(&dusk, &mut rng, &case, true);
    let need = PageTable::pages_needed(&case.lens, 16) as i32;
    let t = PageTable::from_lengths(&case.lens, 16, (0..need).collect()).unwrap();
    assert_eq!(got.lists, TokenLists::all_tokens(&t, 16, 2));
}

/// Ties: every token of a row scores the same (q zero on the labelled channels); the
/// lowest positions win, besides the kept ones.
#[test]
fn ties_go_to_the_lower_position() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(12);
    let kv = KvShape {
        num_pages: 4,
        page_size: 16,
        num_kv_heads: 1,
        head_dim: 64,
    };
    let t = table(&mut rng, &[50], 16, 4);
    let cal = random_calibration(&mut rng, 1, 64, 8);
    let k = grid_values(&mut rng, kv.elements(), 32, 0.125);
    let q = vec![f16::ZERO; 2 * 64];
    let dev = dusk.device();
    let opts = DsOptions { sink: 0, recent: 3 };
    let mut plan = DsPlan::new(&dusk, kv, &cal, 2, &t, Budget::Tokens(7), opts).unwrap();
    plan.update(
        &dusk,
        &dev.upload(&k).unwrap(),
        &PageUpdates::all(&dusk, &kv, &t).unwrap(),
    )
    .unwrap();
    plan.poison_outputs(&dusk, 0xFF).unwrap();
    plan.select(&dusk, &dev.upload(&q).unwrap()).unwrap();
    let got = download(&plan);
    assert_eq!(got.lists.indices, [0, 1, 2, 3, 47, 48, 49]);
}

/// A NaN in one sequence's q flags that sequence's rows of its KV head, selects only
/// positions inside it, and leaves the other rows as the reference has them.
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
    let cal = random_calibration(&mut rng, 2, 64, 8);
    let mut q = grid_values(&mut rng, 2 * 8 * 64, 8, 0.25);
    // Sequence 0, query head 3 (KV head 0's group), on a labelled channel.
    q[3 * 64 + cal.head(0)[2]] = f16::NAN;
    let dev = dusk.device();
    let keep = DsOptions { sink: 0, recent: 4 };
    let mut plan = DsPlan::new(&dusk, kv, &cal, 8, &t, Budget::Tokens(40), keep).unwrap();
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
    let mut labels = vec![f16::ZERO; kv.rows() * 8];
    let (p, l) = table_pages(&t, 16, false);
    ds_labels(&k, &kv, &cal, &p, &l, &mut labels);
    let want = ds_scores(&q, &labels, &cal, &kv, &t, 8);
    let want_items = select_items(&want, plan.shape(), keep.keep());
    let want_lists = lists_of(&want_items);
    for r in 1..4 {
        assert_eq!(got.lists.row(r), want_lists.row(r), "row {r}");
    }
    // The NaN row keeps its window and the lowest positions (every other score NaN).
    let mut nan_row: Vec<i32> = (0..36).collect();
    nan_row.extend(146..150);
    assert_eq!(got.lists.row(0), &nan_row[..]);
}

/// Writing the labels of the last pages after they change (a decode step's append) brings
/// the cache back to the reference; entries written on the device that are out of range
/// are skipped; the labels carry into the next step's plan.
#[test]
fn updates_of_written_pages() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(10);
    let kv = KvShape {
        num_pages: 12,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 128,
    };
    let t = table(&mut rng, &[40, 17, 64], 16, 12);
    let cal = random_calibration(&mut rng, 2, 128, 16);
    let mut k = grid_values(&mut rng, kv.elements(), 32, 0.125);
    let dev = dusk.device();
    let mut state = DsState::new(&dusk, kv, &cal).unwrap();
    state
        .update(
            &dusk,
            &dev.upload(&k).unwrap(),
            &PageUpdates::all(&dusk, &kv, &t).unwrap(),
        )
        .unwrap();
    let mut labels = vec![f16::ZERO; kv.rows() * 16];
    let (p, l) = table_pages(&t, 16, false);
    ds_labels(&k, &kv, &cal, &p, &l, &mut labels);
    assert_eq!(state.labels().download().unwrap(), labels);
    // Change every token of the cache; only the last pages are rewritten.
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
    let (lp, ll) = table_pages(&t, 16, true);
    ds_labels(&k, &kv, &cal, &lp, &ll, &mut labels);
    assert_eq!(state.labels().download().unwrap(), labels);
    // Device-written entries: an id out of range, a length of 0 and one past the page are
    // skipped; the good entry is applied.
    for x in k.iter_mut() {
        *x = f16::from_f32(x.to_f32() - 1.0);
    }
    let kb = dev.upload(&k).unwrap();
    let pages = dev.upload(&[12, -1, lp[0], lp[1], lp[2]]).unwrap();
    let lens = dev.upload(&[16, 16, 0, 17, ll[2]]).unwrap();
    state
        .update(&dusk, &kb, &PageUpdates::from_device(pages, lens).unwrap())
        .unwrap();
    ds_labels(&k, &kv, &cal, &lp[2..], &ll[2..], &mut labels);
    assert_eq!(state.labels().download().unwrap(), labels);
    let plan = DsPlan::with_state(
        &dusk,
        state,
        4,
        &t,
        Budget::Tokens(16),
        DsOptions::default(),
    )
    .unwrap();
    assert_eq!(plan.state().labels().download().unwrap(), labels);
}

/// An append kernel of one's own (what the one-launch cache maintenance does): program
/// `(b, h)` writes sequence `b`'s new key for KV head `h` into its slot of the cache's
/// labels with the stock per-token helper.
#[kernel(crate = "dusk_kernels::dusk_paths", num_warps = 1)]
#[allow(clippy::too_many_arguments)]
fn append_labels<const D: usize, const R: usize>(
    new_k: Ptr<f16>,
    pages: Ptr<i32>,
    slots: Ptr<i32>,
    num_kv_heads: i32,
    page_size: i32,
    channels: Ptr<i32>,
    labels: Ptr<f16>,
) {
    let b = program_id(0);
    let h = program_id(1);
    let key_at = ((b * num_kv_heads + h) as i64) * D;
    let at = label_offset::<R>(load(pages + b), h, load(slots + b), num_kv_heads, page_size);
    write_token_labels::<D, R>(new_k, key_at, channels, h, labels, at);
}

#[test]
fn the_label_write_helper_in_an_append_kernel() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(13);
    let kv = KvShape {
        num_pages: 6,
        page_size: 16,
        num_kv_heads: 4,
        head_dim: 128,
    };
    let cal = random_calibration(&mut rng, 4, 128, 16);
    let mut state = DsState::new(&dusk, kv, &cal).unwrap();
    let mut labels = vec![f16::NAN; kv.rows() * 16];
    state.labels_mut().copy_from_host(&labels).unwrap();
    // Three sequences append one token each: page 4 slot 0, page 1 slot 15, page 2 slot 7.
    let (pages, slots) = ([4, 1, 2], [0, 15, 7]);
    let new_k = smooth_values(&mut rng, 3 * 4 * 128);
    let dev = dusk.device();
    let k = dusk
        .load(append_labels::build::<128, 16>().unwrap())
        .unwrap();
    append_labels::launch::<128, 16>(
        dev,
        &k,
        [3, 4, 1],
        &dev.upload(&new_k).unwrap(),
        &dev.upload(&pages).unwrap(),
        &dev.upload(&slots).unwrap(),
        4,
        16,
        state.channels(),
        state.labels(),
    )
    .unwrap();
    for b in 0..3 {
        for h in 0..4 {
            let at = kv.quantized_row(pages[b] as usize, slots[b] as usize, h) * 16;
            for (j, &c) in cal.head(h).iter().enumerate() {
                labels[at + j] = new_k[(b * 4 + h) * 128 + c];
            }
        }
    }
    let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&state.labels().download().unwrap()), bits(&labels));
}

/// Samples with planted outlier channels: q and k large on a few channels per KV head.
fn planted_samples(
    rng: &mut SmallRng,
    samples: usize,
    hq: usize,
    hk: usize,
    d: usize,
    outliers: &[Vec<usize>],
) -> (Vec<f16>, Vec<f16>) {
    let group = hq / hk;
    let mut q = smooth_values(rng, samples * hq * d);
    let mut k = smooth_values(rng, samples * hk * d);
    for s in 0..samples {
        for (h, chans) in outliers.iter().enumerate() {
            for &c in chans {
                k[(s * hk + h) * d + c] = f16::from_f32(k[(s * hk + h) * d + c].to_f32() * 8.0);
                for g in 0..group {
                    let i = (s * hq + h * group + g) * d + c;
                    q[i] = f16::from_f32(q[i].to_f32() * 8.0);
                }
            }
        }
    }
    (q, k)
}

#[test]
fn calibration_finds_the_outlier_channels() {
    let mut rng = SmallRng::seed_from_u64(14);
    let (hq, hk, d, r) = (8, 2, 64, 8);
    let outliers: Vec<Vec<usize>> = (0..hk)
        .map(|_| {
            let mut c: Vec<usize> = (0..d).collect();
            c.shuffle(&mut rng);
            c.truncate(r);
            c.sort();
            c
        })
        .collect();
    let (q, k) = planted_samples(&mut rng, 200, hq, hk, d, &outliers);
    let cal = DsCalibration::calibrate(&q, &k, hq, hk, d, r).unwrap();
    assert_eq!(cal.samples(), 200);
    for (h, planted) in outliers.iter().enumerate() {
        assert_eq!(cal.head(h), &planted[..], "head {h}");
    }
    // Against the definition, in f64 from f32 inputs, ties included: every kept channel's
    // mean is above every other's, or equal with a lower index.
    let qf: Vec<f32> = (0..3 * 4 * 64)
        .map(|i| ((i * 37) % 5) as f32 - 2.0)
        .collect();
    let kf: Vec<f32> = (0..3 * 2 * 64).map(|i| ((i * 11) % 3) as f32).collect();
    let cal = DsCalibration::calibrate(&qf, &kf, 4, 2, 64, 16).unwrap();
    for h in 0..2 {
        let mean = |c: usize| -> f64 {
            let mut s = 0.0;
            for t in 0..3 {
                for g in 0..2 {
                    s += (qf[(t * 4 + h * 2 + g) * 64 + c] as f64
                        * kf[(t * 2 + h) * 64 + c] as f64)
                        .abs();
                }
            }
            s / 6.0
        };
        let kept = cal.head(h);
        assert!(kept.windows(2).all(|w| w[0] < w[1]), "ascending");
        for &a in kept {
            for b in (0..64).filter(|b| !kept.contains(b)) {
                assert!(
                    mean(a) > mean(b) || (mean(a) == mean(b) && a < b),
                    "head {h}: {a} kept over {b}"
                );
            }
        }
    }
}

#[test]
fn calibration_is_reproducible_from_its_json() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(15);
    let (hq, hk, d, r) = (8, 2, 64, 8);
    let q = smooth_values(&mut rng, 50 * hq * d);
    let k = smooth_values(&mut rng, 50 * hk * d);
    let a = DsCalibration::calibrate(&q, &k, hq, hk, d, r).unwrap();
    let b = DsCalibration::calibrate(&q, &k, hq, hk, d, r).unwrap();
    assert_eq!(a.to_json(), b.to_json(), "the same samples, the same JSON");
    let json = a.to_json();
    let loaded = DsCalibration::from_json(&json).unwrap();
    assert_eq!(loaded, a);
    assert_eq!(loaded.to_json(), json);
    let path =
        std::env::temp_dir().join(format!("dusk_ds_calibration_{}.json", std::process::id()));
    a.save(&path).unwrap();
    assert_eq!(DsCalibration::load(&path).unwrap(), a);
    std::fs::remove_file(&path).unwrap();
    // The same selection from the calibration and from its JSON.
    let kv = KvShape {
        num_pages: 10,
        page_size: 16,
        num_kv_heads: hk,
        head_dim: d,
    };
    let t = table(&mut rng, &[100, 47], 16, 10);
    let cache = smooth_values(&mut rng, kv.elements());
    let qs = smooth_values(&mut rng, 2 * hq * d);
    let dev = dusk.device();
    let (cb, qb) = (dev.upload(&cache).unwrap(), dev.upload(&qs).unwrap());
    let mut outs = vec![];
    for cal in [&a, &loaded] {
        let mut plan = DsPlan::new(
            &dusk,
            kv,
            cal,
            hq,
            &t,
            Budget::Tokens(20),
            DsOptions::default(),
        )
        .unwrap();
        plan.update(&dusk, &cb, &PageUpdates::all(&dusk, &kv, &t).unwrap())
            .unwrap();
        plan.poison_outputs(&dusk, 0xFF).unwrap();
        plan.select(&dusk, &qb).unwrap();
        outs.push(download(&plan).lists);
    }
    assert_eq!(outs[0], outs[1]);
    // The text: one channel list per head.
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["r"], 8);
    assert_eq!(v["channels"].as_array().unwrap().len(), 2);
}

#[test]
fn bad_calibrations_are_typed_errors() {
    let q = vec![f16::ONE; 4 * 8 * 64];
    let k = vec![f16::ONE; 4 * 2 * 64];
    let cal = |q: &[f16], k: &[f16], hq, r| DsCalibration::calibrate(q, k, hq, 2, 64, r);
    assert!(cal(&q, &k, 8, 8).is_ok());
    assert_eq!(arg_of(cal(&q, &k, 8, 0).unwrap_err()), "r");
    assert_eq!(arg_of(cal(&q, &k, 8, 65).unwrap_err()), "r");
    assert_eq!(arg_of(cal(&q, &k, 7, 8).unwrap_err()), "num_q_heads");
    assert_eq!(arg_of(cal(&q[1..], &k, 8, 8).unwrap_err()), "q");
    assert_eq!(arg_of(cal(&[], &[], 8, 8).unwrap_err()), "q");
    assert_eq!(arg_of(cal(&q, &k[64..], 8, 8).unwrap_err()), "k");
    let mut bad = k.clone();
    bad[5] = f16::NAN;
    assert_eq!(arg_of(cal(&q, &bad, 8, 8).unwrap_err()), "k");
    // Channels of the caller's.
    let from = |lists: &[Vec<usize>]| DsCalibration::from_channels(64, lists).map(|_| ());
    assert!(from(&[vec![0, 5], vec![63, 1]]).is_ok());
    assert_eq!(arg_of(from(&[vec![], vec![]]).unwrap_err()), "r");
    assert_eq!(arg_of(from(&[(0..65).collect()]).unwrap_err()), "r");
    assert_eq!(arg_of(from(&[vec![0, 64]]).unwrap_err()), "channels");
    assert_eq!(arg_of(from(&[vec![3, 3]]).unwrap_err()), "channels");
    assert_eq!(
        arg_of(from(&[vec![0, 1], vec![2]]).unwrap_err()),
        "channels"
    );
    assert_eq!(arg_of(from(&[]).unwrap_err()), "channels");
    // JSON: not a calibration, another format, channels out of range, r that disagrees.
    let good = DsCalibration::from_channels(64, &[vec![0, 5], vec![63, 1]])
        .unwrap()
        .to_json();
    assert!(DsCalibration::from_json(&good).is_ok());
    assert_eq!(
        arg_of(DsCalibration::from_json("{").unwrap_err()),
        "calibration"
    );
    assert_eq!(
        arg_of(DsCalibration::from_json("[1, 2]").unwrap_err()),
        "calibration"
    );
    let edit =
        |from: &str, to: &str| DsCalibration::from_json(&good.replacen(from, to, 1)).map(|_| ());
    assert_eq!(
        arg_of(edit("\"version\": 1", "\"version\": 2").unwrap_err()),
        "calibration"
    );
    assert_eq!(arg_of(edit("63", "64").unwrap_err()), "channels");
    assert_eq!(arg_of(edit("\"r\": 2", "\"r\": 3").unwrap_err()), "r");
    assert_eq!(
        arg_of(edit("\"num_kv_heads\": 2", "\"num_kv_heads\": 3").unwrap_err()),
        "num_kv_heads"
    );
    assert_eq!(
        arg_of(edit("\"samples\"", "\"sample\"").unwrap_err()),
        "calibration"
    );
    let missing = std::path::Path::new("/nonexistent/dusk/calibration.json");
    assert_eq!(arg_of(DsCalibration::load(missing).unwrap_err()), "path");
}

#[test]
fn bad_plans_are_typed_errors() {
    let dusk = dusk();
    let kv = KvShape {
        num_pages: 6,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let t = PageTable::from_lengths(&[40, 20], 16, vec![0, 1, 2, 3, 4]).unwrap();
    let cal = DsCalibration::from_channels(64, &[(0..8).collect(), (8..16).collect()]).unwrap();
    let opts = DsOptions::default();
    let plan = |kv: KvShape, cal: &DsCalibration, hq: usize, t: &PageTable, b: Budget| {
        DsPlan::new(&dusk, kv, cal, hq, t, b, opts).map(|_| ())
    };
    let ok = plan(kv, &cal, 4, &t, Budget::Tokens(32));
    assert!(ok.is_ok(), "{ok:?}");
    assert_eq!(
        arg_of(plan(kv, &cal, 4, &t, Budget::Tokens(0)).unwrap_err()),
        "budget"
    );
    assert_eq!(
        arg_of(plan(kv, &cal, 4, &t, Budget::Fraction(0.0)).unwrap_err()),
        "budget"
    );
    let empty = PageTable::from_lengths(&[40, 0], 16, vec![0, 1, 2]).unwrap();
    let e = plan(kv, &cal, 4, &empty, Budget::Tokens(32)).unwrap_err();
    assert!(e.to_string().contains("sequence 1 empty"), "{e}");
    assert_eq!(arg_of(e), "kv_indptr");
    assert_eq!(
        arg_of(plan(kv, &cal, 3, &t, Budget::Tokens(32)).unwrap_err()),
        "num_q_heads"
    );
    assert_eq!(
        arg_of(plan(kv, &cal, 64, &t, Budget::Tokens(32)).unwrap_err()),
        "num_q_heads"
    );
    // A width with no kernels, a calibration of another shape.
    let r12 = DsCalibration::from_channels(64, &[(0..12).collect(), (12..24).collect()]).unwrap();
    assert_eq!(
        arg_of(plan(kv, &r12, 4, &t, Budget::Tokens(32)).unwrap_err()),
        "r"
    );
    let d128 = DsCalibration::from_channels(128, &[(0..8).collect(), (8..16).collect()]).unwrap();
    assert_eq!(
        arg_of(plan(kv, &d128, 4, &t, Budget::Tokens(32)).unwrap_err()),
        "calibration"
    );
    let one_head = DsCalibration::from_channels(64, &[(0..8).collect()]).unwrap();
    assert_eq!(
        arg_of(plan(kv, &one_head, 4, &t, Budget::Tokens(32)).unwrap_err()),
        "calibration"
    );
    let d96 = KvShape { head_dim: 96, ..kv };
    let cal96 = DsCalibration::from_channels(96, &[(0..8).collect(), (8..16).collect()]).unwrap();
    assert_eq!(
        arg_of(plan(d96, &cal96, 4, &t, Budget::Tokens(32)).unwrap_err()),
        "head_dim"
    );
    let far = PageTable {
        kv_page_indices: vec![0, 1, 6, 3, 4],
        ..t.clone()
    };
    assert_eq!(
        arg_of(plan(kv, &cal, 4, &far, Budget::Tokens(32)).unwrap_err()),
        "kv_page_indices"
    );

    let mut p = DsPlan::new(&dusk, kv, &cal, 4, &t, Budget::Tokens(32), opts).unwrap();
    let dev = dusk.device();
    let q_short = dev.upload(&vec![f16::ZERO; 2 * 4 * 64 - 1]).unwrap();
    assert_eq!(arg_of(p.select(&dusk, &q_short).unwrap_err()), "q");
    let k_short = dev.upload(&vec![f16::ZERO; kv.elements() - 64]).unwrap();
    let all = PageUpdates::all(&dusk, &kv, &t).unwrap();
    assert_eq!(arg_of(p.update(&dusk, &k_short, &all).unwrap_err()), "k");
    // Everything kept whatever the budget: a window as long as the sequences.
    let wide = DsOptions {
        sink: 30,
        recent: 30,
    };
    let mut w = DsPlan::new(&dusk, kv, &cal, 4, &t, Budget::Tokens(1), wide).unwrap();
    assert_eq!(w.shape().sel_indptr, [0, 40, 80, 100, 120]);
    w.update(
        &dusk,
        &dev.upload(&vec![f16::ONE; kv.elements()]).unwrap(),
        &all,
    )
    .unwrap();
    w.select(&dusk, &dev.upload(&vec![f16::ONE; 2 * 4 * 64]).unwrap())
        .unwrap();
    assert_eq!(download(&w).lists, TokenLists::all_tokens(&t, 16, 2));
}
