//! `#[kernel]` end to end: kernels written in the kernel language, built, run through the
//! CPU interpreter with their generated `launch`, and compared with plain Rust.

use dusk::kernel;
use dusk::runtime::{Buffer, Device, LoadedKernel};
use std::sync::Arc;

fn load(dev: &Device, k: dusk::compiler::Kernel) -> LoadedKernel {
    dev.load_kernel(Arc::new(k), None).unwrap()
}

/// A deterministic pseudo-random sequence in [-1, 1).
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

fn poisoned(dev: &Device, n: usize) -> Buffer<f32> {
    let mut b = dev.alloc::<f32>(n).unwrap();
    dev.fill_bytes(&mut b, 0xFF).unwrap();
    b
}

fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: got {g}, want {w}"
        );
    }
}

// ---- vector add ----

#[kernel]
fn vector_add<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let pid = program_id(0);
    let offs = pid * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let a = load(x + offs, mask, 0.0);
    let b = load(y + offs, mask, 0.0);
    store(out + offs, a + b, mask);
}

#[test]
fn vector_add_at_an_odd_length() {
    let dev = Device::cpu();
    let n = 1001;
    let (xs, ys) = (noise(n, 1), noise(n, 2));
    let k = vector_add::build::<256>().unwrap();
    assert_eq!(k.name, "vector_add_BLOCK256");
    assert_eq!(k.num_warps, 4);
    let k = load(&dev, k);
    let (x, y) = (dev.upload(&xs).unwrap(), dev.upload(&ys).unwrap());
    let out = poisoned(&dev, n);
    let grid = [n.div_ceil(256) as u32, 1, 1];
    vector_add::launch::<256>(&dev, &k, grid, &x, &y, &out, n as i32).unwrap();
    let want: Vec<f32> = xs.iter().zip(&ys).map(|(a, b)| a + b).collect();
    assert_eq!(out.download().unwrap(), want);
}

#[test]
fn specialisations_have_their_own_names() {
    assert_eq!(
        vector_add::build::<64>().unwrap().name,
        "vector_add_BLOCK64"
    );
    assert_ne!(
        vector_add::build::<64>().unwrap(),
        vector_add::build::<128>().unwrap()
    );
}

// ---- row softmax over a 2-D block ----

/// Softmax of each row of a `rows x cols` matrix (`cols <= COLS`), `ROWS` rows a program.
#[kernel(num_warps = 8)]
fn softmax<const ROWS: usize, const COLS: usize>(x: Ptr<f32>, out: Ptr<f32>, rows: i32, cols: i32) {
    let r = program_id(0) * ROWS + arange(0, ROWS);
    let c = arange(0, COLS);
    let mask = expand(r < rows, 1, COLS) & expand(c < cols, 0, ROWS);
    let offs = expand(r * cols, 1, COLS) + c.expand(0, ROWS);
    let v = load(x + offs, mask, f32::NEG_INFINITY);
    let m = max(v, 1);
    let e = exp2((v - expand(m, 1, COLS)) * std::f32::consts::LOG2_E);
    let s = e.sum(1);
    store(out + offs, e / s.expand(1, COLS), mask);
}

#[test]
fn softmax_rows_match_plain_rust() {
    let dev = Device::cpu();
    let (rows, cols) = (37, 100);
    let xs: Vec<f32> = noise(rows * cols, 3).iter().map(|v| v * 4.0).collect();
    let k = softmax::build::<4, 128>().unwrap();
    assert_eq!(k.name, "softmax_ROWS4_COLS128");
    assert_eq!(k.num_warps, 8);
    let k = load(&dev, k);
    let x = dev.upload(&xs).unwrap();
    let out = poisoned(&dev, rows * cols);
    let grid = [rows.div_ceil(4) as u32, 1, 1];
    softmax::launch::<4, 128>(&dev, &k, grid, &x, &out, rows as i32, cols as i32).unwrap();
    let mut want = vec![0f32; rows * cols];
    for r in 0..rows {
        let row = &xs[r * cols..(r + 1) * cols];
        let m = row.iter().fold(f32::NEG_INFINITY, |a, v| a.max(*v));
        let s: f32 = row.iter().map(|v| (v - m).exp()).sum();
        for c in 0..cols {
            want[r * cols + c] = (row[c] - m).exp() / s;
        }
    }
    assert_close(&out.download().unwrap(), &want, 1e-5);
}

// ---- GEMV: a loop carrying an accumulator ----

/// `y = A x` for a row-major `rows x cols` A, `ROWS` rows a program, `COLS` columns a step.
#[kernel]
fn gemv<const ROWS: usize, const COLS: usize>(
    a: Ptr<f32>,
    x: Ptr<f32>,
    y: Ptr<f32>,
    rows: i32,
    cols: i32,
) {
    let r = program_id(0) * ROWS + arange(0, ROWS);
    let row_ok = r < rows;
    // 64-bit row offsets, from an i64 cast; the literal takes the offset's type.
    let row_base = (r as i64) * (cols as i64) + 0;
    let mut acc = zeros::<f32>([ROWS]);
    let mut steps = 0;
    for c0 in (0..cols).step_by(COLS) {
        let c = c0 + arange(0, COLS);
        let col_ok = c < cols;
        let offs = expand(row_base, 1, COLS) + expand(c.to::<i64>(), 0, ROWS);
        let tile = load(
            a + offs,
            expand(row_ok, 1, COLS) && expand(col_ok, 0, ROWS),
            0.0,
        );
        let xv = load(x + c, col_ok, 0);
        acc += sum(tile * expand(xv, 0, ROWS), 1);
        steps += 1;
    }
    // `steps` is the number of column tiles; every row of y gets acc + 0 * steps.
    store(y + r, acc + (steps * 0) as f32, row_ok);
}

