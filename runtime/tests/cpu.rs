//! The runtime on the CPU backend: buffers, argument checking, and launches through the
//! interpreter. Needs no GPU; `Device::best()` must fall back here without panicking.

use dusk_compiler::{DType, Kernel, KernelBuilder};
use dusk_runtime::{
    median, rotation_sets, Arg, Buffer, Device, Element, RuntimeError, TimeConfig, Timing,
};
use half::{bf16, f16};
use std::sync::Arc;

fn roundtrip<T: Element>(dev: &Device, data: &[T]) {
    let b = dev.upload(data).unwrap();
    assert_eq!(b.len(), data.len());
    assert_eq!(b.dtype(), T::DTYPE);
    assert_eq!(b.size_bytes(), data.len() * T::DTYPE.size_bytes());
    assert_eq!(b.download().unwrap(), data);
    let z: Buffer<T> = dev.alloc(data.len()).unwrap();
    assert!(z.download().unwrap().iter().all(|v| *v == T::default()));
}

#[test]
fn upload_download_roundtrip_every_element_type() {
    let dev = Device::cpu();
    roundtrip(&dev, &[0u8, 1, 127, 255]);
    roundtrip(&dev, &[0i32, -1, i32::MIN, i32::MAX, 12345]);
    roundtrip(&dev, &[0i64, -1, i64::MIN, i64::MAX, 1 << 40]);
    roundtrip(&dev, &[0.0f32, -1.5, f32::MAX, f32::MIN_POSITIVE, 1e-40]);
    roundtrip(
        &dev,
        &[
            f16::from_f32(0.5),
            f16::from_f32(-65504.0),
            f16::MIN_POSITIVE_SUBNORMAL,
        ],
    );
    roundtrip(
        &dev,
        &[bf16::from_f32(3.0), bf16::from_f32(-1e30), bf16::ZERO],
    );
    roundtrip::<f32>(&dev, &[]);
}

