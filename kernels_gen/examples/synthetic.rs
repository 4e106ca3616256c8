//! Generates a synthetic batch ([`dusk_kernels::synthetic`]) on the GPU when there is one
//! (the paper's shape by default: 32 sequences of 32k tokens, 32 query heads over 8 KV
//! heads, head_dim 128) or through the interpreter (2 sequences of 1024 tokens, 8 over 2),
//! checks it against the host reference bit for bit (every page on the CPU; on the GPU the
//! pages of every planted token of the first sequences and random others), and prints what
//! each head's attention looks like: the oracle top-p budget at p = 0.95 and the planted
//! tokens' share of the softmax mass.
//!
//!     cargo run --release -p dusk-kernels --example synthetic -- \
//!         [--batch 32] [--len 32768] [--heads 32/8] [--seed 1] [--profile-seqs 2]
//!
//! Exit status: 0 when the batch equals the reference, 1 when it differs, 2 on an error.

use dusk_kernels::ops::Dusk;
use dusk_kernels::synthetic::analysis::{attention_weights, top_p_budget};
use dusk_kernels::synthetic::{reference, write_cache, SyntheticCache, SyntheticSpec};
use dusk_runtime::Device;
use half::f16;
use std::process::ExitCode;
use std::time::Instant;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("synthetic: {e}");
            ExitCode::from(2)
        }
    }
}

/// The options: `--batch`, `--len`, `--heads Q/KV`, `--seed`, `--profile-seqs`.
struct Options {
    batch: usize,
    len: usize,
    q_heads: usize,
    kv_heads: usize,
    seed: u64,
    profile_seqs: usize,
}

