//! The GPU check and benchmark of the fused threshold search, run on the device machine:
//!
//! 1. top-p on thousands of fresh random rows (focused, diffuse, tied, denormal weights;
//!    lengths 1 to 8192; outputs poisoned first) against the sort-based oracle; GQA (group
//!    4) against the union of the same kernel's per-head sets; NaN rows flagged;
//! 2. device-to-device copy bandwidth;
//! 3. 2048 rows (batch 64 x 32 heads) of 8192, 32768 and 4096 candidates, p = 0.9, scores
//!    rotated past twice the L2 (the harness's rule), beside the peers' times (`--peers`,
//!    written by `benches/baselines/topp_peers.py` in the same command). `--profile N`
//!    skips the checks and the sweep and times the default for rows of N candidates only
//!    (for ncu; `--config TEXT` changes the timed default in the shared config text, e.g.
//!    `histogram=false` or `backoff_ns=1000,min_programs_per_sm=3`; `--timeline` each row's
//!    phases from the GPU's clock); `--no-sweep`
//!    times the defaults only; `--focus F` multiplies the timed rows' logits by F (1: the
//!    diffuse rows that keep ~86% of their candidates; 12: attention as focused as
//!    Twilight's, ~2% kept at 32768), the cases then named `top_p_focus{F}_...`, each with
//!    the fraction of candidates the default kept.
//!
//!     gpu-check threshold --peers peers.json --out benches/results/threshold_search.json

use crate::common::{case_json, copy_gbps, spread, Common, PeerTime, Res};
use clap::Args;
use dusk::kernels::ops::Dusk;
use dusk::kernels::paged::TokenLists;
use dusk::kernels::policies::top_p;
use dusk::kernels::prune::{ParamValues, PrunePlan};
use dusk::kernels::reference::{check_kept, softmax, top_p_oracle};
use dusk::kernels::threshold::{SearchConfig, SHARED_ROW};
use dusk::kernels::timeline::TIMELINE_WORDS;
use dusk::runtime::{Device, Measured};
use dusk_aot::config_text::ConfigText;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

fn normal(rng: &mut SmallRng) -> f32 {
    let (u, v): (f32, f32) = (rng.random_range(1e-7..1.0), rng.random());
    (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
}

/// Rows of logits: attention-like (a diffuse background with a few heavy tokens), diffuse,
/// tied, or with weights down in the denormals.
fn logits(rng: &mut SmallRng, n: usize, kind: usize) -> Vec<f32> {
    (0..n)
        .map(|_| match kind % 4 {
            0 => normal(rng) * 2.0 + if rng.random_bool(0.01) { 6.0 } else { 0.0 },
            1 => rng.random_range(-1.0..1.0),
            2 => rng.random_range(0..5) as f32 * 0.5,
            _ => rng.random_range(-120.0..0.0),
        })
        .collect()
}

/// Configurations timed beside the default for rows of `n` candidates: the first step
/// from the histogram throughout (it won at every length), the weights staged in shared
/// memory where rows fit, in `work`, or recomputed from the scores.
fn sweep(n: usize) -> Vec<SearchConfig> {
    let streamed =
        |tile, warps, pivots, shared| SearchConfig::streamed(tile, 1, warps, pivots, shared);
    let mut out = vec![];
    if n <= SHARED_ROW {
        for (tile, warps) in [(1024, 2), (1024, 4), (2048, 4), (1024, 8)] {
            for pivots in [1, 2] {
                out.push(streamed(tile, warps, pivots, true));
            }
        }
    }
    for (tile, warps) in [(1024, 2), (1024, 4), (2048, 4), (4096, 8)] {
        out.push(streamed(tile, warps, 1, false));
    }
    for (tile, warps) in [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (2048, 16)] {
        for prefetch in [false, true] {
            out.push(SearchConfig {
                recompute: true,
                prefetch,
                ..streamed(tile, warps, 1, false)
            });
        }
    }
    for (tile, warps) in [(1024, 4), (1024, 2)] {
        out.push(SearchConfig {
            prefetch: true,
            backoff_ns: 0,
            ..streamed(tile, warps, 1, n <= SHARED_ROW)
        });
    }
    // Registers capped so that more programs fit an SM.
    for (tile, warps, programs) in [(2048, 8, 2), (2048, 8, 3), (2048, 8, 4), (2048, 4, 6)] {
        out.push(SearchConfig {
            recompute: true,
            prefetch: true,
            backoff_ns: 0,
            min_programs_per_sm: programs,
            ..streamed(tile, warps, 1, false)
        });
    }
    out
}

/// Each row's kept set, from the plan's CSR output.
fn kept_sets(plan: &PrunePlan, lens: &[usize]) -> Res<Vec<Vec<bool>>> {
    let ip = plan.sel_indptr().download()?;
    let sel = plan.sel_indices().download()?;
    let budgets = plan.budgets().download()?;
    let mut out = vec![];
    for (r, &n) in lens.iter().enumerate() {
        let toks = &sel[ip[r] as usize..ip[r + 1] as usize];
        if toks.len() as i32 != budgets[r] || toks.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!("row {r}: budget {} or order wrong", budgets[r]).into());
        }
        let mut k = vec![false; n];
        for &t in toks {
            *k.get_mut(t as usize).ok_or("position out of range")? = true;
        }
        out.push(k);
    }
    Ok(out)
}

