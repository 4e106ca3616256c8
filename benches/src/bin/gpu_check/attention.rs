//! GPU check and benchmark of varlen paged decode attention, run on the device machine:
//!
//! 1. every mode (dense, head varlen, group varlen, padded, SparQ transform, bf16) against
//!    the f64 reference on fresh random inputs, outputs poisoned first;
//! 2. a decode step captured in a CUDA graph and replayed, with the query and the token
//!    lists changed in place between replays (the plan's `run` allocates nothing and never
//!    syncs, so it can be captured);
//! 3. (unless `--check-only`) device-to-device copy bandwidth, then timings: dense at
//!    batch 1/32/64, 8k/32k context, GQA 32/8 and MHA 32/32; a random quarter of the pages
//!    at batch 32; group varlen against padded on log-normal budgets (mean 256, max 4096,
//!    32k context, batch 64), each beside the peers' times (`--peers`, written by
//!    `benches/baselines/attention_peers.py` in the same command).
//!
//!    `gpu-check attention --peers peers.json --out varlen_attention.json --commit <sha>`
//!
//! `--check-only` stops after 1 and 2 (for compute-sanitizer); `--sweep` and
//! `--sweep-lists` name other tunings to time beside the defaults (the shared config text);
//! `--profile` times one dense GQA case only, for `ncu` (`--profile-skewed`: the skewed
//! group varlen case; `--skewed-repeats N`: that case timed on N draws of its budgets, each
//! beside the `--sweep-lists` tilings, and with `--timeline` where each program's time
//! goes); `--seed N` draws the same inputs in every process; `--cold-meta N` times every
//! case rotating through N copies of its metadata (lists, page table), so that no run finds
//! the ones before it left in L2; `--cpu` runs 1 on the interpreter.

use crate::common::{case_json, copy_gbps, spread, Common, PeerTime, Res};
use clap::Args;
use dusk::compiler::{DType, KernelBuilder};
use dusk::kernels::attention_ops::{
    default_tiling, AttentionMeta, AttentionMode, AttentionPlan, AttentionSpec, AttentionTuning,
    SparqMix,
};
use dusk::kernels::ops::Dusk;
use dusk::kernels::paged::{KvShape, PageTable, TokenLists};
use dusk::kernels::reference::{self, HalfFloat};
use dusk::kernels::timeline::TIMELINE_WORDS;
use dusk::runtime::{Arg, Buffer, Device, Element, LoadedKernel, Measured, TimeConfig};
use dusk_aot::config_text::ConfigText;
use half::{bf16, f16};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::sync::Arc;

const D: usize = 128;
const PAGE: usize = 16;

fn page_table(rng: &mut SmallRng, seq_lens: &[usize]) -> (PageTable, usize) {
    let total = PageTable::pages_needed(seq_lens, PAGE);
    let mut ids: Vec<i32> = (0..total as i32).collect();
    ids.shuffle(rng);
    let table = PageTable::from_lengths(seq_lens, PAGE, ids).expect("consistent page ids");
    (table, total.max(1))
}

/// Random ascending lists of the given lengths (cycled over rows), clamped to each sequence.
fn random_lists(
    rng: &mut SmallRng,
    table: &PageTable,
    heads_per_batch: usize,
    lens: &[usize],
) -> TokenLists {
    let mut indptr = vec![0i32];
    let mut indices = vec![];
    for r in 0..table.batch() * heads_per_batch {
        let n = table.seq_len(r / heads_per_batch, PAGE);
        let want = lens[r % lens.len()].min(n);
        let mut row: Vec<i32> = rand::seq::index::sample(rng, n, want)
            .into_iter()
            .map(|x| x as i32)
            .collect();
        row.sort_unstable();
        indices.extend(row);
        indptr.push(indices.len() as i32);
    }
    TokenLists { indptr, indices }
}

fn poisoned<T: Element>(dev: &Device, n: usize) -> Res<Buffer<T>> {
    let mut b = dev.alloc::<T>(n)?;
    dev.fill_bytes(&mut b, 0xFF)?;
    Ok(b)
}

struct CheckCase {
    seqs: Vec<usize>,
    kv_heads: usize,
    group: usize,
    head_dim: usize,
    mode: AttentionMode,
    lens: Vec<usize>,
    sparq: bool,
    /// Tokens per work item (`None`: the plan's default).
    chunk: Option<usize>,
    /// GQA on the CUDA cores (`false`) or the tensor cores (`true`); `None`: the default.
    tensor_cores: Option<bool>,
    /// Token lists: programs of the balanced split (`None`: the plan's default, about as
    /// many as fit on the GPU, so each takes a segment of the shortest length in these
    /// small cases).
    list_programs: Option<u32>,
    /// Token lists: the split merges rows (no merge launch).
    fused_merge: bool,
    /// Token lists with a merge launch: the merge takes each row once its pieces are in
    /// (the default), else after the whole split.
    row_signals: bool,
    /// Tensor cores: K and V staged through this many tiles of shared memory (`None`: the
    /// default).
    stages: Option<usize>,
}