#[test]
fn poison_fill_and_host_copy() {
    let dev = Device::cpu();
    let mut b = dev.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    dev.fill_bytes(&mut b, 0xFF).unwrap();
    assert!(b.download().unwrap().iter().all(|v| v.is_nan()));
    dev.fill_bytes(&mut b, 0).unwrap();
    assert_eq!(b.download().unwrap(), vec![0.0; 3]);
    let mut i = dev.alloc::<i32>(2).unwrap();
    dev.fill_bytes(&mut i, 0x01).unwrap();
    assert_eq!(i.download().unwrap(), vec![0x0101_0101; 2]);

    b.copy_from_host(&[4.0, 5.0, 6.0]).unwrap();
    assert_eq!(b.download().unwrap(), vec![4.0, 5.0, 6.0]);
    let e = b.copy_from_host(&[1.0]).unwrap_err();
    assert!(
        matches!(
            e,
            RuntimeError::BufferMismatch {
                op: "copy_from_host",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn device_to_device_copy() {
    let dev = Device::cpu();
    let src = dev.upload(&[7u8, 8, 9]).unwrap();
    let mut dst = dev.alloc::<u8>(3).unwrap();
    dst.copy_from(&src).unwrap();
    assert_eq!(dst.download().unwrap(), vec![7, 8, 9]);
    assert_eq!(src.download().unwrap(), vec![7, 8, 9]);

    let short = dev.alloc::<u8>(2).unwrap();
    let e = dst.copy_from(&short).unwrap_err();
    assert!(
        matches!(
            e,
            RuntimeError::BufferMismatch {
                op: "copy_from",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn best_falls_back_to_the_cpu_without_panicking() {
    match Device::gpu(0) {
        // Here (no GPU, no CUDA driver): an error, and `best` is the CPU.
        Err(e) => {
            assert!(matches!(e, RuntimeError::NoGpu { .. }), "{e}");
            let dev = Device::best();
            assert!(!dev.is_gpu());
            assert_eq!(dev.name(), "cpu (interpreter)");
            assert_eq!(dev.driver_version(), None);
            assert_eq!(dev.compute_capability(), None);
            assert_eq!(dev.num_sms(), None);
            assert!(dev.cuda_stream().is_none());
            dev.synchronize().unwrap();
            // Again: the failed probe must leave nothing behind.
            assert!(matches!(Device::gpu(3), Err(RuntimeError::NoGpu { .. })));
        }
        // On a GPU machine `best` picks it.
        Ok(_) => assert!(Device::best().is_gpu()),
    }
}

/// `y[i] = x[i] * a` for `i < n`, 128 elements per program.
fn scale_kernel() -> Arc<Kernel> {
    let mut b = KernelBuilder::new("scale");
    b.set_num_warps(1);
    let x = b.param_ptr("x", DType::F32);
    let y = b.param_ptr("y", DType::F32);
    let a = b.param_scalar("a", DType::F32);
    let n = b.param_scalar("n", DType::I32);
    let pid = b.program_id(0);
    let base = b.mul_c(pid, 128);
    let r = b.arange(0, 128);
    let offs = b.add(base, r);
    let mask = b.lt(offs, n);
    let xp = b.add_ptr(x, offs);
    let v = b.load_masked(xp, Some(mask), None);
    let w = b.mul(v, a);
    let yp = b.add_ptr(y, offs);
    b.store_masked(yp, w, Some(mask));
    Arc::new(b.finish().unwrap())
}

#[test]
fn launch_checks_arguments_before_running() {
    let dev = Device::cpu();
    let k = dev.load_kernel(scale_kernel(), None).unwrap();
    assert!(!k.is_gpu());
    assert_eq!(k.num_threads(), 32);
    let x = dev.upload(&[1.0f32; 4]).unwrap();
    let y = dev.alloc::<f32>(4).unwrap();
    let wrong = dev.alloc::<f16>(4).unwrap();

    let e = dev
        .launch(
            &k,
            [1, 1, 1],
            &[Arg::from(&x), Arg::from(&y), Arg::F32(2.0)],
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            RuntimeError::ArgCount {
                expected: 4,
                found: 3,
                ..
            }
        ),
        "{e}"
    );

    let e = dev
        .launch(
            &k,
            [1, 1, 1],
            &[Arg::from(&x), Arg::from(&wrong), Arg::F32(2.0), Arg::I32(4)],
        )
        .unwrap_err();
    match &e {
        RuntimeError::ArgMismatch {
            kernel,
            index,
            param,
            expected,
            found,
        } => {
            assert_eq!((kernel.as_str(), *index, param.as_str()), ("scale", 1, "y"));
            assert!(expected.contains("f32") && found.contains("f16"), "{e}");
        }
        _ => panic!("wrong error: {e}"),
    }
    // One line, and `Debug` prints it too (for `?` in `main` and `unwrap`).
    assert_eq!(
        e.to_string(),
        "kernel `scale`: argument 1 (`y`): expected a buffer of f32, found buffer<f16>[4]"
    );
    assert_eq!(format!("{e:?}"), e.to_string());

    let e = dev
        .launch(
            &k,
            [1, 1, 1],
            &[Arg::from(&x), Arg::from(&y), Arg::F32(2.0), Arg::I64(4)],
        )
        .unwrap_err();
    assert!(
        matches!(&e, RuntimeError::ArgMismatch { index: 3, param, .. } if param == "n"),
        "{e}"
    );

    let e = dev
        .launch(
            &k,
            [1, 1, 1],
            &[Arg::I32(0), Arg::from(&y), Arg::F32(2.0), Arg::I32(4)],
        )
        .unwrap_err();
    assert!(
        matches!(&e, RuntimeError::ArgMismatch { index: 0, .. }),
        "{e}"
    );

    let e = dev
        .launch(
            &k,
            [1, 1, 1],
            &[Arg::from(&x), Arg::from(&y), Arg::from(&y), Arg::I32(4)],
        )
        .unwrap_err();
    assert!(
        matches!(&e, RuntimeError::ArgMismatch { index: 2, param, .. } if param == "a"),
        "{e}"
    );

    let e = dev
        .launch(
            &k,
            [1, 70000, 1],
            &[Arg::from(&x), Arg::from(&y), Arg::F32(2.0), Arg::I32(4)],
        )
        .unwrap_err();
    assert!(matches!(e, RuntimeError::InvalidLaunch { .. }), "{e}");

    // A zero-size grid checks the arguments, then does nothing.
    dev.launch(
        &k,
        [0, 1, 1],
        &[Arg::from(&x), Arg::from(&y), Arg::F32(2.0), Arg::I32(4)],
    )
    .unwrap();
    assert_eq!(y.download().unwrap(), vec![0.0; 4]);
}

#[test]
fn gpu_kernels_need_ptx_and_cpu_ignores_it() {
    let dev = Device::cpu();
    // On the CPU the PTX is ignored; only the IR matters.
    let k = dev.load_kernel(scale_kernel(), Some("not ptx")).unwrap();
    assert_eq!(k.name(), "scale");
    assert_eq!(k.num_regs(), None);
}

#[test]
fn cpu_launch_runs_the_interpreter() {
    let dev = Device::cpu();
    let k = dev.load_kernel(scale_kernel(), None).unwrap();
    let n = 300;
    let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let x = dev.upload(&xs).unwrap();
    let mut y = dev.alloc::<f32>(n).unwrap();
    dev.fill_bytes(&mut y, 0xFF).unwrap();
    let grid = [(n as u32).div_ceil(128), 1, 1];
    dev.launch(
        &k,
        grid,
        &[
            Arg::from(&x),
            Arg::from(&y),
            Arg::F32(0.5),
            Arg::I32(n as i32),
        ],
    )
    .unwrap();
    let want: Vec<f32> = xs.iter().map(|v| v * 0.5).collect();
    assert_eq!(y.download().unwrap(), want);

    // The same buffer as input and output (in place) is passed to the interpreter once.
    dev.launch(
        &k,
        grid,
        &[
            Arg::from(&x),
            Arg::from(&x),
            Arg::F32(2.0),
            Arg::I32(n as i32),
        ],
    )
    .unwrap();
    let want: Vec<f32> = xs.iter().map(|v| v * 2.0).collect();
    assert_eq!(x.download().unwrap(), want);

    // An access past the end is an interpreter error, not UB or a panic.
    let small = dev.alloc::<f32>(10).unwrap();
    let e = dev
        .launch(
            &k,
            grid,
            &[
                Arg::from(&x),
                Arg::from(&small),
                Arg::F32(1.0),
                Arg::I32(n as i32),
            ],
        )
        .unwrap_err();
    assert!(matches!(e, RuntimeError::Interp(_)), "{e}");
}

#[test]
fn cpu_timing_and_median() {
    let dev = Device::cpu();
    let mut seen = vec![];
    let cfg = TimeConfig {
        cpu_rounds: 4,
        ..TimeConfig::default()
    };
    let t = dev
        .time_calls_with(&cfg, 3, |set| {
            seen.push(set);
            Ok::<(), String>(())
        })
        .unwrap();
    // One eager turn through the sets, then a turn a round.
    assert_eq!(seen, [0, 1, 2].repeat(5));
    assert_eq!((t.samples_us.len(), t.calls, t.timing), (4, 3, Timing::Cpu));
    assert!(t.samples_us.iter().all(|v| *v >= 0.0));
    assert_eq!(t.timing.to_string(), "cpu");
    let e = dev.time_calls(1, |_| Err("boom".to_string())).unwrap_err();
    assert!(
        matches!(e, RuntimeError::Timed(_)) && e.to_string().contains("boom"),
        "{e}"
    );

    assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    assert!(median(&[]).is_nan());
}

/// The rotation rule: together the sets exceed twice the L2, and no more sets than that.
#[test]
fn rotation_sets_exceed_twice_the_l2() {
    let l2 = 50 << 20;
    for bytes in [
        1usize,
        4096,
        16 << 20,
        33 << 20,
        50 << 20,
        100 << 20,
        101 << 20,
        1 << 30,
    ] {
        let n = rotation_sets(bytes, l2);
        assert!(n * bytes > 2 * l2, "{n} sets of {bytes} bytes");
        assert!(
            n == 1 || (n - 1) * bytes <= 2 * l2,
            "{n} sets of {bytes} bytes"
        );
    }
    assert_eq!(rotation_sets(0, l2), 2 * l2 + 1);
    assert_eq!(Device::cpu().rotation_sets(4096), 1);
    assert_eq!(Device::cpu().l2_bytes(), None);
}

#[test]
fn borrowed_host_memory_is_read_and_written_in_place() {
    let dev = Device::cpu();
    let k = dev.load_kernel(scale_kernel(), None).unwrap();
    let n = 300;
    let mut xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut ys = vec![f32::NAN; n];
    // SAFETY: both vectors outlive the buffers and are not touched while they are used.
    let (x, y) = unsafe {
        (
            dev.borrow_host(xs.as_mut_ptr(), n).unwrap(),
            dev.borrow_host(ys.as_mut_ptr(), n).unwrap(),
        )
    };
    assert!(x.untyped().is_borrowed() && !dev.alloc::<f32>(1).unwrap().untyped().is_borrowed());
    assert_eq!(x.untyped().address(), xs.as_ptr() as u64);
    let grid = [(n as u32).div_ceil(128), 1, 1];
    let args = [
        Arg::from(&x),
        Arg::from(&y),
        Arg::F32(3.0),
        Arg::I32(n as i32),
    ];
    dev.launch(&k, grid, &args).unwrap();
    drop((x, y));
    assert_eq!(ys, xs.iter().map(|v| v * 3.0).collect::<Vec<_>>());

    // Two views that overlap are refused before the interpreter runs, naming both.
    let (a, b) = unsafe {
        (
            dev.borrow_host(xs.as_mut_ptr(), 200).unwrap(),
            dev.borrow_host(xs.as_mut_ptr().add(100), 200).unwrap(),
        )
    };
    let e = dev
        .launch(
            &k,
            grid,
            &[Arg::from(&a), Arg::from(&b), Arg::F32(1.0), Arg::I32(200)],
        )
        .unwrap_err();
    assert!(
        matches!(e, RuntimeError::InvalidLaunch { .. }) && e.to_string().contains("`x` and `y`"),
        "{e}"
    );
    drop((a, b));

    // Two views of exactly the same memory are one buffer to the interpreter (in place).
    let (a, b) = unsafe {
        (
            dev.borrow_host(xs.as_mut_ptr(), 200).unwrap(),
            dev.borrow_host(xs.as_mut_ptr(), 200).unwrap(),
        )
    };
    dev.launch(
        &k,
        grid,
        &[Arg::from(&a), Arg::from(&b), Arg::F32(0.5), Arg::I32(200)],
    )
    .unwrap();
    drop((a, b));
    assert_eq!(xs[199], 199.0 * 0.5);
    assert_eq!(xs[200], 200.0);

    // Copies, poisoning and downloads work on borrowed memory too.
    let mut z = unsafe { dev.borrow_host(ys.as_mut_ptr(), n).unwrap() };
    dev.fill_bytes(&mut z, 0).unwrap();
    z.copy_from_host(&vec![2.0; n]).unwrap();
    assert_eq!(z.download().unwrap(), vec![2.0; n]);
    drop(z);
    assert_eq!(ys, vec![2.0; n]);

    // Bad addresses are errors; a GPU-only borrow fails on the CPU.
    let e = unsafe { dev.borrow_host::<f32>(std::ptr::null_mut(), 4) }.unwrap_err();
    assert!(e.to_string().contains("null"), "{e}");
    let misaligned = unsafe { xs.as_mut_ptr().cast::<u8>().add(1).cast::<f32>() };
    assert!(unsafe { dev.borrow_host(misaligned, 4) }.is_err());
    assert!(unsafe { dev.borrow_device::<f32>(0x1000, 4) }.is_err());
    // An empty borrow needs no address.
    assert!(unsafe { dev.borrow_host::<f32>(std::ptr::null_mut(), 0) }.is_ok());
}

#[test]
fn with_stream_on_the_cpu_just_runs() {
    let dev = Device::cpu();
    assert!(dev.launch_stream().is_none());
    // SAFETY: on the CPU the stream is never used.
    let r = unsafe { dev.with_stream(std::ptr::null_mut(), || 7) };
    assert_eq!(r, 7);
}