/// Rows of `lens` candidates searched with `group` query heads a row (p = 0.9): each
/// row's kept set must be the union of the same scores searched one head at a time (the
/// scores are laid out alike).
fn union_equals_per_head(
    dusk: &Dusk,
    rng: &mut SmallRng,
    lens: &[usize],
    group: usize,
    scale: f32,
    label: &str,
) -> Res<()> {
    let per_head: Vec<usize> = lens.iter().flat_map(|&n| vec![n; group]).collect();
    let scores: Vec<f32> = per_head
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| logits(rng, n, i))
        .collect();
    let s = dusk.device().upload(&scores)?;
    let p = [ParamValues::Uniform(0.9)];
    let plan = |lens: &[usize], group| {
        PrunePlan::new(
            dusk,
            &top_p::POLICY,
            &TokenLists::leading(lens),
            group,
            scale,
            &p,
        )
    };
    let mut heads = plan(&per_head, 1)?;
    heads.run(dusk, &s)?;
    let one = kept_sets(&heads, &per_head)?;
    let mut united = plan(lens, group)?;
    united.poison_outputs(dusk, 0xFF)?;
    united.run(dusk, &s)?;
    for (r, u) in kept_sets(&united, lens)?.iter().enumerate() {
        let want: Vec<bool> = (0..lens[r])
            .map(|j| (0..group).any(|g| one[r * group + g][j]))
            .collect();
        if *u != want {
            return Err(format!("{label} row {r}: union differs from the per-head sets").into());
        }
    }
    Ok(())
}

