//! The `dusk` binary end to end (no GPU needed): help, a bundle identical to the committed
//! one, stage dumps, and errors as one line without a backtrace.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn dusk(args: &[&str], cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dusk"))
        .args(args)
        .env("DUSK_CACHE_DIR", cache)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("dusk runs")
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dusk-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn help_names_every_command() {
    let out = dusk(&["--help"], &temp("help"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for cmd in ["list", "compile", "inspect", "tune", "bench"] {
        assert!(text.contains(cmd), "{cmd} missing from --help");
    }
}

#[test]
fn compile_writes_the_committed_bundle_and_stages() {
    let cache = temp("cache");
    let out_dir = temp("bundle");
    let o = out_dir.to_str().unwrap();
    let out = dusk(
        &["compile", "--out", o, "--emit", "ir,fused-ir,llvm,ptx"],
        &cache,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels_gen/bundle");
    for f in std::fs::read_dir(&committed).unwrap() {
        let name = f.unwrap().file_name();
        assert_eq!(
            std::fs::read(out_dir.join(&name)).unwrap(),
            std::fs::read(committed.join(&name)).unwrap(),
            "{name:?}"
        );
    }
    let stage = out_dir.join("stages/quantize_k4_d128.fused.ir");
    assert!(std::fs::read_to_string(stage)
        .unwrap()
        .contains("kernel @quantize_k4"));
    assert!(out_dir
        .join("stages/spgemv_quant_mma_d128_g4_b4_t64_w2_o0.ll")
        .exists());
    // A second run reads every kernel from the disk cache.
    let again = dusk(&["compile", "--out", o], &cache);
    assert!(String::from_utf8_lossy(&again.stdout).contains("from the disk cache"));
    let _ = std::fs::remove_dir_all(&out_dir);
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn errors_are_one_line_without_a_backtrace() {
    for args in [
        &["compile", "no_such_kernel"][..],
        &["tune", "spgemv", "--shape", "batch=1,heads=4"][..],
        &["compile", "--target", "sm_75"][..],
    ] {
        let out = dusk(args, &temp("err"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            !err.contains("backtrace") && !err.contains("panicked"),
            "{err}"
        );
        assert!(err.starts_with("error"), "{args:?}: {err}");
    }
}