/// One correctness case on the GPU; returns (output rel err, worst lse abs err).
fn check_case<T: HalfFloat>(dusk: &Dusk, rng: &mut SmallRng, c: &CheckCase) -> Res<(f64, f64)> {
    let dev = dusk.device();
    let (table, num_pages) = page_table(rng, &c.seqs);
    let kv = KvShape {
        num_pages,
        page_size: PAGE,
        num_kv_heads: c.kv_heads,
        head_dim: c.head_dim,
    };
    let hq = c.kv_heads * c.group;
    let batch = c.seqs.len();
    let lists = match c.mode {
        AttentionMode::Dense => None,
        AttentionMode::HeadVarlen => Some(random_lists(rng, &table, hq, &c.lens)),
        _ => Some(random_lists(rng, &table, c.kv_heads, &c.lens)),
    };
    let longest = lists
        .as_ref()
        .map(|l| l.max_row_len())
        .unwrap_or(*c.seqs.iter().max().unwrap_or(&1));
    let spec = AttentionSpec {
        kv,
        batch,
        num_q_heads: hq,
        mode: c.mode,
        max_tokens: longest.max(1),
        sm_scale: None,
        sparq: c.sparq,
        dtype: T::DTYPE,
    };
    let plan = AttentionPlan::with_tuning(dusk, spec, |t| {
        if let Some(ch) = c.chunk {
            t.chunk_tokens = ch;
        }
        if let Some(n) = c.list_programs {
            t.list_programs = n;
        }
        t.fused_merge = c.fused_merge;
        t.row_signals = c.row_signals;
        if c.tensor_cores == Some(false) && t.tensor_cores {
            let (bt, w, f) = default_tiling(c.head_dim, c.group);
            (t.block_tokens, t.num_warps, t.prefetch, t.tensor_cores) = (bt, w, f, false);
            t.chunk_tokens = t.chunk_tokens.div_ceil(bt) * bt;
        }
        if let Some(n) = c.stages {
            (t.stages, t.stream_kv, t.l2_prefetch, t.prefetch) = (n, false, false, 1);
        }
    })?;
    let meta = plan.upload_meta(dusk, &table, lists.as_ref())?;
    let gen = |rng: &mut SmallRng, n: usize| -> Vec<T> {
        (0..n)
            .map(|_| T::from_f32(rng.random_range(-2.0f32..2.0)))
            .collect()
    };
    let q = gen(rng, batch * hq * c.head_dim);
    let k = gen(rng, kv.elements());
    let v = gen(rng, kv.elements());
    let alpha: Vec<f32> = (0..batch * hq)
        .map(|_| rng.random_range(0.0..1.0))
        .collect();
    let v_mean = gen(rng, batch * c.kv_heads * c.head_dim);
    let (qb, kb, vb) = (dev.upload(&q)?, dev.upload(&k)?, dev.upload(&v)?);
    let (ab, vmb) = (dev.upload(&alpha)?, dev.upload(&v_mean)?);
    let mix = c.sparq.then_some(SparqMix {
        alpha: &ab,
        v_mean: &vmb,
    });
    // Three launches back to back, the outputs poisoned before each and the last checked:
    // a merge that read a row before its pieces were in, or counters that a launch left
    // set, would show in the later ones.
    let launch = || -> Res<(Buffer<T>, Buffer<f32>)> {
        let mut out = poisoned::<T>(dev, q.len())?;
        let mut lse = poisoned::<f32>(dev, batch * hq)?;
        plan.run(dusk, &qb, &kb, &vb, &meta, mix, &mut out, &mut lse)?;
        Ok((out, lse))
    };
    launch()?;
    launch()?;
    let (out, lse) = launch()?;
    if !plan.counters_settled()? {
        return Err("attention: a launch left the rows' counters unsettled".into());
    }
    let f = |x: &[T]| x.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
    let vm = f(&v_mean);
    let (want, want_lse) = reference::attention(
        &f(&q),
        &f(&k),
        &f(&v),
        hq,
        &kv,
        &table,
        &reference::per_query_rows(c.mode, &table, lists.as_ref(), &kv, hq),
        1.0 / (c.head_dim as f64).sqrt(),
        c.sparq.then_some((&alpha[..], &vm[..])),
    );
    let got = f(&out.download()?);
    let got_lse = lse.download()?;
    let err = reference::rel_error(&got, &want);
    let mut lse_err = 0.0f64;
    for (a, b) in got_lse.iter().zip(&want_lse) {
        if b.is_infinite() {
            if *a != f32::NEG_INFINITY {
                return Err(format!("empty row: lse {a}, want -inf").into());
            }
        } else {
            lse_err = lse_err.max((*a as f64 - b).abs());
        }
    }
    Ok((err, lse_err))
}

impl CheckCase {
    /// f16, no SparQ, the plan's default tuning.
    fn new(
        mode: AttentionMode,
        seqs: &[usize],
        kv_heads: usize,
        group: usize,
        head_dim: usize,
        lens: &[usize],
    ) -> CheckCase {
        CheckCase {
            seqs: seqs.to_vec(),
            kv_heads,
            group,
            head_dim,
            mode,
            lens: lens.to_vec(),
            sparq: false,
            chunk: None,
            tensor_cores: None,
            list_programs: None,
            fused_merge: false,
            row_signals: true,
            stages: None,
        }
    }
}

