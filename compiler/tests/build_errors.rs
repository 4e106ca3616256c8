//! Building and verifying kernels: type errors name the kernel, the op and the source line;
//! hand-made IR with broken SSA is caught by the verifier; the printer shows the IR.

use dusk_compiler::ir::{Kernel, Op};
use dusk_compiler::print::print_kernel;
use dusk_compiler::verify::verify;
use dusk_compiler::{CompileError, DType, KernelBuilder};

fn build_error(f: impl FnOnce(&mut KernelBuilder)) -> String {
    let mut b = KernelBuilder::new("bad_kernel");
    f(&mut b);
    match b.finish() {
        Err(e) => e.to_string(),
        Ok(_) => panic!("expected a build error"),
    }
}

#[test]
fn shape_mismatch_names_kernel_op_line_and_both_shapes() {
    let line = line!() + 4;
    let msg = build_error(|b| {
        let x = b.arange(0, 16);
        let y = b.arange(0, 32);
        b.add(x, y);
    });
    assert!(msg.contains("bad_kernel"), "{msg}");
    assert!(msg.contains(": add: "), "{msg}");
    assert!(msg.contains(&format!("build_errors.rs:{line}")), "{msg}");
    assert!(msg.contains("i32[16]") && msg.contains("i32[32]"), "{msg}");
}

/// The message is one line: the kernel, `file:line:column` of the builder call that made
/// the op, the op, and what is wrong; `Debug` prints the same line (so `?` in `main` and
/// `unwrap` read well).
#[test]
fn build_errors_read_as_one_line_with_file_line_and_column() {
    let mut b = KernelBuilder::new("max_sub_exp_COLS128");
    let x = b.param_ptr("x", DType::F32);
    let offs = b.arange(0, 128);
    let p = b.add_ptr(x, offs);
    let v = b.load(p);
    let (line, column) = (line!() + 1, 15);
    let _ = b.add(v, offs);
    let e = b.finish().unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "kernel max_sub_exp_COLS128, {}:{line}:{column}: add: operand types differ: \
             f32[128] and i32[128]",
            file!()
        )
    );
    assert_eq!(format!("{e:?}"), e.to_string());
    assert!(!e.to_string().contains('\n'));
}

/// Bools are spelled as kernels spell them (`bool`, never the IR's `i1`), and the messages
/// about them say what to write.
#[test]
fn bool_messages_speak_the_kernel_language() {
    let msg = build_error(|b| {
        let i = b.arange(0, 64);
        let z = b.i32(0);
        let m = b.gt(i, z);
        b.sum(m, 0);
    });
    assert!(
        msg.contains("cannot reduce bools (bool[64]); convert with `as i32` first"),
        "{msg}"
    );
    let msg = build_error(|b| {
        let i = b.arange(0, 64);
        let f = b.cast(i, DType::F32);
        b.select(i, f, f);
    });
    assert!(
        msg.contains("the condition of `where_` must be a bool block")
            && msg.contains("found i32[64]"),
        "{msg}"
    );
    let msg = build_error(|b| {
        let i = b.arange(0, 64);
        let z = b.i32(0);
        let m = b.gt(i, z);
        b.add(m, m);
    });
    assert!(
        msg.contains("`+` is not defined on bools (only `&`, `|` and `^` are), found bool[64]"),
        "{msg}"
    );
    let msg = build_error(|b| {
        let i = b.arange(0, 64);
        let z = b.i32(0);
        let m = b.gt(i, z);
        b.if_then(m, |_| {});
    });
    assert!(
        msg.contains("an `if` condition must be a scalar bool") && msg.contains("found bool[64]"),
        "{msg}"
    );
    let msg = build_error(|b| {
        let x = b.i32(3);
        b.sqrt(x);
    });
    assert!(
        msg.contains("`sqrt` needs floats, found i32; convert with `as f32` first"),
        "{msg}"
    );
    for text in [
        build_error(|b| {
            let i = b.arange(0, 64);
            let z = b.i32(0);
            let m = b.gt(i, z);
            b.sum(m, 0);
        }),
        build_error(|b| {
            let t = b.bool(true);
            b.exp2(t);
        }),
    ] {
        assert!(!text.contains("i1"), "{text}");
    }
}

