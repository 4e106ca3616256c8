//! The kernels of `docs/kernel-language.md`, with plain Rust references and a runner
//! that checks each on a device against its reference, for the `kernel_language` example
//! (the GPU when there is one, the interpreter otherwise). The guide is where these kernels
//! live: its doc tests run them through the interpreter in CI, and `tests/guide.rs` fails
//! when a kernel here is no longer the guide's (edit the guide, then copy it here).

use dusk::kernel;
use dusk::kernels::reference::rel_error;
use dusk::runtime::Device;
use dusk::Dusk;

#[kernel]
pub fn vector_add<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let a = load(x + offs, mask, 0.0);
    let b = load(y + offs, mask, 0.0);
    store(out + offs, a + b, mask);
}

#[kernel]
pub fn softmax<const ROWS: usize, const COLS: usize>(x: Ptr<f32>, out: Ptr<f32>, rows: i32) {
    let r = program_id(0) * ROWS + arange(0, ROWS);
    let ok = r < rows;
    let offs = expand(r * COLS, 1, COLS) + expand(arange(0, COLS), 0, ROWS);
    let mask = expand(ok, 1, COLS);
    let v = load(x + offs, mask, 0.0);
    let m = max(v, 1);
    let e = exp2((v - expand(m, 1, COLS)) * 1.4426950408889634);
    let s = sum(e, 1);
    store(out + offs, e / expand(s, 1, COLS), mask);
}

#[kernel]
pub fn gemv<const ROWS: usize, const COLS: usize>(
    a: Ptr<f32>,
    x: Ptr<f32>,
    y: Ptr<f32>,
    rows: i32,
    cols: i32,
) {
    let r = program_id(0) * ROWS + arange(0, ROWS);
    let row_ok = r < rows;
    let mut acc = splat(0.0, [ROWS]);
    for c0 in (0..cols).step_by(COLS) {
        let c = c0 + arange(0, COLS);
        let col_ok = c < cols;
        let offs = expand(r * cols, 1, COLS) + expand(c, 0, ROWS);
        let tile = load(
            a + offs,
            expand(row_ok, 1, COLS) & expand(col_ok, 0, ROWS),
            0.0,
        );
        let xv = load(x + c, col_ok, 0.0);
        acc = acc + sum(tile * expand(xv, 0, ROWS), 1);
    }
    store(y + r, acc, row_ok);
}

/// How many of `n` values in (0, 1] fall in each octave below 1 (bin j holds
/// [2^-(j+1), 2^-j); the last bin everything smaller), in all (`counts`, added to by every
/// program) and, per program, how many lie at or above each bin's lower edge (`above`): a
/// histogram in shared memory, then a running sum over it.
#[kernel]
pub fn octaves<const BLOCK: usize, const BINS: usize>(
    x: Ptr<f32>,
    counts: Ptr<i32>,
    above: Ptr<i32>,
    n: i32,
) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let v = load(x + offs, mask, 1.0);
    let exponent = bitcast::<i32>(v) >> 23;
    let bin = minimum(maximum(126 - exponent, 0), BINS - 1);
    let bins = shared::<i32>(BINS);
    store(bins + arange(0, BINS), zeros::<i32>([BINS]));
    atomic_add(bins + bin, splat(1, [BLOCK]), mask);
    let here = load(bins + arange(0, BINS));
    atomic_add(counts + arange(0, BINS), here);
    store(above + program_id(0) * BINS + arange(0, BINS), cumsum(here));
}

/// The positive values of each block of `x`, in order, at the front of the block's span
/// of `y` (zeros after them): ranks from a running sum, the values written to `scratch`
/// at their ranks, then read back by the threads that own those places. Other threads
/// wrote them, in global memory: `barrier()` between.
#[kernel]
pub fn keep_positive<const BLOCK: usize>(x: Ptr<f32>, scratch: Ptr<f32>, y: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let v = load(x + offs, mask, 0.0);
    let keep = v > 0.0;
    let rank = cumsum(where_(keep, 1, 0));
    let kept = rank.max(0);
    let base = program_id(0) * BLOCK;
    store(scratch + (base + rank - 1), v, keep);
    barrier();
    let front = arange(0, BLOCK) < kept;
    let back = load(scratch + base + arange(0, BLOCK), front, 0.0);
    store(y + offs, back, mask);
}