fn correctness(dusk: &Dusk, rng: &mut SmallRng) -> Res<f64> {
    use AttentionMode::*;
    let new = CheckCase::new;
    let chunk = |c: CheckCase, n: usize| CheckCase {
        chunk: Some(n),
        ..c
    };
    // (case, in bf16)
    let mut cases = vec![
        (new(Dense, &[1, 300, 4097], 8, 4, 128, &[]), false),
        (chunk(new(Dense, &[777, 16, 33], 4, 1, 64, &[]), 64), false),
        (new(Dense, &[2000], 2, 8, 256, &[]), false),
        (
            chunk(
                new(HeadVarlen, &[3000, 500], 4, 2, 128, &[0, 1, 2707, 27, 300]),
                128,
            ),
            false,
        ),
        (
            new(
                GroupVarlen,
                &[5000, 1200, 40],
                8,
                4,
                128,
                &[27, 2707, 0, 1, 600],
            ),
            false,
        ),
        (
            chunk(new(GroupVarlen, &[1500, 700], 2, 8, 64, &[1000, 3]), 256),
            false,
        ),
        (
            new(Padded, &[2500, 900], 8, 4, 128, &[2000, 50, 0, 700]),
            false,
        ),
        (
            CheckCase {
                sparq: true,
                ..new(GroupVarlen, &[900, 400], 4, 4, 128, &[300, 77])
            },
            false,
        ),
        (new(GroupVarlen, &[1800, 64], 8, 4, 128, &[1000, 9]), true),
    ];
    // GQA of head_dim 64 and 128 runs on the tensor cores by default; the CUDA-core kernel
    // stays a tuning option, so two GQA cases are checked on it too.
    let fma = |c: CheckCase| CheckCase {
        tensor_cores: Some(false),
        ..c
    };
    cases.push((fma(new(Dense, &[1, 300, 4097], 8, 4, 128, &[])), false));
    cases.push((
        fma(chunk(
            new(GroupVarlen, &[1500, 700], 2, 8, 64, &[1000, 3]),
            256,
        )),
        false,
    ));
    // Few programs, each taking a long segment across several rows.
    let strided = |c: CheckCase| CheckCase {
        list_programs: Some(5),
        ..chunk(c, 64)
    };
    cases.push((
        strided(new(
            GroupVarlen,
            &[5000, 1200, 40],
            8,
            4,
            128,
            &[27, 2707, 0, 1, 600],
        )),
        false,
    ));
    cases.push((
        fma(strided(new(
            HeadVarlen,
            &[3000, 500],
            4,
            2,
            128,
            &[0, 1, 2707, 27, 300],
        ))),
        false,
    ));
    // K and V staged through shared memory by cp.async (a tuning option): rings of 2 to
    // 6 stages, short chunks (a stage past the chunk's end), both head dims, every mode.
    let staged = |c: CheckCase, n: usize| CheckCase {
        stages: Some(n),
        ..c
    };
    cases.extend([
        (
            staged(new(Dense, &[1, 300, 4097], 8, 4, 128, &[]), 4),
            false,
        ),
        (
            staged(chunk(new(Dense, &[777, 16, 33], 2, 8, 64, &[]), 64), 6),
            false,
        ),
        (
            staged(chunk(new(Dense, &[2000, 5], 8, 4, 128, &[]), 16), 3),
            true,
        ),
        (staged(new(Dense, &[4097, 900], 8, 4, 128, &[]), 2), false),
        (
            staged(
                new(
                    GroupVarlen,
                    &[5000, 1200, 40],
                    8,
                    4,
                    128,
                    &[27, 2707, 0, 1, 600],
                ),
                3,
            ),
            false,
        ),
        (
            staged(new(Padded, &[2500, 900], 8, 4, 128, &[2000, 50, 0, 700]), 4),
            false,
        ),
    ]);
    let mut worst = 0.0f64;
    println!("correctness (fresh random inputs, outputs poisoned, f64 reference):");
    for (case, bf) in cases {
        // Token lists three ways: merged by a second launch (row by row as the split
        // signals them, or after the whole split) and by the split itself.
        let lists = matches!(case.mode, HeadVarlen | GroupVarlen);
        let ways = [(false, true), (false, false), (true, false)];
        for (fused_merge, row_signals) in ways.into_iter().take(1 + 2 * lists as usize) {
            let c = CheckCase {
                fused_merge,
                row_signals,
                seqs: case.seqs.clone(),
                lens: case.lens.clone(),
                ..case
            };
            let (mode, kv_heads, group, head_dim) = (c.mode, c.kv_heads, c.group, c.head_dim);
            let (sparq, tensor_cores, list_programs) = (c.sparq, c.tensor_cores, c.list_programs);
            let stages = c.stages;
            let (err, lse_err) = if bf {
                check_case::<bf16>(dusk, rng, &c)?
            } else {
                check_case::<f16>(dusk, rng, &c)?
            };
            let tol = if bf { 1e-2 } else { 2e-3 };
            println!(
                "  {mode:?} seqs {:?} kv_heads {kv_heads} group {group} d {head_dim} lens {:?}{}{}{}{}{}{}{}: rel err {err:.2e}, lse abs err {lse_err:.1e}",
                c.seqs,
                c.lens,
                if sparq { " sparq" } else { "" },
                if bf { " bf16" } else { " f16" },
                if tensor_cores == Some(false) { " cuda-cores" } else { "" },
                match list_programs {
                    Some(n) => format!(" {n} list programs"),
                    None => String::new(),
                },
                if fused_merge { " fused merge" } else { "" },
                if lists && !fused_merge && !row_signals { " merge after the split" } else { "" },
                match stages {
                    Some(n) => format!(" {n} stages"),
                    None => String::new(),
                }
            );
            if err >= tol || lse_err > 1e-2 {
                return Err(format!(
                    "attention: rel err {err:.2e} (tol {tol:.0e}), lse err {lse_err:.1e}"
                )
                .into());
            }
            if !bf {
                worst = worst.max(err);
            }
        }
    }
    Ok(worst)
}

/// A decode step captured in a CUDA graph: replayed, checked; the query and the device
/// token lists then changed in place, replayed again, checked again. `fused_merge`: the
/// split merges rows, so its arrival counters must be back at zero between replays.
fn graph_replay(dusk: &Dusk, rng: &mut SmallRng, fused_merge: bool) -> Res<(f64, f64, f64)> {
    use cudarc::driver::sys;
    let dev = dusk.device();
    let stream = dev.cuda_stream().ok_or("no stream")?.clone();
    let seqs = [3000usize, 1000, 2048, 77];
    let (table, num_pages) = page_table(rng, &seqs);
    let kv = KvShape {
        num_pages,
        page_size: PAGE,
        num_kv_heads: 8,
        head_dim: D,
    };
    let hq = 32;
    let budget = 1024;
    let spec = AttentionSpec {
        kv,
        batch: seqs.len(),
        num_q_heads: hq,
        mode: AttentionMode::GroupVarlen,
        max_tokens: budget,
        sm_scale: None,
        sparq: false,
        dtype: DType::F16,
    };
    let plan = AttentionPlan::with_tuning(dusk, spec, |t| t.fused_merge = fused_merge)?;
    // Lists of a fixed capacity (each row `budget` slots), so a step can rewrite them in
    // place: the pruner's contract.
    let make = |rng: &mut SmallRng| -> TokenLists {
        let lens: Vec<usize> = (0..8).map(|_| rng.random_range(0..=budget)).collect();
        random_lists(rng, &table, 8, &lens)
    };
    let pad = |l: &TokenLists| -> (Vec<i32>, Vec<i32>) {
        let mut idx = l.indices.clone();
        idx.resize(seqs.len() * 8 * budget, 0);
        (l.indptr.clone(), idx)
    };
    let lists1 = make(rng);
    let (ip1, ix1) = pad(&lists1);
    let ip_dev = dev.upload(&ip1)?;
    let ix_dev = dev.upload(&ix1)?;
    let mut meta: AttentionMeta = plan.device_meta(dusk, &table, ip_dev, ix_dev)?;
    let gen = |rng: &mut SmallRng, n: usize| -> Vec<f16> {
        (0..n)
            .map(|_| f16::from_f32(rng.random_range(-2.0f32..2.0)))
            .collect()
    };
    let q1 = gen(rng, seqs.len() * hq * D);
    let k = gen(rng, kv.elements());
    let v = gen(rng, kv.elements());
    let mut qb = dev.upload(&q1)?;
    let (kb, vb) = (dev.upload(&k)?, dev.upload(&v)?);
    let mut out = poisoned::<f16>(dev, q1.len())?;
    let mut lse = poisoned::<f32>(dev, seqs.len() * hq)?;
    dev.synchronize()?;
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = plan.run(dusk, &qb, &kb, &vb, &meta, None, &mut out, &mut lse);
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0))?;
    captured?;
    let graph = graph.ok_or("empty graph")?;
    let f = |x: &[f16]| x.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
    let (kf, vf) = (f(&k), f(&v));
    let check = |q: &[f16], lists: &TokenLists, out: &Buffer<f16>| -> Res<f64> {
        let rows =
            reference::per_query_rows(AttentionMode::GroupVarlen, &table, Some(lists), &kv, hq);
        let (want, _) = reference::attention(
            &f(q),
            &kf,
            &vf,
            hq,
            &kv,
            &table,
            &rows,
            1.0 / (D as f64).sqrt(),
            None,
        );
        Ok(reference::rel_error(&f(&out.download()?), &want))
    };
    graph.launch()?;
    let e1 = check(&q1, &lists1, &out)?;
    // New step: new query, new lists, written in place; same graph.
    let q2 = gen(rng, q1.len());
    qb.copy_from_host(&q2)?;
    let lists2 = make(rng);
    let (ip2, ix2) = pad(&lists2);
    let (ipb, ixb) = meta.lists_mut().ok_or("list metadata")?;
    ipb.copy_from_host(&ip2)?;
    ixb.copy_from_host(&ix2)?;
    graph.launch()?;
    let e2 = check(&q2, &lists2, &out)?;
    if e1.max(e2) >= 2e-3 {
        return Err(format!("graph replay: rel err {e1:.2e}, {e2:.2e}").into());
    }
    // The replay's time: graph launches queued between events (a graph is not captured in
    // a graph).
    let queued = TimeConfig {
        graph: false,
        ..TimeConfig::default()
    };
    let replay = dev
        .time_calls_with(&queued, 1, |_| graph.launch())?
        .median_us();
    Ok((e1, e2, replay))
}