#[test]
fn gemv_with_a_carried_accumulator() {
    let dev = Device::cpu();
    let (rows, cols) = (70, 333);
    let (am, xs) = (noise(rows * cols, 4), noise(cols, 5));
    let k = load(&dev, gemv::build::<16, 64>().unwrap());
    let (a, x) = (dev.upload(&am).unwrap(), dev.upload(&xs).unwrap());
    let y = poisoned(&dev, rows);
    let grid = [rows.div_ceil(16) as u32, 1, 1];
    gemv::launch::<16, 64>(&dev, &k, grid, &a, &x, &y, rows as i32, cols as i32).unwrap();
    let want: Vec<f32> = (0..rows)
        .map(|r| (0..cols).map(|c| am[r * cols + c] * xs[c]).sum())
        .collect();
    assert_close(&y.download().unwrap(), &want, 1e-5);
}

// ---- branches ----

/// Each program scales and shifts its block by values chosen from the block's sum.
#[kernel]
fn branchy<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32, thresh: f32) {
    let pid = program_id(0);
    let offs = pid * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let v = load(x + offs, mask, 0.0);
    let total = sum(v, 0);
    let mut scale = 1.0;
    let mut shift = 0.0;
    if total > thresh {
        scale = 2.0;
        shift = total;
    } else if total < -thresh {
        scale = -1.0;
    }
    let first = if pid == 0 { 10.0 } else { total * 0.5 };
    store(out + offs, v * scale + shift + first, mask);
}

#[test]
fn if_else_with_carried_values() {
    let dev = Device::cpu();
    let (n, block) = (16 * 9 + 3, 16);
    let xs: Vec<f32> = noise(n, 6)
        .iter()
        .enumerate()
        .map(|(i, v)| v + ((i / 16) as f32 - 4.0) * 0.2)
        .collect();
    let k = load(&dev, branchy::build::<16>().unwrap());
    let x = dev.upload(&xs).unwrap();
    let out = poisoned(&dev, n);
    let thresh = 5.0f32;
    branchy::launch::<16>(
        &dev,
        &k,
        [n.div_ceil(block) as u32, 1, 1],
        &x,
        &out,
        n as i32,
        thresh,
    )
    .unwrap();
    let mut want = vec![0f32; n];
    let mut kinds = [0; 3];
    for (p, chunk) in xs.chunks(block).enumerate() {
        let total: f32 = chunk.iter().sum();
        let (scale, shift, kind) = if total > thresh {
            (2.0, total, 0)
        } else if total < -thresh {
            (-1.0, 0.0, 1)
        } else {
            (1.0, 0.0, 2)
        };
        kinds[kind] += 1;
        let first = if p == 0 { 10.0 } else { total * 0.5 };
        for (i, v) in chunk.iter().enumerate() {
            want[p * block + i] = v * scale + shift + first;
        }
    }
    assert!(
        kinds.iter().all(|k| *k > 0),
        "every arm is taken: {kinds:?}"
    );
    assert_close(&out.download().unwrap(), &want, 1e-5);
}

/// A scalar loop with a branch inside: counts and sums the positive elements of `x[..n]`.
#[kernel(num_warps = 1)]
fn count_positive(x: Ptr<f32>, out_count: Ptr<i32>, out_total: Ptr<f32>, n: i32) {
    let mut count = 0;
    let mut total = 0.0;
    for i in 0..n {
        let v = load(x + i);
        if v > 0.0 {
            count += 1;
            total = total + v;
        }
    }
    store(out_count, count);
    store(out_total, total);
}

#[test]
fn branch_inside_a_loop() {
    let dev = Device::cpu();
    let xs = noise(77, 7);
    let k = count_positive::build().unwrap();
    assert_eq!(k.name, "count_positive");
    let k = load(&dev, k);
    let x = dev.upload(&xs).unwrap();
    let count = dev.alloc::<i32>(1).unwrap();
    let total = dev.alloc::<f32>(1).unwrap();
    count_positive::launch(&dev, &k, [1, 1, 1], &x, &count, &total, xs.len() as i32).unwrap();
    let pos: Vec<f32> = xs.iter().copied().filter(|v| *v > 0.0).collect();
    assert_eq!(count.download().unwrap(), vec![pos.len() as i32]);
    assert_close(&total.download().unwrap(), &[pos.iter().sum()], 1e-5);
}

/// Branches on a compile-time bool are decided when the kernel is built.
#[kernel]
fn maybe_negate<const BLOCK: usize, const NEG: bool>(x: Ptr<f32>, out: Ptr<f32>) {
    let offs = arange(0, BLOCK);
    let mut v = load(x + offs);
    if NEG {
        v = -v;
    }
    // Compile-time arithmetic: HALF is an i64 known when the kernel is built.
    let half = BLOCK / 2;
    let lower = offs < half;
    store(out + offs, where_(lower, v, 0.0));
}

