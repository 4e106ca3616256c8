//! The cache append's part of `gpu-check selectors` (`dusk::kernels::cache`):
//!
//! 1. decode loops on the GPU, fresh random tokens, compared bit for bit with the host and
//!    the whole-cache kernels (`cache::check`): the default case, NaN tokens, the
//!    benchmark's batches and heads over short contexts, Double Sparsity's and SparQ's
//!    parts, every compiled configuration;
//! 2. one decode step at 32k context, batch 32 and 64, GQA 32/8 and MHA 32/32, head_dim
//!    128, one new token per sequence, INT4 copy and one selector's state (Quest's,
//!    `append_*`; Double Sparsity's labels of 16 channels, `append_ds_*`; SparQ's
//!    transposed copy in blocks of 256 and sums of V, `append_sparq_*`, the sequences'
//!    tokens at every place of a run of the copy, and `append_sparq_finish_*`, where every
//!    token finishes a run at once, the step that was the slowest when runs were copied
//!    whole; now every row copies one slice of the run before its own in either): the touched list
//!    checked, then the step timed by the harness beside the same computation in PyTorch
//!    (`--append-peers`, written by `benches/baselines/append_peers.py` in the same
//!    command), and for Quest every compiled configuration timed as a sweep (DS and SparQ
//!    have the default configuration's kernel only).

use crate::common::{case_json, PeerTime, Res};
use dusk::kernels::cache::append::specialised_configs;
use dusk::kernels::cache::bench::{AppendBench, AppendCase};
use dusk::kernels::cache::check::{check_decode, DecodeCase};
use dusk::kernels::cache::{AppendConfig, AppendParts};
use dusk::kernels::ops::Dusk;
use serde_json::{json, Value};

/// The decode loops, on the device `dusk` runs on.
pub fn check(dusk: &Dusk, seed: u64) -> Res<()> {
    let cases = [
        ("default", DecodeCase::default()),
        (
            "nan tokens",
            DecodeCase {
                nan: true,
                ..DecodeCase::default()
            },
        ),
        (
            "batch 64, 8 KV heads of 128",
            DecodeCase {
                lens: (0..64).map(|b| (b * 37) % 100).collect(),
                steps: 4,
                num_kv_heads: 8,
                head_dim: 128,
                ..DecodeCase::default()
            },
        ),
        (
            "double sparsity's labels, r 16, 8 KV heads of 128",
            DecodeCase {
                lens: vec![0, 16, 37, 5, 250],
                steps: 12,
                num_kv_heads: 8,
                head_dim: 128,
                parts: AppendParts {
                    quantized: Some(4),
                    ds: Some(16),
                    ..AppendParts::default()
                },
                ..DecodeCase::default()
            },
        ),
        (
            "sparq's copy in blocks of 256 and sums of V, 8 KV heads of 128",
            DecodeCase {
                lens: vec![0, 16, 250, 5, 511],
                steps: 12,
                num_kv_heads: 8,
                head_dim: 128,
                parts: AppendParts {
                    quantized: Some(4),
                    sparq: true,
                    ..AppendParts::default()
                },
                sparq_block_size: 256,
                ..DecodeCase::default()
            },
        ),
        (
            "batch 32, 32 KV heads of 128, 8 rows a program",
            DecodeCase {
                lens: (0..32).map(|b| (b * 11) % 50).collect(),
                steps: 3,
                num_kv_heads: 32,
                head_dim: 128,
                config: AppendConfig {
                    rows_per_program: 8,
                    num_warps: 1,
                },
                ..DecodeCase::default()
            },
        ),
    ];
    // Every compiled configuration (the sweep's), on rows they do not divide evenly.
    let configs = specialised_configs().into_iter().map(|config| {
        let what = format!(
            "{} rows on {} warps",
            config.rows_per_program, config.num_warps
        );
        let case = DecodeCase {
            lens: vec![15, 1, 40, 0, 64],
            steps: 3,
            num_kv_heads: 3,
            head_dim: 128,
            config,
            ..DecodeCase::default()
        };
        (what, case)
    });
    let cases = cases
        .into_iter()
        .map(|(w, c)| (w.to_string(), c))
        .chain(configs);
    for (i, (what, case)) in cases.enumerate() {
        let case = DecodeCase {
            seed: seed ^ (0xa9 + i as u64),
            ..case
        };
        let r = check_decode(dusk, &case).map_err(|e| format!("append, {what}: {e}"))?;
        println!(
            "  append {what}: {} tokens ({} new pages) equal to the host and the whole-cache kernels",
            r.tokens, r.pages_started
        );
    }
    Ok(())
}