/// Fills f16 buffers on the device with a hash of the index (uniform in [-1, 1)): the
/// benchmark caches reach 34 GB, too much to make on the host.
pub(crate) fn fill_kernel(dusk: &Dusk) -> Res<Arc<LoadedKernel>> {
    const BLOCK: i64 = 2048;
    let mut b = KernelBuilder::new("bench_fill_f16");
    let x = b.param_ptr("x", DType::F16);
    let n = b.param_scalar("n", DType::I64);
    let seed = b.param_scalar("seed", DType::I64);
    let pid = b.program_id(0);
    let pid = b.cast(pid, DType::I64);
    let base = b.mul_c(pid, BLOCK);
    let r = b.arange(0, BLOCK);
    let r = b.cast(r, DType::I64);
    let i = b.add(base, r);
    let ok = b.lt(i, n);
    let mut h = b.add(i, seed);
    for _ in 0..2 {
        let c16 = b.i64(16);
        let sh = b.shr(h, c16);
        let mask = b.i64(0xFFFF_FFFF);
        let sh = b.and(sh, mask);
        h = b.xor(h, sh);
        h = b.mul_c(h, 0x45d9f3b);
        let m = b.i64(0xFFFF_FFFF);
        h = b.and(h, m);
    }
    let m = b.i64(0xFFFF);
    let h = b.and(h, m);
    let hf = b.cast(h, DType::F32);
    let s = b.f32(1.0 / 32768.0);
    let hf = b.mul(hf, s);
    let one = b.f32(1.0);
    let hf = b.sub(hf, one);
    let hv = b.cast(hf, DType::F16);
    let p = b.add_ptr(x, i);
    b.store_masked(p, hv, Some(ok));
    Ok(dusk.load(b.finish()?)?)
}

pub(crate) fn random_device(
    dusk: &Dusk,
    fill: &LoadedKernel,
    n: usize,
    seed: i64,
) -> Res<Buffer<f16>> {
    let buf = dusk.device().alloc::<f16>(n)?;
    let grid = n.div_ceil(2048) as u32;
    dusk.device().launch(
        fill,
        [grid, 1, 1],
        &[Arg::from(&buf), Arg::I64(n as i64), Arg::I64(seed)],
    )?;
    Ok(buf)
}

/// A benchmark cache: K/V pairs in as many copies as the harness's rotation asks for the
/// bytes a run reads (so reads come from DRAM).
struct Cache {
    pairs: Vec<(Buffer<f16>, Buffer<f16>)>,
}

fn cache(dusk: &Dusk, fill: &LoadedKernel, kv: KvShape, read_bytes: usize) -> Res<Cache> {
    let copies = dusk.device().rotation_sets(read_bytes);
    let mut pairs = vec![];
    for c in 0..copies {
        let s = 2 * c as i64 * kv.elements() as i64;
        pairs.push((
            random_device(dusk, fill, kv.elements(), s)?,
            random_device(dusk, fill, kv.elements(), s + kv.elements() as i64)?,
        ));
    }
    Ok(Cache { pairs })
}

/// The metadata a timed plan rotates through: one upload, or with `--cold-meta N` N of
/// them (N x the lists and the page table, beyond the L2 for N of 64 or more on these
/// cases), so that each run reads metadata no run before it left in L2, as an engine
/// whose other kernels evict it between steps would.
fn metas(
    dusk: &Dusk,
    plan: &AttentionPlan,
    table: &PageTable,
    lists: Option<&TokenLists>,
    cold_meta: usize,
) -> Res<Vec<AttentionMeta>> {
    (0..cold_meta.max(1))
        .map(|_| Ok(plan.upload_meta(dusk, table, lists)?))
        .collect()
}

/// The default timed twice, before and after the other tilings (a pass now and then ran
/// 10-17% slower than the same configuration timed beside it, 6f9a353's run): both passes'
/// samples together, and each pass's median.
fn time_default(
    dusk: &Dusk,
    plan: &AttentionPlan,
    c: &Cache,
    meta: &[AttentionMeta],
    q: &Buffer<f16>,
    between: impl FnOnce() -> Res<Vec<Value>>,
) -> Res<(Measured, Value, Vec<Value>)> {
    let mut a = time_plan(dusk, plan, c, meta, q)?;
    let others = between()?;
    let b = time_plan(dusk, plan, c, meta, q)?;
    let passes = json!([a.median_us(), b.median_us()]);
    if a.timing != b.timing {
        return Err(format!("the default was timed as {} then {}", a.timing, b.timing).into());
    }
    a.samples_us.extend(b.samples_us);
    Ok((a, passes, others))
}

/// `plan.run` timed by the harness, rotating through the cache's copies (and the
/// metadata's).
fn time_plan(
    dusk: &Dusk,
    plan: &AttentionPlan,
    c: &Cache,
    meta: &[AttentionMeta],
    q: &Buffer<f16>,
) -> Res<Measured> {
    let dev = dusk.device();
    let rows = plan.spec().batch * plan.spec().num_q_heads;
    let mut out = dev.alloc::<f16>(rows * D)?;
    let mut lse = dev.alloc::<f32>(rows)?;
    let sets = c.pairs.len().max(meta.len());
    Ok(dev.time_calls(sets, |i| {
        let (k, v) = &c.pairs[i % c.pairs.len()];
        plan.run(
            dusk,
            q,
            k,
            v,
            &meta[i % meta.len()],
            None,
            &mut out,
            &mut lse,
        )
    })?)
}

/// An alternative tuning to time beside the default: overrides in the shared config text
/// (`dusk_aot::config_text`, e.g. `fused_merge=true,merge_chunks=4`) applied onto the
/// plan's default tuning.
type Tiling = String;

