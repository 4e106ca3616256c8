//! The GPU check and benchmark of the foundation kernels, run on the device machine:
//!
//! 1. `quantize_k` and `spgemv_quant` against the host reference on fresh random inputs
//!    (outputs poisoned first), over several shapes, GQA ratios and bit widths;
//! 2. device-to-device copy bandwidth;
//! 3. `spgemv_quant` timed at batch 32, 32 query heads, 8 and 32 KV heads, 32k context,
//!    all tokens and a random quarter of the pages, beside the PyTorch peer's times
//!    (`--peer`, written by `benches/baselines/spgemv_torch.py` in the same command).
//!
//!    `gpu-check spgemv --peers peer.json --out benches/results/spgemv.json --commit <sha>`

use crate::common::{case_json, copy_gbps, Common, PeerTime, Res};
use clap::Args;
use dusk::kernels::ops::{Dusk, QuantizedK, SpgemvPlan};
use dusk::kernels::paged::{KvShape, PageTable, TokenLists};
use dusk::kernels::reference;
use dusk::kernels::spgemv::{self, SpgemvConfig};
use dusk::runtime::{Buffer, Device, Measured};
use dusk_aot::config_text::ConfigText;
use half::f16;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, RngCore, SeedableRng};
use serde_json::json;

/// A page table over shuffled pages; the last page of each sequence is partly filled
/// when `ragged`.
fn page_table(rng: &mut SmallRng, seq_lens: &[usize], page_size: usize) -> (PageTable, usize) {
    let total = PageTable::pages_needed(seq_lens, page_size);
    let mut ids: Vec<i32> = (0..total as i32).collect();
    ids.shuffle(rng);
    let table = PageTable::from_lengths(seq_lens, page_size, ids).expect("consistent page ids");
    (table, total.max(1))
}

/// For each (batch, KV head), a random `frac` of the sequence's pages.
fn random_pages(
    rng: &mut SmallRng,
    table: &PageTable,
    page_size: usize,
    heads: usize,
    frac: f64,
) -> Vec<Vec<usize>> {
    let mut out = vec![];
    for b in 0..table.batch() {
        let n = table.seq_len(b, page_size).div_ceil(page_size);
        for _ in 0..heads {
            let keep = ((n as f64 * frac).round() as usize).clamp(1.min(n), n);
            let mut all: Vec<usize> = (0..n).collect();
            for i in 0..keep {
                let j = rng.random_range(i..n);
                all.swap(i, j);
            }
            let mut chosen = all[..keep].to_vec();
            chosen.sort_unstable();
            out.push(chosen);
        }
    }
    out
}

fn random_f16(rng: &mut SmallRng, n: usize) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(rng.random_range(-2.0f32..2.0)))
        .collect()
}

fn poisoned<T: dusk::runtime::Element>(dev: &Device, n: usize) -> Res<Buffer<T>> {
    let mut b = dev.alloc::<T>(n)?;
    dev.fill_bytes(&mut b, 0xFF)?;
    Ok(b)
}

/// One correctness case; returns (worst code difference, score relative error).
/// One correctness case: sequence lengths, KV heads, group, code bits, fraction of pages
/// selected (1 for all tokens), and which scoring kernel.
#[derive(Clone, Copy)]
struct CheckCase {
    seqs: &'static [usize],
    kv_heads: usize,
    group: usize,
    bits: u32,
    frac: f64,
    tensor_cores: bool,
}