/// Top-p on `rows` random rows against the oracle; GQA unions against per-head runs.
fn check(dusk: &Dusk, rng: &mut SmallRng, rows: usize) -> Res<(usize, usize)> {
    let scale = 1.0 / (128f32).sqrt();
    let lens: Vec<usize> = (0..rows)
        .map(|i| match i % 5 {
            0 => rng.random_range(1..=16),
            1 => 8192,
            _ => rng.random_range(1..=8192),
        })
        .collect();
    let rows_s: Vec<Vec<f32>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| logits(rng, n, i / 5))
        .collect();
    let ps: Vec<f64> = (0..rows)
        .map(|_| [0.5, 0.85, 0.9, 0.95, 0.99, 1.0, 1e-4][rng.random_range(0..7)])
        .collect();
    let scores: Vec<f32> = rows_s.concat();
    let cand = TokenLists::leading(&lens);
    let s = dusk.device().upload(&scores)?;
    let mut near_ties = 0;
    // The default configuration (rows of 8192 stream), the rows held in registers, and
    // the weights staged in shared memory.
    let resident = SearchConfig {
        block: 8192,
        group: 1,
        num_warps: 16,
        stream: false,
        pivots: 1,
        shared: false,
        histogram: false,
        recompute: false,
        prefetch: false,
        backoff_ns: 0,
        min_programs_per_sm: 0,
        timeline: false,
        split_heads: false,
    };
    let shared = SearchConfig {
        block: 2048,
        num_warps: 4,
        stream: true,
        shared: true,
        ..resident
    };
    let streamed = SearchConfig::streamed(2048, 1, 4, 1, false);
    // Recomputed weights, with L2 prefetches (memcheck sees their addresses stay in rows).
    let recomputed = SearchConfig {
        recompute: true,
        prefetch: true,
        backoff_ns: 0,
        ..streamed
    };
    for cfg in [
        None,
        Some(resident),
        Some(shared),
        Some(streamed),
        Some(recomputed),
    ] {
        let params = [ParamValues::PerRow(ps.clone())];
        let mut plan = match cfg {
            None => PrunePlan::new(dusk, &top_p::POLICY, &cand, 1, scale, &params)?,
            Some(c) => PrunePlan::with_config(dusk, &top_p::POLICY, &cand, c, scale, &params)?,
        };
        plan.poison_outputs(dusk, 0xFF)?;
        plan.run(dusk, &s)?;
        dusk.device().synchronize()?;
        let label = format!(
            "{}{}",
            match (
                plan.config().stream,
                plan.config().shared,
                plan.config().recompute
            ) {
                (true, true, _) => "staged in shared memory",
                (true, false, true) => "streamed, weights recomputed",
                (true, false, false) => "streamed",
                (false, _, _) => "resident",
            },
            if plan.config().histogram {
                ", histogram"
            } else {
                ""
            }
        );
        let kept = kept_sets(&plan, &lens).map_err(|e| format!("{label}: {e}"))?;
        let mass = plan.kept_mass().download()?;
        for r in 0..rows {
            let w = softmax(&rows_s[r], scale as f64);
            let oracle = top_p_oracle(&w, ps[r]);
            let p = ps[r];
            check_kept(&w, &kept[r], &oracle, |b, a| {
                (b - p).abs() < 1e-5 || (a - p).abs() < 1e-5
            })
            .map_err(|e| format!("{label} row {r} (n {}, p {p}): {e}", lens[r]))?;
            near_ties += (kept[r] != oracle) as usize;
            // The kept set holds p of the mass; the reported mass is that set's, as two f32
            // sums of the same weights in different orders (the kept ones over z) give it:
            // within their rounding bound, n ulps.
            let exact: f64 = (0..w.len()).filter(|&j| kept[r][j]).map(|j| w[j]).sum();
            if exact < p.min(1.0) - 1e-5 {
                return Err(format!("{label} row {r}: kept mass {exact} below p {p}").into());
            }
            let rounding = lens[r] as f64 * f32::EPSILON as f64 * exact + 1e-7;
            if (mass[r] as f64 - exact).abs() > rounding {
                return Err(format!(
                    "{label} row {r}: reported kept mass {} where the kept set holds {exact}",
                    mass[r]
                )
                .into());
            }
        }
    }

    // GQA: groups of 4 query heads over one candidate list; the union must equal the union
    // of the same rows searched one head at a time (the scores layout is the same).
    let groups = rows / 4;
    union_equals_per_head(dusk, rng, &lens[..groups], 4, scale, "GQA")?;

    // Rows longer than registers hold stream (128k candidates among them): group 1 against
    // the oracle, group 2 against the union of per-head runs.
    let long = [9000usize, 33000, 0, 131072, 20000];
    let rows_l: Vec<Vec<f32>> = long
        .iter()
        .enumerate()
        .map(|(i, &n)| logits(rng, n, i))
        .collect();
    let s = dusk.device().upload(&rows_l.concat())?;
    let ps_l = [0.9, 0.5, 0.9, 0.95, 1.0];
    let mut plan = PrunePlan::new(
        dusk,
        &top_p::POLICY,
        &TokenLists::leading(&long),
        1,
        scale,
        &[ParamValues::PerRow(ps_l.to_vec())],
    )?;
    if !plan.config().stream {
        return Err("long rows should stream".into());
    }
    plan.poison_outputs(dusk, 0xFF)?;
    plan.run(dusk, &s)?;
    let kept = kept_sets(&plan, &long)?;
    for (r, row) in rows_l.iter().enumerate() {
        let w = softmax(row, scale as f64);
        let oracle = top_p_oracle(&w, ps_l[r]);
        let p = ps_l[r];
        check_kept(&w, &kept[r], &oracle, |b, a| {
            (b - p).abs() < 1e-5 || (a - p).abs() < 1e-5
        })
        .map_err(|e| format!("long row {r} (n {}): {e}", long[r]))?;
    }
    union_equals_per_head(dusk, rng, &long, 2, scale, "streamed GQA")?;

    // A NaN row is flagged and keeps all; its neighbours are unaffected.
    let mut bad = logits(rng, 300, 0);
    bad[17] = f32::NAN;
    let good = logits(rng, 300, 0);
    let s = dusk.device().upload(&[bad, good.clone()].concat())?;
    let mut plan = PrunePlan::new(
        dusk,
        &top_p::POLICY,
        &TokenLists::leading(&[300, 300]),
        1,
        scale,
        &[ParamValues::Uniform(0.9)],
    )?;
    plan.poison_outputs(dusk, 0xFF)?;
    plan.run(dusk, &s)?;
    let kept = kept_sets(&plan, &[300, 300])?;
    let flags = plan.flags().download()?;
    let w = softmax(&good, scale as f64);
    let oracle = top_p_oracle(&w, 0.9);
    if flags != [1, 0] || !kept[0].iter().all(|k| *k) || kept[1] != oracle {
        return Err("NaN row handling".into());
    }
    Ok((2 * rows + groups + 2 * long.len(), near_ties))
}

