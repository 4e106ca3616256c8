//! The `dusk` binary end to end (no GPU needed): help, a bundle identical to the committed
//! one, stage dumps, errors as one line without a backtrace, and the exit status and message
//! of each failure: no GPU for `tune` and `bench`, `--interpreter` (a tiny shape runs and
//! writes no tuning cache, a large one is refused), shapes no config can run, a file given
//! as `--out`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `dusk args` with no GPU visible (even on a machine with one), its caches and home in
/// `home`: the tuning cache would go to `home/.cache/dusk/tuning.json` or
/// `home/xdg/dusk/tuning.json`.
fn dusk_no_gpu(args: &[&str], home: &Path) -> Output {
    std::fs::create_dir_all(home).unwrap();
    Command::new(env!("CARGO_BIN_EXE_dusk"))
        .args(args)
        .current_dir(home)
        .env_remove("DUSK_CACHE_DIR")
        .env("HOME", home)
        .env("XDG_CACHE_HOME", home.join("xdg"))
        .env("CUDA_VISIBLE_DEVICES", "")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("dusk runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every file named `tuning.json` under `dir`.
fn tuning_caches(dir: &Path) -> Vec<PathBuf> {
    let mut found = vec![];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            found.extend(tuning_caches(&p));
        } else if p.file_name().is_some_and(|n| n == "tuning.json") {
            found.push(p);
        }
    }
    found
}

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
        .join("stages/spgemv_quant_mma_d128_g4_b4_t64_w4_o0_x16_l2.ll")
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