fn check_case(dusk: &Dusk, rng: &mut SmallRng, case: &CheckCase) -> Res<(u8, f64)> {
    let CheckCase {
        seqs: seq_lens,
        kv_heads,
        group,
        bits,
        frac,
        tensor_cores,
    } = *case;
    let dev = dusk.device();
    let page_size = 16;
    let (table, num_pages) = page_table(rng, seq_lens, page_size);
    let kv = KvShape {
        num_pages,
        page_size,
        num_kv_heads: kv_heads,
        head_dim: 128,
    };
    let k_host = random_f16(rng, kv.elements());
    let k = dev.upload(&k_host)?;
    let rows = kv.rows();
    let mut qk = QuantizedK {
        packed: poisoned(dev, rows * kv.head_dim * bits as usize / 8)?,
        scale: poisoned(dev, rows)?,
        zero: poisoned(dev, rows)?,
        kv,
        bits,
    };
    dusk.quantize_k_into(&k, &mut qk)?;
    let got = reference::QuantizedRows {
        packed: qk.packed.download()?,
        scale: qk.scale.download()?,
        zero: qk.zero.download()?,
    };
    // Both in the quantized copy's head-major layout (`KvShape::quantized_row`).
    let want = reference::quantize(&k_host, &kv, bits);
    if got.scale != want.scale || got.zero != want.zero {
        return Err("quantize_k: scale or zero differs from the reference".into());
    }
    let mut worst = 0u8;
    for r in 0..rows {
        let rb = kv.head_dim * bits as usize / 8;
        for i in 0..kv.head_dim {
            let a = reference::code(&got.packed[r * rb..][..rb], i, bits);
            let b = reference::code(&want.packed[r * rb..][..rb], i, bits);
            worst = worst.max(a.abs_diff(b));
        }
    }
    if worst > 1 {
        return Err(format!("quantize_k: a code differs by {worst} from the reference").into());
    }
    let cand = if frac >= 1.0 {
        TokenLists::all_tokens(&table, page_size, kv_heads)
    } else {
        TokenLists::from_pages(
            &table,
            page_size,
            kv_heads,
            &random_pages(rng, &table, page_size, kv_heads, frac),
        )
    };
    let q_heads = kv_heads * group;
    let q_host = random_f16(rng, table.batch() * q_heads * kv.head_dim);
    let q = dev.upload(&q_host)?;
    // The default (the tensor cores where the shape allows), or `dp2a`.
    let plan = SpgemvPlan::with_config(dusk, kv, q_heads, bits, &table, &cand, |c| {
        if !tensor_cores {
            *c = SpgemvConfig::dp2a(c.head_dim, c.page_size, c.group, c.bits)
        }
    })?;
    let mut scores = poisoned::<f32>(dev, plan.num_scores())?;
    plan.run(dusk, &q, &qk, &mut scores)?;
    let got_s = scores.download()?;
    let want_s = reference::spgemv(&q_host, q_heads, &got, bits, &kv, &table, &cand);
    Ok((worst, reference::rel_error(&got_s, &want_s)))
}

/// A configuration in the shared config text (`dusk_aot::config_text`, e.g.
/// `block_tokens=64,num_warps=2`) applied onto the shape's default; `None` is the default.
type Tiling = Option<String>;

struct BenchCase {
    kv_heads: usize,
    quarter: bool,
}

