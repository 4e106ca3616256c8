//! The runtime on a real GPU (feature `gpu`; run on the device machine). The kernels are
//! hand-written PTX, so these tests need no LLVM: they check loading, argument passing,
//! copies, poisoning, timing and the errors, not the code generator.

use dusk_compiler::{DType, Kernel, KernelBuilder};
use dusk_runtime::{Arg, Device, Element, RuntimeError, Timing};
use half::{bf16, f16};
use std::sync::Arc;

/// `y[i] = x[i] * a` for `i < n`: 128 elements per program, 32 threads.
const SCALE_PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.visible .entry scale(
    .param .u64 scale_param_0,
    .param .u64 scale_param_1,
    .param .f32 scale_param_2,
    .param .u32 scale_param_3
)
.maxntid 32, 1, 1
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<8>;

    ld.param.u64 %rd1, [scale_param_0];
    ld.param.u64 %rd2, [scale_param_1];
    ld.param.f32 %f1, [scale_param_2];
    ld.param.u32 %r1, [scale_param_3];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %tid.x;
    shl.b32 %r2, %r2, 7;
    add.s32 %r4, %r2, %r3;
    mov.u32 %r5, 0;
LOOP:
    setp.ge.s32 %p1, %r4, %r1;
    @%p1 bra SKIP;
    mul.wide.s32 %rd3, %r4, 4;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.f32 %f2, [%rd4];
    mul.rn.f32 %f3, %f2, %f1;
    add.s64 %rd5, %rd2, %rd3;
    st.global.f32 [%rd5], %f3;
SKIP:
    add.s32 %r4, %r4, 32;
    add.s32 %r5, %r5, 1;
    setp.lt.u32 %p1, %r5, 4;
    @%p1 bra LOOP;
    ret;
}
"#;

/// Writes each scalar parameter, widened to 64 bits, to `out[0..5]`.
const PACK_PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.visible .entry pack(
    .param .u64 pack_param_0,
    .param .u32 pack_param_1,
    .param .u64 pack_param_2,
    .param .f32 pack_param_3,
    .param .u8 pack_param_4,
    .param .u8 pack_param_5
)
{
    .reg .b16 %h<4>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<10>;

    ld.param.u64 %rd1, [pack_param_0];
    cvta.to.global.u64 %rd1, %rd1;
    ld.param.s32 %r1, [pack_param_1];
    cvt.s64.s32 %rd2, %r1;
    st.global.u64 [%rd1], %rd2;
    ld.param.u64 %rd3, [pack_param_2];
    st.global.u64 [%rd1+8], %rd3;
    ld.param.b32 %r2, [pack_param_3];
    cvt.u64.u32 %rd4, %r2;
    st.global.u64 [%rd1+16], %rd4;
    ld.param.u8 %h1, [pack_param_4];
    cvt.u64.u16 %rd5, %h1;
    st.global.u64 [%rd1+24], %rd5;
    ld.param.u8 %h2, [pack_param_5];
    cvt.u64.u16 %rd6, %h2;
    st.global.u64 [%rd1+32], %rd6;
    ret;
}
"#;

fn gpu() -> Device {
    Device::gpu(0).expect("these tests need a GPU")
}

fn scale_ir() -> Arc<Kernel> {
    let mut b = KernelBuilder::new("scale");
    b.set_num_warps(1);
    b.param_ptr("x", DType::F32);
    b.param_ptr("y", DType::F32);
    b.param_scalar("a", DType::F32);
    b.param_scalar("n", DType::I32);
    Arc::new(b.finish().unwrap())
}

#[test]
fn properties() {
    let dev = gpu();
    println!("{dev:?}");
    assert!(dev.is_gpu() && Device::best().is_gpu());
    assert!(!dev.name().is_empty());
    assert!(dev.compute_capability().unwrap() >= (8, 0));
    assert!(dev.num_sms().unwrap() > 0);
    assert!(dev.driver_version().unwrap() >= (12, 0));
    assert_eq!(dev.ordinal(), Some(0));
    assert!(dev.cuda_stream().is_some());
    assert!(matches!(Device::gpu(1000), Err(RuntimeError::NoGpu { .. })));
    dev.synchronize().unwrap();
}

