//! The CPU interpreter on kernels made with the builder.

use dusk_compiler::interp::{run, ArgValue, InterpError};
use dusk_compiler::{DType, Kernel, KernelBuilder};
use half::{bf16, f16};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn bytes_i32(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
fn f16_bytes(v: &[f16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn bytes_f16(b: &[u8]) -> Vec<f16> {
    b.chunks_exact(2)
        .map(|c| f16::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
fn ptr(buffer: usize) -> ArgValue {
    ArgValue::Ptr {
        buffer,
        offset_bytes: 0,
    }
}

/// Deterministic pseudo-random values in [-4, 4).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 8192) as f32 / 1024.0 - 4.0
        })
        .collect()
}

/// `out[i] = x[i] + y[i]` for `i < n`, `block` elements a program.
fn vector_add(block: i64) -> Kernel {
    let mut b = KernelBuilder::new("vector_add");
    let x = b.param_ptr("x", DType::F32);
    let y = b.param_ptr("y", DType::F32);
    let out = b.param_ptr("out", DType::F32);
    let n = b.param_scalar("n", DType::I32);
    let pid = b.program_id(0);
    let base = b.mul_c(pid, block);
    let r = b.arange(0, block);
    let offs = b.add(base, r);
    let mask = b.lt(offs, n);
    let px = b.add_ptr(x, offs);
    let py = b.add_ptr(y, offs);
    let xv = b.load_masked(px, Some(mask), None);
    let yv = b.load_masked(py, Some(mask), None);
    let s = b.add(xv, yv);
    let po = b.add_ptr(out, offs);
    b.store_masked(po, s, Some(mask));
    b.finish().unwrap()
}

#[test]
fn vector_add_masked_odd_length() {
    let n = 1001usize;
    let block = 128;
    let k = vector_add(block);
    let (x, y) = (values(n, 1), values(n, 2));
    let (mut bx, mut by) = (f32_bytes(&x), f32_bytes(&y));
    // Exactly n elements: an unmasked access past the end would fault.
    let mut bo = vec![0u8; 4 * n];
    let grid = [n.div_ceil(block as usize) as u32, 1, 1];
    let args = [ptr(0), ptr(1), ptr(2), ArgValue::I32(n as i32)];
    run(&k, grid, &args, &mut [&mut bx, &mut by, &mut bo]).unwrap();
    let out = bytes_f32(&bo);
    for i in 0..n {
        assert_eq!(out[i], x[i] + y[i], "element {i}");
    }
}

#[test]
fn vector_add_pointer_argument_offset() {
    // A pointer argument starting partway into its buffer.
    let k = vector_add(16);
    let x: Vec<f32> = (0..20).map(|i| i as f32).collect();
    let (mut bx, mut by) = (f32_bytes(&x), f32_bytes(&x));
    let mut bo = vec![0u8; 4 * 20];
    let args = [
        ArgValue::Ptr {
            buffer: 0,
            offset_bytes: 8,
        },
        ptr(1),
        ArgValue::Ptr {
            buffer: 2,
            offset_bytes: 4,
        },
        ArgValue::I32(18),
    ];
    run(&k, [2, 1, 1], &args, &mut [&mut bx, &mut by, &mut bo]).unwrap();
    let out = bytes_f32(&bo);
    assert_eq!(out[0], 0.0);
    for i in 0..18 {
        assert_eq!(out[i + 1], x[i + 2] + x[i]);
    }
    assert_eq!(out[19], 0.0);
}

#[test]
fn row_softmax_matches_f64() {
    let (rows, cols, block) = (37usize, 100usize, 128i64);
    let mut b = KernelBuilder::new("softmax");
    let x = b.param_ptr("x", DType::F32);
    let out = b.param_ptr("out", DType::F32);
    let ncols = b.param_scalar("ncols", DType::I32);
    let row = b.program_id(0);
    let start = b.mul(row, ncols);
    let r = b.arange(0, block);
    let mask = b.lt(r, ncols);
    let offs = b.add(start, r);
    let px = b.add_ptr(x, offs);
    let ninf = b.f32(f32::NEG_INFINITY);
    let xv = b.load_masked(px, Some(mask), Some(ninf));
    let m = b.max(xv, 0);
    let d = b.sub(xv, m);
    let log2e = b.f32(std::f32::consts::LOG2_E);
    let d = b.mul(d, log2e);
    let e = b.exp2(d);
    let s = b.sum(e, 0);
    let y = b.div(e, s);
    let po = b.add_ptr(out, offs);
    b.store_masked(po, y, Some(mask));
    let k = b.finish().unwrap();

    let xs = values(rows * cols, 7);
    let mut bx = f32_bytes(&xs);
    let mut bo = vec![0u8; 4 * rows * cols];
    let args = [ptr(0), ptr(1), ArgValue::I32(cols as i32)];
    run(&k, [rows as u32, 1, 1], &args, &mut [&mut bx, &mut bo]).unwrap();
    let out = bytes_f32(&bo);
    for r in 0..rows {
        let row = &xs[r * cols..(r + 1) * cols];
        let m = row.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v as f64));
        let e: Vec<f64> = row.iter().map(|&v| (v as f64 - m).exp()).collect();
        let s: f64 = e.iter().sum();
        for c in 0..cols {
            let want = e[c] / s;
            let got = out[r * cols + c] as f64;
            assert!(
                (got - want).abs() <= 1e-5 * want.max(1e-3),
                "row {r} col {c}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn reduce_2d_both_axes() {
    let (rows, cols) = (8usize, 16usize);
    let mut b = KernelBuilder::new("reduce2d");
    let x = b.param_ptr("x", DType::I32);
    let f = b.param_ptr("f", DType::F32);
    let col_sums = b.param_ptr("col_sums", DType::I32);
    let row_sums = b.param_ptr("row_sums", DType::I32);
    let col_max = b.param_ptr("col_max", DType::F32);
    let row_min = b.param_ptr("row_min", DType::F32);
    let ri = b.arange(0, rows as i64);
    let ci = b.arange(0, cols as i64);
    let r2 = b.expand(ri, 1, cols); // [rows, cols]: r2[i][j] = i
    let c2 = b.expand(ci, 0, rows); // [rows, cols]: c2[i][j] = j
    let r2s = b.mul_c(r2, cols as i64);
    let offs = b.add(r2s, c2);
    let px = b.add_ptr(x, offs);
    let xv = b.load(px);
    let pf = b.add_ptr(f, offs);
    let fv = b.load(pf);
    let cs = b.sum(xv, 0);
    let rs = b.sum(xv, 1);
    let cm = b.max(fv, 0);
    let rm = b.min(fv, 1);
    let p = b.add_ptr(col_sums, ci);
    b.store(p, cs);
    let p = b.add_ptr(row_sums, ri);
    b.store(p, rs);
    let p = b.add_ptr(col_max, ci);
    b.store(p, cm);
    let p = b.add_ptr(row_min, ri);
    b.store(p, rm);
    let k = b.finish().unwrap();

    let xs: Vec<i32> = (0..rows * cols)
        .map(|i| (i as i32 * 37) % 101 - 50)
        .collect();
    let fs = values(rows * cols, 3);
    let (mut bx, mut bf) = (i32_bytes(&xs), f32_bytes(&fs));
    let (mut bcs, mut brs) = (vec![0u8; 4 * cols], vec![0u8; 4 * rows]);
    let (mut bcm, mut brm) = (vec![0u8; 4 * cols], vec![0u8; 4 * rows]);
    let args = [ptr(0), ptr(1), ptr(2), ptr(3), ptr(4), ptr(5)];
    let mut mem: [&mut [u8]; 6] = [&mut bx, &mut bf, &mut bcs, &mut brs, &mut bcm, &mut brm];
    run(&k, [1, 1, 1], &args, &mut mem).unwrap();
    let (cs, rs) = (bytes_i32(&bcs), bytes_i32(&brs));
    let (cm, rm) = (bytes_f32(&bcm), bytes_f32(&brm));
    for j in 0..cols {
        assert_eq!(cs[j], (0..rows).map(|i| xs[i * cols + j]).sum::<i32>());
        assert_eq!(
            cm[j],
            (0..rows)
                .map(|i| fs[i * cols + j])
                .fold(f32::NEG_INFINITY, f32::max)
        );
    }
    for i in 0..rows {
        assert_eq!(rs[i], xs[i * cols..(i + 1) * cols].iter().sum::<i32>());
        assert_eq!(
            rm[i],
            fs[i * cols..(i + 1) * cols]
                .iter()
                .copied()
                .fold(f32::INFINITY, f32::min)
        );
    }
}

/// Sums `x[0..n]` in blocks of 32 in a loop carrying a block accumulator and a counter;
/// writes the sum and the iteration count.
fn loop_sum() -> Kernel {
    let mut b = KernelBuilder::new("loop_sum");
    let x = b.param_ptr("x", DType::F32);
    let out = b.param_ptr("out", DType::F32);
    let count = b.param_ptr("count", DType::I32);
    let n = b.param_scalar("n", DType::I32);
    let step = b.param_scalar("step", DType::I32);
    let zero = b.f32(0.0);
    let acc0 = b.splat(zero, &[32]);
    let c0 = b.i32(0);
    let lo = b.i32(0);
    let res = b.for_range(lo, n, step, &[acc0, c0], |b, i, carried| {
        let r = b.arange(0, 32);
        let offs = b.add(i, r);
        let mask = b.lt(offs, n);
        let p = b.add_ptr(x, offs);
        let v = b.load_masked(p, Some(mask), None);
        let acc = b.add(carried[0], v);
        let c = b.add_c(carried[1], 1);
        vec![acc, c]
    });
    let total = b.sum(res[0], 0);
    b.store(out, total);
    b.store(count, res[1]);
    b.finish().unwrap()
}

#[test]
fn for_loop_with_carried_values() {
    let k = loop_sum();
    let n = 100usize;
    let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut bx = f32_bytes(&xs);
    let (mut bo, mut bc) = (vec![0u8; 4], vec![0u8; 4]);
    let args = [
        ptr(0),
        ptr(1),
        ptr(2),
        ArgValue::I32(n as i32),
        ArgValue::I32(32),
    ];
    run(&k, [1, 1, 1], &args, &mut [&mut bx, &mut bo, &mut bc]).unwrap();
    assert_eq!(bytes_f32(&bo)[0], (0..n).sum::<usize>() as f32);
    assert_eq!(bytes_i32(&bc)[0], 4);

    // Zero iterations: the results are the initial values.
    let args = [ptr(0), ptr(1), ptr(2), ArgValue::I32(0), ArgValue::I32(32)];
    let (mut bo, mut bc) = (f32_bytes(&[9.0]), i32_bytes(&[9]));
    run(&k, [1, 1, 1], &args, &mut [&mut bx, &mut bo, &mut bc]).unwrap();
    assert_eq!(bytes_f32(&bo)[0], 0.0);
    assert_eq!(bytes_i32(&bc)[0], 0);

    // A non-positive step is a fault, not a hang.
    let args = [
        ptr(0),
        ptr(1),
        ptr(2),
        ArgValue::I32(n as i32),
        ArgValue::I32(0),
    ];
    let e = run(&k, [1, 1, 1], &args, &mut [&mut bx, &mut bo, &mut bc]).unwrap_err();
    assert!(
        matches!(&e, InterpError::Fault { op, .. } if op == "for"),
        "{e}"
    );
}

#[test]
fn if_else_and_select() {
    // Even programs write pid * 10, odd ones -pid, through an if; a select clamps negatives
    // to -1 in a second buffer.
    let mut b = KernelBuilder::new("branches");
    let out = b.param_ptr("out", DType::I32);
    let out2 = b.param_ptr("out2", DType::I32);
    let pid = b.program_id(0);
    let two = b.i32(2);
    let r = b.rem(pid, two);
    let zero = b.i32(0);
    let even = b.eq(r, zero);
    let v = b.if_else(even, |b| vec![b.mul_c(pid, 10)], |b| vec![b.neg(pid)]);
    let p = b.add_ptr(out, pid);
    b.store(p, v[0]);
    let neg = b.lt(v[0], zero);
    let m1 = b.i32(-1);
    let s = b.select(neg, m1, v[0]);
    let p = b.add_ptr(out2, pid);
    b.store(p, s);
    let k = b.finish().unwrap();
    let (mut bo, mut bo2) = (vec![0u8; 4 * 5], vec![0u8; 4 * 5]);
    run(&k, [5, 1, 1], &[ptr(0), ptr(1)], &mut [&mut bo, &mut bo2]).unwrap();
    assert_eq!(bytes_i32(&bo), vec![0, -1, 20, -3, 40]);
    assert_eq!(bytes_i32(&bo2), vec![0, -1, 20, -1, 40]);
}

#[test]
fn programs_run_in_order_x_fastest() {
    // Every program folds its linear id into one cell: cell = cell * 31 + id, an
    // order-dependent (wrapping) result; also checks num_programs.
    let mut b = KernelBuilder::new("order");
    let cell = b.param_ptr("cell", DType::I32);
    let (x, y, z) = (b.program_id(0), b.program_id(1), b.program_id(2));
    let nx = b.num_programs(0);
    let ny = b.num_programs(1);
    let yx = b.mul(y, nx);
    let nxy = b.mul(nx, ny);
    let zxy = b.mul(z, nxy);
    let id = b.add(x, yx);
    let id = b.add(id, zxy);
    let old = b.load(cell);
    let scaled = b.mul_c(old, 31);
    let new = b.add(scaled, id);
    b.store(cell, new);
    let k = b.finish().unwrap();
    let mut bc = i32_bytes(&[1]);
    run(&k, [3, 2, 4], &[ptr(0)], &mut [&mut bc]).unwrap();
    let want = (0..24).fold(1i32, |a, id| a.wrapping_mul(31).wrapping_add(id));
    assert_eq!(bytes_i32(&bc)[0], want);
}

#[test]
fn f16_load_convert_store_rounding() {
    let mut b = KernelBuilder::new("halves");
    let src = b.param_ptr("src", DType::F16);
    let srcf = b.param_ptr("srcf", DType::F32);
    let dst = b.param_ptr("dst", DType::F16);
    let widened = b.param_ptr("widened", DType::F32);
    let narrowed = b.param_ptr("narrowed", DType::F16);
    let bfout = b.param_ptr("bfout", DType::BF16);
    let r = b.arange(0, 8);
    let p = b.add_ptr(src, r);
    let h = b.load(p);
    // f16 arithmetic: computed in f32, rounded to f16.
    let one = b.const_like(h, 1);
    let s = b.add(h, one);
    let p = b.add_ptr(dst, r);
    b.store(p, s);
    let w = b.cast(h, DType::F32);
    let p = b.add_ptr(widened, r);
    b.store(p, w);
    let p = b.add_ptr(srcf, r);
    let f = b.load(p);
    let n = b.cast(f, DType::F16);
    let p = b.add_ptr(narrowed, r);
    b.store(p, n);
    let bfv = b.cast(f, DType::BF16);
    let p = b.add_ptr(bfout, r);
    b.store(p, bfv);
    let k = b.finish().unwrap();

    let hs: Vec<f16> = [2048.0, 1.5, -3.25, 65504.0, 0.0, -1.0, 4096.0, 0.099975586]
        .iter()
        .map(|&v| f16::from_f32(v))
        .collect();
    let t = 2f32.powi(-11);
    let fs = [
        1.0 + t,
        1.0 + 3.0 * t,
        65520.0,
        65519.0,
        -1.0 - t,
        1e-8,
        f32::NAN,
        0.1,
    ];
    let mut bsrc = f16_bytes(&hs);
    let mut bsrcf = f32_bytes(&fs);
    let (mut bdst, mut bw, mut bn, mut bbf) =
        (vec![0u8; 16], vec![0u8; 32], vec![0u8; 16], vec![0u8; 16]);
    let args = [ptr(0), ptr(1), ptr(2), ptr(3), ptr(4), ptr(5)];
    let mut mem: [&mut [u8]; 6] = [&mut bsrc, &mut bsrcf, &mut bdst, &mut bw, &mut bn, &mut bbf];
    run(&k, [1, 1, 1], &args, &mut mem).unwrap();

    let dst = bytes_f16(&bdst);
    for i in 0..8 {
        assert_eq!(dst[i], f16::from_f32(hs[i].to_f32() + 1.0), "element {i}");
    }
    // 2048 + 1 is a tie between 2048 and 2050: to even, 2048. 65504 + 1 stays 65504.
    assert_eq!(dst[0].to_f32(), 2048.0);
    assert_eq!(dst[3].to_f32(), 65504.0);
    assert_eq!(dst[6].to_f32(), 4096.0);

    let w = bytes_f32(&bw);
    for i in 0..8 {
        assert_eq!(w[i], hs[i].to_f32());
    }

    let n = bytes_f16(&bn);
    assert_eq!(n[0].to_f32(), 1.0); // tie, to even
    assert_eq!(n[1].to_f32(), 1.0 + 4.0 * t); // tie, to even (up)
    assert!(n[2].is_infinite() && n[2].to_f32() > 0.0); // tie at the top: to infinity
    assert_eq!(n[3].to_f32(), 65504.0);
    assert_eq!(n[4].to_f32(), -1.0);
    assert_eq!(n[5].to_f32(), 0.0); // underflows
    assert!(n[6].is_nan());
    for i in 0..8 {
        assert_eq!(
            n[i].to_bits(),
            f16::from_f32(fs[i]).to_bits(),
            "element {i}"
        );
    }
    let bf: Vec<bf16> = bbf
        .chunks_exact(2)
        .map(|c| bf16::from_le_bytes([c[0], c[1]]))
        .collect();
    for i in 0..8 {
        assert_eq!(
            bf[i].to_bits(),
            bf16::from_f32(fs[i]).to_bits(),
            "element {i}"
        );
    }
}

/// One scalar op on two scalar parameters of type `d`, written to `out[0]` as `d`.
fn scalar_op(
    d: DType,
    f: impl FnOnce(
        &mut KernelBuilder,
        dusk_compiler::Value,
        dusk_compiler::Value,
    ) -> dusk_compiler::Value,
) -> Kernel {
    let mut b = KernelBuilder::new("scalar_op");
    let out = b.param_ptr("out", d);
    let x = b.param_scalar("x", d);
    let y = b.param_scalar("y", d);
    let r = f(&mut b, x, y);
    b.store(out, r);
    b.finish().unwrap()
}

fn run_i32(k: &Kernel, x: i32, y: i32) -> Result<i32, InterpError> {
    let mut bo = vec![0u8; 4];
    run(
        k,
        [1, 1, 1],
        &[ptr(0), ArgValue::I32(x), ArgValue::I32(y)],
        &mut [&mut bo],
    )?;
    Ok(bytes_i32(&bo)[0])
}

fn run_u8(k: &Kernel, x: u8, y: u8) -> Result<u8, InterpError> {
    let mut bo = vec![0u8; 1];
    run(
        k,
        [1, 1, 1],
        &[ptr(0), ArgValue::U8(x), ArgValue::U8(y)],
        &mut [&mut bo],
    )?;
    Ok(bo[0])
}

#[test]
fn integer_ops() {
    let shr8 = scalar_op(DType::U8, |b, x, y| b.shr(x, y));
    assert_eq!(run_u8(&shr8, 200, 3).unwrap(), 25); // logical
    assert_eq!(run_u8(&shr8, 0x80, 7).unwrap(), 1);
    assert!(matches!(
        run_u8(&shr8, 1, 8),
        Err(InterpError::Fault { .. })
    ));

    let shr32 = scalar_op(DType::I32, |b, x, y| b.shr(x, y));
    assert_eq!(run_i32(&shr32, -200, 3).unwrap(), -25); // arithmetic
    assert!(matches!(
        run_i32(&shr32, 1, 32),
        Err(InterpError::Fault { .. })
    ));
    assert!(matches!(
        run_i32(&shr32, 1, -1),
        Err(InterpError::Fault { .. })
    ));

    let shl32 = scalar_op(DType::I32, |b, x, y| b.shl(x, y));
    assert_eq!(run_i32(&shl32, 3, 31).unwrap(), i32::MIN);

    let rem = scalar_op(DType::I32, |b, x, y| b.rem(x, y));
    assert_eq!(run_i32(&rem, -7, 3).unwrap(), -1);
    assert_eq!(run_i32(&rem, 7, -3).unwrap(), 1);
    assert_eq!(run_i32(&rem, -7, -3).unwrap(), -1);
    let e = run_i32(&rem, 7, 0).unwrap_err();
    assert!(
        matches!(&e, InterpError::Fault { op, .. } if op == "rem"),
        "{e}"
    );

    let div = scalar_op(DType::I32, |b, x, y| b.div(x, y));
    assert_eq!(run_i32(&div, -7, 2).unwrap(), -3);
    assert_eq!(run_i32(&div, i32::MIN, -1).unwrap(), i32::MIN);
    assert!(matches!(
        run_i32(&div, 1, 0),
        Err(InterpError::Fault { .. })
    ));

    let div8 = scalar_op(DType::U8, |b, x, y| b.div(x, y));
    assert_eq!(run_u8(&div8, 250, 7).unwrap(), 35); // unsigned

    let add = scalar_op(DType::I32, |b, x, y| b.add(x, y));
    assert_eq!(run_i32(&add, i32::MAX, 1).unwrap(), i32::MIN);
    let add8 = scalar_op(DType::U8, |b, x, y| b.add(x, y));
    assert_eq!(run_u8(&add8, 250, 10).unwrap(), 4);

    let max8 = scalar_op(DType::U8, |b, x, y| b.maximum(x, y));
    assert_eq!(run_u8(&max8, 200, 100).unwrap(), 200); // unsigned compare
    let min32 = scalar_op(DType::I32, |b, x, y| b.minimum(x, y));
    assert_eq!(run_i32(&min32, -5, 3).unwrap(), -5);

    let not = scalar_op(DType::I32, |b, x, _| b.not(x));
    assert_eq!(run_i32(&not, 5, 0).unwrap(), !5);
    let abs = scalar_op(DType::I32, |b, x, _| b.abs(x));
    assert_eq!(run_i32(&abs, -5, 0).unwrap(), 5);

    // Casts: u8 -> i32 zero-extends, i32 -> u8 wraps, f32 -> i32 truncates and saturates.
    let casts = scalar_op(DType::I32, |b, x, _| {
        let u = b.cast(x, DType::U8);
        let back = b.cast(u, DType::I32);
        let f = b.cast(x, DType::F32);
        let big = b.f32(1e10);
        let f = b.mul(f, big);
        let sat = b.cast(f, DType::I32);
        let t = b.f32(-2.75);
        let t = b.cast(t, DType::I32);
        let s = b.add(back, sat);
        b.add(s, t)
    });
    // -1 -> u8 255 -> i32 255; -1e10 saturates to i32::MIN; -2.75 -> -2.
    assert_eq!(
        run_i32(&casts, -1, 0).unwrap(),
        255i32.wrapping_add(i32::MIN).wrapping_sub(2)
    );
}

#[test]
fn float_min_max_nan_and_compare() {
    let k = {
        let mut b = KernelBuilder::new("nan");
        let out = b.param_ptr("out", DType::F32);
        let flags = b.param_ptr("flags", DType::U8);
        let x = b.param_scalar("x", DType::F32);
        let y = b.param_scalar("y", DType::F32);
        let mn = b.minimum(x, y);
        let mx = b.maximum(x, y);
        let i1 = b.i32(1);
        b.store(out, mn);
        let p = b.add_ptr(out, i1);
        b.store(p, mx);
        let cmps = [b.eq(x, y), b.ne(x, y), b.lt(x, y), b.ge(x, y)];
        for (i, c) in cmps.into_iter().enumerate() {
            let c = b.cast(c, DType::U8);
            let o = b.i32(i as i32);
            let p = b.add_ptr(flags, o);
            b.store(p, c);
        }
        b.finish().unwrap()
    };
    let (mut bo, mut bf) = (vec![0u8; 8], vec![0u8; 4]);
    let args = [ptr(0), ptr(1), ArgValue::F32(f32::NAN), ArgValue::F32(2.0)];
    run(&k, [1, 1, 1], &args, &mut [&mut bo, &mut bf]).unwrap();
    assert_eq!(bytes_f32(&bo), vec![2.0, 2.0]);
    assert_eq!(bf, vec![0, 1, 0, 0]);
}

#[test]
fn out_of_bounds_load_is_a_fault() {
    // Unmasked vector add over 1001 elements with blocks of 128: program 7 reads past the end.
    let mut b = KernelBuilder::new("oob");
    let x = b.param_ptr("x", DType::F32);
    let out = b.param_ptr("out", DType::F32);
    let pid = b.program_id(0);
    let base = b.mul_c(pid, 128);
    let r = b.arange(0, 128);
    let offs = b.add(base, r);
    let px = b.add_ptr(x, offs);
    let v = b.load(px);
    let po = b.add_ptr(out, offs);
    let (mask_lo, mask_hi) = (b.i32(0), b.i32(1001));
    let lo = b.ge(offs, mask_lo);
    let hi = b.lt(offs, mask_hi);
    let m = b.and(lo, hi);
    b.store_masked(po, v, Some(m));
    let k = b.finish().unwrap();
    let mut bx = f32_bytes(&values(1001, 5));
    let mut bo = vec![0u8; 4 * 1001];
    let e = run(&k, [8, 1, 1], &[ptr(0), ptr(1)], &mut [&mut bx, &mut bo]).unwrap_err();
    match &e {
        InterpError::Fault {
            kernel,
            op,
            loc,
            program,
            msg,
        } => {
            assert_eq!(kernel, "oob");
            assert_eq!(op, "load");
            assert!(loc.contains("interp.rs"), "{loc}");
            assert_eq!(*program, [7, 0, 0]);
            assert!(msg.contains("buffer 0") && msg.contains("4004"), "{msg}");
        }
        other => panic!("expected a fault, got {other:?}"),
    }
    // Programs before the faulting one ran.
    assert_eq!(&bo[..4 * 896], &bx[..4 * 896]);

    // A negative offset faults too.
    let mut bo2 = vec![0u8; 4 * 1001];
    let args = [
        ptr(0),
        ArgValue::Ptr {
            buffer: 1,
            offset_bytes: 0,
        },
    ];
    let k2 = {
        let mut b = KernelBuilder::new("neg");
        let x = b.param_ptr("x", DType::F32);
        let _out = b.param_ptr("out", DType::F32);
        let m1 = b.i64(-1);
        let p = b.add_ptr(x, m1);
        let v = b.load(p);
        b.store(x, v);
        b.finish().unwrap()
    };
    let e = run(&k2, [1, 1, 1], &args, &mut [&mut bx, &mut bo2]).unwrap_err();
    assert!(
        matches!(&e, InterpError::Fault { op, .. } if op == "load"),
        "{e}"
    );
}

#[test]
fn out_of_bounds_store_is_a_fault_and_writes_nothing() {
    let mut b = KernelBuilder::new("oob_store");
    let out = b.param_ptr("out", DType::I32);
    let r = b.arange(0, 8);
    let p = b.add_ptr(out, r);
    let line = line!() + 1;
    b.store(p, r);
    let k = b.finish().unwrap();
    let mut bo = vec![0u8; 4 * 7];
    let e = run(&k, [1, 1, 1], &[ptr(0)], &mut [&mut bo]).unwrap_err();
    assert!(
        matches!(&e, InterpError::Fault { op, .. } if op == "store"),
        "{e}"
    );
    // One line: the kernel, `file:line:column` of the op, the op and the program, then
    // what went wrong; `Debug` reads the same.
    let text = e.to_string();
    assert!(
        text.starts_with(&format!(
            "kernel oob_store, {}:{line}:7: store in program (0, 0, 0): ",
            file!()
        )),
        "{text}"
    );
    assert_eq!(format!("{e:?}"), text);
    assert!(bo.iter().all(|&x| x == 0));
}

#[test]
fn bad_arguments_are_errors() {
    let k = vector_add(128);
    let mut bx = vec![0u8; 16];
    let mut by = vec![0u8; 16];
    let mut bo = vec![0u8; 16];

    let args = [ArgValue::I32(0), ptr(1), ptr(2), ArgValue::I32(4)];
    let e = run(&k, [1, 1, 1], &args, &mut [&mut bx, &mut by, &mut bo]).unwrap_err();
    assert!(
        matches!(&e, InterpError::BadArgument { index: 0, name, .. } if name == "x"),
        "{e}"
    );

    let args = [ptr(0), ptr(1), ptr(2), ArgValue::F32(4.0)];
    let e = run(&k, [1, 1, 1], &args, &mut [&mut bx, &mut by, &mut bo]).unwrap_err();
    assert!(
        matches!(&e, InterpError::BadArgument { index: 3, .. }),
        "{e}"
    );

    let args = [ptr(0), ptr(1), ptr(2), ArgValue::I64(4)];
    let e = run(&k, [1, 1, 1], &args, &mut [&mut bx, &mut by, &mut bo]).unwrap_err();
    assert!(
        matches!(&e, InterpError::BadArgument { index: 3, .. }),
        "{e}"
    );

    let args = [ptr(0), ptr(1), ptr(3), ArgValue::I32(4)];
    let e = run(&k, [1, 1, 1], &args, &mut [&mut bx, &mut by, &mut bo]).unwrap_err();
    assert!(
        matches!(&e, InterpError::BadArgument { index: 2, .. }),
        "{e}"
    );

    let args = [ptr(0), ptr(1), ptr(2)];
    let e = run(&k, [1, 1, 1], &args, &mut [&mut bx, &mut by, &mut bo]).unwrap_err();
    assert!(
        matches!(
            e,
            InterpError::ArgumentCount {
                expected: 4,
                found: 3,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn empty_grid_runs_nothing() {
    let k = vector_add(128);
    let mut bx = vec![0u8; 4];
    let args = [ptr(0), ptr(0), ptr(0), ArgValue::I32(1000)];
    run(&k, [0, 1, 1], &args, &mut [&mut bx]).unwrap();
}

/// Offsets of a row-major `[rows, cols]` block.
fn offsets_2d(b: &mut KernelBuilder, rows: usize, cols: usize) -> dusk_compiler::Value {
    let r = b.arange(0, rows as i64);
    let r = b.mul_c(r, cols as i64);
    let r = b.expand(r, 1, cols);
    let c = b.arange(0, cols as i64);
    let c = b.expand(c, 0, rows);
    b.add(r, c)
}

/// `dot` (`a . b^T`) and `dot_ta` (`acc + a^T . b^T`) against f64 sums of the same f16
/// inputs: the products are exact, so only the f32 sums differ.
#[test]
fn dot_and_dot_ta_match_f64() {
    let (m, kd, n, mv) = (16, 64, 8, 32);
    let mut b = KernelBuilder::new("dots");
    let pa = b.param_ptr("a", DType::F16);
    let pb = b.param_ptr("b", DType::F16);
    let pv = b.param_ptr("v", DType::F16);
    let pp = b.param_ptr("p", DType::F16);
    let pc = b.param_ptr("c", DType::F32);
    let ps = b.param_ptr("s", DType::F32);
    let po = b.param_ptr("o", DType::F32);
    let load = |b: &mut KernelBuilder, p, rows, cols| {
        let off = offsets_2d(b, rows, cols);
        let p = b.add_ptr(p, off);
        b.load(p)
    };
    let a = load(&mut b, pa, m, kd);
    let bk = load(&mut b, pb, n, kd);
    let v = load(&mut b, pv, 8, mv);
    let p = load(&mut b, pp, n, 8);
    let c = load(&mut b, pc, mv, n);
    let s = b.dot(a, bk, None);
    let o = b.dot_ta(v, p, Some(c));
    let off = offsets_2d(&mut b, m, n);
    let dst = b.add_ptr(ps, off);
    b.store(dst, s);
    let off = offsets_2d(&mut b, mv, n);
    let dst = b.add_ptr(po, off);
    b.store(dst, o);
    let k = b.finish().unwrap();
    let h = |n: usize, seed: u32| -> Vec<f16> {
        values(n, seed).into_iter().map(f16::from_f32).collect()
    };
    let (av, bv, vv, pvv) = (h(m * kd, 1), h(n * kd, 2), h(8 * mv, 3), h(n * 8, 4));
    let cv = values(mv * n, 5);
    let mut bufs = [
        f16_bytes(&av),
        f16_bytes(&bv),
        f16_bytes(&vv),
        f16_bytes(&pvv),
        f32_bytes(&cv),
        vec![0u8; 4 * m * n],
        vec![0u8; 4 * mv * n],
    ];
    let args: Vec<ArgValue> = (0..7).map(ptr).collect();
    let mut mem: Vec<&mut [u8]> = bufs.iter_mut().map(|x| x.as_mut_slice()).collect();
    run(&k, [1, 1, 1], &args, &mut mem).unwrap();
    let f = |x: f16| x.to_f64();
    let s = bytes_f32(&bufs[5]);
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..kd).map(|t| f(av[i * kd + t]) * f(bv[j * kd + t])).sum();
            assert!((s[i * n + j] as f64 - want).abs() < 1e-3, "s[{i}][{j}]");
        }
    }
    let o = bytes_f32(&bufs[6]);
    for i in 0..mv {
        for j in 0..n {
            let want: f64 = cv[i * n + j] as f64
                + (0..8)
                    .map(|t| f(vv[t * mv + i]) * f(pvv[j * 8 + t]))
                    .sum::<f64>();
            assert!((o[i * n + j] as f64 - want).abs() < 1e-3, "o[{i}][{j}]");
        }
    }
}

/// `arrive`: each program of a grid gets a distinct count, the counter ends at the number
/// of programs, and the last program (the one that found `programs - 1`) sees the values
/// every other program stored before arriving.
#[test]
fn arrive_counts_programs_and_the_last_sees_their_stores() {
    let mut b = KernelBuilder::new("arrive");
    let counter = b.param_ptr("counter", DType::I32);
    let slots = b.param_ptr("slots", DType::I32);
    let tickets = b.param_ptr("tickets", DType::I32);
    let total = b.param_ptr("total", DType::I32);
    let pid = b.program_id(0);
    let programs = b.num_programs(0);
    let p = b.add_ptr(slots, pid);
    let v = b.mul_c(pid, 10);
    b.store(p, v);
    let ticket = b.arrive(counter);
    let p = b.add_ptr(tickets, pid);
    b.store(p, ticket);
    let last = b.add_c(programs, -1);
    let is_last = b.eq(ticket, last);
    b.if_then(is_last, |b| {
        let r = b.arange(0, 64);
        let ok = b.lt(r, programs);
        let p = b.add_ptr(slots, r);
        let seen = b.load_masked(p, Some(ok), None);
        let sum = b.sum(seen, 0);
        b.store(total, sum);
    });
    let k = b.finish().unwrap();
    let n = 37;
    let mut counter = i32_bytes(&[0]);
    let mut slots = vec![0u8; 4 * n];
    let mut tickets = vec![0u8; 4 * n];
    let mut total = i32_bytes(&[-1]);
    let args = [ptr(0), ptr(1), ptr(2), ptr(3)];
    let mut bufs = [&mut counter[..], &mut slots, &mut tickets, &mut total];
    run(&k, [n as u32, 1, 1], &args, &mut bufs).unwrap();
    assert_eq!(bytes_i32(&counter), [n as i32]);
    let mut t = bytes_i32(&tickets);
    t.sort();
    assert_eq!(t, (0..n as i32).collect::<Vec<_>>());
    assert_eq!(bytes_i32(&total), [10 * (0..n as i32).sum::<i32>()]);
}

/// `signal` adds one per program (wrapping past `i32::MAX`); `await_count` in a later launch
/// gives every thread the count, whose wrapping difference from the target says whether it
/// was reached.
#[test]
fn signals_wrap_and_a_later_launch_reads_their_count() {
    let mut b = KernelBuilder::new("signal");
    let counter = b.param_ptr("counter", DType::I32);
    b.signal(counter);
    let signal = b.finish().unwrap();
    let mut b = KernelBuilder::new("await");
    let counter = b.param_ptr("counter", DType::I32);
    let target = b.param_scalar("target", DType::I32);
    let out = b.param_ptr("out", DType::I32);
    let count = b.await_count(counter, target);
    let behind = b.sub(count, target);
    b.store(out, behind);
    let wait = b.finish().unwrap();
    let mut counter = i32_bytes(&[i32::MAX - 2]);
    run(&signal, [5, 1, 1], &[ptr(0)], &mut [&mut counter[..]]).unwrap();
    assert_eq!(bytes_i32(&counter), [i32::MIN + 2]);
    for (target, want) in [(i32::MIN + 2, 0), (i32::MIN + 3, -1), (i32::MAX, 3)] {
        let mut out = i32_bytes(&[7]);
        let args = [ptr(0), ArgValue::I32(target), ptr(1)];
        run(&wait, [1, 1, 1], &args, &mut [&mut counter[..], &mut out]).unwrap();
        assert_eq!(bytes_i32(&out), [want], "target {target}");
    }
}

/// `shared_alloc`: a block stored to shared memory in one order and loaded back in another
/// (a 16 x 16 transpose) by the same program; each program has its own block, unwritten
/// elements read as the 0xFF fill (NaN), and an access past the block is a fault.
#[test]
fn shared_memory_transposes_a_block_per_program() {
    let build = |reach: i64| {
        let mut b = KernelBuilder::new("shared_transpose");
        let x = b.param_ptr("x", DType::F32);
        let out = b.param_ptr("out", DType::F32);
        let pid = b.program_id(0);
        let base = b.mul_c(pid, 256);
        let (r, c) = (b.arange(0, 16), b.arange(0, 16));
        let rows = b.mul_c(r, 16);
        let rows = b.expand(rows, 1, 16);
        let cols = b.expand(c, 0, 16);
        let idx = b.add(rows, cols);
        let cols16 = b.mul_c(c, 16);
        let cols16 = b.expand(cols16, 0, 16);
        let rows1 = b.expand(r, 1, 16);
        let tidx = b.add(rows1, cols16);
        let tile = b.shared_alloc(DType::F32, 256 + 16);
        let src = b.add_ptr(x, base);
        let src = b.add_ptr(src, idx);
        let v = b.load(src);
        let dst = b.add_ptr(tile, idx);
        b.store(dst, v);
        let back = b.add_ptr(tile, tidx);
        let t = b.load(back);
        let dst = b.add_ptr(out, base);
        let dst = b.add_ptr(dst, idx);
        b.store(dst, t);
        // One element past what was stored: the fill (or, with `reach`, past the block).
        let past = b.i32(256 + reach as i32);
        let p = b.add_ptr(tile, past);
        let fill = b.load(p);
        let programs = b.num_programs(0);
        let last = b.mul_c(programs, 256);
        let p = b.add_ptr(out, last);
        let p = b.add_ptr(p, pid);
        b.store(p, fill);
        b.finish().unwrap()
    };
    let k = build(0);
    assert!(dusk_compiler::print::print_kernel(&k).contains("shared_alloc 272 x f32"));
    let programs = 3;
    let xs = values(256 * programs, 7);
    let mut x = f32_bytes(&xs);
    let mut out = vec![0u8; 4 * (256 * programs + programs)];
    let mut bufs = [&mut x[..], &mut out];
    run(&k, [programs as u32, 1, 1], &[ptr(0), ptr(1)], &mut bufs).unwrap();
    let o = bytes_f32(&out);
    for p in 0..programs {
        for i in 0..16 {
            for j in 0..16 {
                assert_eq!(
                    o[p * 256 + i * 16 + j],
                    xs[p * 256 + j * 16 + i],
                    "{p} {i} {j}"
                );
            }
        }
        assert!(
            o[256 * programs + p].is_nan(),
            "unwritten shared memory reads as NaN"
        );
    }
    let k = build(16);
    let mut bufs = [&mut x[..], &mut out];
    let e = run(&k, [1, 1, 1], &[ptr(0), ptr(1)], &mut bufs).unwrap_err();
    assert!(e.to_string().contains("out-of-bounds load"), "{e}");
}

/// `atomic_add` and `bitcast`: a histogram of values by the leading bits of their f32
/// pattern, mass (f32) and count (i32) per bin, accumulated in shared memory by every lane
/// of the block (several lanes a bin) and in global memory across programs; a masked-off
/// lane adds nothing.
#[test]
fn atomic_adds_build_a_histogram_by_float_bits() {
    let (n, bins) = (512usize, 16usize);
    let mut b = KernelBuilder::new("bit_histogram");
    let x = b.param_ptr("x", DType::F32);
    let mass = b.param_ptr("mass", DType::F32);
    let count = b.param_ptr("count", DType::I32);
    let pid = b.program_id(0);
    let base = b.mul_c(pid, n as i64);
    let i = b.arange(0, n as i64);
    let src = b.add_ptr(x, base);
    let src = b.add_ptr(src, i);
    let v = b.load(src);
    let bits = b.bitcast(v, DType::I32);
    let shift = b.i32(23);
    let bin = b.shr(bits, shift);
    let top = b.i32(126);
    let bin = b.sub(top, bin);
    let last = b.i32(bins as i32 - 1);
    let bin = b.minimum(bin, last);
    let zero_i = b.i32(0);
    let bin = b.maximum(bin, zero_i);
    let back = b.bitcast(bits, DType::F32);
    let kept = b.ge(back, v);
    let m_bins = b.shared_alloc(DType::F32, bins);
    let all = b.arange(0, bins as i64);
    let zf = b.f32(0.0);
    let zeros = b.splat(zf, &[bins]);
    let mp = b.add_ptr(m_bins, all);
    b.store(mp, zeros);
    let at = b.add_ptr(m_bins, bin);
    b.atomic_add(at, v, Some(kept));
    let m = b.load(mp);
    let out = b.mul_c(pid, bins as i64);
    let om = b.add_ptr(mass, out);
    let om = b.add_ptr(om, all);
    b.store(om, m);
    let one = b.i32(1);
    let ones = b.splat(one, &[n]);
    let odd = b.and(i, one);
    let even = b.eq(odd, zero_i);
    let cp = b.add_ptr(count, bin);
    b.atomic_add(cp, ones, Some(even));
    let k = b.finish().unwrap();
    assert!(dusk_compiler::print::print_kernel(&k).contains("atomic_add"));

    let programs = 3;
    // Positive values over 24 octaves: bin j holds [2^-(j+1), 2^-j), the last one the rest.
    let xs: Vec<f32> = values(n * programs, 5)
        .iter()
        .map(|v| (v * 3.0).exp2() / 4096.0)
        .collect();
    let mut x = f32_bytes(&xs);
    let mut m_out = vec![0u8; 4 * bins * programs];
    let mut c_out = i32_bytes(&vec![0; bins]);
    let mut bufs = [&mut x[..], &mut m_out, &mut c_out];
    run(
        &k,
        [programs as u32, 1, 1],
        &[ptr(0), ptr(1), ptr(2)],
        &mut bufs,
    )
    .unwrap();
    let (m, c) = (bytes_f32(&m_out), bytes_i32(&c_out));
    let bin_of = |v: f32| (126 - (v.to_bits() >> 23) as i32).clamp(0, bins as i32 - 1) as usize;
    let mut want_c = vec![0; bins];
    for p in 0..programs {
        let mut want_m = vec![0f64; bins];
        for (j, &v) in xs[p * n..(p + 1) * n].iter().enumerate() {
            want_m[bin_of(v)] += v as f64;
            if j % 2 == 0 {
                want_c[bin_of(v)] += 1;
            }
        }
        for j in 0..bins {
            let got = m[p * bins + j] as f64;
            assert!(
                (got - want_m[j]).abs() <= 1e-5 * want_m[j].max(1e-30),
                "program {p} bin {j}: {got} against {}",
                want_m[j]
            );
        }
        assert!(
            want_m.iter().filter(|w| **w > 0.0).count() > 4,
            "values span several bins"
        );
    }
    assert_eq!(c, want_c);
}

/// `load_fresh` with global `atomic_add`: each program adds its value to its own word and
/// to a total, then reads every earlier program's word (programs run in order here, as
/// they start in order on a GPU): a running sum across programs.
#[test]
fn load_fresh_reads_what_earlier_programs_added() {
    let mut b = KernelBuilder::new("running_sum");
    let words = b.param_ptr("words", DType::I32);
    let total = b.param_ptr("total", DType::I32);
    let out = b.param_ptr("out", DType::I32);
    let pid = b.program_id(0);
    let v = b.mul_c(pid, 3);
    let v = b.add_c(v, 1);
    let mine = b.add_ptr(words, pid);
    b.atomic_add(mine, v, None);
    b.atomic_add(total, v, None);
    let i = b.arange(0, 16);
    let before = b.lt(i, pid);
    let p = b.add_ptr(words, i);
    let seen = b.load_fresh(p, Some(before));
    let sum = b.sum(seen, 0);
    let o = b.add_ptr(out, pid);
    b.store(o, sum);
    let k = b.finish().unwrap();
    assert!(dusk_compiler::print::print_kernel(&k).contains("load_fresh"));
    let programs = 10;
    let mut w = i32_bytes(&[0; 16]);
    let mut t = i32_bytes(&[5]);
    let mut o = i32_bytes(&[0; 10]);
    let mut bufs = [&mut w[..], &mut t, &mut o];
    run(&k, [programs, 1, 1], &[ptr(0), ptr(1), ptr(2)], &mut bufs).unwrap();
    let want: Vec<i32> = (0..10).map(|p| (0..p).map(|q| 3 * q + 1).sum()).collect();
    assert_eq!(bytes_i32(&o), want);
    assert_eq!(bytes_i32(&t), [5 + (0..10).map(|q| 3 * q + 1).sum::<i32>()]);
}

/// `async_copy` lands in shared memory only once an `async_wait` has waited for its
/// committed group: read before, the block still holds its fill (NaN); a wait leaving one
/// group pending lands the older group only; masked-off elements land as zeros; and
/// `load_tile` reads the landed block as a `[4, 16]` tile of rows 16 apart.
#[test]
fn async_copies_land_when_their_group_is_waited_for() {
    let mut b = KernelBuilder::new("staged_copies");
    let x = b.param_ptr("x", DType::F32);
    let out = b.param_ptr("out", DType::F32);
    let i = b.arange(0, 64);
    let tile = b.shared_alloc(DType::F32, 128);
    let n = b.i32(40);
    let m = b.lt(i, n);
    let (dst, src) = (b.add_ptr(tile, i), b.add_ptr(x, i));
    b.async_copy(dst, src, Some(m));
    b.async_commit();
    let second = b.add_c(i, 64);
    let (dst2, src2) = (b.add_ptr(tile, second), b.add_ptr(x, second));
    b.async_copy(dst2, src2, None);
    b.async_commit();
    // Before any wait: the fill.
    let early = b.load(dst);
    let o = b.add_ptr(out, i);
    b.store(o, early);
    // The first group landed, the second still pending.
    b.async_wait(1);
    let first = b.load(dst);
    let o = b.add_ptr(out, second);
    b.store(o, first);
    let pending = b.load(dst2);
    let at = b.add_c(i, 128);
    let o = b.add_ptr(out, at);
    b.store(o, pending);
    // Both landed: the second block as a [4, 16] tile.
    b.async_wait(0);
    let c64 = b.i32(64);
    let base = b.add_ptr(tile, c64);
    let t = b.load_tile(base, 4, 16, 16);
    let r = b.arange(0, 4);
    let r = b.mul_c(r, 16);
    let r = b.expand(r, 1, 16);
    let c = b.arange(0, 16);
    let c = b.expand(c, 0, 4);
    let idx = b.add(r, c);
    let idx = b.add_c(idx, 192);
    let o = b.add_ptr(out, idx);
    b.store(o, t);
    let k = b.finish().unwrap();
    let xs = values(128, 3);
    let mut xb = f32_bytes(&xs);
    let mut ob = vec![0u8; 4 * 256];
    let mut bufs = [&mut xb[..], &mut ob];
    run(&k, [2, 1, 1], &[ptr(0), ptr(1)], &mut bufs).unwrap();
    let o = bytes_f32(&ob);
    assert!(o[..64].iter().all(|v| v.is_nan()), "read before the wait");
    for j in 0..64 {
        let want = if j < 40 { xs[j] } else { 0.0 };
        assert_eq!(o[64 + j], want, "first group, element {j}");
        assert!(o[128 + j].is_nan(), "second group landed early at {j}");
        assert_eq!(o[192 + j], xs[64 + j], "tile element {j}");
    }
}