#[test]
fn compile_time_branches() {
    let dev = Device::cpu();
    let xs = noise(32, 8);
    let x = dev.upload(&xs).unwrap();
    for neg in [false, true] {
        let k = if neg {
            maybe_negate::build::<32, true>().unwrap()
        } else {
            maybe_negate::build::<32, false>().unwrap()
        };
        assert_eq!(k.name, format!("maybe_negate_BLOCK32_NEG{neg}"));
        let k = load(&dev, k);
        let out = poisoned(&dev, 32);
        if neg {
            maybe_negate::launch::<32, true>(&dev, &k, [1, 1, 1], &x, &out).unwrap();
        } else {
            maybe_negate::launch::<32, false>(&dev, &k, [1, 1, 1], &x, &out).unwrap();
        }
        let want: Vec<f32> = xs
            .iter()
            .enumerate()
            .map(|(i, v)| {
                if i < 16 {
                    if neg {
                        -v
                    } else {
                        *v
                    }
                } else {
                    0.0
                }
            })
            .collect();
        assert_eq!(out.download().unwrap(), want);
    }
}

/// Nested loops: the inner one carries a variable of the outer body and one from outside
/// both; bounds from values, literals and const generics.
#[kernel(num_warps = 1)]
fn nested<const N: usize>(out: Ptr<i32>, n: i32) {
    let mut total = 0;
    let mut outer_steps = 0;
    for i in 0..n {
        let mut row = 0;
        for j in (i..n).step_by(2) {
            row += j;
            total += 1;
        }
        store(out + 1 + i, row);
        outer_steps = outer_steps + 1;
    }
    for _ in 0..N {
        total -= 1;
    }
    let extra = if N > 4 { 100 } else { 0 };
    store(out, total + outer_steps * 1000 + extra);
}

#[test]
fn nested_loops() {
    let dev = Device::cpu();
    let n = 9;
    let k = load(&dev, nested::build::<8>().unwrap());
    let out = dev.alloc::<i32>(n + 1).unwrap();
    nested::launch::<8>(&dev, &k, [1, 1, 1], &out, n as i32).unwrap();
    let mut want = vec![0; n + 1];
    let mut total = 0;
    for i in 0..n {
        want[1 + i] = (i..n).step_by(2).sum::<usize>() as i32;
        total += (i..n).step_by(2).count() as i32;
    }
    want[0] = total - 8 + n as i32 * 1000 + 100;
    assert_eq!(out.download().unwrap(), want);
}

// ---- helpers: one kernel calling another ----

/// `a * x + y`, elementwise: a helper taking blocks, so it has `inline` only.
#[kernel]
fn axpy(a: f32, x: Block<f32>, y: Block<f32>) -> Block<f32> {
    a * x + y
}

/// Loads `N` elements of `p` from `start`, zero past `n`.
#[kernel]
fn load_block<const N: usize>(p: Ptr<f32>, start: i32, n: i32) -> Tensor {
    let offs = start + arange(0, N);
    load(p + offs, offs < n, 0.0)
}

#[kernel]
fn saxpy<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>, a: f32, n: i32) {
    let start = program_id(0) * BLOCK;
    let xv = load_block::<BLOCK>(x, start, n);
    let yv = load_block::<BLOCK>(y, start, n);
    let offs = start + arange(0, BLOCK);
    store(out + offs, axpy(a, xv, yv), offs < n);
}

#[test]
fn helper_kernels() {
    let dev = Device::cpu();
    let n = 300;
    let (xs, ys) = (noise(n, 9), noise(n, 10));
    let k = load(&dev, saxpy::build::<128>().unwrap());
    let (x, y) = (dev.upload(&xs).unwrap(), dev.upload(&ys).unwrap());
    let out = poisoned(&dev, n);
    saxpy::launch::<128>(&dev, &k, [3, 1, 1], &x, &y, &out, 2.5, n as i32).unwrap();
    let want: Vec<f32> = xs.iter().zip(&ys).map(|(x, y)| 2.5 * x + y).collect();
    assert_close(&out.download().unwrap(), &want, 1e-6);
    // A helper taking no blocks is a kernel too.
    let k = load_block::build::<64>().unwrap();
    assert_eq!(k.params.len(), 3);
}

/// A helper whose name is one edit from the builtin `load`: a plain call `loads(..)` is
/// taken for a misspelt builtin (see tests/ui/unknown_builtin.rs), `self::loads(..)` calls
/// the helper; helpers with names far from every builtin are called plainly.
#[kernel]
fn loads(p: Ptr<f32>, i: Block<i32>) -> Block<f32> {
    load(p + i) + load(p + i + 1)
}

#[kernel]
fn pair_sums(x: Ptr<f32>, out: Ptr<f32>) {
    let i = arange(0, 8) * 2;
    store(out + arange(0, 8), self::loads(x, i));
}

#[test]
fn helpers_named_like_builtins_are_called_through_self() {
    let dev = Device::cpu();
    let xs = noise(16, 4);
    let k = load(&dev, pair_sums::build().unwrap());
    let x = dev.upload(&xs).unwrap();
    let out = poisoned(&dev, 8);
    pair_sums::launch(&dev, &k, [1, 1, 1], &x, &out).unwrap();
    let want: Vec<f32> = xs.chunks(2).map(|p| p[0] + p[1]).collect();
    assert_close(&out.download().unwrap(), &want, 1e-6);
}

/// A helper returning several values: a program's row of a CSR layout, its start and its
/// length (the preamble several kernels share).
#[kernel]
fn csr_row(indptr: Ptr<i32>) -> (i32, i32, i32) {
    let row = program_id(0);
    let start = load(indptr + row);
    (row, start, load(indptr + (row + 1)) - start)
}