fn bench_case(
    dusk: &Dusk,
    rng: &mut SmallRng,
    c: &BenchCase,
    copy_gbps: f64,
    tilings: &[Tiling],
) -> Res<Vec<(String, Measured, f64)>> {
    let dev = dusk.device();
    let (batch, q_heads, context, page_size, d, bits) =
        (32usize, 32usize, 32768usize, 16usize, 128usize, 4u32);
    let (table, num_pages) = page_table(rng, &vec![context; batch], page_size);
    let kv = KvShape {
        num_pages,
        page_size,
        num_kv_heads: c.kv_heads,
        head_dim: d,
    };
    let rows = kv.rows();
    let cand = if c.quarter {
        TokenLists::from_pages(
            &table,
            page_size,
            c.kv_heads,
            &random_pages(rng, &table, page_size, c.kv_heads, 0.25),
        )
    } else {
        TokenLists::all_tokens(&table, page_size, c.kv_heads)
    };
    let group = q_heads / c.kv_heads;
    let nnz = cand.indices.len();
    // Bytes the kernel must move: codes, scale and zero of each candidate, its index, and
    // the scores written.
    let bytes = nnz * (d * bits as usize / 8 + 4 + 4) + nnz * group * 4;
    // Random codes, scales and zeros, in as many copies as the harness's rotation asks
    // (one where the candidates' bytes alone pass twice the L2).
    let mut sets = vec![];
    for _ in 0..dev.rotation_sets(bytes) {
        let mut packed = vec![0u8; rows * d / 2];
        rng.fill_bytes(&mut packed);
        sets.push(QuantizedK {
            packed: dev.upload(&packed)?,
            scale: dev.upload(&random_f16(rng, rows))?,
            zero: dev.upload(&random_f16(rng, rows))?,
            kv,
            bits,
        });
    }
    let q = dev.upload(&random_f16(rng, batch * q_heads * d))?;
    let mut out = vec![];
    // The first configuration's scores on the first input set, which every other one must
    // reproduce within the checks' tolerance (dp2a rounds q to 15 bits).
    let mut first_scores: Option<Vec<f32>> = None;
    for tiling in tilings {
        let base = SpgemvConfig::new(d, page_size, group, bits);
        let chosen = match tiling {
            Some(text) => base
                .with_text(text)
                .map_err(|e| format!("spgemv config: {e}"))?,
            None => base,
        };
        if !spgemv::specialised(&chosen) {
            // Each sweep entry is timed where dusk-kernels holds a kernel for it (the
            // tensor cores take groups of 2 to 8; some tilings exist for some groups only).
            println!(
                "  (no kernel for {} at group {group}: not timed)",
                chosen.to_text()
            );
            continue;
        }
        let plan = SpgemvPlan::with_config(dusk, kv, q_heads, bits, &table, &cand, |cfg| {
            if tiling.is_some() {
                *cfg = chosen;
            }
        })?;
        let mut scores = dev.alloc::<f32>(plan.num_scores())?;
        dev.fill_bytes(&mut scores, 0xFF)?;
        plan.run(dusk, &q, &sets[0], &mut scores)?;
        let got = scores.download()?;
        let agrees = match &first_scores {
            None => {
                first_scores = Some(got);
                String::new()
            }
            Some(want) => {
                let want: Vec<f64> = want.iter().map(|&x| x as f64).collect();
                let err = reference::rel_error(&got, &want);
                if err >= 1e-3 {
                    return Err(format!(
                        "spgemv {}: scores differ from the first configuration's by {err:.2e}",
                        chosen.to_text()
                    )
                    .into());
                }
                format!(", scores within {err:.1e} of the first's")
            }
        };
        let t = dev.time_calls(sets.len(), |i| plan.run(dusk, &q, &sets[i], &mut scores))?;
        let us = t.median_us();
        let gbps = bytes as f64 / (us * 1e-6) / 1e9;
        let cfg = plan.config();
        let label = format!(
            "{}{}",
            cfg.to_text(),
            if tiling.is_none() { " (default)" } else { "" }
        );
        println!(
            "  spgemv kv_heads={} {} {label}: {us:.1} us ({}), {gbps:.0} GB/s = {:.1}% of copy{agrees}",
            c.kv_heads,
            if c.quarter {
                "quarter pages"
            } else {
                "all tokens"
            },
            t.timing,
            100.0 * gbps / copy_gbps
        );
        out.push((label, t, bytes as f64));
    }
    Ok(out)
}

/// `gpu-check spgemv`'s options.
#[derive(Args, Debug)]
pub struct SpgemvArgs {
    #[command(flatten)]
    common: Common,
    /// Time one GQA all-tokens case at one configuration (config text, e.g.
    /// `block_tokens=64,num_warps=4`; one compiled into dusk-kernels,
    /// `spgemv::specialised_configs`), for a profiler; no checks.
    #[arg(long, value_name = "CONFIG")]
    profile: Option<String>,
    /// A configuration to time beside the default (config text; repeat the option for
    /// more); its scores must match the default's. Keys: block_tokens, num_warps,
    /// min_programs_per_sm, tensor_cores, tiles, l2_prefetch.
    #[arg(long, value_name = "CONFIG")]
    sweep: Vec<String>,
}