#[test]
fn element_type_mismatch() {
    let msg = build_error(|b| {
        let x = b.i32(1);
        let y = b.f32(1.0);
        b.mul(x, y);
    });
    assert!(msg.contains("operand types differ: i32 and f32"), "{msg}");
}

#[test]
fn arange_must_be_a_power_of_two() {
    let msg = build_error(|b| {
        b.arange(0, 12);
    });
    assert!(msg.contains("power of two"), "{msg}");
}

#[test]
fn float_only_and_int_only_ops() {
    let msg = build_error(|b| {
        let x = b.i32(3);
        b.exp2(x);
    });
    assert!(msg.contains("needs floats"), "{msg}");
    let msg = build_error(|b| {
        let x = b.f32(3.0);
        b.shl(x, x);
    });
    assert!(msg.contains("needs integers"), "{msg}");
}

#[test]
fn loads_need_pointers_and_matching_masks() {
    let msg = build_error(|b| {
        let x = b.i32(3);
        b.load(x);
    });
    assert!(msg.contains("load needs a pointer"), "{msg}");
    let msg = build_error(|b| {
        let p = b.param_ptr("p", DType::F32);
        let offs = b.arange(0, 8);
        let ptrs = b.add_ptr(p, offs);
        let c = b.i32(3);
        let m16 = b.arange(0, 16);
        let mask = b.lt(m16, c);
        b.load_masked(ptrs, Some(mask), None);
    });
    assert!(
        msg.contains(": load: a mask must be a bool block of the pointer's shape (bool[8], e.g. `offs < n`), found bool[16]"),
        "{msg}"
    );
}

#[test]
fn loop_carried_types_must_match() {
    let msg = build_error(|b| {
        let lo = b.i32(0);
        let hi = b.i32(4);
        let st = b.i32(1);
        let init = b.f32(0.0);
        b.for_range(lo, hi, st, &[init], |_, i, _| vec![i]);
    });
    assert!(
        msg.contains(": for: ") && msg.contains("yields (i32) but (f32) expected"),
        "{msg}"
    );
}

#[test]
fn verifier_catches_use_before_definition() {
    let mut b = KernelBuilder::new("k");
    let x = b.i32(1);
    let y = b.add(x, x);
    let _ = y;
    let mut k: Kernel = b.finish().unwrap();
    // Swap the two ops: the add now reads a value defined after it.
    k.body.ops.swap(0, 1);
    match verify(&k) {
        Err(CompileError::Verify {
            kernel, op, msg, ..
        }) => {
            assert_eq!(kernel, "k");
            assert_eq!(op, "add");
            assert!(msg.contains("before it is defined"), "{msg}");
        }
        other => panic!("expected a verify error, got {other:?}"),
    }
}

#[test]
fn verifier_catches_wrong_result_types() {
    let mut b = KernelBuilder::new("k");
    let x = b.i32(1);
    b.add(x, x);
    let mut k = b.finish().unwrap();
    let Op { results, .. } = &k.body.ops[1];
    let r = results[0];
    k.types[r.0 as usize] = dusk_compiler::Type::scalar(DType::F32);
    let e = verify(&k).unwrap_err().to_string();
    assert!(e.contains("result types"), "{e}");
}

#[test]
fn printer_shows_ops_types_and_regions() {
    let mut b = KernelBuilder::new("show");
    let p = b.param_ptr("out", DType::F32);
    let lo = b.i32(0);
    let hi = b.i32(4);
    let st = b.i32(1);
    let z = b.f32(0.0);
    let acc = b.for_range(lo, hi, st, &[z], |b, i, c| {
        let f = b.cast(i, DType::F32);
        vec![b.add(c[0], f)]
    });
    b.store(p, acc[0]);
    let text = print_kernel(&b.finish().unwrap());
    assert!(text.starts_with("kernel @show("), "{text}");
    assert!(text.contains("for"), "{text}");
    assert!(text.contains("cast to f32"), "{text}");
    assert!(text.contains("store"), "{text}");
}