/// Each row's sum of `x`, plus the row's index; `mut` and `_` in a helper's tuple.
#[kernel(num_warps = 1)]
fn row_sums(indptr: Ptr<i32>, x: Ptr<f32>, out: Ptr<f32>) {
    let (row, start, mut n) = csr_row(indptr);
    let (_, _, len) = csr_row(indptr);
    let mut total = 0.0;
    #[bound(64)]
    while n > 0 {
        let take = minimum(n, 16);
        let j = arange(0, 16);
        total += sum(load(x + (start + len - n + j), j < take, 0.0), 0);
        n -= take;
    }
    store(out + row, total + row as f32);
}

#[test]
fn helpers_return_tuples() {
    let dev = Device::cpu();
    let lens = [5usize, 0, 40, 17];
    let mut indptr = vec![0i32];
    for l in lens {
        indptr.push(indptr.last().unwrap() + l as i32);
    }
    let xs = noise(*indptr.last().unwrap() as usize, 6);
    let k = load(&dev, row_sums::build().unwrap());
    let (ip, x) = (dev.upload(&indptr).unwrap(), dev.upload(&xs).unwrap());
    let out = poisoned(&dev, lens.len());
    row_sums::launch(&dev, &k, [lens.len() as u32, 1, 1], &ip, &x, &out).unwrap();
    let want: Vec<f32> = (0..lens.len())
        .map(|r| {
            let row = &xs[indptr[r] as usize..indptr[r + 1] as usize];
            row.iter().sum::<f32>() + r as f32
        })
        .collect();
    assert_close(&out.download().unwrap(), &want, 1e-5);
}

/// A tuple taken apart: every element is evaluated before any name is bound (a swap), and
/// compile-time numbers stay compile-time.
#[kernel(num_warps = 1)]
fn swapped(out: Ptr<i32>) {
    let (a, b) = (program_id(0), 7);
    let (a, b) = (b, a);
    let (c, mut d) = (a * 10, b);
    d += 1;
    store(out + arange(0, 4), where_(arange(0, 4) < 2, c, d));
}

#[test]
fn let_takes_a_tuple_apart() {
    let dev = Device::cpu();
    let k = load(&dev, swapped::build().unwrap());
    let out = dev.upload(&[-1i32; 4]).unwrap();
    swapped::launch(&dev, &k, [1, 1, 1], &out).unwrap();
    assert_eq!(out.download().unwrap(), vec![70, 70, 1, 1]);
}

/// The last of the grid's programs to arrive stores how many arrived before it, and sets
/// the counter back.
#[kernel(num_warps = 1)]
fn last_arrival(counter: Ptr<i32>, out: Ptr<i32>) {
    let before = arrive(counter);
    if before == num_programs(0) - 1 {
        store(out, before);
        store(counter, 0);
    }
}

#[test]
fn arrive_finds_the_last_program() {
    let dev = Device::cpu();
    let k = load(&dev, last_arrival::build().unwrap());
    let (counter, out) = (dev.upload(&[0i32]).unwrap(), dev.upload(&[-1i32]).unwrap());
    last_arrival::launch(&dev, &k, [5, 1, 1], &counter, &out).unwrap();
    assert_eq!(out.download().unwrap(), vec![4]);
    assert_eq!(counter.download().unwrap(), vec![0]);
    let ptx = dusk::compiler::codegen::compile(
        &last_arrival::build().unwrap(),
        &dusk::compiler::codegen::Target::sm90a(),
    )
    .unwrap();
    assert!(ptx.contains("atom.acq_rel.gpu.global.add"), "{ptx}");
}

/// `out = 2x + 1` in the element type `T` (f16, bf16, f32, ...), computed in f32 by a
/// helper generic over it too.
#[kernel(num_warps = 1)]
fn doubled<T, const N: usize>(x: Ptr<T>, out: Ptr<T>) {
    let i = arange(0, N);
    store(out + i, plus_one::<T, N>(load(x + i) as f32 * 2.0));
}

/// `x + 1` as a `T` (plus a block of `T` zeros, to use `T` in a turbofish).
#[kernel]
fn plus_one<T, const N: usize>(x: Block<f32>) -> Block<T> {
    (x + 1.0) as T + zeros::<T>([N])
}

const N_ELEMS: usize = 64;

#[test]
fn type_parameters_make_a_kernel_per_element_type() {
    use half::{bf16, f16};
    /// `doubled` built for `T`: its name, and its output (poisoned first) from `xs`
    /// (converted by `to` and back by `from`).
    fn run<T: dusk::runtime::Element>(
        xs: &[f32],
        to: fn(f32) -> T,
        from: fn(T) -> f32,
    ) -> (String, Vec<f32>) {
        let dev = Device::cpu();
        let k = doubled::build::<T, N_ELEMS>().unwrap();
        let name = k.name.clone();
        let k = load(&dev, k);
        let x = dev
            .upload(&xs.iter().map(|v| to(*v)).collect::<Vec<_>>())
            .unwrap();
        let mut out = dev.alloc::<T>(N_ELEMS).unwrap();
        dev.fill_bytes(&mut out, 0xFF).unwrap();
        doubled::launch::<T, N_ELEMS>(&dev, &k, [1, 1, 1], &x, &out).unwrap();
        let got = out.download().unwrap().into_iter().map(from).collect();
        (name, got)
    }
    let xs = noise(N_ELEMS, 12);
    let want: Vec<f32> = xs.iter().map(|x| 2.0 * x + 1.0).collect();
    let (name, got) = run(&xs, f16::from_f32, f16::to_f32);
    assert_eq!(name, "doubled_Tf16_N64");
    assert_close(&got, &want, 1e-2);
    let (name, got) = run(&xs, bf16::from_f32, bf16::to_f32);
    assert_eq!(name, "doubled_Tbf16_N64");
    assert_close(&got, &want, 5e-2);
    let (name, got) = run(&xs, |v| v, |v| v);
    assert_eq!(name, "doubled_Tf32_N64");
    assert_close(&got, &want, 1e-6);
}

