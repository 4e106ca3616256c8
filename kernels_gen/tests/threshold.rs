//! The fused threshold search through the CPU interpreter, against the sort-based oracle
//! (`reference::threshold_oracle`) on random rows: focused and diffuse weights, ties,
//! denormal weights, GQA unions, every stock policy and a user-written one; and the edge
//! cases and error paths of the plan.

use dusk_kernels::ops::Dusk;
use dusk_kernels::paged::TokenLists;
use dusk_kernels::policies::{ratio_to_max, top_k, top_p, top_p_bounded};
use dusk_kernels::prune::{ParamValues, PrunePlan};
use dusk_kernels::reference::{check_kept, softmax, threshold_oracle, top_p_oracle};
use dusk_kernels::threshold::{Policy, SearchConfig};
use dusk_kernels::timeline::TIMELINE_WORDS;
use dusk_kernels::DuskError;
use dusk_macros::policy;
use dusk_runtime::Device;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// A user's policy, as the guide shows: top-p, but never fewer than 4 candidates.
#[policy(crate = "dusk_kernels::dusk_paths")]
fn top_p_at_least_4(mass: f32, count: i32, #[check(p > 0.0 && p <= 1.0)] p: f32) -> bool {
    mass >= p && count >= 4
}

/// A parameter named one slip away from a statistic (`counts`, `count`) must be declared
/// the policy's own with `#[param]` (a `#[check]` does too); see
/// `tests/ui/policy_misspelt_statistic.rs` for the error without it.
#[policy(crate = "dusk_kernels::dusk_paths")]
fn at_least_counts(count: i32, #[param] counts: i32) -> bool {
    count >= counts
}

#[test]
fn param_marks_a_parameter_named_like_a_statistic() {
    let p = &at_least_counts::POLICY;
    assert_eq!(p.reads, &["count"]);
    assert_eq!(p.params.len(), 1);
    assert_eq!(p.params[0].name, "counts");
    assert_eq!(p.params[0].expected, "any integer");
    assert!((p.params[0].check)(3.0) && !(p.params[0].check)(3.5));
}

#[derive(Clone, Copy, Debug)]
enum Shape {
    Focused,
    Diffuse,
    Ties,
    Denormal,
}

fn logits(rng: &mut SmallRng, n: usize, shape: Shape) -> Vec<f32> {
    (0..n)
        .map(|_| match shape {
            Shape::Focused => {
                let base: f32 = rng.random_range(-4.0..4.0);
                if rng.random_bool(0.02) {
                    base + 30.0
                } else {
                    base
                }
            }
            Shape::Diffuse => rng.random_range(-1.0..1.0),
            Shape::Ties => rng.random_range(0..4) as f32 * 0.75,
            Shape::Denormal => rng.random_range(-110.0f32..0.0),
        })
        .collect()
}

/// One search over `rows` (one query head each: group 1); returns each row's kept set and
/// kept mass.
fn run(
    dusk: &Dusk,
    policy: &Policy,
    rows: &[Vec<f32>],
    scale: f32,
    params: &[ParamValues],
) -> (Vec<Vec<bool>>, Vec<f32>, Vec<i32>) {
    let mut indptr = vec![0i32];
    let mut indices = vec![];
    let mut scores = vec![];
    for r in rows {
        // Candidate positions: ascending with gaps, as a selector's output is.
        indices.extend((0..r.len() as i32).map(|j| 3 * j + 1));
        indptr.push(indices.len() as i32);
        scores.extend_from_slice(r);
    }
    let cand = TokenLists { indptr, indices };
    let mut plan = PrunePlan::new(dusk, policy, &cand, 1, scale, params).unwrap();
    let s = dusk.device().upload(&scores).unwrap();
    plan.run(dusk, &s).unwrap();
    let sel_indptr = plan.sel_indptr().download().unwrap();
    let sel = plan.sel_indices().download().unwrap();
    let mass = plan.kept_mass().download().unwrap();
    let flags = plan.flags().download().unwrap();
    let budgets = plan.budgets().download().unwrap();
    let mut kept = vec![];
    for (i, r) in rows.iter().enumerate() {
        let toks = &sel[sel_indptr[i] as usize..sel_indptr[i + 1] as usize];
        assert_eq!(toks.len() as i32, budgets[i], "row {i}: budget");
        assert!(toks.windows(2).all(|w| w[0] < w[1]), "row {i}: ascending");
        let mut k = vec![false; r.len()];
        for t in toks {
            assert_eq!(t % 3, 1, "row {i}: a candidate position");
            k[(t / 3) as usize] = true;
        }
        kept.push(k);
    }
    (kept, mass, flags)
}