fn describe(t: &AttentionTuning) -> String {
    t.to_text()
}

/// Times `spec` under each of `tilings`; returns `[{"tiling", "us"}]`.
#[allow(clippy::too_many_arguments)]
fn time_tilings(
    dusk: &Dusk,
    spec: AttentionSpec,
    table: &PageTable,
    lists: Option<&TokenLists>,
    c: &Cache,
    q: &Buffer<f16>,
    tilings: &[Tiling],
    cold_meta: usize,
) -> Res<Vec<Value>> {
    let mut out = vec![];
    for t in tilings {
        let mut bad = None;
        let p = AttentionPlan::with_tuning(dusk, spec, |u: &mut AttentionTuning| {
            bad = u.apply_text(t).err();
            // A text that changes the step but not the chunk keeps the default chunk,
            // rounded up to whole steps.
            if !t.contains("chunk_tokens") {
                u.chunk_tokens = u.chunk_tokens.div_ceil(u.block_tokens) * u.block_tokens;
            }
        });
        if let Some(e) = bad {
            return Err(format!("attention config `{t}`: {e}").into());
        }
        // A tuning this case cannot take (`stages` where the tensor cores do not serve it,
        // e.g. MHA) is left out of the case, said so, and the sweep goes on.
        let p = match p {
            Ok(p) => p,
            Err(e) => {
                println!("    tiling {t}: not for this case ({e})");
                continue;
            }
        };
        let m = metas(dusk, &p, table, lists, cold_meta)?;
        let t = time_plan(dusk, &p, c, &m, q)?;
        out.push(json!({"tiling": describe(p.tuning()), "us": t.median_us(), "timing": t.timing.as_str()}));
    }
    Ok(out)
}

struct Bench<'a> {
    dusk: &'a Dusk,
    fill: Arc<LoadedKernel>,
    rng: SmallRng,
    copy_gbps: f64,
    peers: Option<Value>,
    cases: Vec<Value>,
    /// Copies of each case's metadata rotated through (`--cold-meta`).
    cold_meta: usize,
    /// Where each program's time goes, for the skewed case (`--timeline`).
    timeline: bool,
}

impl<'a> Bench<'a> {
    /// A benchmark run's state: `copy_gbps` the yardstick (NaN when only profiled),
    /// `peers` their times for the same cases.
    fn new(
        dusk: &'a Dusk,
        rng: SmallRng,
        copy_gbps: f64,
        peers: Option<Value>,
        args: &AttentionArgs,
    ) -> Res<Self> {
        Ok(Bench {
            dusk,
            fill: fill_kernel(dusk)?,
            rng,
            copy_gbps,
            peers,
            cases: vec![],
            cold_meta: args.cold_meta,
            timeline: args.timeline,
        })
    }

    /// The default tuning of `plan` timed twice ([`time_default`]) with `tilings` timed
    /// between the two passes.
    #[allow(clippy::too_many_arguments)]
    fn time_default(
        &self,
        plan: &AttentionPlan,
        spec: AttentionSpec,
        table: &PageTable,
        lists: Option<&TokenLists>,
        meta: &[AttentionMeta],
        c: &Cache,
        q: &Buffer<f16>,
        tilings: &[Tiling],
    ) -> Res<(Measured, Value, Vec<Value>)> {
        time_default(self.dusk, plan, c, meta, q, || {
            time_tilings(self.dusk, spec, table, lists, c, q, tilings, self.cold_meta)
        })
    }

    /// The peer `key`'s time for `case` (`{key}_us`, `{key}_timing` in the peers' file).
    fn peer(&self, case: &str, key: &str) -> PeerTime {
        let found = self
            .peers
            .as_ref()
            .and_then(|p| p["cases"].as_array()?.iter().find(|c| c["case"] == case));
        PeerTime::from_case(found, key)
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        case: &str,
        shape: Value,
        ours: &Measured,
        peer: &str,
        peer_time: &PeerTime,
        bytes: usize,
        extra: Value,
    ) {
        let us = ours.median_us();
        let gbps = bytes as f64 / (us * 1e-6) / 1e9;
        println!(
            "  {case} vs {peer}: {us:.1} us ({}; peer {}), {gbps:.0} GB/s = {:.1}% of copy",
            ours.timing,
            peer_time.us.map_or("n/a".into(), |p| format!(
                "{p:.1} us ({}), {:.2}x",
                peer_time.timing.as_deref().unwrap_or("?"),
                p / us
            )),
            100.0 * gbps / self.copy_gbps
        );
        self.cases.push(case_json(
            &format!("{case}_vs_{peer}"),
            shape,
            ours,
            peer,
            peer_time,
            bytes as f64,
            self.copy_gbps,
            extra,
        ));
    }

    /// Dense decode, beside FlashInfer and SDPA (flash); `tilings` are timed too.
    fn dense(
        &mut self,
        batch: usize,
        hq: usize,
        hkv: usize,
        ctx: usize,
        tilings: &[Tiling],
    ) -> Res<()> {
        let (table, num_pages) = page_table(&mut self.rng, &vec![ctx; batch]);
        let kv = KvShape {
            num_pages,
            page_size: PAGE,
            num_kv_heads: hkv,
            head_dim: D,
        };
        let bytes = 2 * kv.elements() * 2;
        let c = cache(self.dusk, &self.fill, kv, bytes)?;
        let q = random_device(self.dusk, &self.fill, batch * hq * D, 7)?;
        let spec = AttentionSpec {
            kv,
            batch,
            num_q_heads: hq,
            mode: AttentionMode::Dense,
            max_tokens: ctx,
            sm_scale: None,
            sparq: false,
            dtype: DType::F16,
        };
        let plan = AttentionPlan::new(self.dusk, spec)?;
        let meta = metas(self.dusk, &plan, &table, None, self.cold_meta)?;
        let (us, passes, others) =
            self.time_default(&plan, spec, &table, None, &meta, &c, &q, tilings)?;
        let tu = plan.tuning();
        let name = format!("dense_b{batch}_h{hq}x{hkv}_ctx{ctx}");
        let shape = json!({"batch": batch, "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": D,
                           "page_size": PAGE, "context": ctx});
        let extra = json!({
            "tuning": describe(tu),
            "default_passes_us": passes,
            "other_tilings_us": others,
        });
        let fi = self.peer(&name, "flashinfer");
        self.record(&name, shape.clone(), &us, "flashinfer", &fi, bytes, extra);
        let sd = self.peer(&name, "sdpa_flash");
        self.record(&name, shape, &us, "sdpa-flash", &sd, bytes, json!({}));
        Ok(())
    }