/// Each program waits for the one before it (`await_count` on the count of `signal`s),
/// reads the running total it published (`load_fresh`), adds its index and publishes the
/// new total; it records the count it saw, its SM and whether the clock ran.
#[kernel(num_warps = 1)]
fn relay(counter: Ptr<i32>, total: Ptr<i32>, seen: Ptr<i32>, sm: Ptr<i32>, ticked: Ptr<i32>) {
    let p = program_id(0);
    let t0 = global_timer();
    let count = await_count(counter, p);
    let before = load_fresh(total + arange(0, 1));
    store(total + arange(0, 1), before + p);
    store(seen + p, count);
    store(sm + p, sm_id());
    sleep(100);
    store(ticked + p, where_(global_timer() >= t0, 1, 0));
    signal(counter);
}

#[test]
fn programs_wait_for_and_signal_each_other() {
    let dev = Device::cpu();
    let n = 6;
    let k = load(&dev, relay::build().unwrap());
    let (counter, total) = (dev.upload(&[0i32]).unwrap(), dev.upload(&[0i32]).unwrap());
    let (seen, sm, ticked) = (
        dev.upload(&vec![-1i32; n]).unwrap(),
        dev.upload(&vec![-1i32; n]).unwrap(),
        dev.upload(&vec![-1i32; n]).unwrap(),
    );
    let grid = [n as u32, 1, 1];
    relay::launch(&dev, &k, grid, &counter, &total, &seen, &sm, &ticked).unwrap();
    assert_eq!(total.download().unwrap(), vec![15]);
    assert_eq!(counter.download().unwrap(), vec![6]);
    assert_eq!(seen.download().unwrap(), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(sm.download().unwrap(), vec![0; n]);
    assert_eq!(ticked.download().unwrap(), vec![1; n]);
    let ptx = dusk::compiler::codegen::compile(
        &relay::build().unwrap(),
        &dusk::compiler::codegen::Target::sm90a(),
    )
    .unwrap();
    for needle in [
        "red.release.gpu",
        "ld.relaxed.gpu",
        "fence.acq_rel.gpu",
        "%globaltimer",
        "%smid",
        "nanosleep",
    ] {
        assert!(ptx.contains(needle), "no {needle} in:\n{ptx}");
    }
}

/// Doubles its argument.
#[kernel]
fn twice(x: Block<f32>) -> Block<f32> {
    x * 2.0
}

#[kernel]
fn passes_ints(x: Ptr<i32>) {
    let v = load(x + arange(0, 16));
    store(x + arange(0, 16), twice(v)); // PASSES-INTS
}

#[test]
fn helper_arguments_are_checked_against_their_declared_types() {
    let e = passes_ints::build().unwrap_err().to_string();
    assert!(
        e.contains(
            "`twice`'s parameter `x` is declared `Block<f32>`, but the argument is `i32[16]`"
        ),
        "{e}"
    );
}

// ---- bounded `while`, `#[unroll]` ----

/// Per program: halves `x[pid]` while it is at least 1, at most `MAX` times, and counts the
/// halvings.
#[kernel(num_warps = 1)]
fn halvings<const MAX: usize>(x: Ptr<f32>, steps: Ptr<i32>) {
    let pid = program_id(0);
    let mut v = load(x + pid);
    let mut n = 0;
    #[bound(MAX)]
    while v >= 1.0 {
        v = v / 2.0;
        n += 1;
    }
    store(x + pid, v);
    store(steps + pid, n);
}

#[test]
fn bounded_while_stops_at_its_condition_or_its_bound() {
    let dev = Device::cpu();
    let xs = [0.5f32, 1.0, 3.0, 1000.0, 1e30, 7.0];
    let k = halvings::build::<64>().unwrap();
    let text = dusk::compiler::print::print_kernel(&k);
    assert!(text.contains("for") && text.contains("if"), "{text}");
    let k = load(&dev, k);
    let x = dev.upload(&xs).unwrap();
    let steps = dev.alloc::<i32>(xs.len()).unwrap();
    halvings::launch::<64>(&dev, &k, [xs.len() as u32, 1, 1], &x, &steps).unwrap();
    let (mut want_x, mut want_n) = (vec![], vec![]);
    for &x0 in &xs {
        let (mut v, mut n) = (x0, 0);
        while v >= 1.0 && n < 64 {
            v /= 2.0;
            n += 1;
        }
        want_x.push(v);
        want_n.push(n);
    }
    assert_eq!(want_n[4], 64, "1e30 needs more halvings than the bound");
    assert_eq!(x.download().unwrap(), want_x);
    assert_eq!(steps.download().unwrap(), want_n);
}

#[test]
fn bounded_while_compiles_to_ptx() {
    let k = halvings::build::<16>().unwrap();
    let ptx =
        dusk::compiler::codegen::compile(&k, &dusk::compiler::codegen::Target::sm90a()).unwrap();
    assert!(ptx.contains(".entry halvings_MAX16"), "{ptx}");
}

/// `out[i] = sum over taps s = 0, 2, 4, .. of (s + 1) * x[i + s]`, the taps unrolled when the
/// kernel is built; odd-numbered taps of a multiple of 4 are also negated.
#[kernel(num_warps = 1)]
fn taps<const B: usize, const TAPS: usize>(x: Ptr<f32>, out: Ptr<f32>) {
    let i = arange(0, B);
    let mut acc = zeros::<f32>([B]);
    #[unroll]
    for s in (0..TAPS).step_by(2) {
        let w = if s % 4 == 0 { s + 1 } else { -(s + 1) };
        acc = acc + load(x + (i + s)) * w;
    }
    store(out + i, acc);
}

#[kernel]
fn zero_step(x: Ptr<f32>) {
    #[unroll]
    for i in (0..4).step_by(0) {
        store(x + i, 1.0);
    }
}

#[test]
fn unrolled_loops_need_a_positive_step() {
    let e = zero_step::build().unwrap_err().to_string();
    assert!(
        e.contains("zero_step") && e.contains("at least 1, found 0"),
        "{e}"
    );
}

#[test]
fn unrolled_loops_run_when_the_kernel_is_built() {
    let k = taps::build::<32, 7>().unwrap();
    let text = dusk::compiler::print::print_kernel(&k);
    assert!(!text.contains("for"), "{text}");
    assert_eq!(text.matches("load").count(), 4, "{text}");
    let dev = Device::cpu();
    let xs = noise(40, 3);
    let x = dev.upload(&xs).unwrap();
    let out = poisoned(&dev, 32);
    taps::launch::<32, 7>(&dev, &load(&dev, k), [1, 1, 1], &x, &out).unwrap();
    let want: Vec<f32> = (0..32)
        .map(|i| {
            (0..7)
                .step_by(2)
                .map(|s| {
                    let w = if s % 4 == 0 { s + 1 } else { -(s + 1) };
                    w as f32 * xs[i + s as usize]
                })
                .sum()
        })
        .collect();
    assert_close(&out.download().unwrap(), &want, 1e-6);
}

// ---- integer ops, pointer casts, dp2a ----

/// Packs each pair of bytes of `src` into one i32 word through `ptr_cast`, shifts and masks,
/// and sums two `dp2a`s.
#[kernel(num_warps = 1)]
fn int_ops<const N: usize>(src: Ptr<u8>, pairs: Ptr<i32>, out: Ptr<i32>, dot: Ptr<i32>) {
    let i = arange(0, N);
    let words = ptr_cast::<i32>(src);
    let w = load(words + i);
    let lo = w & 0xFF;
    let hi = (w >> 8) & 0xFF;
    let mut acc = lo ^ (hi << 1);
    acc -= 1;
    acc = acc % 1000 * -1 + 7 / 2;
    store(out + i, acc);
    let p = load(pairs + i);
    let d = dp2a(p, w, zeros::<i32>([N]), false);
    store(dot + i, dp2a(p, w, d, true));
}

#[test]
fn integer_ops_and_dp2a() {
    let dev = Device::cpu();
    const N: usize = 8;
    let bytes: Vec<u8> = (0..4 * N as u32).map(|i| (i * 37 % 251) as u8).collect();
    let pairs: Vec<i32> = (0..N as i32)
        .map(|i| ((i - 3) & 0xFFFF) | ((2 * i + 1) << 16))
        .collect();
    let k = load(&dev, int_ops::build::<N>().unwrap());
    let src = dev.upload(&bytes).unwrap();
    let pb = dev.upload(&pairs).unwrap();
    let out = dev.alloc::<i32>(N).unwrap();
    let dot = dev.alloc::<i32>(N).unwrap();
    int_ops::launch::<N>(&dev, &k, [1, 1, 1], &src, &pb, &out, &dot).unwrap();
    let mut want = vec![];
    let mut want_dot = vec![];
    for i in 0..N {
        let b = &bytes[4 * i..4 * i + 4];
        let w = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let (lo, hi) = (w & 0xFF, (w >> 8) & 0xFF);
        let acc = (lo ^ (hi << 1)) - 1;
        want.push(-(acc % 1000) + 3);
        let (p_lo, p_hi) = (pairs[i] as i16 as i32, (pairs[i] >> 16) as i16 as i32);
        let d = p_lo * b[0] as i32 + p_hi * b[1] as i32;
        want_dot.push(d + p_lo * b[2] as i32 + p_hi * b[3] as i32);
    }
    assert_eq!(out.download().unwrap(), want);
    assert_eq!(dot.download().unwrap(), want_dot);
}

// ---- math builtins, f16 and scalar parameters ----

#[kernel]
fn math<const BLOCK: usize>(
    x: Ptr<f16>,
    out: Ptr<f32>,
    stats: Ptr<f32>,
    scale: f32,
    flip: bool,
    offset: i64,
) {
    let i = arange(0, BLOCK);
    let v = load(x + offset + i).to::<f32>();
    let a = abs(v);
    let e = v.exp();
    let l = log(a + 1.0);
    let r = sqrt(a) + rsqrt(a + 1.0);
    let lo = minimum(v, 0.0);
    let hi = maximum(0.0, v);
    let y = where_(flip || (v < -100.0), -v, v) * scale;
    let z = {
        let t = e + l;
        t * 0.5
    };
    let zero = 1.4426950408889634 * (BLOCK as f32) * 0.0;
    store(out + i, y + z + r + lo * 2 - hi / 4.0 + zero);
    store(stats, max(v, 0));
    store(stats + 1, min(v, 0));
    store(
        stats + 2,
        num_programs(0).to::<f32>() + (i32::MAX - 2147483647) as f32,
    );
    let s = splat(2.5, [BLOCK]);
    store(stats + 3, sum(s, 0) / BLOCK);
    let keep = !(i < 2);
    store(stats + 4, sum(where_(keep, 1.0f32, 0.0), 0));
}

#[test]
fn math_builtins_match_plain_rust() {
    use dusk::half::f16;
    let dev = Device::cpu();
    const B: usize = 64;
    let pad = 3;
    let xs: Vec<f16> = noise(B + pad, 11)
        .iter()
        .map(|v| f16::from_f32(v * 3.0))
        .collect();
    let k = load(&dev, math::build::<B>().unwrap());
    let x = dev.upload(&xs).unwrap();
    for flip in [false, true] {
        let out = poisoned(&dev, B);
        let stats = poisoned(&dev, 5);
        math::launch::<B>(&dev, &k, [1, 1, 1], &x, &out, &stats, 0.5, flip, pad as i64).unwrap();
        let vs: Vec<f32> = xs[pad..].iter().map(|v| v.to_f32()).collect();
        let want: Vec<f32> = vs
            .iter()
            .map(|&v| {
                let a = v.abs();
                let y = if flip { -v } else { v } * 0.5;
                let z = (v.exp() + (a + 1.0).ln()) * 0.5;
                let r = a.sqrt() + 1.0 / (a + 1.0).sqrt();
                y + z + r + v.min(0.0) * 2.0 - v.max(0.0) / 4.0
            })
            .collect();
        assert_close(&out.download().unwrap(), &want, 1e-5);
        let mx = vs.iter().fold(f32::NEG_INFINITY, |a, v| a.max(*v));
        let mn = vs.iter().fold(f32::INFINITY, |a, v| a.min(*v));
        assert_eq!(
            stats.download().unwrap(),
            vec![mx, mn, 1.0, 2.5, (B - 2) as f32]
        );
    }
}

#[kernel(debug, num_warps = 2, min_programs_per_sm = 3)]
fn options_kernel(x: Ptr<u8>, v: u8) {
    store(x + arange(0, 32), splat(v, [32]) << 1u8);
}

#[test]
fn kernel_options() {
    let k = options_kernel::build().unwrap();
    assert_eq!((k.num_warps, k.min_programs_per_sm), (2, 3));
    let dev = Device::cpu();
    let x = dev.alloc::<u8>(32).unwrap();
    options_kernel::launch(&dev, &load(&dev, k), [1, 1, 1], &x, 21).unwrap();
    assert_eq!(x.download().unwrap(), vec![42u8; 32]);
}

/// Parameter names that the generated code also uses internally do not clash with it.
#[kernel]
fn clashing_names(b: Ptr<i32>, name: i32, kernel: i32, grid: i32, device: i32) {
    let __b = name + kernel;
    store(b, __b + grid + device);
}

#[kernel]
fn no_params() {}

#[test]
fn internal_names_are_hygienic() {
    let dev = Device::cpu();
    let k = load(&dev, clashing_names::build().unwrap());
    let out = dev.alloc::<i32>(1).unwrap();
    clashing_names::launch(&dev, &k, [1, 1, 1], &out, 1, 20, 300, 4000).unwrap();
    assert_eq!(out.download().unwrap(), vec![4321]);
    let k = load(&dev, no_params::build().unwrap());
    no_params::launch(&dev, &k, [1, 1, 1]).unwrap();
}

// ---- errors found when the kernel is built ----

#[kernel]
fn mixes_types<const BLOCK: usize>(x: Ptr<f32>) {
    let i = arange(0, BLOCK);
    let v = load(x + i);
    let w = v + i; // MIXES-TYPES
    store(x + i, w);
}

/// The 1-based line and column of `needle` in the line of this file ending with `marker`.
fn source_position(marker: &str, needle: &str) -> (usize, usize) {
    let src = include_str!("kernel_macro.rs");
    let (i, l) = src
        .lines()
        .enumerate()
        .find(|(_, l)| l.ends_with(marker))
        .unwrap();
    (i + 1, l.find(needle).unwrap() + 1)
}

#[test]
fn build_errors_name_the_kernel_and_the_line() {
    // The location is the kernel's own source, down to the operator: the generated builder
    // calls carry the user's spans.
    let (line, column) = source_position("// MIXES-TYPES", "+ i");
    let e = mixes_types::build::<64>().unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "kernel mixes_types_BLOCK64, tests/kernel_macro.rs:{line}:{column}: add: operand \
             types differ: f32[64] and i32[64]"
        )
    );
    // `Debug` reads the same, so `fn main() -> Result<(), Box<dyn Error>>` prints it well.
    assert_eq!(format!("{e:?}"), e.to_string());
}