fn roundtrip<T: Element>(dev: &Device, data: &[T]) {
    let b = dev.upload(data).unwrap();
    assert!(b.is_gpu());
    assert_eq!(b.download().unwrap(), data);
    let z = dev.alloc::<T>(data.len()).unwrap();
    assert!(z.download().unwrap().iter().all(|v| *v == T::default()));
}

#[test]
fn buffers() {
    let dev = gpu();
    roundtrip(&dev, &[0u8, 1, 255]);
    roundtrip(&dev, &[i32::MIN, -1, 7]);
    roundtrip(&dev, &[i64::MIN, 1 << 40]);
    roundtrip(&dev, &[f16::from_f32(0.5), f16::MAX]);
    roundtrip(&dev, &[bf16::from_f32(-3.0), bf16::MIN_POSITIVE]);
    roundtrip(&dev, &[1.5f32, f32::MIN_POSITIVE]);
    roundtrip::<f32>(&dev, &[]);
    let big: Vec<i32> = (0..(1 << 22)).collect();
    roundtrip(&dev, &big);

    let mut b = dev.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    dev.fill_bytes(&mut b, 0xFF).unwrap();
    assert!(b.download().unwrap().iter().all(|v| v.is_nan()));
    b.copy_from_host(&[4.0, 5.0, 6.0]).unwrap();
    let mut c = dev.alloc::<f32>(3).unwrap();
    c.copy_from(&b).unwrap();
    assert_eq!(c.download().unwrap(), vec![4.0, 5.0, 6.0]);
    assert!(matches!(
        c.copy_from(&dev.alloc::<f32>(2).unwrap()),
        Err(RuntimeError::BufferMismatch { .. })
    ));

    // Buffers of another backend, or of another device handle, are refused.
    let cpu = Device::cpu().upload(&[1.0f32, 2.0, 3.0]).unwrap();
    assert!(matches!(
        c.copy_from(&cpu),
        Err(RuntimeError::WrongDevice { .. })
    ));
    let other = gpu().upload(&[1.0f32, 2.0, 3.0]).unwrap();
    assert!(matches!(
        c.copy_from(&other),
        Err(RuntimeError::WrongDevice { .. })
    ));
    let mut cpu_mut = Device::cpu().alloc::<f32>(3).unwrap();
    assert!(matches!(
        dev.fill_bytes(&mut cpu_mut, 0),
        Err(RuntimeError::WrongDevice { .. })
    ));
}

#[test]
fn load_errors() {
    let dev = gpu();
    assert!(matches!(
        dev.load_kernel(scale_ir(), None),
        Err(RuntimeError::MissingPtx { .. })
    ));
    let e = dev
        .load_kernel(
            scale_ir(),
            Some(".version 8.0\n.target sm_80\n.address_size 64\nthis is not ptx"),
        )
        .unwrap_err();
    println!("{e}");
    assert!(
        matches!(&e, RuntimeError::PtxLoad { log, .. } if !log.is_empty()),
        "{e}"
    );
    let e = dev.load_kernel(scale_ir(), Some(PACK_PTX)).unwrap_err();
    println!("{e}");
    assert!(
        matches!(&e, RuntimeError::KernelNotFound { entries, .. } if entries == &["pack"]),
        "{e}"
    );
}