/// A deterministic pseudo-random sequence in [-1, 1) (no dependency needed).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Runs the kernels on `dusk`'s device over odd sizes, outputs poisoned first, and
/// returns each one's name and relative error against its f64 reference.
pub fn run_all(
    dusk: &Dusk,
    seed: u64,
) -> Result<Vec<(&'static str, f64)>, Box<dyn std::error::Error>> {
    let dev: &Device = dusk.device();
    let mut out = vec![];

    let n = 1000 + (seed % 37) as usize;
    let (xs, ys) = (noise(n, seed), noise(n, seed + 1));
    let (x, y) = (dev.upload(&xs)?, dev.upload(&ys)?);
    let mut z = dev.alloc::<f32>(n)?;
    dev.fill_bytes(&mut z, 0xFF)?;
    let k = dusk.load(vector_add::build::<256>()?)?;
    vector_add::launch::<256>(
        dev,
        &k,
        [n.div_ceil(256) as u32, 1, 1],
        &x,
        &y,
        &z,
        n as i32,
    )?;
    let want: Vec<f64> = xs
        .iter()
        .zip(&ys)
        .map(|(a, b)| *a as f64 + *b as f64)
        .collect();
    out.push(("vector_add", rel_error(&z.download()?, &want)));

    let (rows, cols) = (37usize, 128usize);
    let xs = noise(rows * cols, seed + 2);
    let x = dev.upload(&xs)?;
    let mut o = dev.alloc::<f32>(rows * cols)?;
    dev.fill_bytes(&mut o, 0xFF)?;
    let k = dusk.load(softmax::build::<4, 128>()?)?;
    softmax::launch::<4, 128>(
        dev,
        &k,
        [rows.div_ceil(4) as u32, 1, 1],
        &x,
        &o,
        rows as i32,
    )?;
    let mut want = vec![0f64; rows * cols];
    for r in 0..rows {
        let row = &xs[r * cols..(r + 1) * cols];
        let m = row.iter().fold(f64::NEG_INFINITY, |a, v| a.max(*v as f64));
        let s: f64 = row.iter().map(|v| (*v as f64 - m).exp()).sum();
        for c in 0..cols {
            want[r * cols + c] = (row[c] as f64 - m).exp() / s;
        }
    }
    out.push(("softmax", rel_error(&o.download()?, &want)));

    let (rows, cols) = (70usize, 333usize);
    let (am, xs) = (noise(rows * cols, seed + 3), noise(cols, seed + 4));
    let (a, x) = (dev.upload(&am)?, dev.upload(&xs)?);
    let mut y = dev.alloc::<f32>(rows)?;
    dev.fill_bytes(&mut y, 0xFF)?;
    let k = dusk.load(gemv::build::<16, 64>()?)?;
    gemv::launch::<16, 64>(
        dev,
        &k,
        [rows.div_ceil(16) as u32, 1, 1],
        &a,
        &x,
        &y,
        rows as i32,
        cols as i32,
    )?;
    let want: Vec<f64> = (0..rows)
        .map(|r| {
            (0..cols)
                .map(|c| am[r * cols + c] as f64 * xs[c] as f64)
                .sum()
        })
        .collect();
    out.push(("gemv", rel_error(&y.download()?, &want)));

    let (n, block, bins) = (3000 + (seed % 29) as usize, 1024usize, 16usize);
    let xs: Vec<f32> = noise(n, seed + 5)
        .iter()
        .map(|v| (v.abs() * 20.0 - 19.0).exp2().min(1.0))
        .collect();
    let x = dev.upload(&xs)?;
    let programs = n.div_ceil(block);
    let counts = dev.upload(&vec![0i32; bins])?;
    let mut above = dev.alloc::<i32>(programs * bins)?;
    dev.fill_bytes(&mut above, 0xFF)?;
    let k = dusk.load(octaves::build::<1024, 16>()?)?;
    octaves::launch::<1024, 16>(
        dev,
        &k,
        [programs as u32, 1, 1],
        &x,
        &counts,
        &above,
        n as i32,
    )?;
    let bin_of = |v: f32| (126 - (v.to_bits() >> 23) as i32).clamp(0, bins as i32 - 1) as usize;
    let mut want_counts = vec![0f64; bins];
    let mut want_above = vec![0f64; programs * bins];
    for (i, v) in xs.iter().enumerate() {
        want_counts[bin_of(*v)] += 1.0;
        let p = i / block;
        for j in bin_of(*v)..bins {
            want_above[p * bins + j] += 1.0;
        }
    }
    let got = |b: Vec<i32>| b.iter().map(|c| *c as f32).collect::<Vec<_>>();
    let err_counts = rel_error(&got(counts.download()?), &want_counts);
    let err_above = rel_error(&got(above.download()?), &want_above);
    out.push(("octaves", err_counts.max(err_above)));

    let n = 2500 + (seed % 31) as usize;
    let xs = noise(n, seed + 6);
    let x = dev.upload(&xs)?;
    let programs = n.div_ceil(block);
    let scratch = dev.alloc::<f32>(programs * block)?;
    let mut y = dev.alloc::<f32>(n)?;
    dev.fill_bytes(&mut y, 0xFF)?;
    let k = dusk.load(keep_positive::build::<1024>()?)?;
    keep_positive::launch::<1024>(dev, &k, [programs as u32, 1, 1], &x, &scratch, &y, n as i32)?;
    let mut want = vec![0f64; n];
    for (p, chunk) in xs.chunks(block).enumerate() {
        let kept = chunk.iter().filter(|v| **v > 0.0);
        for (j, v) in kept.enumerate() {
            want[p * block + j] = *v as f64;
        }
    }
    out.push(("keep_positive", rel_error(&y.download()?, &want)));
    Ok(out)
}