fn near_p(p: f64) -> impl Fn(f64, f64) -> bool {
    move |before, with| (before - p).abs() < 1e-5 || (with - p).abs() < 1e-5
}

#[test]
fn top_p_matches_the_oracle_on_random_rows() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let mut rng = SmallRng::seed_from_u64(7);
    let shapes = [Shape::Focused, Shape::Diffuse, Shape::Ties, Shape::Denormal];
    let mut checked = 0;
    for (batch, shape) in shapes.iter().cycle().take(8).enumerate() {
        let rows: Vec<Vec<f32>> = (0..160)
            .map(|_| {
                let n = rng.random_range(1..=1000);
                logits(&mut rng, n, *shape)
            })
            .collect();
        let ps: Vec<f64> = (0..rows.len())
            .map(|_| [0.5, 0.8, 0.9, 0.95, 0.99, 1e-3, 1.0][rng.random_range(0..7)])
            .collect();
        let scale = if batch % 2 == 0 { 1.0 } else { 0.125 };
        let (kept, mass, flags) = run(
            &dusk,
            &top_p::POLICY,
            &rows,
            scale,
            &[ParamValues::PerRow(ps.clone())],
        );
        for (i, r) in rows.iter().enumerate() {
            let w = softmax(r, scale as f64);
            let oracle = top_p_oracle(&w, ps[i]);
            check_kept(&w, &kept[i], &oracle, near_p(ps[i]))
                .unwrap_or_else(|e| panic!("{shape:?} row {i} (p {}): {e}", ps[i]));
            let m: f64 = (0..w.len()).filter(|j| kept[i][*j]).map(|j| w[j]).sum();
            assert!((mass[i] as f64 - m).abs() < 1e-4, "row {i}: kept mass");
            assert!(mass[i] as f64 >= ps[i] - 1e-5, "row {i}: mass below p");
            assert_eq!(flags[i], 0);
            checked += 1;
        }
    }
    assert_eq!(checked, 1280);
}

#[test]
fn stock_and_user_policies_match_their_oracles() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let mut rng = SmallRng::seed_from_u64(11);
    let rows: Vec<Vec<f32>> = (0..120)
        .map(|i| {
            let n = rng.random_range(1..=700);
            let shape = [Shape::Focused, Shape::Diffuse, Shape::Ties][i % 3];
            logits(&mut rng, n, shape)
        })
        .collect();
    let ks: Vec<f64> = (0..rows.len())
        .map(|_| rng.random_range(1..=64) as f64)
        .collect();
    let (kept, _, _) = run(
        &dusk,
        &top_k::POLICY,
        &rows,
        1.0,
        &[ParamValues::PerRow(ks.clone())],
    );
    for (i, r) in rows.iter().enumerate() {
        let w = softmax(r, 1.0);
        let oracle = threshold_oracle(&w, |_, c| c >= ks[i] as usize);
        check_kept(&w, &kept[i], &oracle, |_, _| false)
            .unwrap_or_else(|e| panic!("top_k row {i}: {e}"));
    }

    let (kept, _, _) = run(
        &dusk,
        &ratio_to_max::POLICY,
        &rows,
        1.0,
        &[ParamValues::Uniform(0.05)],
    );
    for (i, r) in rows.iter().enumerate() {
        let w = softmax(r, 1.0);
        let wmax = w.iter().cloned().fold(0.0, f64::max);
        let oracle: Vec<bool> = w.iter().map(|x| *x >= 0.05 * wmax).collect();
        check_kept(&w, &kept[i], &oracle, |_, _| false)
            .unwrap_or_else(|e| panic!("ratio_to_max row {i}: {e}"));
    }

    let params = [
        ParamValues::Uniform(0.9),
        ParamValues::Uniform(8.0),
        ParamValues::Uniform(40.0),
    ];
    let (kept, _, _) = run(&dusk, &top_p_bounded::POLICY, &rows, 1.0, &params);
    for (i, r) in rows.iter().enumerate() {
        let w = softmax(r, 1.0);
        let oracle = threshold_oracle(&w, |m, c| (m >= 0.9 && c >= 8) || c >= 40);
        check_kept(&w, &kept[i], &oracle, near_p(0.9))
            .unwrap_or_else(|e| panic!("top_p_bounded row {i}: {e}"));
        let n = kept[i].iter().filter(|k| **k).count();
        assert!(n >= 8.min(r.len()), "row {i}: floor");
    }

    let (kept, _, _) = run(
        &dusk,
        &top_p_at_least_4::POLICY,
        &rows,
        1.0,
        &[ParamValues::Uniform(0.5)],
    );
    for (i, r) in rows.iter().enumerate() {
        let w = softmax(r, 1.0);
        let oracle = threshold_oracle(&w, |m, c| m >= 0.5 && c >= 4);
        check_kept(&w, &kept[i], &oracle, near_p(0.5))
            .unwrap_or_else(|e| panic!("user policy row {i}: {e}"));
    }
}