pub fn run(args: &SpgemvArgs) -> Res<()> {
    let dev = Device::gpu(0)?;
    println!(
        "device: {} (driver {:?}, cc {:?})",
        dev.name(),
        dev.driver_version(),
        dev.compute_capability()
    );
    let dusk = Dusk::new(dev.clone())?;
    let mut rng = SmallRng::seed_from_u64(args.common.seed_or(0x5eed));
    // A malformed config text is an error before anything runs.
    for t in args.sweep.iter().chain(&args.profile) {
        SpgemvConfig::new(128, 16, 4, 4)
            .with_text(t)
            .map_err(|e| format!("spgemv config `{t}`: {e}"))?;
    }
    if let Some(t) = &args.profile {
        // One GQA all-tokens case at one tiling ("64x4"), for a profiler to look at; the
        // tiling must be one compiled into dusk-kernels (`spgemv::specialised`).
        let c = BenchCase {
            kv_heads: 8,
            quarter: false,
        };
        bench_case(&dusk, &mut rng, &c, f64::NAN, &[Some(t.clone())])?;
        return Ok(());
    }

    println!("correctness (fresh random inputs, outputs poisoned):");
    let cases = [
        CheckCase {
            seqs: &[1],
            kv_heads: 1,
            group: 8,
            bits: 4,
            frac: 1.0,
            tensor_cores: false,
        },
        CheckCase {
            seqs: &[37, 300, 16],
            kv_heads: 2,
            group: 4,
            bits: 4,
            frac: 1.0,
            tensor_cores: false,
        },
        CheckCase {
            seqs: &[1000, 77],
            kv_heads: 8,
            group: 1,
            bits: 4,
            frac: 0.25,
            tensor_cores: false,
        },
        CheckCase {
            seqs: &[513, 129, 64],
            kv_heads: 4,
            group: 8,
            bits: 4,
            frac: 0.5,
            tensor_cores: false,
        },
        CheckCase {
            seqs: &[333, 1024],
            kv_heads: 8,
            group: 4,
            bits: 8,
            frac: 1.0,
            tensor_cores: false,
        },
        CheckCase {
            seqs: &[4096, 17, 255],
            kv_heads: 2,
            group: 8,
            bits: 8,
            frac: 0.25,
            tensor_cores: false,
        },
        CheckCase {
            seqs: &[1],
            kv_heads: 1,
            group: 4,
            bits: 4,
            frac: 1.0,
            tensor_cores: true,
        },
        CheckCase {
            seqs: &[37, 300, 16],
            kv_heads: 2,
            group: 4,
            bits: 4,
            frac: 1.0,
            tensor_cores: true,
        },
        CheckCase {
            seqs: &[513, 129, 64],
            kv_heads: 4,
            group: 8,
            bits: 4,
            frac: 0.5,
            tensor_cores: true,
        },
        CheckCase {
            seqs: &[2048, 33],
            kv_heads: 8,
            group: 2,
            bits: 4,
            frac: 0.25,
            tensor_cores: true,
        },
    ];
    let mut worst_err = 0.0f64;
    for case in &cases {
        let (code_diff, err) = check_case(&dusk, &mut rng, case)?;
        let CheckCase {
            seqs,
            kv_heads,
            group,
            bits,
            frac,
            tensor_cores,
        } = case;
        let path = if *tensor_cores {
            "tensor cores"
        } else {
            "dp2a"
        };
        println!("  seqs {seqs:?} kv_heads {kv_heads} group {group} bits {bits} cand {frac} {path}: codes within {code_diff}, scores rel err {err:.2e}");
        if err >= 1e-3 {
            return Err(format!("spgemv_quant: relative error {err:.2e} over 1e-3").into());
        }
        worst_err = worst_err.max(err);
    }
    if args.common.check_only {
        println!("all checks passed");
        return Ok(());
    }

    let copy_gbps = copy_gbps(&dev)?;

    let peers = args.common.peers()?;
    // The default tiling first (the reported figure), then alternatives from the sweep.
    let tilings: Vec<Tiling> = std::iter::once(None)
        .chain(args.sweep.iter().cloned().map(Some))
        .collect();
    let mut cases = vec![];
    for kv_heads in [8usize, 32] {
        for quarter in [false, true] {
            let c = BenchCase { kv_heads, quarter };
            let results = bench_case(&dusk, &mut rng, &c, copy_gbps, &tilings)?;
            // The figure reported is the default configuration's (the first).
            let (_, ours, bytes) = &results[0];
            let cand_name = if quarter { "quarter_pages" } else { "all" };
            let peer_case = peers.as_ref().and_then(|p| {
                p["cases"]
                    .as_array()?
                    .iter()
                    .find(|x| x["num_kv_heads"] == kv_heads && x["candidates"] == cand_name)
            });
            cases.push(case_json(
                &format!("spgemv_int4_b32_h32x{kv_heads}_ctx32768_{cand_name}"),
                json!({"batch": 32, "num_q_heads": 32, "num_kv_heads": kv_heads, "head_dim": 128, "page_size": 16,
                       "context": 32768, "bits": 4, "candidate_pages_pct": if quarter { 25 } else { 100 }}),
                ours,
                "torch",
                &PeerTime::from_case(peer_case, "peer"),
                *bytes,
                copy_gbps,
                json!({"other_tilings_us": results[1..].iter()
                    .map(|(n, t, _)| json!({"tiling": n, "us": t.median_us(), "timing": t.timing.as_str()}))
                    .collect::<Vec<_>>()}),
            ));
        }
    }
    args.common.write_results(
        &dev,
        copy_gbps,
        peers.as_ref(),
        json!({"check_max_rel_error": worst_err}),
        cases,
    )?;
    Ok(())
}
