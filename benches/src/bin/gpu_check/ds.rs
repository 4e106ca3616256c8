//! Double Sparsity's part of `gpu-check selectors` (`dusk::kernels::selectors::ds`):
//!
//! 1. DS on small shapes and on the benchmark shapes against the host references (token
//!    scores in f64, tokens equal to the sort-based top-k), outputs poisoned first;
//! 2. DS's selection (label scores, device top-k over tokens) at 32k context, batch 32 and
//!    64, GQA 32/8 and MHA 32/32, r = 16, budget N/4 (the first 4 and last 64 tokens
//!    always kept), timed by the harness beside the same computation in PyTorch
//!    (`--ds-peers`, written by `benches/baselines/ds_peers.py` in the same command); the
//!    scoring alone as a fraction of the copy rate on the bytes it moves.

use crate::common::{case_json, PeerTime, Res};
use dusk::kernels::ops::Dusk;
use dusk::kernels::selectors::ds_bench::{DsBench, DsCase};
use serde_json::{json, Value};

/// The checks on small shapes (sequences shorter than a tile and longer, every group the
/// benchmark uses, other label widths, a window).
pub fn check(dusk: &Dusk, seed: u64) -> Res<()> {
    let small = [
        (1usize, 1000usize, 8usize, 2usize, 16usize),
        (3, 4096, 32, 8, 16),
        (2, 333, 16, 16, 8),
        (4, 20000, 32, 4, 32),
    ];
    for (i, &(batch, context, hq, hkv, r)) in small.iter().enumerate() {
        let case = DsCase {
            batch,
            context,
            num_q_heads: hq,
            num_kv_heads: hkv,
            r,
            seed: seed ^ (0xd5 + i as u64),
            ..DsCase::default()
        };
        let mut bench = DsBench::new(dusk, &case)?;
        let rep = bench.check(dusk, usize::MAX)?;
        println!(
            "  ds batch {batch} context {context} heads {hq}/{hkv} r {r}: {} rows equal, score error {:.1e}",
            rep.rows, rep.max_score_error
        );
    }
    Ok(())
}

/// The timed cases whose names `wanted` accepts, each checked first.
pub fn cases(
    dusk: &Dusk,
    seed: u64,
    copy_gbps: f64,
    peers: Option<&Value>,
    attention: Option<&Value>,
    wanted: impl Fn(&str) -> bool,
) -> Res<Vec<Value>> {
    let mut out = vec![];
    for batch in [32usize, 64] {
        for hkv in [8usize, 32] {
            let name = format!("ds_b{batch}_h32x{hkv}_ctx32768_r16_quarter");
            if !wanted(&name) {
                continue;
            }
            let case = DsCase {
                batch,
                num_kv_heads: hkv,
                seed: seed ^ (batch * 100 + hkv) as u64,
                ..DsCase::default()
            };
            let mut bench = DsBench::new(dusk, &case)?;
            let rep = bench.check(dusk, 16)?;
            let t = bench.time(dusk)?;
            let shape = json!({"batch": batch, "num_q_heads": 32, "num_kv_heads": hkv, "head_dim": 128,
                               "page_size": 16, "context": 32768, "r": 16, "budget_pct": 25,
                               "sink": case.options.sink, "recent": case.options.recent});
            let find = |file: Option<&Value>, case: &str| -> Option<Value> {
                file?["cases"]
                    .as_array()?
                    .iter()
                    .find(|c| c["case"] == case)
                    .cloned()
            };
            let peer_case = find(peers, &name);
            // FlashInfer's dense decode of the same shape, from the attention peers.
            let fi_dense = PeerTime::from_case(
                find(attention, &format!("dense_b{batch}_h32x{hkv}_ctx32768")).as_ref(),
                "flashinfer",
            );
            let torch_score = PeerTime::from_case(peer_case.as_ref(), "torch_score");
            let select_us = t.select.median_us();
            let share = fi_dense.us.map(|d| select_us / d);
            let score_gbps = bench.score_bytes() as f64 / (t.score.median_us() * 1e-6) / 1e9;
            println!(
                "  {name}: select {select_us:.1} us ({}), score {:.1} us = {:.1}% of copy, top-k {:.1} us; {} of FlashInfer's dense decode",
                t.select.timing,
                t.score.median_us(),
                100.0 * score_gbps / copy_gbps,
                t.top_k.median_us(),
                share.map_or("n/a".into(), |s| format!("{:.1}%", 100.0 * s)),
            );
            let extra = json!({
                "rows_checked": rep.rows,
                "max_score_error": rep.max_score_error,
                "score_us": t.score.median_us(),
                "score_bytes": bench.score_bytes(),
                "score_frac_of_copy_bw": score_gbps / copy_gbps,
                "score_timing": t.score.timing.as_str(),
                "torch_score_us": torch_score.us,
                "torch_score_timing": torch_score.timing,
                "top_k_us": t.top_k.median_us(),
                "top_k_bytes": bench.top_k_bytes(),
                "top_k_timing": t.top_k.timing.as_str(),
                "flashinfer_dense_us": fi_dense.us,
                "flashinfer_dense_timing": fi_dense.timing,
                "select_over_flashinfer_dense": share,
            });
            // The selection moves the score's bytes and the top-k's.
            let bytes = (bench.score_bytes() + bench.top_k_bytes()) as f64;
            out.push(case_json(
                &name,
                shape,
                &t.select,
                "torch",
                &PeerTime::from_case(peer_case.as_ref(), "torch"),
                bytes,
                copy_gbps,
                extra,
            ));
        }
    }
    Ok(out)
}