#[test]
fn gqa_keeps_the_union_of_the_group() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let mut rng = SmallRng::seed_from_u64(3);
    let group = 4;
    let lens: Vec<usize> = vec![0, 1, 257, 900, 1000, 33];
    let mut indptr = vec![0i32];
    let mut indices = vec![];
    let mut scores = vec![];
    let mut heads = vec![];
    for &n in &lens {
        indices.extend(0..n as i32);
        indptr.push(indices.len() as i32);
        for _ in 0..group {
            let r = logits(&mut rng, n, Shape::Focused);
            scores.extend_from_slice(&r);
            heads.push(r);
        }
    }
    let cand = TokenLists { indptr, indices };
    let p = 0.9;
    let params = [ParamValues::Uniform(p)];
    // The default, then staged in shared memory (the positions compacted there before the
    // rows' look-back) bisecting and from the histogram, then streamed with the weights
    // recomputed from each head's scores (the union recomputes every head's).
    let default = PrunePlan::new(&dusk, &top_p::POLICY, &cand, group, 0.5, &params).unwrap();
    let staged = |histogram| SearchConfig {
        histogram,
        ..SearchConfig::streamed(1024, group, 4, 1, true)
    };
    let recomputed = SearchConfig {
        recompute: true,
        ..SearchConfig::streamed(1024, group, 4, 1, false)
    };
    // And with its timeline (a diagnosis option), which changes nothing in the results and
    // records each row's phases in order.
    let timed = SearchConfig {
        timeline: true,
        ..recomputed
    };
    // Split over the heads (a program a query head, the row's last one writing the
    // union): staged in shared memory, from `work`, recomputed.
    let split = |cfg: SearchConfig| SearchConfig {
        split_heads: true,
        ..cfg
    };
    let from_work = SearchConfig::streamed(1024, group, 2, 1, false);
    let plans = [
        staged(false),
        staged(true),
        recomputed,
        timed,
        split(staged(false)),
        split(staged(true)),
        split(from_work),
        split(recomputed),
    ]
    .map(|cfg| PrunePlan::with_config(&dusk, &top_p::POLICY, &cand, cfg, 0.5, &params).unwrap());
    let s = dusk.device().upload(&scores).unwrap();
    for mut plan in [default].into_iter().chain(plans) {
        // Twice: the look-back's words and a split search's arrivals are back at zero
        // after a launch.
        for _ in 0..2 {
            plan.poison_outputs(&dusk, 0xFF).unwrap();
            plan.run(&dusk, &s).unwrap();
            check_union(&plan, &lens, &heads, group, p);
        }
        if let Some(t) = plan.timeline() {
            for r in t.download().unwrap().chunks(TIMELINE_WORDS) {
                assert!(r[0] > 0 && r[..6].windows(2).all(|w| w[0] <= w[1]), "{r:?}");
            }
        }
    }
}