#[test]
fn launch_scale() {
    let dev = gpu();
    let k = dev.load_kernel(scale_ir(), Some(SCALE_PTX)).unwrap();
    println!("{k:?}");
    assert!(k.num_regs().unwrap() > 0);
    let n = 1000usize;
    let xs: Vec<f32> = (0..n).map(|i| i as f32 - 100.0).collect();
    let x = dev.upload(&xs).unwrap();
    let mut y = dev.alloc::<f32>(n + 5).unwrap();
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
    let got = y.download().unwrap();
    for i in 0..n {
        assert_eq!(got[i], xs[i] * 0.5, "element {i}");
    }
    assert!(got[n..].iter().all(|v| v.is_nan()), "wrote past n");

    // In place.
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
    assert_eq!(
        x.download().unwrap(),
        xs.iter().map(|v| v * 2.0).collect::<Vec<_>>()
    );

    // Checks before launching.
    let e = dev
        .launch(&k, grid, &[Arg::from(&x), Arg::from(&y), Arg::F32(2.0)])
        .unwrap_err();
    assert!(matches!(e, RuntimeError::ArgCount { .. }), "{e}");
    let cpu = Device::cpu().alloc::<f32>(n).unwrap();
    let e = dev
        .launch(
            &k,
            grid,
            &[
                Arg::from(&x),
                Arg::from(&cpu),
                Arg::F32(2.0),
                Arg::I32(n as i32),
            ],
        )
        .unwrap_err();
    assert!(matches!(e, RuntimeError::WrongDevice { .. }), "{e}");
    let e = dev
        .launch(
            &k,
            [1, 1, 70000],
            &[
                Arg::from(&x),
                Arg::from(&y),
                Arg::F32(2.0),
                Arg::I32(n as i32),
            ],
        )
        .unwrap_err();
    assert!(matches!(e, RuntimeError::InvalidLaunch { .. }), "{e}");
    // A kernel loaded by another device handle, or on the CPU, is refused.
    let other = gpu();
    let e = other
        .launch(
            &k,
            grid,
            &[
                Arg::from(&x),
                Arg::from(&y),
                Arg::F32(2.0),
                Arg::I32(n as i32),
            ],
        )
        .unwrap_err();
    assert!(matches!(e, RuntimeError::WrongDevice { .. }), "{e}");
    let cpu_k = Device::cpu().load_kernel(scale_ir(), None).unwrap();
    let e = dev
        .launch(
            &cpu_k,
            grid,
            &[
                Arg::from(&x),
                Arg::from(&y),
                Arg::F32(2.0),
                Arg::I32(n as i32),
            ],
        )
        .unwrap_err();
    assert!(matches!(e, RuntimeError::WrongDevice { .. }), "{e}");
    dev.synchronize().unwrap();
}

#[test]
fn scalar_arguments_reach_the_kernel() {
    let dev = gpu();
    let mut b = KernelBuilder::new("pack");
    b.set_num_warps(1);
    b.param_ptr("out", DType::I64);
    b.param_scalar("a", DType::I32);
    b.param_scalar("b", DType::I64);
    b.param_scalar("c", DType::F32);
    b.param_scalar("d", DType::U8);
    b.param_scalar("e", DType::Bool);
    let k = dev
        .load_kernel(Arc::new(b.finish().unwrap()), Some(PACK_PTX))
        .unwrap();
    let out = dev.alloc::<i64>(5).unwrap();
    let args = [
        Arg::from(&out),
        Arg::I32(-5),
        Arg::I64(-(1 << 40)),
        Arg::F32(1.5),
        Arg::U8(200),
        Arg::Bool(true),
    ];
    dev.launch(&k, [1, 1, 1], &args).unwrap();
    assert_eq!(
        out.download().unwrap(),
        vec![-5, -(1 << 40), 1.5f32.to_bits() as i64, 200, 1]
    );
}