/// `gpu-check threshold`'s options.
#[derive(Args, Debug)]
pub struct ThresholdArgs {
    #[command(flatten)]
    common: Common,
    /// Rows checked against the oracle (default 4000 on the GPU, 60 on the CPU).
    #[arg(long)]
    rows: Option<usize>,
    /// No checks and no sweep: time the default for rows of N candidates only (for ncu).
    #[arg(long, value_name = "N")]
    profile: Option<usize>,
    /// Multiply the timed rows' logits by F (1: diffuse rows keeping ~86% of their
    /// candidates; 12: rows as focused as Twilight's, ~2% kept at 32768).
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    focus: f32,
    /// Time the defaults only.
    #[arg(long)]
    no_sweep: bool,
    /// Overrides on the timed default, in the shared config text (e.g.
    /// `histogram=false,num_warps=8`). Keys: block, num_warps, stream, pivots, shared,
    /// histogram, recompute, prefetch, backoff_ns, min_programs_per_sm, timeline, split_heads.
    #[arg(long, value_name = "CONFIG")]
    config: Option<String>,
    /// A configuration to time beside the default, besides the built-in sweep (config
    /// text; repeat the option for more).
    #[arg(long, value_name = "CONFIG")]
    sweep: Vec<String>,
    /// Each row's phases from the GPU's clock (with --profile).
    #[arg(long)]
    timeline: bool,
}