/// Each candidate row's kept set is the union of its query heads' oracle sets.
fn check_union(plan: &PrunePlan, lens: &[usize], heads: &[Vec<f32>], group: usize, p: f64) {
    let sel_indptr = plan.sel_indptr().download().unwrap();
    let sel = plan.sel_indices().download().unwrap();
    for (r, &n) in lens.iter().enumerate() {
        let mut union = vec![false; n];
        for g in 0..group {
            let w = softmax(&heads[r * group + g], 0.5);
            let o = top_p_oracle(&w, p);
            for j in 0..n {
                union[j] |= o[j];
            }
        }
        let mut kept = vec![false; n];
        for t in &sel[sel_indptr[r] as usize..sel_indptr[r + 1] as usize] {
            kept[*t as usize] = true;
        }
        assert_eq!(
            kept,
            union,
            "candidate row {r} ({n} candidates), {:?}",
            plan.config()
        );
    }
}

#[test]
fn edge_cases() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let p1 = [ParamValues::Uniform(1.0)];
    // Empty row, one candidate, all equal, p = 1 (every positive weight kept), tiny p.
    let rows = vec![
        vec![],
        vec![2.5],
        vec![0.25; 300],
        (0..500).map(|i| -(i as f32) * 0.05).collect::<Vec<_>>(),
    ];
    let (kept, mass, flags) = run(&dusk, &top_p::POLICY, &rows, 1.0, &p1);
    assert!(kept[0].is_empty());
    assert_eq!(mass[0], 0.0);
    assert_eq!(kept[1], vec![true]);
    assert!(kept[2].iter().all(|k| *k), "all equal weights: all kept");
    assert!(
        kept[3].iter().all(|k| *k),
        "p = 1 keeps every positive weight: kept {} of 500, mass {}",
        kept[3].iter().filter(|k| **k).count(),
        mass[3]
    );
    assert!(flags.iter().all(|f| *f == 0));

    let tiny = [ParamValues::Uniform(1e-6)];
    let (kept, _, _) = run(&dusk, &top_p::POLICY, &rows[3..], 1.0, &tiny);
    assert_eq!(
        kept[0].iter().filter(|k| **k).count(),
        1,
        "tiny p: the maximum alone"
    );

    // Ties at the cut stay together: weights 4, 4, 4, 1, 1 (unnormalised); p = 0.5 needs
    // two of the three equal ones, so all three are kept.
    let l4 = (4.0f32).ln();
    let ties = vec![vec![l4, 0.0, l4, 0.0, l4]];
    let (kept, _, _) = run(
        &dusk,
        &top_p::POLICY,
        &ties,
        1.0,
        &[ParamValues::Uniform(0.5)],
    );
    assert_eq!(kept[0], vec![true, false, true, false, true]);

    // NaN and infinite logits: the row keeps everything and is flagged; others unaffected.
    let mut bad = vec![
        vec![0.0f32, 1.0, f32::NAN, 2.0],
        vec![0.0, f32::INFINITY, 1.0],
    ];
    bad.push(vec![0.0, 5.0, 0.0, 0.0]);
    let (kept, mass, flags) = run(
        &dusk,
        &top_p::POLICY,
        &bad,
        1.0,
        &[ParamValues::Uniform(0.5)],
    );
    assert_eq!(flags, vec![1, 1, 0]);
    assert!(kept[0].iter().all(|k| *k) && kept[1].iter().all(|k| *k));
    assert_eq!(kept[2], vec![false, true, false, false]);
    assert_eq!(mass[0], 1.0);
}