#[kernel]
fn wrong_shapes(x: Ptr<f32>) {
    let a = load(x + arange(0, 64));
    let b = load(x + arange(0, 128));
    store(x + arange(0, 64), a * b); // WRONG-SHAPES
}

#[test]
fn shape_errors_point_at_the_operator() {
    let (line, column) = source_position("// WRONG-SHAPES", "* b");
    let e = wrong_shapes::build().unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "kernel wrong_shapes, tests/kernel_macro.rs:{line}:{column}: mul: "
        )),
        "{e}"
    );
    assert!(e.contains("f32[64] and f32[128]"), "{e}");
}

#[kernel]
fn masks_with_ints(x: Ptr<f32>) {
    let offs = arange(0, 64);
    let v = load(x + offs, offs, 0.0); // INT-MASK
    store(x + offs, v);
}

#[test]
fn mask_errors_speak_the_kernel_language() {
    let (line, column) = source_position("// INT-MASK", "load(");
    let e = masks_with_ints::build().unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "kernel masks_with_ints, tests/kernel_macro.rs:{line}:{column}: load: a mask must \
             be a bool block of the pointer's shape (bool[64], e.g. `offs < n`), found i32[64]"
        )
    );
}

#[test]
fn launch_checks_arguments_at_run_time_too() {
    // The typed `launch` rules out wrong element types at compile time; a kernel of another
    // signature loaded in its place is still caught by the runtime's checks.
    let dev = Device::cpu();
    let other = load(&dev, load_block::build::<64>().unwrap());
    let x = dev.upload(&[1.0f32]).unwrap();
    let e = vector_add::launch::<256>(&dev, &other, [1, 1, 1], &x, &x, &x, 1).unwrap_err();
    assert!(e.to_string().contains("load_block"), "{e}");
}