pub fn run(args: &ThresholdArgs) -> Res<()> {
    let dev = Device::best();
    println!("device: {}", dev.name());
    let dusk = Dusk::new(dev.clone())?;
    let mut rng = SmallRng::seed_from_u64(args.common.seed_or(0x7095));
    let rows = match args.rows {
        Some(r) => r,
        None if dev.is_gpu() => 4000,
        None => 60,
    };
    // `--profile N`: no checks, only the timing of rows of N candidates (for ncu).
    let profile = args.profile;
    let (checked, near) = if profile.is_some() {
        (0, 0)
    } else {
        check(&dusk, &mut rng, rows)?
    };
    println!("threshold search: {checked} rows agree with the oracle ({near} differ at a cut within rounding of p)");
    if args.common.check_only {
        println!("all checks passed");
        return Ok(());
    }
    if !dev.is_gpu() {
        return Err("timing needs a GPU (run with --check-only on the CPU)".into());
    }

    let copy_gbps = copy_gbps(&dev)?;

    let peers = args.common.peers()?;
    let scale = 1.0 / (128f32).sqrt();
    let focus = args.focus;
    let focus_tag = if focus == 1.0 {
        String::new()
    } else {
        format!("focus{focus}_")
    };
    if let Some(p) = &peers {
        let peer_focus = p["focus"].as_f64().unwrap_or(1.0);
        if peer_focus != focus as f64 {
            return Err(
                format!("--peers timed rows of focus {peer_focus}, these are {focus}").into(),
            );
        }
    }
    let mut cases = vec![];
    let sizes = match profile {
        Some(n) => vec![n],
        None => vec![8192usize, 32768, 4096],
    };
    for n in sizes {
        let (batch, heads) = (64usize, 32usize);
        let rows = batch * heads;
        let lens = vec![n; rows];
        let bytes = (rows * n * 4) as f64;
        let sets: Vec<_> = (0..dev.rotation_sets(bytes as usize))
            .map(|_| {
                let s: Vec<f32> = (0..rows)
                    .flat_map(|_| logits(&mut rng, n, 0))
                    .map(|x| x * focus)
                    .collect();
                dev.upload(&s)
            })
            .collect::<Result<_, _>>()?;
        let mut cfg = SearchConfig::for_rows(n, 1);
        if let Some(text) = &args.config {
            cfg.apply_text(text).map_err(|e| format!("--config: {e}"))?;
        }
        cfg.timeline |= args.timeline;
        let mut plan = PrunePlan::with_config(
            &dusk,
            &top_p::POLICY,
            &TokenLists::leading(&lens),
            cfg,
            scale,
            &[ParamValues::Uniform(0.9)],
        )?;
        let ours = dev.time_calls(sets.len(), |i| plan.run(&dusk, &sets[i]))?;
        let us = ours.median_us();
        if let Some(words) = plan.timeline() {
            timeline(&words.download()?);
        }
        // The last run's budgets: what these rows keep (the output's bytes follow it).
        let kept = plan.budgets().download()?;
        let kept_fraction = kept.iter().map(|&b| b as f64).sum::<f64>() / (rows * n) as f64;
        let gbps = bytes / (us * 1e-6) / 1e9;
        // Reading the scores once at the copy rate (bytes moved per second, read + write).
        let read_us = bytes / (copy_gbps * 1e9) * 1e6;
        println!(
            "top-p {rows} rows x {n}: {us:.1} us ({}); reading the scores once at the copy rate: {read_us:.1} us ({:.2}x); {:.1}% of copy BW; {:.2}% of the candidates kept",
            ours.timing,
            us / read_us,
            100.0 * gbps / copy_gbps,
            100.0 * kept_fraction
        );
        // Other configurations beside the default, same inputs (tuning's raw material).
        let mut others = vec![];
        let mut sweep = if profile.is_some() || args.no_sweep {
            vec![]
        } else {
            sweep(n)
        };
        for text in &args.sweep {
            let base = SearchConfig::for_rows(n, 1);
            sweep.push(base.with_text(text).map_err(|e| format!("--sweep: {e}"))?);
        }
        for cfg in sweep {
            let mut alt = PrunePlan::with_config(
                &dusk,
                &top_p::POLICY,
                &TokenLists::leading(&lens),
                cfg,
                scale,
                &[ParamValues::Uniform(0.9)],
            )?;
            let t: Measured = dev.time_calls(sets.len(), |i| alt.run(&dusk, &sets[i]))?;
            let name = cfg.to_text();
            println!("  {name}: {:.1} us", t.median_us());
            others.push(json!({"config": name, "us": t.median_us(), "timing": t.timing.as_str()}));
        }
        let pc = peers.as_ref().and_then(|p| {
            p["cases"]
                .as_array()?
                .iter()
                .find(|c| c["n"] == n && c["rows"] == rows)
        });
        for name in ["flashinfer", "torch", "triton"] {
            cases.push(case_json(
                &format!("top_p_{focus_tag}b{batch}_h{heads}_n{n}_vs_{name}"),
                json!({"batch": batch, "num_q_heads": heads, "candidates": n, "p_permille": 900, "logit_focus": focus}),
                &ours,
                name,
                &PeerTime::from_case(pc, name),
                bytes,
                copy_gbps,
                json!({"kept_fraction": kept_fraction, "time_over_one_read": us / read_us,
                       "other_configs_us": others}),
            ));
        }
    }
    args.common.write_results(
        &dev,
        copy_gbps,
        peers.as_ref(),
        json!({"checked_rows": checked, "near_tie_rows": near,
               "triton_rows_equal_to_sort": peers.as_ref().map(|p| p["cases"].clone())}),
        cases,
    )
}

/// Where a search's time goes, row by row (`--timeline`, with `--profile N`): each phase's
/// duration over the rows (us: min / p10 / p50 / p90 / max) and its share of the rows'
/// summed time, from the records of the last run (see [`SearchConfig::timeline`]).
fn timeline(words: &[i64]) {
    let recs: Vec<&[i64]> = words.chunks(TIMELINE_WORDS).collect();
    let t0 = recs.iter().map(|r| r[0]).min().unwrap_or(0);
    let end = recs.iter().map(|r| r[5]).max().unwrap_or(t0);
    let total: f64 = recs.iter().map(|r| (r[5] - r[0]) as f64).sum();
    println!(
        "timeline ({} rows, {:.1} us from the first start to the last end):",
        recs.len(),
        (end - t0) as f64 / 1e3
    );
    let starts: Vec<f64> = recs.iter().map(|r| (r[0] - t0) as f64 / 1e3).collect();
    println!("  starts                    {}", spread(starts));
    for (name, a, b) in [
        ("pass 1 (maximum)", 0, 1),
        ("pass 2 (weights, histogram)", 1, 2),
        ("search (budget known)", 2, 3),
        ("to its place in the list", 3, 4),
        ("compaction (staged: copy)", 4, 5),
        ("whole row", 0, 5),
    ] {
        let d: Vec<f64> = recs.iter().map(|r| (r[b] - r[a]) as f64 / 1e3).collect();
        let share = 100.0 * d.iter().sum::<f64>() * 1e3 / total;
        println!("  {name:<27} {} ({share:.0}% of the rows' time)", spread(d));
    }
}