fn options(gpu: bool) -> Res<Options> {
    let mut o = if gpu {
        Options {
            batch: 32,
            len: 32768,
            q_heads: 32,
            kv_heads: 8,
            seed: 1,
            profile_seqs: 2,
        }
    } else {
        Options {
            batch: 2,
            len: 1024,
            q_heads: 8,
            kv_heads: 2,
            seed: 1,
            profile_seqs: 2,
        }
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair.get(1).ok_or(format!("{} needs a value", pair[0]))?;
        let number = || {
            value
                .parse::<usize>()
                .map_err(|e| format!("{} {value}: {e}", pair[0]))
        };
        match pair[0].as_str() {
            "--batch" => o.batch = number()?,
            "--len" => o.len = number()?,
            "--seed" => o.seed = number()? as u64,
            "--profile-seqs" => o.profile_seqs = number()?,
            "--heads" => {
                let (q, kv) = value
                    .split_once('/')
                    .ok_or("--heads takes Q/KV, e.g. 32/8")?;
                (o.q_heads, o.kv_heads) = (q.parse()?, kv.parse()?);
            }
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    o.profile_seqs = o.profile_seqs.min(o.batch);
    Ok(o)
}

fn run() -> Res<bool> {
    let device = Device::best();
    let o = options(device.is_gpu())?;
    println!("backend: {}", device.name());
    let dusk = Dusk::new(device)?;
    let spec = SyntheticSpec::new(vec![o.len; o.batch], o.q_heads, o.kv_heads, 128, 16, o.seed);
    let cache = SyntheticCache::generate(&dusk, &spec)?;
    let bytes = 2 * cache.kv.elements() * 2;
    println!(
        "batch {} x {} tokens, {}/{} heads, head_dim 128, pages of 16: K and V {:.1} MiB each; {} planted tokens",
        o.batch,
        o.len,
        o.q_heads,
        o.kv_heads,
        bytes as f64 / 2.0 / (1u64 << 20) as f64,
        cache.planted.tokens.len()
    );
    // A second generation into the same buffers, timed (the first compiled the kernels).
    let (mut k, mut v) = (cache.k, cache.v);
    dusk.device().synchronize()?;
    let t = Instant::now();
    write_cache(&dusk, &spec, &cache.table, &mut k, &mut v)?;
    dusk.device().synchronize()?;
    let s = t.elapsed().as_secs_f64();
    println!(
        "generated K and V in {:.1} ms (wall clock, the page table's and planted tokens' uploads included): {:.2} GB/s written",
        s * 1e3,
        bytes as f64 / s / 1e9
    );

    let (k, v, q) = (k.download()?, v.download()?, cache.q.download()?);
    let ok = check(
        &spec,
        &cache.table,
        &cache.planted,
        &k,
        &v,
        &q,
        dusk.device().is_gpu(),
    )?;

    println!(
        "\nper query head, over the first {} sequences (oracle top-p, p = 0.95, f64):",
        o.profile_seqs
    );
    println!("head  kind     scale  planted  budget mean (min-max)   planted mass");
    for qh in 0..spec.num_q_heads {
        let (mut budgets, mut masses) = (vec![], vec![]);
        for b in 0..o.profile_seqs {
            let w = attention_weights(&spec, &cache.table, &k, &q, b, qh);
            budgets.push(top_p_budget(&w, 0.95));
            masses.push(
                cache
                    .planted
                    .positions(b, qh)
                    .iter()
                    .map(|p| w[*p])
                    .sum::<f64>(),
            );
        }
        let h = spec.heads[qh];
        let mean = budgets.iter().sum::<usize>() as f64 / budgets.len() as f64;
        let mass = if h.planted > 0 {
            format!("{:.3}", masses.iter().sum::<f64>() / masses.len() as f64)
        } else {
            "-".into()
        };
        println!(
            "{qh:4}  {:7}  {:5.2}  {:7}  {:8.1} ({}-{})  {mass:>14}",
            h.kind(),
            h.scale,
            h.planted,
            mean,
            budgets.iter().min().unwrap_or(&0),
            budgets.iter().max().unwrap_or(&0),
        );
    }
    Ok(ok)
}

/// The downloaded batch against the host reference: every page (`sampled` false) or the
/// pages of the first sequences' planted tokens and 256 others drawn from the seed; all the
/// queries. Prints the verdict.
fn check(
    spec: &SyntheticSpec,
    table: &dusk_kernels::paged::PageTable,
    planted: &dusk_kernels::synthetic::Planted,
    k: &[f16],
    v: &[f16],
    q: &[f16],
    sampled: bool,
) -> Res<bool> {
    let plants = planted.by_token(spec.group());
    let nnz = table.kv_page_indices.len();
    let entry_of = |b: usize, j: usize| table.kv_indptr[b] as usize + j;
    let mut entries: Vec<usize> = if sampled {
        let first: Vec<usize> = planted
            .tokens
            .iter()
            .filter(|t| t.seq < 2)
            .map(|t| entry_of(t.seq, t.pos / spec.page_size))
            .collect();
        let key = dusk_kernels::synthetic::hash::stream_key(
            spec.seed,
            dusk_kernels::synthetic::hash::Stream::Pages,
        );
        let others =
            (0..256u32).map(|i| dusk_kernels::synthetic::hash::mix(key ^ !i) as usize % nnz);
        first.into_iter().chain(others).collect()
    } else {
        (0..nnz).collect()
    };
    entries.sort();
    entries.dedup();
    let per_page = spec.page_size * spec.num_kv_heads * spec.head_dim;
    let (mut differ, mut first_bad) = (0usize, None);
    for &e in &entries {
        let b = table.kv_indptr.partition_point(|p| *p as usize <= e) - 1;
        let (wk, wv) = reference::page(spec, &plants, b, e - table.kv_indptr[b] as usize);
        let at = table.kv_page_indices[e] as usize * per_page;
        for (got, want) in [(&k[at..at + per_page], &wk), (&v[at..at + per_page], &wv)] {
            let bad = got
                .iter()
                .zip(want.iter())
                .filter(|(g, w)| g.to_bits() != w.to_bits())
                .count();
            if bad > 0 {
                first_bad.get_or_insert(format!("page table entry {e} (sequence {b})"));
            }
            differ += bad;
        }
    }
    let want_q = reference::queries(spec, 0);
    let bad_q = q
        .iter()
        .zip(&want_q)
        .filter(|(g, w)| g.to_bits() != w.to_bits())
        .count();
    let ok = differ == 0 && bad_q == 0;
    println!(
        "check against the host reference (bit for bit): {} of {nnz} pages ({}), {differ} K/V values differ; queries: {bad_q} of {} differ: {}",
        entries.len(),
        if sampled { "every planted token's page in sequences 0 and 1, and 256 drawn" } else { "all" },
        q.len(),
        if ok { "PASS" } else { "FAIL" }
    );
    if let Some(at) = first_bad {
        println!("  first difference at {at}");
    }
    Ok(ok)
}