#[test]
fn bad_arguments_are_rejected_before_launch() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let cand = TokenLists {
        indptr: vec![0, 3],
        indices: vec![0, 4, 9],
    };
    let arg_of = |r: Result<PrunePlan, DuskError>| match r {
        Err(DuskError::InvalidArgument { arg, .. }) => arg,
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("accepted"),
    };
    for p in [0.0, -0.5, 1.5, f64::NAN] {
        let r = PrunePlan::new(
            &dusk,
            &top_p::POLICY,
            &cand,
            1,
            1.0,
            &[ParamValues::Uniform(p)],
        );
        assert_eq!(arg_of(r), "params", "p = {p}");
    }
    let r = PrunePlan::new(
        &dusk,
        &top_k::POLICY,
        &cand,
        1,
        1.0,
        &[ParamValues::Uniform(0.0)],
    );
    assert_eq!(arg_of(r), "params", "k = 0");
    let r = PrunePlan::new(
        &dusk,
        &top_k::POLICY,
        &cand,
        1,
        1.0,
        &[ParamValues::Uniform(2.5)],
    );
    assert_eq!(arg_of(r), "params", "k = 2.5");
    // An integer parameter given a fraction says that it must be an integer, per row too.
    for values in [ParamValues::Uniform(16.5), ParamValues::PerRow(vec![16.5])] {
        let err = PrunePlan::new(&dusk, &top_k::POLICY, &cand, 1, 1.0, &[values])
            .err()
            .unwrap();
        let e = err.to_string();
        assert_eq!(format!("{err:?}"), e, "Debug prints the same line");
        assert_eq!(
            e,
            "invalid argument `params`: expected an integer for `k` (an i32 parameter of \
             policy `top_k`), found 16.5"
        );
    }
    let r = PrunePlan::new(
        &dusk,
        &top_k::POLICY,
        &cand,
        1,
        1.0,
        &[ParamValues::Uniform(3e9)],
    );
    assert_eq!(arg_of(r), "params", "k = 3e9, past i32");
    let r = PrunePlan::new(&dusk, &top_p::POLICY, &cand, 1, 1.0, &[]);
    assert_eq!(arg_of(r), "params", "missing p");
    let r = PrunePlan::new(
        &dusk,
        &top_p::POLICY,
        &cand,
        1,
        1.0,
        &[ParamValues::PerRow(vec![0.5, 0.5])],
    );
    assert_eq!(arg_of(r), "params", "one p per row");
    let p = [ParamValues::Uniform(0.9)];
    let r = PrunePlan::new(&dusk, &top_p::POLICY, &cand, 0, 1.0, &p);
    assert_eq!(arg_of(r), "group");
    let r = PrunePlan::new(&dusk, &top_p::POLICY, &cand, 1, f32::NAN, &p);
    assert_eq!(arg_of(r), "scale");
    let unsorted = TokenLists {
        indptr: vec![0, 3],
        indices: vec![0, 9, 4],
    };
    let r = PrunePlan::new(&dusk, &top_p::POLICY, &unsorted, 1, 1.0, &p);
    assert_eq!(arg_of(r), "cand");
    let mut plan = PrunePlan::new(&dusk, &top_p::POLICY, &cand, 2, 1.0, &p).unwrap();
    let short = dusk.device().upload(&[0.0f32; 5]).unwrap();
    match plan.run(&dusk, &short) {
        Err(DuskError::InvalidArgument { arg, .. }) => assert_eq!(arg, "scores"),
        other => panic!("short scores: {other:?}"),
    }
}

