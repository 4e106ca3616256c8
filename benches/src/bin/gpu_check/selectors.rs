//! The GPU check and benchmark of the token selectors (`dusk::kernels::selectors`), run on
//! the device machine:
//!
//! 1. Quest on small shapes and on the benchmark shapes against the host references (page
//!    scores in f64, pages equal to the sort-based top-k, token lists equal to those pages'
//!    tokens), outputs poisoned first;
//! 2. Quest's selection (page scores, device top-k, token lists) at 32k context, batch 32
//!    and 64, GQA 32/8 and MHA 32/32, budget N/4, timed by the harness beside the same
//!    computation in PyTorch (`--peers`, written by `benches/baselines/quest_peers.py` in
//!    the same command) and as a fraction of FlashInfer's dense decode of the same shape
//!    (`--attention-peers`, the attention peers' file of the same command).
//!
//! 3. Double Sparsity's checks and cases likewise ([`crate::ds`]; its PyTorch peer from
//!    `--ds-peers`, written by `benches/baselines/ds_peers.py`).
//! 4. the cache append (`append.rs`): decode loops checked bit for bit, then one decode
//!    step's maintenance timed beside PyTorch (`--append-peers`, from
//!    `benches/baselines/append_peers.py`).
//!
//! 5. SparQ ([`crate::sparq`]): checks against Algorithm 1 in f64, then the selection timed
//!    beside PyTorch (`--sparq-peers`, from `benches/baselines/sparq_peers.py`).
//!
//!    `gpu-check selectors --peers quest.json --ds-peers ds.json --append-peers append.json --sparq-peers sparq.json --attention-peers attention.json --out selectors.json`

use crate::append;
use crate::common::{case_json, copy_gbps, Common, PeerTime, Res};
use clap::Args;
use dusk::kernels::ops::Dusk;
use dusk::kernels::selectors::bench::{QuestBench, QuestCase};
use dusk::kernels::selectors::quest::quest_walking;
use dusk::kernels::selectors::topk::{Budget, TopKConfig};
use dusk::kernels::selectors::Selector;
use dusk::runtime::Device;
use serde_json::{json, Value};
use std::path::PathBuf;

/// `gpu-check selectors`'s options.
#[derive(Args, Debug)]
pub struct SelectorsArgs {
    #[command(flatten)]
    common: Common,
    /// FlashInfer's dense decode times of the same shapes (the JSON attention_peers.py
    /// wrote in the same command), for the selection's share of a decode step.
    #[arg(long, value_name = "FILE")]
    attention_peers: Option<PathBuf>,
    /// Double Sparsity's PyTorch peer (the JSON ds_peers.py wrote in the same command).
    #[arg(long, value_name = "FILE")]
    ds_peers: Option<PathBuf>,
    /// The cache append's PyTorch peer (the JSON append_peers.py wrote in the same command).
    #[arg(long, value_name = "FILE")]
    append_peers: Option<PathBuf>,
    /// SparQ's PyTorch peer (the JSON sparq_peers.py wrote in the same command).
    #[arg(long, value_name = "FILE")]
    sparq_peers: Option<PathBuf>,
    /// Run only the cases whose name starts with one of these (e.g. `append_`,
    /// `quest_b64`; repeat the option for several); a family's checks run when one of its
    /// cases may.
    #[arg(long, value_name = "PREFIX")]
    only: Vec<String>,
}

impl SelectorsArgs {
    /// Whether the case `name` runs (`--only`).
    fn wants(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| name.starts_with(o.as_str()))
    }
    /// Whether some case of the family whose names start with `prefix` may run.
    fn wants_family(&self, prefix: &str) -> bool {
        self.only.is_empty()
            || self
                .only
                .iter()
                .any(|o| o.starts_with(prefix) || prefix.starts_with(o.as_str()))
    }
}

fn read_json(path: &Option<PathBuf>, option: &str) -> Res<Option<Value>> {
    let Some(p) = path else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(p).map_err(|e| format!("{option} {}: {e}", p.display()))?;
    Ok(Some(serde_json::from_str(&text).map_err(|e| {
        format!("{option} {}: not JSON: {e}", p.display())
    })?))
}