/// The timed cases (those `wants` keeps), each with its sweep over the compiled
/// configurations.
pub fn cases(
    dusk: &Dusk,
    peers: Option<&Value>,
    copy_gbps: f64,
    seed: u64,
    wants: impl Fn(&str) -> bool,
) -> Res<Vec<Value>> {
    let mut out = vec![];
    let selectors = [
        (
            "",
            "quest",
            AppendParts {
                quest: true,
                ..AppendParts::default()
            },
        ),
        (
            "ds_",
            "ds",
            AppendParts {
                ds: Some(16),
                ..AppendParts::default()
            },
        ),
        (
            "sparq_",
            "sparq",
            AppendParts {
                sparq: true,
                ..AppendParts::default()
            },
        ),
    ];
    for (prefix, selector, parts) in selectors {
        let finish = if parts.sparq {
            &[false, true][..]
        } else {
            &[false]
        };
        for &finish_runs in finish {
            for batch in [32usize, 64] {
                for hkv in [8usize, 32] {
                    let prefix = if finish_runs { "sparq_finish_" } else { prefix };
                    let name = format!("append_{prefix}b{batch}_h32x{hkv}_ctx32768");
                    if !wants(&name) {
                        continue;
                    }
                    let case = AppendCase {
                        batch,
                        num_kv_heads: hkv,
                        finish_runs,
                        parts: AppendParts {
                            quantized: Some(4),
                            ..parts
                        },
                        seed: seed ^ (batch * 100 + hkv) as u64,
                        ..AppendCase::default()
                    };
                    out.push(timed(dusk, &name, selector, &case, peers, copy_gbps)?);
                }
            }
        }
    }
    Ok(out)
}

/// One timed case: the touched list checked, the sweep over the compiled configurations
/// (Quest's), the default configuration checked and timed, beside the peer's figure.
fn timed(
    dusk: &Dusk,
    name: &str,
    selector: &str,
    case: &AppendCase,
    peers: Option<&Value>,
    copy_gbps: f64,
) -> Res<Value> {
    let mut bench = AppendBench::new(dusk, case)?;
    bench.check(dusk)?;
    let mut sweep = vec![];
    if case.parts.quest {
        for cfg in specialised_configs() {
            bench.set_config(dusk, cfg)?;
            let t = bench.time(dusk)?;
            sweep.push(
                json!({"rows_per_program": cfg.rows_per_program, "num_warps": cfg.num_warps,
                              "us": t.median_us(), "timing": t.timing.as_str()}),
            );
        }
        bench.set_config(dusk, AppendConfig::default())?;
        bench.check(dusk)?;
    }
    let t = bench.time(dusk)?;
    let peer_case = peers.and_then(|p| p["cases"].as_array()?.iter().find(|c| c["case"] == name));
    let peer = PeerTime::from_case(peer_case, "torch");
    println!(
        "  {name}: {:.2} us ({}, {} rotation sets), torch {}; sweep {}",
        t.median_us(),
        t.timing,
        bench.sets(),
        peer.us.map_or("n/a".into(), |p| format!("{p:.2} us")),
        sweep
            .iter()
            .map(|s| format!(
                "{}x{}w {:.2}",
                s["rows_per_program"],
                s["num_warps"],
                s["us"].as_f64().unwrap_or(f64::NAN)
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let p = &case.parts;
    let shape = json!({"batch": case.batch, "num_q_heads": 32, "num_kv_heads": case.num_kv_heads,
                       "head_dim": 128, "page_size": 16, "context": 32768, "new_tokens": 1,
                       "bits": 4, "selector": selector, "quest": p.quest, "ds_r": p.ds,
                       "sparq_block_size": p.sparq.then_some(case.sparq_block_size),
                       "finish_runs": case.finish_runs});
    let extra = json!({
        "peer_torch": peers.map(|p| p["torch"].clone()),
        "peer_copy_gbps": peers.and_then(|p| p["copy_gbps"].as_f64()),
        "rotation_sets": bench.sets(),
        "read_bytes": bench.read_bytes(),
        "config": {"rows_per_program": bench.case().config.rows_per_program,
                   "num_warps": bench.case().config.num_warps},
        "sweep": sweep,
    });
    Ok(case_json(
        name,
        shape,
        &t,
        "torch",
        &peer,
        bench.bytes() as f64,
        copy_gbps,
        extra,
    ))
}