/// Rows longer than registers hold stream through tiles: checked on rows of 9000 to 20000
/// candidates (group 1 and 2, with an empty and a NaN row among them), and on short rows
/// forced through the streaming kernel with small tiles.
#[test]
fn streaming_search_matches_the_oracle() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let mut rng = SmallRng::seed_from_u64(5);
    for group in [1usize, 2] {
        let lens = [9000usize, 0, 20000, 12345];
        let mut indptr = vec![0i32];
        let mut indices = vec![];
        let mut heads = vec![];
        for &n in &lens {
            indices.extend(0..n as i32);
            indptr.push(indices.len() as i32);
            for g in 0..group {
                let mut r = logits(&mut rng, n, [Shape::Focused, Shape::Diffuse][g % 2]);
                if n == 12345 && g == 0 {
                    r[77] = f32::NAN;
                }
                heads.push(r);
            }
        }
        let cand = TokenLists { indptr, indices };
        let p = 0.9;
        // The default, the weights recomputed from the scores in every pass (or not), and
        // with a group, split over its heads.
        let default = SearchConfig::for_rows(20000, group);
        let mut configs = vec![
            default,
            SearchConfig {
                recompute: !default.recompute,
                ..default
            },
        ];
        if group > 1 {
            configs.push(SearchConfig {
                split_heads: true,
                ..default
            });
        }
        for cfg in configs {
            let mut plan = PrunePlan::with_config(
                &dusk,
                &top_p::POLICY,
                &cand,
                cfg,
                1.0,
                &[ParamValues::Uniform(p)],
            )
            .unwrap();
            assert!(plan.config().stream);
            plan.run(&dusk, &dusk.device().upload(&heads.concat()).unwrap())
                .unwrap();
            check_streamed(&plan, &lens, &heads, group, p);
        }
    }

    let rows: Vec<Vec<f32>> = (0..40)
        .map(|i| {
            let n = rng.random_range(1..=3000);
            logits(
                &mut rng,
                n,
                [Shape::Focused, Shape::Ties, Shape::Denormal][i % 3],
            )
        })
        .collect();
    let lens: Vec<usize> = rows.iter().map(|r| r.len()).collect();
    let cand = TokenLists::leading(&lens);
    let ps: Vec<f64> = (0..rows.len())
        .map(|i| [0.5, 0.9, 0.99, 1.0][i % 4])
        .collect();
    // The weights staged in the global workspace, then in shared memory, then recomputed
    // from the scores in every pass; the first step bisecting, then from the histogram (on
    // 8 warps too: its scan is padded).
    for (shared, recompute, histogram, num_warps) in [
        (false, false, false, 4),
        (false, false, true, 4),
        (true, false, false, 4),
        (true, false, true, 4),
        (false, true, false, 4),
        (false, true, true, 4),
        (false, false, true, 8),
        (true, false, true, 8),
    ] {
        let cfg = SearchConfig {
            block: 1024,
            group: 1,
            num_warps,
            stream: true,
            pivots: 1,
            shared,
            histogram,
            recompute,
            // L2 prefetches ahead of the loads (in bounds, and nothing else changes).
            prefetch: histogram,
            backoff_ns: 0,
            min_programs_per_sm: 0,
            timeline: false,
            split_heads: false,
        };
        let mut plan = PrunePlan::with_config(
            &dusk,
            &top_p::POLICY,
            &cand,
            cfg,
            1.0,
            &[ParamValues::PerRow(ps.clone())],
        )
        .unwrap();
        plan.run(&dusk, &dusk.device().upload(&rows.concat()).unwrap())
            .unwrap();
        let ip = plan.sel_indptr().download().unwrap();
        let sel = plan.sel_indices().download().unwrap();
        for (r, row) in rows.iter().enumerate() {
            let w = softmax(row, 1.0);
            let oracle = top_p_oracle(&w, ps[r]);
            let mut kept = vec![false; row.len()];
            for t in &sel[ip[r] as usize..ip[r + 1] as usize] {
                kept[*t as usize] = true;
            }
            check_kept(&w, &kept, &oracle, near_p(ps[r])).unwrap_or_else(|e| {
                panic!(
                    "streamed row {r} (p {}, shared {shared}, recompute {recompute}, \
                     histogram {histogram}): {e}",
                    ps[r]
                )
            });
        }
    }
    // Rows longer than the shared staging holds are refused before any launch.
    let err = PrunePlan::with_config(
        &dusk,
        &top_p::POLICY,
        &cand,
        SearchConfig {
            block: 1024,
            group: 4,
            num_warps: 4,
            stream: true,
            pivots: 1,
            shared: true,
            histogram: false,
            recompute: false,
            prefetch: false,
            backoff_ns: 0,
            min_programs_per_sm: 0,
            timeline: false,
            split_heads: false,
        },
        1.0,
        &[ParamValues::Uniform(0.9)],
    )
    .err()
    .expect("rows of up to 3000 candidates do not fit 2048 a head");
    assert!(err.to_string().contains("cfg.shared"), "{err}");
}