pub fn run(args: &SelectorsArgs) -> Res<()> {
    let dev = Device::best();
    println!("device: {}", dev.name());
    let dusk = Dusk::new(dev.clone())?;
    let seed = args.common.seed_or(0x5e1);

    println!("correctness (fresh random inputs, outputs poisoned):");
    if args.wants_family("append_") {
        append::check(&dusk, seed)?;
    }
    let small = [
        (1usize, 1000usize, 8usize, 2usize, false),
        (3, 4096, 32, 8, true),
        (2, 333, 16, 16, false),
        (4, 20000, 32, 4, true),
        (2, 9000, 32, 8, false),
    ];
    let quest_checks = if args.wants_family("quest_") {
        &small[..]
    } else {
        &[]
    };
    for (i, &(batch, context, hq, hkv, sink)) in quest_checks.iter().enumerate() {
        let case = QuestCase {
            batch,
            context,
            num_q_heads: hq,
            num_kv_heads: hkv,
            sink,
            seed: seed ^ i as u64,
            ..QuestCase::default()
        };
        let mut bench = QuestBench::new(&dusk, &case, |_| {})?;
        let r = bench.check(&dusk, usize::MAX)?;
        println!(
            "  quest batch {batch} context {context} heads {hq}/{hkv} sink {sink}: {} rows equal, score error {:.1e}",
            r.rows, r.max_score_error
        );
        // The score and top-k fused (the default at rows of 513 to 2048 pages): once more,
        // the second launch finding the arrivals the first set back; then two launches.
        if bench.is_fused() {
            bench.check(&dusk, usize::MAX)?;
            bench.fuse(&dusk, false)?;
            bench.check(&dusk, usize::MAX)?;
            println!("    fused in one launch: equal, twice; in two launches: equal");
        }
    }
    if args.wants_family("ds_") {
        crate::ds::check(&dusk, seed)?;
    }
    if args.wants_family("sparq_") {
        crate::sparq::check_small(&dusk, seed)?;
    }
    if args.common.check_only || !dev.is_gpu() {
        println!("all checks passed");
        return Ok(());
    }

    let copy_gbps = copy_gbps(&dev)?;
    let peers = args.common.peers()?;
    let attention = read_json(&args.attention_peers, "--attention-peers")?;
    let mut cases = vec![];
    for batch in [32usize, 64] {
        for hkv in [8usize, 32] {
            let name = format!("quest_b{batch}_h32x{hkv}_ctx32768_quarter");
            if !args.wants(&name) {
                continue;
            }
            let case = QuestCase {
                batch,
                num_kv_heads: hkv,
                budget: Budget::Fraction(0.25),
                seed: seed ^ (batch * 100 + hkv) as u64,
                ..QuestCase::default()
            };
            let mut bench = QuestBench::new(&dusk, &case, |_| {})?;
            let r = bench.check(&dusk, 16)?;
            let t = bench.time(&dusk)?;
            let shape = json!({"batch": batch, "num_q_heads": 32, "num_kv_heads": hkv, "head_dim": 128,
                               "page_size": 16, "context": 32768, "budget_pct": 25});
            let peer_case = peers.as_ref().and_then(|p| {
                p["cases"]
                    .as_array()?
                    .iter()
                    .find(|c| c["case"] == name.as_str())
            });
            // FlashInfer's dense decode of the same shape, from the attention peers.
            let dense = format!("dense_b{batch}_h32x{hkv}_ctx32768");
            let fi_dense = PeerTime::from_case(
                attention.as_ref().and_then(|a| {
                    a["cases"]
                        .as_array()?
                        .iter()
                        .find(|c| c["case"] == dense.as_str())
                }),
                "flashinfer",
            );
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
            let mut extra = json!({
                "rows_checked": r.rows,
                "max_score_error": r.max_score_error,
                "score_us": t.score.median_us(),
                "score_bytes": bench.score_bytes(),
                "score_frac_of_copy_bw": score_gbps / copy_gbps,
                "score_timing": t.score.timing.as_str(),
                "top_k_us": t.top_k.median_us(),
                "top_k_bytes": bench.top_k_bytes(),
                "top_k_timing": t.top_k.timing.as_str(),
                "flashinfer_dense_us": fi_dense.us,
                "flashinfer_dense_timing": fi_dense.timing,
                "select_over_flashinfer_dense": share,
            });
            extra["two_launches"] = quest_two_launches(&dusk, &case, select_us)?;
            if hkv == 8 {
                extra["alternatives"] = quest_configs(&dusk, &case, copy_gbps)?;
            }
            // The selection moves the score's bytes and the top-k's.
            let bytes = (bench.score_bytes() + bench.top_k_bytes()) as f64;
            cases.push(case_json(
                &name,
                shape,
                &t.select,
                "torch",
                &PeerTime::from_case(peer_case, "torch"),
                bytes,
                copy_gbps,
                extra,
            ));
        }
    }
    let ds_peers = read_json(&args.ds_peers, "--ds-peers")?;
    cases.extend(crate::ds::cases(
        &dusk,
        seed,
        copy_gbps,
        ds_peers.as_ref(),
        attention.as_ref(),
        |name| args.wants(name),
    )?);
    let append_peers = read_json(&args.append_peers, "--append-peers")?;
    cases.extend(append::cases(
        &dusk,
        append_peers.as_ref(),
        copy_gbps,
        seed,
        |name| args.wants(name),
    )?);
    let sparq_peers = read_json(&args.sparq_peers, "--sparq-peers")?;
    cases.extend(crate::sparq::cases(
        &dusk,
        seed,
        copy_gbps,
        sparq_peers.as_ref(),
        attention.as_ref(),
        |name| args.wants(name),
    )?);
    args.common.write_results(
        &dev,
        copy_gbps,
        peers
            .as_ref()
            .or(ds_peers.as_ref())
            .or(sparq_peers.as_ref()),
        json!({}),
        cases,
    )
}