    /// A random quarter of each sequence's pages (the same for every KV head, as FlashInfer
    /// takes them), as group lists; beside FlashInfer given those pages.
    fn quarter(
        &mut self,
        batch: usize,
        hq: usize,
        hkv: usize,
        ctx: usize,
        tilings: &[Tiling],
    ) -> Res<()> {
        let (table, num_pages) = page_table(&mut self.rng, &vec![ctx; batch]);
        let kv = KvShape {
            num_pages,
            page_size: PAGE,
            num_kv_heads: hkv,
            head_dim: D,
        };
        let pages_per_seq = ctx / PAGE;
        let keep = pages_per_seq / 4;
        let mut sel = vec![];
        for _ in 0..batch {
            let mut chosen: Vec<usize> =
                rand::seq::index::sample(&mut self.rng, pages_per_seq, keep).into_vec();
            chosen.sort_unstable();
            for _ in 0..hkv {
                sel.push(chosen.clone());
            }
        }
        let lists = TokenLists::from_pages(&table, PAGE, hkv, &sel);
        let tokens = lists.indices.len();
        let bytes = tokens * (2 * D * 2 + 4);
        let c = cache(self.dusk, &self.fill, kv, bytes)?;
        let q = random_device(self.dusk, &self.fill, batch * hq * D, 9)?;
        let spec = AttentionSpec {
            kv,
            batch,
            num_q_heads: hq,
            mode: AttentionMode::GroupVarlen,
            max_tokens: keep * PAGE,
            sm_scale: None,
            sparq: false,
            dtype: DType::F16,
        };
        let plan = AttentionPlan::new(self.dusk, spec)?;
        let meta = metas(self.dusk, &plan, &table, Some(&lists), self.cold_meta)?;
        let (us, passes, others) =
            self.time_default(&plan, spec, &table, Some(&lists), &meta, &c, &q, tilings)?;
        let name = format!("quarter_b{batch}_h{hq}x{hkv}_ctx{ctx}");
        let shape = json!({"batch": batch, "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": D,
                           "page_size": PAGE, "context": ctx, "kept_pages_pct": 25});
        let fi = self.peer(&name, "flashinfer");
        let extra = json!({"tuning": describe(plan.tuning()), "split_grid": plan.grid(),
                           "default_passes_us": passes, "other_tilings_us": others});
        self.record(&name, shape, &us, "flashinfer", &fi, bytes, extra);
        Ok(())
    }

    /// Group varlen on log-normal per-group budgets (mean 256, at most 4096) against the
    /// padded baseline (every group padded to 4096).
    fn skewed(
        &mut self,
        batch: usize,
        hq: usize,
        hkv: usize,
        ctx: usize,
        tilings: &[Tiling],
    ) -> Res<()> {
        let (table, num_pages) = page_table(&mut self.rng, &vec![ctx; batch]);
        let kv = KvShape {
            num_pages,
            page_size: PAGE,
            num_kv_heads: hkv,
            head_dim: D,
        };
        // Log-normal with sigma 1 and mean 256: mu = ln 256 - 1/2.
        let (sigma, max) = (1.0f64, 4096usize);
        let mu = (256f64).ln() - sigma * sigma / 2.0;
        let lens: Vec<usize> = (0..batch * hkv)
            .map(|_| {
                let (u1, u2): (f64, f64) = (self.rng.random(), self.rng.random());
                let z = (-2.0 * (1.0 - u1).ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                ((mu + sigma * z).exp().round() as usize).clamp(1, max)
            })
            .collect();
        let lists = random_lists(&mut self.rng, &table, hkv, &lens);
        let tokens = lists.indices.len();
        println!(
            "  skewed draw: {tokens} kept tokens, longest row {}, rows of 1024+ tokens {}",
            lists.max_row_len(),
            lens.iter().filter(|&&n| n >= 1024).count()
        );
        let bytes = tokens * (2 * D * 2 + 4);
        let c = cache(self.dusk, &self.fill, kv, bytes)?;
        let q = random_device(self.dusk, &self.fill, batch * hq * D, 11)?;
        let mut timed = vec![];
        let mut others = vec![];
        let mut passes = json!(null);
        let mut tuning = String::new();
        let mut grid = [0; 3];
        for mode in [AttentionMode::GroupVarlen, AttentionMode::Padded] {
            let spec = AttentionSpec {
                kv,
                batch,
                num_q_heads: hq,
                mode,
                max_tokens: max,
                sm_scale: None,
                sparq: false,
                dtype: DType::F16,
            };
            let plan = AttentionPlan::new(self.dusk, spec)?;
            let meta = metas(self.dusk, &plan, &table, Some(&lists), self.cold_meta)?;
            if mode == AttentionMode::GroupVarlen {
                if self.timeline {
                    timeline(self.dusk, spec, &table, &lists, &c, &q)?;
                }
                tuning = describe(plan.tuning());
                grid = plan.grid();
                let t;
                (t, passes, others) =
                    self.time_default(&plan, spec, &table, Some(&lists), &meta, &c, &q, tilings)?;
                timed.push(t);
            } else {
                timed.push(time_plan(self.dusk, &plan, &c, &meta, &q)?);
            }
        }
        let name = format!("skewed_b{batch}_h{hq}x{hkv}_ctx{ctx}");
        let mean = tokens as f64 / lens.len() as f64;
        let shape = json!({"batch": batch, "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": D,
                           "page_size": PAGE, "context": ctx, "budget_mean": 256, "budget_max": max});
        let extra = json!({"kept_tokens": tokens, "measured_mean_budget": mean,
                           "longest_budget": lists.max_row_len(), "tuning": tuning, "split_grid": grid,
                           "default_passes_us": passes, "other_tilings_us": others});
        for o in &others {
            if let (Some(t), Some(us)) = (o["tiling"].as_str(), o["us"].as_f64()) {
                let gbps = bytes as f64 / (us * 1e-6) / 1e9;
                let pct = 100.0 * gbps / self.copy_gbps;
                println!("    tiling {t}: {us:.1} us, {pct:.1}% of copy");
            }
        }
        let padded = PeerTime {
            us: Some(timed[1].median_us()),
            timing: Some(timed[1].timing.as_str().into()),
        };
        self.record(&name, shape, &timed[0], "padded", &padded, bytes, extra);
        Ok(())
    }
}

/// `gpu-check attention`'s options.
#[derive(Args, Debug)]
pub struct AttentionArgs {
    #[command(flatten)]
    common: Common,
    /// Run the correctness checks through the interpreter (to test this program).
    #[arg(long)]
    cpu: bool,
    /// A tuning to time beside the defaults of the dense cases: overrides in the shared
    /// config text (e.g. `chunk_tokens=256,num_warps=1`); repeat the option for more.
    #[arg(long, value_name = "CONFIG")]
    sweep: Vec<String>,
    /// A tuning to time beside the defaults of the token-list cases (as --sweep).
    #[arg(long, value_name = "CONFIG")]
    sweep_lists: Vec<String>,
    /// Time one dense GQA case only (batch 32, 32k), for a profiler.
    #[arg(long)]
    profile: bool,
    /// Time the skewed group varlen case only, for a profiler.
    #[arg(long)]
    profile_skewed: bool,
    /// Time the skewed case alone on N fresh draws of its budgets.
    #[arg(long, value_name = "N")]
    skewed_repeats: Option<usize>,
    /// Rotate every case through N copies of its metadata (lists, page table).
    #[arg(long, value_name = "N", default_value_t = 1)]
    cold_meta: usize,
    /// Where each program's time goes in the skewed case.
    #[arg(long)]
    timeline: bool,
    /// Time only the cases whose name contains one of these (e.g. `dense_b1_`; repeat the
    /// option for more).
    #[arg(long, value_name = "TEXT")]
    only: Vec<String>,
}

impl AttentionArgs {
    /// Whether the case `name` is timed (`--only`).
    fn wanted(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| name.contains(o.as_str()))
    }
}