/// The kept sets of a streamed plan's rows of `lens` candidates against the oracle: each
/// the union of its group's sets, every candidate for a query head with a NaN logit.
fn check_streamed(plan: &PrunePlan, lens: &[usize], heads: &[Vec<f32>], group: usize, p: f64) {
    let ip = plan.sel_indptr().download().unwrap();
    let sel = plan.sel_indices().download().unwrap();
    let flags = plan.flags().download().unwrap();
    for (r, &n) in lens.iter().enumerate() {
        let mut union = vec![false; n];
        for g in 0..group {
            let h = &heads[r * group + g];
            let o = if h.iter().any(|x| x.is_nan()) {
                assert_eq!(flags[r * group + g], 1);
                vec![true; n]
            } else {
                let w = softmax(h, 1.0);
                top_p_oracle(&w, p)
            };
            for j in 0..n {
                union[j] |= o[j];
            }
        }
        let mut kept = vec![false; n];
        for t in &sel[ip[r] as usize..ip[r + 1] as usize] {
            kept[*t as usize] = true;
        }
        assert_eq!(kept, union, "group {group}, row {r} ({n} candidates)");
    }
}

/// Several pivots a step (resident and streamed) keep exactly the oracle's sets too.
#[test]
fn multi_pivot_search_matches_the_oracle() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let mut rng = SmallRng::seed_from_u64(21);
    let rows: Vec<Vec<f32>> = (0..48)
        .map(|i| {
            let n = rng.random_range(1..=1024);
            let shape = [Shape::Focused, Shape::Diffuse, Shape::Ties, Shape::Denormal][i % 4];
            logits(&mut rng, n, shape)
        })
        .collect();
    let ps: Vec<f64> = (0..rows.len())
        .map(|i| [0.5, 0.9, 0.99, 1.0, 1e-3][i % 5])
        .collect();
    let lens: Vec<usize> = rows.iter().map(|r| r.len()).collect();
    let cand = TokenLists::leading(&lens);
    let scores = dusk.device().upload(&rows.concat()).unwrap();
    for (stream, pivots) in [(false, 2), (false, 3), (true, 3), (true, 4)] {
        let cfg = SearchConfig {
            block: 1024,
            group: 1,
            num_warps: 4,
            stream,
            pivots,
            shared: false,
            histogram: stream,
            recompute: pivots == 4,
            prefetch: false,
            backoff_ns: 0,
            min_programs_per_sm: 0,
            timeline: false,
            split_heads: false,
        };
        for (policy, params) in [
            (&top_p::POLICY, vec![ParamValues::PerRow(ps.clone())]),
            (&top_k::POLICY, vec![ParamValues::Uniform(17.0)]),
        ] {
            let mut plan = PrunePlan::with_config(&dusk, policy, &cand, cfg, 1.0, &params).unwrap();
            plan.run(&dusk, &scores).unwrap();
            let ip = plan.sel_indptr().download().unwrap();
            let sel = plan.sel_indices().download().unwrap();
            for (r, row) in rows.iter().enumerate() {
                let w = softmax(row, 1.0);
                let (oracle, p) = if policy.name == "top_p" {
                    (top_p_oracle(&w, ps[r]), ps[r])
                } else {
                    (threshold_oracle(&w, |_, c| c >= 17), 2.0)
                };
                let mut kept = vec![false; row.len()];
                for t in &sel[ip[r] as usize..ip[r + 1] as usize] {
                    kept[*t as usize] = true;
                }
                check_kept(&w, &kept, &oracle, near_p(p)).unwrap_or_else(|e| {
                    panic!(
                        "{} stream {stream} pivots {pivots} row {r}: {e}",
                        policy.name
                    )
                });
            }
        }
    }
}