// ---- launch hints from constant generics ----

#[kernel(num_warps = WARPS, min_programs_per_sm = PROGRAMS)]
fn tuned_copy<const BLOCK: usize, const WARPS: usize, const PROGRAMS: usize>(
    x: Ptr<f32>,
    y: Ptr<f32>,
    n: i32,
) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    store(y + offs, load(x + offs, mask, 0.0), mask);
}

#[test]
fn launch_hints_can_come_from_constant_generics() {
    let k = tuned_copy::build::<256, 2, 12>().unwrap();
    assert_eq!((k.num_warps, k.min_programs_per_sm), (2, 12));
    let k = tuned_copy::build::<256, 8, 0>().unwrap();
    assert_eq!((k.num_warps, k.min_programs_per_sm), (8, 0));
    let dev = Device::cpu();
    let xs = noise(300, 9);
    let x = dev.upload(&xs).unwrap();
    let y = poisoned(&dev, 300);
    let k = load(&dev, k);
    tuned_copy::launch::<256, 8, 0>(&dev, &k, [2, 1, 1], &x, &y, 300).unwrap();
    assert_eq!(y.download().unwrap(), xs);
}

// ---- tensor-core products ----

/// Attention's two products for one group of 8 heads and 8 tokens: scores `q . k^T`, then
/// `acc + v^T . p^T` with the scores (rounded to f16) as `p`.
#[kernel(num_warps = 1)]
fn two_dots(
    q: Ptr<f16>,
    k: Ptr<f16>,
    v: Ptr<f16>,
    acc: Ptr<f32>,
    s_out: Ptr<f32>,
    o_out: Ptr<f32>,
) {
    let r = arange(0, 8);
    let qk = expand(r * 64, 1, 64) + expand(arange(0, 64), 0, 8);
    let s = dot(load(q + qk), load(k + qk));
    let ss = expand(r * 8, 1, 8) + expand(r, 0, 8);
    store(s_out + ss, s);
    let vv = expand(r * 32, 1, 32) + expand(arange(0, 32), 0, 8);
    let oo = expand(arange(0, 32) * 8, 1, 8) + expand(r, 0, 32);
    let o = dot_ta(load(v + vv), s.to::<f16>(), load(acc + oo));
    store(o_out + oo, o);
}

