//! SparQ's part of `gpu-check selectors` (`dusk::kernels::selectors::sparq`):
//!
//! 1. SparQ on small shapes and on the benchmark shapes against Algorithm 1 in f64
//!    (`SparqBench::check`: components, scores, kept tokens, token lists, alpha, the mean
//!    of V), outputs poisoned first;
//! 2. the selection (query, approximate scores, device top-k, alpha) at 32k context, batch
//!    32 and 64, GQA 32/8 and MHA 32/32, head_dim 128, pages of 16, the transposed copy in
//!    blocks of 256, r 16, k = N/8 with a window of k/4, timed by the harness beside the same computation in PyTorch (`--sparq-peers`,
//!    written by `benches/baselines/sparq_peers.py` in the same command); the approximate
//!    scores as a fraction of the copy rate on the bytes they read and on all they move;
//! 3. the score kernel's configurations (`ScoreConfig::alternatives`: tokens a program,
//!    components in flight), each checked against the plan's scoring and timed; at batch
//!    32, the approximate scores with the transposed copy in blocks of 16 (the cache's
//!    pages) and 64 tokens beside the default 256, and the top-k's streamed configurations
//!    beside its default.

use crate::common::{case_json, PeerTime, Res};
use dusk::kernels::ops::Dusk;
use dusk::kernels::selectors::sparq_bench::{ScoreConfig, SparqBench, SparqCase, SparqStep};
use dusk::kernels::selectors::{Budget, TopKConfig};
use serde_json::{json, Value};

/// The small shapes checked in full: (batch, context, q heads, KV heads, r, k, window).
const SMALL: [(usize, usize, usize, usize, usize, usize, usize); 4] = [
    (1, 1000, 8, 2, 16, 128, 32),
    (3, 4096, 32, 8, 16, 512, 128),
    (2, 333, 16, 16, 12, 40, 10),
    (4, 20000, 32, 4, 32, 2500, 600),
];

/// Checks SparQ on the small shapes (every row).
pub fn check_small(dusk: &Dusk, seed: u64) -> Res<()> {
    for (i, &(batch, context, hq, hkv, r, k, window)) in SMALL.iter().enumerate() {
        let case = SparqCase {
            batch,
            context,
            num_q_heads: hq,
            num_kv_heads: hkv,
            r,
            k: Budget::Tokens(k),
            window,
            seed: seed ^ (0x5a << 8) ^ i as u64,
            ..SparqCase::default()
        };
        let mut bench = SparqBench::new(dusk, &case, |_| {})?;
        let c = bench.check(dusk, usize::MAX)?;
        println!(
            "  sparq batch {batch} context {context} heads {hq}/{hkv} r {r} k {k} window {window}: {} rows equal, score error {:.1e}, alpha error {:.1e}, {} near-ties",
            c.rows, c.max_score_error, c.max_alpha_error, c.near_ties
        );
    }
    Ok(())
}

/// The benchmark cases whose names `wanted` takes, checked on 16 rows each then timed;
/// `peers` is sparq_peers.py's JSON, `attention` the attention peers' (FlashInfer's dense
/// decode of the same shapes).
pub fn cases(
    dusk: &Dusk,
    seed: u64,
    copy_gbps: f64,
    peers: Option<&Value>,
    attention: Option<&Value>,
    wanted: impl Fn(&str) -> bool,
) -> Res<Vec<Value>> {
    let find = |file: Option<&Value>, name: &str| {
        file.and_then(|p| {
            p["cases"]
                .as_array()?
                .iter()
                .find(|c| c["case"] == name)
                .cloned()
        })
    };
    let mut out = vec![];
    for batch in [32usize, 64] {
        for hkv in [8usize, 32] {
            let name = format!("sparq_b{batch}_h32x{hkv}_ctx32768_r16_k8th");
            if !wanted(&name) {
                continue;
            }
            let case = SparqCase {
                batch,
                num_kv_heads: hkv,
                seed: seed ^ (batch * 1000 + hkv) as u64,
                ..SparqCase::default()
            };
            let mut bench = SparqBench::new(dusk, &case, |_| {})?;
            let c = bench.check(dusk, 16)?;
            let t = bench.time(dusk)?;
            let k_tokens = case.context / 8;
            let shape = json!({"batch": batch, "num_q_heads": 32, "num_kv_heads": hkv, "head_dim": 128,
                               "page_size": 16, "block_size": case.block_size, "context": 32768, "r": case.r, "k": k_tokens,
                               "window": case.window});
            let dense = format!("dense_b{batch}_h32x{hkv}_ctx32768");
            let fi_dense = PeerTime::from_case(find(attention, &dense).as_ref(), "flashinfer");
            let select_us = t.select.median_us();
            let score_us = t.score.median_us();
            let rate = |bytes: usize| bytes as f64 / (score_us * 1e-6) / 1e9 / copy_gbps;
            println!(
                "  {name}: select {select_us:.1} us ({}); query {:.1}, scores {score_us:.1} us = {:.1}% of copy on the bytes read ({:.1}% on all moved), top-k {:.1}, alpha {:.1} us; {} of FlashInfer's dense decode",
                t.select.timing,
                t.query.median_us(),
                100.0 * rate(bench.score_read_bytes()),
                100.0 * rate(bench.score_bytes()),
                t.top_k.median_us(),
                t.weigh.median_us(),
                fi_dense.us.map_or("n/a".into(), |d| format!("{:.1}%", 100.0 * select_us / d)),
            );
            let mut extra = json!({
                "rows_checked": c.rows,
                "max_score_error": c.max_score_error,
                "max_alpha_error": c.max_alpha_error,
                "near_ties": c.near_ties,
                "query_us": t.query.median_us(),
                "score_us": score_us,
                "score_read_bytes": bench.score_read_bytes(),
                "score_bytes": bench.score_bytes(),
                "score_read_frac_of_copy_bw": rate(bench.score_read_bytes()),
                "score_frac_of_copy_bw": rate(bench.score_bytes()),
                "score_timing": t.score.timing.as_str(),
                "score_spread_us": crate::common::spread(t.score.samples_us.clone()),
                "top_k_us": t.top_k.median_us(),
                "weigh_us": t.weigh.median_us(),
                "score_tile": bench.plan(0).tile(),
                "top_k_config": format!("{:?}", bench.plan(0).top_k_plan().config()),
                "flashinfer_dense_us": fi_dense.us,
                "flashinfer_dense_timing": fi_dense.timing,
                "select_over_flashinfer_dense": fi_dense.us.map(|d| select_us / d),
            });
            let sweep = if batch == 32 {
                sweep(
                    dusk,
                    &case,
                    copy_gbps,
                    (case.block_size, &t.score, &t.top_k),
                    &bench,
                )?
            } else {
                json!({})
            };
            let configs = score_configs(dusk, &case, copy_gbps, &bench)?;
            if let (Some(o), Some(w)) = (extra.as_object_mut(), sweep.as_object()) {
                o.extend(w.clone());
                o.insert("score_by_config".into(), configs);
            }
            let peer = find(peers, &name);
            out.push(case_json(
                &name,
                shape,
                &t.select,
                "torch",
                &PeerTime::from_case(peer.as_ref(), "torch"),
                bench.select_bytes() as f64,
                copy_gbps,
                extra,
            ));
        }
    }
    Ok(out)
}