#[test]
fn tune_and_bench_refuse_without_a_gpu_saying_how_to_go_on() {
    let home = temp("nogpu");
    for (args, cmd) in [
        (
            &[
                "tune",
                "spgemv",
                "--shape",
                "batch=32,heads=32/8,context=32768",
            ][..],
            "tune",
        ),
        (
            &["tune", "search", "--shape", "rows=2048,len=8192"][..],
            "tune",
        ),
        (
            &[
                "bench",
                "spgemv",
                "--shape",
                "batch=32,heads=32/8,context=32768",
            ][..],
            "bench",
        ),
    ] {
        let out = dusk_no_gpu(args, &home);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.starts_with("error: no CUDA GPU was found ("), "{err}");
        assert!(
            err.contains(&format!(
                "; `dusk {cmd}` times kernels on a GPU, so run it on a machine with one, or add \
                 --interpreter to run small shapes on the CPU interpreter"
            )),
            "{err}"
        );
        assert!(stdout(&out).is_empty(), "nothing ran: {}", stdout(&out));
    }
    assert_eq!(tuning_caches(&home), Vec::<PathBuf>::new());
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn the_interpreter_tunes_a_tiny_shape_and_writes_no_tuning_cache() {
    let home = temp("interp");
    let results = home.join("tuned.json");
    let out = dusk_no_gpu(
        &[
            "tune",
            "spgemv",
            "--interpreter",
            "--shape",
            "batch=1,heads=4/1,context=64",
            "--results",
            results.to_str().unwrap(),
        ],
        &home,
    );
    let (text, err) = (stdout(&out), stderr(&out));
    assert!(out.status.success(), "{err}");
    assert!(
        text.starts_with(
            "CPU interpreter (--interpreter): these timings are the interpreter's, not a \
             GPU's; nothing is written to the tuning cache\n"
        ),
        "{text}"
    );
    assert!(text.contains("<- best"), "{text}");
    // Progress, one line a config (stderr is not a terminal here).
    assert!(err.contains("  13/13 configs, "), "{err}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    assert_eq!(json["backend"], "interpreter");
    assert_eq!(json["device"], "cpu (interpreter)");
    assert!(json["note"].as_str().unwrap().contains("interpreter"));
    assert_eq!(json["cases"].as_array().unwrap().len(), 1);
    assert_eq!(tuning_caches(&home), Vec::<PathBuf>::new());

    // bench: the default config, its rate in a unit that fits (never `0 GB/s`).
    let out = dusk_no_gpu(
        &[
            "bench",
            "spgemv",
            "--interpreter",
            "--shape",
            "batch=1,heads=4/1,context=64",
        ],
        &home,
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(text.contains("(default config)"), "{text}");
    assert!(!text.contains(" 0 GB/s") && text.contains("B/s"), "{text}");
    assert_eq!(tuning_caches(&home), Vec::<PathBuf>::new());
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn the_interpreter_refuses_a_large_shape_saying_the_limit() {
    let home = temp("interp-big");
    for (args, limit) in [
        (
            &[
                "tune",
                "spgemv",
                "--interpreter",
                "--shape",
                "batch=32,heads=32/8,context=32768",
            ][..],
            "batch x query heads x candidates = 33554432, the interpreter runs at most 65536",
        ),
        (
            &[
                "tune",
                "search",
                "--interpreter",
                "--shape",
                "rows=2048,len=8192",
            ][..],
            "rows x len = 16777216, the interpreter runs at most 16384",
        ),
        (
            &[
                "bench",
                "attention",
                "--interpreter",
                "--shape",
                "batch=8,heads=32/8,context=32768",
            ][..],
            "batch x query heads x context = 8388608, the interpreter runs at most 8192",
        ),
    ] {
        let out = dusk_no_gpu(args, &home);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with(&format!(
                "error: --shape {}: too large for --interpreter (",
                args[4]
            )),
            "{err}"
        );
        assert!(err.contains(limit), "{err}");
        assert!(
            err.trim_end().ends_with("time shapes this large on a GPU"),
            "{err}"
        );
    }
    // The interpreter never takes a tuning cache.
    let out = dusk_no_gpu(
        &[
            "tune",
            "spgemv",
            "--interpreter",
            "--cache",
            "t.json",
            "--shape",
            "batch=1,heads=4/1,context=64",
        ],
        &home,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("'--interpreter' cannot be used with '--cache"));
    assert_eq!(tuning_caches(&home), Vec::<PathBuf>::new());
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn a_shape_no_config_can_run_is_refused_up_front_naming_the_field() {
    let home = temp("group");
    // GQA 32/7 made every config fail, and the tune exit 0; now it is an argument error,
    // before any GPU is looked for (so the same on any machine).
    for (args, field) in [
        (
            &[
                "tune",
                "spgemv",
                "--shape",
                "batch=32,heads=32/7,context=32768",
            ][..],
            "heads=32/7: expected Q/KV with Q a multiple of KV and 1, 2, 4, 8 or 16 query heads \
             a KV head (e.g. heads=32/8 or heads=32/32), and 32 is not a multiple of 7",
        ),
        (
            &[
                "bench",
                "attention",
                "--shape",
                "batch=8,heads=64/2,context=4096",
            ][..],
            "heads=64/2: expected Q/KV",
        ),
        (
            &[
                "tune",
                "attention",
                "--interpreter",
                "--shape",
                "batch=1,heads=8/2,context=64,head_dim=32",
            ][..],
            "head_dim=32: expected 64, 128 or 256",
        ),
    ] {
        let out = dusk_no_gpu(args, &home);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        let shape = args.iter().position(|a| *a == "--shape").unwrap() + 1;
        assert!(
            err.starts_with(&format!("error: --shape {}: {field}", args[shape])),
            "{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn a_file_given_as_out_is_one_error_naming_the_argument() {
    let dir = temp("out-file");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("passwd");
    std::fs::write(&file, "root:x:0:0\n").unwrap();
    let out = dusk(
        &["compile", "--out", file.to_str().unwrap()],
        &dir.join("cache"),
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!(
            "error: --out {}: exists and is not a directory\n",
            file.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "root:x:0:0\n");
    // Under a file: the OS's reason, said once.
    let under = file.join("bundle");
    let out = dusk(
        &["compile", "--out", under.to_str().unwrap()],
        &dir.join("cache"),
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "error: --out {}: cannot create the directory: ",
            under.display()
        )),
        "{err}"
    );
    // The other file arguments: named, once.
    for (args, want) in [
        (
            vec![
                "compile".to_string(),
                "--tuning".into(),
                dir.join("none.json").display().to_string(),
            ],
            format!(
                "error: --tuning {}: no such file",
                dir.join("none.json").display()
            ),
        ),
        (
            vec![
                "compile".to_string(),
                "--tuning".into(),
                file.display().to_string(),
            ],
            format!("error: --tuning {}: not a tuning cache: ", file.display()),
        ),
        (
            vec![
                "inspect".to_string(),
                "--ptxas".into(),
                dir.join("no-ptxas").display().to_string(),
            ],
            format!(
                "error: --ptxas {}: no such file",
                dir.join("no-ptxas").display()
            ),
        ),
        (
            vec![
                "tune".to_string(),
                "spgemv".into(),
                "--interpreter".into(),
                "--shape".into(),
                "batch=1,heads=4/1,context=64".into(),
                "--results".into(),
                dir.display().to_string(),
            ],
            format!(
                "error: --results {}: is a directory, expected a file",
                dir.display()
            ),
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = dusk(&args, &dir.join("cache"));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with(&want), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