#[test]
fn dot_builtins_match_plain_rust() {
    use dusk::half::f16;
    let dev = Device::cpu();
    let h = |n: usize, seed: u64| -> Vec<f16> {
        noise(n, seed).iter().map(|x| f16::from_f32(*x)).collect()
    };
    let (qs, ks, vs) = (h(8 * 64, 21), h(8 * 64, 22), h(8 * 32, 23));
    let accs = noise(32 * 8, 24);
    let kern = load(&dev, two_dots::build().unwrap());
    let (q, k, v) = (
        dev.upload(&qs).unwrap(),
        dev.upload(&ks).unwrap(),
        dev.upload(&vs).unwrap(),
    );
    let acc = dev.upload(&accs).unwrap();
    let (s, o) = (poisoned(&dev, 64), poisoned(&dev, 256));
    two_dots::launch(&dev, &kern, [1, 1, 1], &q, &k, &v, &acc, &s, &o).unwrap();
    let f = |x: f16| x.to_f32();
    let want_s: Vec<f32> = (0..64)
        .map(|e| {
            (0..64)
                .map(|d| f(qs[e / 8 * 64 + d]) * f(ks[e % 8 * 64 + d]))
                .sum()
        })
        .collect();
    let got_s = s.download().unwrap();
    assert_close(&got_s, &want_s, 1e-4);
    let p: Vec<f32> = got_s.iter().map(|x| f16::from_f32(*x).to_f32()).collect();
    let want_o: Vec<f32> = (0..256)
        .map(|e| {
            let (m, n) = (e / 8, e % 8);
            accs[e]
                + (0..8)
                    .map(|t| f(vs[t * 32 + m]) * p[n * 8 + t])
                    .sum::<f32>()
        })
        .collect();
    assert_close(&o.download().unwrap(), &want_o, 1e-4);
}