pub fn run(args: &AttentionArgs) -> Res<()> {
    let dev = if args.cpu {
        Device::cpu()
    } else {
        Device::gpu(0)?
    };
    println!(
        "device: {} (driver {:?}, cc {:?}, {} SMs)",
        dev.name(),
        dev.driver_version(),
        dev.compute_capability(),
        dev.num_sms().unwrap_or(0)
    );
    let dusk = Dusk::new(dev.clone())?;
    // `--seed N`: the same draws (inputs, lists, budgets) in every process, so that two
    // builds can be compared draw by draw; by default each process draws its own.
    let mut rng = SmallRng::seed_from_u64(args.common.seed_or(0xa77e));
    let (sweep, sweep_lists) = (&args.sweep, &args.sweep_lists);
    // A malformed tuning text is an error before anything runs.
    let probe = AttentionTuning::for_spec(
        &AttentionSpec {
            kv: KvShape {
                num_pages: 1,
                page_size: PAGE,
                num_kv_heads: 8,
                head_dim: D,
            },
            batch: 1,
            num_q_heads: 32,
            mode: AttentionMode::Dense,
            max_tokens: PAGE,
            sm_scale: None,
            sparq: false,
            dtype: DType::F16,
        },
        132,
    );
    for (option, t) in sweep
        .iter()
        .map(|t| ("--sweep", t))
        .chain(sweep_lists.iter().map(|t| ("--sweep-lists", t)))
    {
        probe
            .with_text(t)
            .map_err(|e| format!("{option} {t}: {e}"))?;
    }
    if args.profile_skewed {
        // The skewed group varlen case alone, for a profiler: group lists first (5 untimed
        // runs, 30 timed twice), then the padded baseline.
        let mut bench = Bench::new(&dusk, rng, f64::NAN, None, args)?;
        return bench.skewed(64, 32, 8, 32768, sweep_lists);
    }
    if let Some(repeats) = args.skewed_repeats {
        // The skewed group varlen case alone, on `repeats` fresh draws of the budgets (they
        // move its time by a few percent), each with the `--sweep-lists` tilings beside
        // the default: an A/B of list tilings in minutes, not the whole benchmark.
        let mut bench = Bench::new(&dusk, rng, copy_gbps(&dev)?, None, args)?;
        for _ in 0..repeats {
            bench.skewed(64, 32, 8, 32768, sweep_lists)?;
        }
        return Ok(());
    }
    if args.profile {
        // One case for a profiler: dense GQA 32/8, batch 32, 32k context, default tuning
        // (5 untimed then 30 timed runs).
        let mut bench = Bench::new(&dusk, rng, f64::NAN, None, args)?;
        return bench.dense(32, 32, 8, 32768, &[]);
    }
    let worst = correctness(&dusk, &mut rng)?;
    if !dev.is_gpu() {
        println!("checks passed on the CPU");
        return Ok(());
    }
    let graph = graph_replay(&dusk, &mut rng, false)?;
    let graph_fused = graph_replay(&dusk, &mut rng, true)?;
    for (g, how) in [(graph, ""), (graph_fused, " (split merging rows)")] {
        println!(
            "graph replay{how}: rel err {:.2e}, then {:.2e} after new q and lists written in place; replay {:.1} us",
            g.0, g.1, g.2
        );
    }
    if args.common.check_only {
        println!("all checks passed");
        return Ok(());
    }

    let copy_gbps = copy_gbps(&dev)?;
    let peers = args.common.peers()?;
    let mut bench = Bench::new(&dusk, rng, copy_gbps, peers, args)?;
    println!("timings (harness: inputs rotated past twice the L2, median per call):");
    for batch in [1usize, 32, 64] {
        for ctx in [8192usize, 32768] {
            for (hq, hkv) in [(32usize, 8usize), (32, 32)] {
                if args.wanted(&format!("dense_b{batch}_h{hq}x{hkv}_ctx{ctx}")) {
                    bench.dense(batch, hq, hkv, ctx, sweep)?;
                }
            }
        }
    }
    for hkv in [8usize, 32] {
        if args.wanted(&format!("quarter_b32_h32x{hkv}_ctx32768")) {
            bench.quarter(32, 32, hkv, 32768, sweep_lists)?;
        }
    }
    if args.wanted("skewed_b64_h32x8_ctx32768") {
        bench.skewed(64, 32, 8, 32768, sweep_lists)?;
    }
    args.common.write_results(
        &dev,
        copy_gbps,
        bench.peers.as_ref(),
        json!({
            "check_max_rel_error": worst,
            "graph_replay": {"rel_err_step1": graph.0, "rel_err_step2": graph.1, "replay_us": graph.2},
            "graph_replay_fused_merge": {"rel_err_step1": graph_fused.0, "rel_err_step2": graph_fused.1,
                                         "replay_us": graph_fused.2},
        }),
        bench.cases,
    )?;
    Ok(())
}