#[test]
fn dot_checks_types_and_sizes() {
    let msg = build_error(|b| {
        let x = b.f32(1.0);
        let a = b.splat(x, &[8, 64]);
        b.dot(a, a, None);
    });
    assert!(
        msg.contains("f16 or bf16") && msg.contains(": dot: "),
        "{msg}"
    );
    let msg = build_error(|b| {
        let x = b.constant(dusk_compiler::ir::Const::Float(1.0), DType::F16);
        let a = b.splat(x, &[8, 64]);
        let k = b.splat(x, &[8, 128]);
        b.dot(a, k, None);
    });
    assert!(msg.contains("summed dimension"), "{msg}");
    let msg = build_error(|b| {
        let x = b.constant(dusk_compiler::ir::Const::Float(1.0), DType::F16);
        let a = b.splat(x, &[32, 64]);
        b.dot(a, a, None);
    });
    assert!(msg.contains("M 8 or 16, N 8"), "{msg}");
    let msg = build_error(|b| {
        let x = b.constant(dusk_compiler::ir::Const::Float(1.0), DType::F16);
        let v = b.splat(x, &[8, 64]);
        let p = b.splat(x, &[8, 8]);
        let z = b.f32(0.0);
        let acc = b.splat(z, &[8, 64]);
        b.dot_ta(v, p, Some(acc));
    });
    assert!(msg.contains("accumulator must be f32[64x8]"), "{msg}");
}

/// The histogram and look-back ops check their operands: `bitcast` between f32 and i32
/// only, `atomic_add` into f32 or i32 elements of the pointer's shape, `load_fresh` from
/// i32 words of global memory.
#[test]
fn atomic_bitcast_and_load_fresh_operands() {
    let msg = build_error(|b| {
        let x = b.i32(3);
        b.bitcast(x, DType::I64);
    });
    assert!(
        msg.contains(": bitcast: ") && msg.contains("f32 to i32"),
        "{msg}"
    );
    let msg = build_error(|b| {
        let p = b.param_ptr("p", DType::F16);
        let v = b.f32(1.0);
        b.atomic_add(p, v, None);
    });
    assert!(
        msg.contains("atomic_add needs an f32 or i32 pointer"),
        "{msg}"
    );
    let msg = build_error(|b| {
        let p = b.param_ptr("p", DType::I32);
        let v = b.f32(1.0);
        b.atomic_add(p, v, None);
    });
    assert!(msg.contains("added value must be i32"), "{msg}");
    let msg = build_error(|b| {
        let s = b.shared_alloc(DType::I32, 64);
        b.load_fresh(s, None);
    });
    assert!(
        msg.contains("load_fresh needs an i32 pointer to global memory"),
        "{msg}"
    );
    let msg = build_error(|b| {
        let p = b.param_ptr("p", DType::I32);
        let i = b.arange(0, 16);
        let ps = b.add_ptr(p, i);
        let m = b.arange(0, 32);
        let five = b.i32(5);
        let m = b.lt(m, five);
        b.load_fresh(ps, Some(m));
    });
    assert!(
        msg.contains(": load_fresh: a mask must be a bool block of the pointer's shape"),
        "{msg}"
    );
    let msg = build_error(|b| {
        let s = b.shared_alloc(DType::I32, 64);
        let i = b.arange(0, 64);
        let ps = b.add_ptr(s, i);
        b.load_streaming(ps, None, None);
    });
    assert!(
        msg.contains("a streaming load reads global memory"),
        "{msg}"
    );
}