/// Quest's score walking other numbers of tiles a program, and its top-k in other
/// configurations, on the same case (each over random state of its own, checked against
/// the reference first): GQA's grids are a quarter of MHA's, so the walk sets how many
/// waves the score runs in.
fn quest_configs(dusk: &Dusk, case: &QuestCase, copy_gbps: f64) -> Res<Value> {
    const TILES_2: Selector = quest_walking::<2>();
    const TILES_4: Selector = quest_walking::<4>();
    const TILES_16: Selector = quest_walking::<16>();
    let mut by_tiles = serde_json::Map::new();
    for (tiles, selector) in [(2usize, &TILES_2), (4, &TILES_4), (16, &TILES_16)] {
        let mut b = QuestBench::with_selector(dusk, case, selector, |_| {})?;
        b.check(dusk, 2)?;
        let t = b.time(dusk)?;
        let frac = b.score_bytes() as f64 / (t.score.median_us() * 1e-6) / 1e9 / copy_gbps;
        println!(
            "    score walking {tiles} tiles: {:.1} us = {:.1}% of copy; select {:.1} us",
            t.score.median_us(),
            100.0 * frac,
            t.select.median_us()
        );
        by_tiles.insert(
            tiles.to_string(),
            json!({"score_us": t.score.median_us(), "score_frac_of_copy_bw": frac,
                   "select_us": t.select.median_us()}),
        );
    }
    let mut by_config = serde_json::Map::new();
    let cfg = |tile, num_warps, resident, radix| TopKConfig {
        tile,
        num_warps,
        resident,
        radix,
    };
    for cfg in [
        cfg(2048, 8, true, false),
        cfg(4096, 8, false, true),
        cfg(256, 1, false, true),
    ] {
        let mut b = QuestBench::new(dusk, case, |c| *c = cfg)?;
        b.check(dusk, 2)?;
        let t = b.time(dusk)?;
        println!(
            "    top-k {cfg:?}: {:.1} us; select {:.1} us",
            t.top_k.median_us(),
            t.select.median_us()
        );
        by_config.insert(
            format!("{cfg:?}"),
            json!({"top_k_us": t.top_k.median_us(), "select_us": t.select.median_us()}),
        );
    }
    Ok(json!({"score_by_tiles": by_tiles, "top_k_by_config": by_config}))
}

/// The stock selection in two launches (the score, then the top-k) where it is fused by
/// default (`quest_select`), over random state of its own, checked first; `null` where the
/// shape has no fused kernel. `fused_us`: the stock selection's time, for the line printed.
fn quest_two_launches(dusk: &Dusk, case: &QuestCase, fused_us: f64) -> Res<Value> {
    let mut b = QuestBench::new(dusk, case, |_| {})?;
    if !b.is_fused() {
        return Ok(Value::Null);
    }
    b.fuse(dusk, false)?;
    b.check(dusk, 2)?;
    let t = b.time(dusk)?;
    let us = t.select.median_us();
    println!(
        "    score and top-k in two launches: select {us:.1} us ({:.3}x the one launch's \
         {fused_us:.1})",
        us / fused_us
    );
    Ok(json!({"select_us": us, "timing": t.select.timing.as_str()}))
}