/// The search writes the CSR list itself: each row finds its place from the rows before it
/// (the look-back words, which every launch leaves zero). One plan run on fresh scores
/// again and again, the rows held in registers and streamed, keeps exactly the oracle's
/// sets every time, with the list's rows back to back from 0.
#[test]
fn a_plan_runs_again_on_fresh_scores() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let mut rng = SmallRng::seed_from_u64(33);
    for longest in [900, 5000] {
        let lens: Vec<usize> = (0..40).map(|_| rng.random_range(0..=longest)).collect();
        let cand = TokenLists::leading(&lens);
        let p = [ParamValues::Uniform(0.9)];
        let mut plan = PrunePlan::new(&dusk, &top_p::POLICY, &cand, 1, 1.0, &p).unwrap();
        for run in 0..3 {
            let rows: Vec<Vec<f32>> = lens
                .iter()
                .map(|&n| logits(&mut rng, n, [Shape::Focused, Shape::Diffuse][run % 2]))
                .collect();
            plan.poison_outputs(&dusk, 0xFF).unwrap();
            plan.run(&dusk, &dusk.device().upload(&rows.concat()).unwrap())
                .unwrap();
            let ip = plan.sel_indptr().download().unwrap();
            let sel = plan.sel_indices().download().unwrap();
            let budgets = plan.budgets().download().unwrap();
            assert_eq!(ip[0], 0);
            for (r, row) in rows.iter().enumerate() {
                assert_eq!(ip[r + 1] - ip[r], budgets[r], "run {run} row {r}: budget");
                let mut kept = vec![false; row.len()];
                for t in &sel[ip[r] as usize..ip[r + 1] as usize] {
                    kept[*t as usize] = true;
                }
                let w = softmax(row, 1.0);
                check_kept(&w, &kept, &top_p_oracle(&w, 0.9), near_p(0.9))
                    .unwrap_or_else(|e| panic!("run {run} row {r} (longest {longest}): {e}"));
            }
        }
    }
}

/// `run_into` writes the kept lists into the caller's buffers (poisoned first), the same
/// lists `run` writes into the plan's, and leaves the plan's untouched; buffers too short
/// are refused before anything runs.
#[test]
fn run_into_writes_the_callers_buffers() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let dev = dusk.device();
    let mut rng = SmallRng::seed_from_u64(41);
    let lens = [300, 0, 17, 1200, 1];
    let cand = TokenLists::leading(&lens);
    let p = [ParamValues::Uniform(0.9)];
    let mut plan = PrunePlan::new(&dusk, &top_p::POLICY, &cand, 1, 1.0, &p).unwrap();
    let rows: Vec<Vec<f32>> = lens
        .iter()
        .map(|&n| logits(&mut rng, n, Shape::Focused))
        .collect();
    let scores = dev.upload(&rows.concat()).unwrap();
    plan.run(&dusk, &scores).unwrap();
    let want_ip = plan.sel_indptr().download().unwrap();
    let want = plan.sel_indices().download().unwrap();
    plan.poison_outputs(&dusk, 0xFF).unwrap();
    let nnz = cand.indices.len();
    let mut ip = dev.upload(&vec![-7i32; lens.len() + 1]).unwrap();
    let mut ix = dev.upload(&vec![-7i32; nnz + 3]).unwrap();
    plan.run_into(&dusk, &scores, &mut ip, &mut ix).unwrap();
    let (ip, ix) = (ip.download().unwrap(), ix.download().unwrap());
    assert_eq!(ip, want_ip);
    let used = want_ip[lens.len()] as usize;
    assert_eq!(ix[..used], want[..used]);
    assert!(plan
        .sel_indptr()
        .download()
        .unwrap()
        .iter()
        .all(|&x| x == -1));
    let mut short = dev.alloc::<i32>(lens.len()).unwrap();
    let mut room = dev.alloc::<i32>(nnz).unwrap();
    let e = plan.run_into(&dusk, &scores, &mut short, &mut room);
    assert!(matches!(
        e,
        Err(DuskError::InvalidArgument {
            arg: "sel_indptr",
            ..
        })
    ));
    let mut ip = dev.alloc::<i32>(lens.len() + 1).unwrap();
    let mut small = dev.alloc::<i32>(nnz - 1).unwrap();
    let e = plan.run_into(&dusk, &scores, &mut ip, &mut small);
    assert!(matches!(
        e,
        Err(DuskError::InvalidArgument {
            arg: "sel_indices",
            ..
        })
    ));
}