/// Asynchronous copies go from global to shared memory, between blocks of one shape whose
/// rows are whole 4-byte words; a wait leaves at most 7 groups pending; a shared tile reads
/// through a scalar shared pointer with rows at least as long as its columns. The printer
/// shows the copies' mask, the wait's count and the tile's geometry.
#[test]
fn async_copies_and_shared_tiles_check_their_operands() {
    let copy = |shared_dst: bool, global_src: bool, cols: i64, mask: bool| {
        build_error(|b| {
            let g = b.param_ptr("g", DType::F16);
            let s = b.shared_alloc(DType::F16, 256);
            let i = b.arange(0, cols);
            let dst = if shared_dst {
                b.add_ptr(s, i)
            } else {
                b.add_ptr(g, i)
            };
            let src = if global_src {
                b.add_ptr(g, i)
            } else {
                b.add_ptr(s, i)
            };
            let m = if mask {
                let j = b.arange(0, 2 * cols);
                let n = b.i32(3);
                Some(b.lt(j, n))
            } else {
                None
            };
            b.async_copy(dst, src, m);
        })
    };
    let msg = copy(false, true, 64, false);
    assert!(
        msg.contains("async_copy") && msg.contains("shared pointers"),
        "{msg}"
    );
    let msg = copy(true, false, 64, false);
    assert!(msg.contains("its source must be ptr<f16>[64]"), "{msg}");
    let msg = copy(true, true, 1, false);
    assert!(msg.contains("multiple of 4 bytes"), "{msg}");
    let msg = copy(true, true, 64, true);
    assert!(msg.contains("a mask must be a bool block"), "{msg}");
    let msg = build_error(|b| b.async_wait(8));
    assert!(msg.contains("async_wait takes 0 to 7"), "{msg}");
    let msg = build_error(|b| {
        let g = b.param_ptr("g", DType::F16);
        b.load_tile(g, 8, 128, 136);
    });
    assert!(msg.contains("load_tile reads shared memory"), "{msg}");
    let msg = build_error(|b| {
        let s = b.shared_alloc(DType::F16, 256);
        b.load_tile(s, 8, 32, 16);
    });
    assert!(msg.contains("row stride of at least the columns"), "{msg}");

    let mut b = KernelBuilder::new("staged");
    let g = b.param_ptr("g", DType::F16);
    let s = b.shared_alloc(DType::F16, 8 * 136);
    let i = b.arange(0, 64);
    let n = b.i32(40);
    let m = b.lt(i, n);
    let (dst, src) = (b.add_ptr(s, i), b.add_ptr(g, i));
    b.async_copy(dst, src, Some(m));
    b.async_commit();
    b.async_wait(1);
    let t = b.load_tile(s, 8, 128, 136);
    let zero = b.arange(0, 8);
    let z = b.mul_c(zero, 128);
    let z = b.expand(z, 1, 128);
    let c = b.arange(0, 128);
    let c = b.expand(c, 0, 8);
    let o = b.add(z, c);
    let out = b.add_ptr(g, o);
    b.store(out, t);
    let text = print_kernel(&b.finish().unwrap());
    for want in [
        "async_copy masked",
        "async_commit",
        "async_wait pending=1",
        "load_tile 8x128 stride=136",
    ] {
        assert!(text.contains(want), "no `{want}` in\n{text}");
    }
}

/// The code generator copies each thread's runs of 4, 8 or 16 contiguous bytes with one
/// `cp.async` each (reading 0 bytes where the mask is false), and refuses pointers whose
/// runs it cannot show to be that long (here every other element: 2-byte runs).
#[test]
fn async_copies_lower_to_cp_async_of_whole_runs() {
    use dusk_compiler::codegen::{compile, Target};
    let build = |spread: i64| {
        let mut b = KernelBuilder::new("copy_rows");
        let g = b.param_ptr("g", DType::F16);
        let s = b.shared_alloc(DType::F16, 256);
        let r = b.arange(0, 32);
        let n = b.i32(20);
        let live = b.lt(r, n);
        let live = b.expand(live, 1, 8);
        let rows = b.mul_c(r, 8);
        let rows = b.expand(rows, 1, 8);
        let c = b.arange(0, 8);
        let c = b.expand(c, 0, 32);
        let at = b.add(rows, c);
        let from = b.mul_c(at, spread);
        let (dst, src) = (b.add_ptr(s, at), b.add_ptr(g, from));
        b.async_copy(dst, src, Some(live));
        b.async_commit();
        b.async_wait(0);
        let v = b.load(dst);
        let out = b.add_ptr(g, at);
        b.store(out, v);
        b.finish().unwrap()
    };
    let ptx = compile(&build(1), &Target::sm80()).unwrap();
    assert!(ptx.contains("cp.async.cg.shared.global"), "{ptx}");
    assert!(ptx.contains("cp.async.commit_group"), "{ptx}");
    assert!(ptx.contains("cp.async.wait_group 0"), "{ptx}");
    let err = compile(&build(2), &Target::sm80()).unwrap_err().to_string();
    assert!(err.contains("runs of 4, 8 or 16 contiguous bytes"), "{err}");
}