#[test]
fn timing_and_copy_bandwidth() {
    let dev = gpu();
    let l2 = dev.l2_bytes().unwrap();
    assert!(l2 >= 1 << 20, "L2 of {l2} bytes");
    let n = 256usize << 20;
    let src = dev.upload(&vec![0x5Au8; n]).unwrap();
    let mut dst = dev.alloc::<u8>(n).unwrap();
    let t = dev.time_calls(1, |_| dst.copy_from(&src)).unwrap();
    assert_eq!((t.timing, t.samples_us.len()), (Timing::Graph, 15));
    assert!(t.samples_us.iter().all(|v| *v > 0.0));
    let gbps = 2.0 * n as f64 / (t.median_us() * 1e-6) / 1e9;
    println!(
        "device copy of {} MiB: median {:.1} us, {gbps:.0} GB/s (read + write)",
        n >> 20,
        t.median_us()
    );
    assert!(gbps > 100.0, "{gbps} GB/s is not a device copy");
    assert_eq!(dst.download().unwrap()[n - 1], 0x5A);

    // A call a graph cannot hold (it waits on the host) is queued between events instead.
    let small = dev.upload(&[1u8; 64]).unwrap();
    let t = dev.time_calls(2, |_| small.download().map(drop)).unwrap();
    assert_eq!(t.timing, Timing::Queued);
    assert!(t.graph_error.is_some());
    assert_eq!(t.calls, 20);

    let e = dev.time_calls(1, |_| Err("stop")).unwrap_err();
    assert!(matches!(e, RuntimeError::Timed(_)), "{e}");
}

/// The committed stock bundle (or `$DUSK_BUNDLE`), loaded with no LLVM and launched by
/// name: `quantize_k4_d128` on a cache of 8 pages of 16 tokens and 8 KV heads whose row `r`
/// (the engine's layout, `(page * 16 + slot) * 8 + head`) holds `(r % 64) / 4 + d / 8`
/// (exact in f16: min `(r % 64) / 4`, range 15.875), found at row `(page * 8 + head) * 16 +
/// slot` of the head-major copy.
#[test]
fn stock_bundle_launches_by_name() {
    let dir = std::env::var("DUSK_BUNDLE")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels_gen/bundle").into());
    let bundle = dusk_runtime::Bundle::open(&dir).unwrap();
    let dev = gpu();
    let loaded = bundle.load(&dev).unwrap();
    let (pages, page_size, heads) = (8usize, 16usize, 8usize);
    let rows = pages * page_size * heads;
    let k: Vec<f16> = (0..rows * 128)
        .map(|i| f16::from_f32((i / 128 % 64) as f32 * 0.25 + (i % 128) as f32 / 8.0))
        .collect();
    let k = dev.upload(&k).unwrap();
    let mut packed = dev.alloc::<u8>(rows * 64).unwrap();
    let mut scale = dev.alloc::<f16>(rows).unwrap();
    let mut zero = dev.alloc::<f16>(rows).unwrap();
    dev.fill_bytes(&mut packed, 0xFF).unwrap();
    dev.fill_bytes(&mut scale, 0xFF).unwrap();
    dev.fill_bytes(&mut zero, 0xFF).unwrap();
    let args = [
        Arg::from(&k),
        Arg::from(&packed),
        Arg::from(&scale),
        Arg::from(&zero),
        Arg::I32(rows as i32),
        Arg::I32(heads as i32),
        Arg::I32(page_size as i32),
    ];
    loaded.launch("quantize_k4_d128", &args, &[]).unwrap();
    let (packed, scale, zero) = (
        packed.download().unwrap(),
        scale.download().unwrap(),
        zero.download().unwrap(),
    );
    for r in 0..rows {
        let (slot, head, page) = (r % page_size, r / page_size % heads, r / page_size / heads);
        let src = (page * page_size + slot) * heads + head;
        assert_eq!(zero[r], f16::from_f32((src % 64) as f32 * 0.25), "row {r}");
        assert_eq!(scale[r], f16::from_f32(15.875 / 15.0), "row {r}");
        // Code of element d: round((d / 8) / scale); the first is 0, the last 15.
        assert_eq!(packed[r * 64] & 15, 0);
        assert_eq!(packed[r * 64 + 63] >> 4, 15);
    }
    // A wrong argument is refused before launching.
    let bad = [
        args[1], args[0], args[2], args[3], args[4], args[5], args[6],
    ];
    assert!(matches!(
        loaded.launch("quantize_k4_d128", &bad, &[]),
        Err(RuntimeError::ArgMismatch { index: 0, .. })
    ));
    println!("stock bundle: quantize_k4_d128 launched by name, {rows} rows checked");
}