/// Where the skewed case's time goes, program by program: the default plan with its
/// timeline on (each split program's clock at its start, once its row search is done,
/// at its first step, at its end, and its SM; each merge program's at its start, after its
/// wait for the split, at its end), run after warm-up runs, then summarised: when programs
/// start, how long their chains before the first step take, how their ends spread (per
/// program, per SM, by the rows a program visits), and when the merge starts and ends.
fn timeline(
    dusk: &Dusk,
    spec: AttentionSpec,
    table: &PageTable,
    lists: &TokenLists,
    c: &Cache,
    q: &Buffer<f16>,
) -> Res<()> {
    let plan = AttentionPlan::with_tuning(dusk, spec, |u| u.timeline = true)?;
    let meta = plan.upload_meta(dusk, table, Some(lists))?;
    time_plan(dusk, &plan, c, std::slice::from_ref(&meta), q)?;
    let words = plan
        .timeline()
        .ok_or("the plan keeps no timeline")?
        .download()?;
    let t = plan.tuning();
    let programs = plan.grid()[0] as usize;
    let rows = lists.indptr.len() - 1;
    // The host's copy of the balanced split's arithmetic: each program's rows.
    let rt = t.row_tokens as i64;
    let total = *lists.indptr.last().unwrap_or(&0) as i64;
    let line = total + rows as i64 * rt;
    let seg = ((line + programs as i64 - 1) / programs as i64)
        .max(t.chunk_tokens as i64)
        .max(1);
    let starts: Vec<i64> = (0..rows)
        .map(|r| lists.indptr[r] as i64 + r as i64 * rt)
        .collect();
    let visited = |p: usize| -> usize {
        let s = p as i64 * seg;
        let e = (s + seg).min(line);
        if s >= e {
            return 0;
        }
        let first = starts.iter().filter(|&&x| x <= s).count().max(1) - 1;
        starts.iter().filter(|&&x| x < e).count() - first
    };
    let rec = |p: usize| &words[p * TIMELINE_WORDS..(p + 1) * TIMELINE_WORDS];
    let split: Vec<&[i64]> = (0..programs).map(rec).collect();
    let t0 = split.iter().map(|r| r[0]).min().unwrap_or(0);
    let us = |ns: i64| (ns - t0) as f64 / 1e3;
    let busy: Vec<&&[i64]> = split.iter().filter(|r| r[3] > 0).collect();
    let split_end = split.iter().map(|r| r[3]).max().unwrap_or(t0);
    println!(
        "timeline ({} split programs, {} with a segment; us from the first start):",
        programs,
        busy.len()
    );
    println!(
        "  split starts   {}",
        spread(split.iter().map(|r| us(r[0])).collect())
    );
    let chain = |k: usize| spread(busy.iter().map(|r| (r[k] - r[0]) as f64 / 1e3).collect());
    println!("  row search     {} (after each start)", chain(1));
    println!("  first step     {} (after each start)", chain(2));
    println!(
        "  split ends     {}",
        spread(busy.iter().map(|r| us(r[3])).collect())
    );
    // Per SM: the first start and last end of its programs.
    let mut sms: std::collections::BTreeMap<i64, (i64, i64, usize)> = Default::default();
    for r in &split {
        let e = sms.entry(r[4]).or_insert((i64::MAX, i64::MIN, 0));
        *e = (e.0.min(r[0]), e.1.max(r[3].max(r[0])), e.2 + 1);
    }
    let span = (split_end - t0) as f64;
    let active: f64 =
        sms.values().map(|(a, b, _)| (b - a) as f64).sum::<f64>() / (sms.len() as f64 * span);
    println!(
        "  per SM ({} SMs): last end {}; programs {}; SMs busy {:.0}% of the split's span",
        sms.len(),
        spread(sms.values().map(|(_, b, _)| us(*b)).collect()),
        spread(sms.values().map(|(_, _, n)| *n as f64).collect()),
        100.0 * active
    );
    // Ends and chains by the rows a program visits.
    let mut by_rows: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for (p, r) in split.iter().enumerate() {
        if r[3] > 0 {
            by_rows.entry(visited(p).min(4)).or_default().push(p);
        }
    }
    for (n, ps) in &by_rows {
        println!(
            "  {}{} rows: {} programs, ends {}, first step {}",
            n,
            if *n == 4 { "+" } else { "" },
            ps.len(),
            spread(ps.iter().map(|&p| us(split[p][3])).collect()),
            spread(
                ps.iter()
                    .map(|&p| (split[p][2] - split[p][0]) as f64 / 1e3)
                    .collect()
            )
        );
    }
    let merge: Vec<&[i64]> = (programs..words.len() / TIMELINE_WORDS).map(rec).collect();
    if merge.iter().all(|r| r[0] > 0) {
        println!(
            "  merge ({} programs): starts {}; past its wait {}; ends {} (split's last end {:.1})",
            merge.len(),
            spread(merge.iter().map(|r| us(r[0])).collect()),
            spread(merge.iter().map(|r| us(r[1])).collect()),
            spread(merge.iter().map(|r| us(r[2])).collect()),
            us(split_end)
        );
        // By the pieces its row has (the merge's steps take 8 a step).
        let group = merge.len() / rows;
        let pieces = |r: usize| -> i64 {
            let (a, b) = (lists.indptr[r] as i64, lists.indptr[r + 1] as i64);
            let (rs, re) = (a + (r as i64 + 1) * rt, b + (r as i64 + 1) * rt);
            if rs >= re {
                0
            } else {
                (re - 1) / seg - rs / seg + 1
            }
        };
        let mut by_pieces: std::collections::BTreeMap<i64, Vec<usize>> = Default::default();
        for (m, _) in merge.iter().enumerate() {
            let n = pieces(m / group.max(1));
            let bucket = match n {
                0..=1 => n,
                2..=8 => 8,
                9..=16 => 16,
                _ => 99,
            };
            by_pieces.entry(bucket).or_default().push(m);
        }
        for (n, ms) in &by_pieces {
            println!(
                "  merge, rows of {}: {} programs, starts {}, past its wait {}, ends {}",
                match n {
                    0 | 1 => format!("{n} piece(s)"),
                    8 => "2-8 pieces".into(),
                    16 => "9-16 pieces".into(),
                    _ => "17+ pieces".into(),
                },
                ms.len(),
                spread(ms.iter().map(|&m| us(merge[m][0])).collect()),
                spread(ms.iter().map(|&m| us(merge[m][1])).collect()),
                spread(ms.iter().map(|&m| us(merge[m][2])).collect()),
            );
        }
    }
    // Does a late first step make a late end? Ends by the quarter of first steps.
    let mut order: Vec<&&[i64]> = busy.clone();
    order.sort_by_key(|r| r[2] - r[0]);
    for (i, q) in order.chunks(order.len().div_ceil(4).max(1)).enumerate() {
        println!(
            "  first steps, quarter {}: first step {}, ends {}",
            i + 1,
            spread(q.iter().map(|r| (r[2] - r[0]) as f64 / 1e3).collect()),
            spread(q.iter().map(|r| us(r[3])).collect())
        );
    }
    Ok(())
}