/// The approximate scores with other block sizes of the transposed copy, and the top-k with
/// its other streamed configurations, at `case`'s shape (`default`: the block size and the
/// timings of `bench`, the case as planned).
fn sweep(
    dusk: &Dusk,
    case: &SparqCase,
    copy_gbps: f64,
    default: (usize, &dusk::runtime::Measured, &dusk::runtime::Measured),
    bench: &SparqBench,
) -> Res<Value> {
    let (block_size, score, top_k) = default;
    let rate =
        |b: &SparqBench, us: f64| b.score_read_bytes() as f64 / (us * 1e-6) / 1e9 / copy_gbps;
    let mut by_block = serde_json::Map::new();
    by_block.insert(
        block_size.to_string(),
        json!({"score_us": score.median_us(), "score_read_frac_of_copy_bw": rate(bench, score.median_us())}),
    );
    for bs in [16usize, 64] {
        let mut b = SparqBench::new(
            dusk,
            &SparqCase {
                block_size: bs,
                ..*case
            },
            |_| {},
        )?;
        b.check(dusk, 2)?;
        let m = b.time_step(dusk, SparqStep::Score)?;
        println!(
            "    blocks of {bs}: scores {:.1} us = {:.1}% of copy on the bytes read",
            m.median_us(),
            100.0 * rate(&b, m.median_us())
        );
        by_block.insert(
            bs.to_string(),
            json!({"score_us": m.median_us(), "score_read_frac_of_copy_bw": rate(&b, m.median_us())}),
        );
    }
    let mut by_config = serde_json::Map::new();
    by_config.insert(
        format!("{:?}", bench.plan(0).top_k_plan().config()),
        json!(top_k.median_us()),
    );
    // Streamed by counting two bits a pass (tiles of 4096 on 8 warps: the default before the
    // radix select).
    for (tile, num_warps) in [(1024usize, 4u32), (256, 1), (4096, 8)] {
        let cfg = TopKConfig {
            tile,
            num_warps,
            resident: false,
            radix: false,
        };
        let mut b = SparqBench::new(dusk, case, |c| *c = cfg)?;
        b.check(dusk, 2)?;
        let m = b.time_step(dusk, SparqStep::TopK)?;
        println!("    top-k {cfg:?}: {:.1} us", m.median_us());
        by_config.insert(format!("{cfg:?}"), json!(m.median_us()));
    }
    Ok(json!({"score_by_block_size": by_block, "top_k_us_by_config": by_config}))
}

/// The score kernel's configurations (`ScoreConfig::alternatives`, the plan's first), each
/// checked against the plan's scoring and timed, over `bench`'s state.
fn score_configs(dusk: &Dusk, case: &SparqCase, copy_gbps: f64, bench: &SparqBench) -> Res<Value> {
    let mut by_score = serde_json::Map::new();
    let frac = |bytes: usize, us: f64| bytes as f64 / (us * 1e-6) / 1e9 / copy_gbps;
    for cfg in ScoreConfig::alternatives(case.num_q_heads / case.num_kv_heads) {
        let m = bench.time_score_config(dusk, cfg)?;
        let us = m.median_us();
        let (read, moved) = (bench.score_read_bytes(), bench.score_config_bytes(&cfg));
        println!(
            "    scores {}: {us:.1} us = {:.1}% of copy on the bytes read ({:.1}% on all moved)",
            cfg.label(),
            100.0 * frac(read, us),
            100.0 * frac(moved, us)
        );
        by_score.insert(
            cfg.label(),
            json!({"score_us": us, "score_read_frac_of_copy_bw": frac(read, us),
                   "score_frac_of_copy_bw": frac(moved, us), "score_timing": m.timing.as_str()}),
        );
    }
    Ok(Value::Object(by_score))
}
