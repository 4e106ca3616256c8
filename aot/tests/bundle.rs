//! The committed stock bundle (`kernels_gen/bundle/`) must be what the current sources
//! compile to: regenerate it and compare every file. When it is stale, regenerate it with
//!
//!     cargo dusk compile --out kernels_gen/bundle
//!
//! (or `DUSK_BLESS=1 cargo test -p dusk-aot --test bundle`).

use dusk_aot::{bundle, stock};
use dusk_compiler::codegen::Target;
use dusk_runtime::{Arg, Bundle, Device, RuntimeError};
use std::path::{Path, PathBuf};

fn committed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels_gen/bundle")
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn committed_stock_bundle_is_fresh() {
    let kernels = stock::kernels().unwrap();
    if std::env::var_os("DUSK_BLESS").is_some() {
        let _ = std::fs::remove_dir_all(committed());
        bundle::write(&committed(), &Target::sm90a(), &kernels, None).unwrap();
    }
    let fresh = std::env::temp_dir().join(format!("dusk-stock-bundle-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&fresh);
    bundle::write(&fresh, &Target::sm90a(), &kernels, None).unwrap();
    assert_eq!(
        files(&committed()),
        files(&fresh),
        "kernels_gen/bundle/ has other files than a fresh bundle; regenerate it (see this test's docs)"
    );
    for f in files(&fresh) {
        let want = std::fs::read_to_string(fresh.join(&f)).unwrap();
        let have = std::fs::read_to_string(committed().join(&f)).unwrap();
        assert!(
            want == have,
            "kernels_gen/bundle/{f} is stale: the sources compile to something else; \
             regenerate it with `cargo dusk compile --out kernels_gen/bundle`"
        );
    }
    let _ = std::fs::remove_dir_all(&fresh);
}

#[test]
fn runtime_reads_the_committed_bundle_and_checks_arguments() {
    let b = Bundle::open(committed()).unwrap();
    assert_eq!(b.manifest().target.arch, "sm_90a");
    let names: Vec<&str> = b
        .manifest()
        .kernels
        .iter()
        .map(|k| k.name.as_str())
        .collect();
    for k in stock::kernels().unwrap() {
        assert!(names.contains(&k.name.as_str()), "{} missing", k.name);
    }
    let dev = Device::cpu();
    let (k, packed) = (
        dev.alloc::<half::f16>(1024).unwrap(),
        dev.alloc::<u8>(512).unwrap(),
    );
    let (s, z) = (
        dev.alloc::<half::f16>(8).unwrap(),
        dev.alloc::<half::f16>(8).unwrap(),
    );
    let args = [
        Arg::from(&k),
        Arg::from(&packed),
        Arg::from(&s),
        Arg::from(&z),
        Arg::I32(8),
        Arg::I32(1),
        Arg::I32(16),
    ];
    b.check_args("quantize_k4_d128", &args).unwrap();
    assert_eq!(b.grid("quantize_k4_d128", &args, &[]).unwrap(), [1, 1, 1]);
    // Swapped buffers and a missing argument are refused, naming the parameter.
    let swapped = [
        args[1], args[0], args[2], args[3], args[4], args[5], args[6],
    ];
    let e = b.check_args("quantize_k4_d128", &swapped).unwrap_err();
    assert!(
        matches!(e, RuntimeError::ArgMismatch { index: 0, .. }),
        "{e}"
    );
    assert!(matches!(
        b.check_args("quantize_k4_d128", &args[..4]),
        Err(RuntimeError::ArgCount {
            expected: 7,
            found: 4,
            ..
        })
    ));
    // SpGEMV's grid: rows x ceil(longest row / 64).
    let k = b.kernel("spgemv_quant_dp2a_d128_g1_b4_t64_w2_o14").unwrap();
    assert_eq!(k.launch.inputs, ["rows", "max_row_len"]);
    // A bundle holds PTX only: loading it on the CPU is a typed error, not a panic.
    assert!(matches!(b.load(&dev), Err(RuntimeError::Bundle { .. })));
}

#[test]
fn header_compiles_as_c_and_cxx() {
    let header = committed().join("dusk.h");
    for (compiler, lang) in [("gcc", "c"), ("g++", "c++")] {
        let Ok(out) = std::process::Command::new(compiler)
            .args(["-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-x", lang])
            .arg(&header)
            .output()
        else {
            eprintln!("{compiler} not found: skipping");
            continue;
        };
        assert!(
            out.status.success(),
            "{compiler}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn manifest_carries_tuning_results_of_its_kernels() {
    use dusk_aot::tune::{Status, Trial, TuneCache, TuneRecord};
    let kernels = stock::kernels().unwrap();
    let hash = bundle::ir_hash(&kernels[2].kernel);
    let mut cache = TuneCache::in_memory();
    cache.insert(
        "k".into(),
        TuneRecord {
            key: "spgemv_quant head_dim=128".into(),
            device: "NVIDIA H100 80GB HBM3".into(),
            compute_capability: "9.0".into(),
            driver: "13.0".into(),
            best: Some(0),
            default: 0,
            trials: vec![Trial {
                label: "block_tokens=64,num_warps=2,min_programs_per_sm=14,tensor_cores=false"
                    .into(),
                config: serde_json::json!({}),
                ir_hash: hash,
                status: Status::Ok {
                    us: 100.0,
                    timing: Some("graph".into()),
                },
            }],
        },
    );
    let m = bundle::manifest(&Target::sm90a(), &kernels, Some(&cache));
    assert_eq!(m.kernels[2].tuning.len(), 1);
    assert_eq!(m.kernels[2].tuning[0]["best"], true);
    assert_eq!(m.kernels[2].tuning[0]["us"], 100.0);
    assert!(m.kernels[0].tuning.is_empty());
}

/// `dusk compile --all` bundles every stock configuration once: kernel names are unique
/// (one C function each in the header), though several row lengths share a search default.
#[test]
fn all_stock_kernels_have_unique_names() {
    let all = stock::all_kernels().unwrap();
    let mut names: Vec<&str> = all.iter().map(|k| k.name.as_str()).collect();
    names.sort_unstable();
    let n = names.len();
    names.dedup();
    assert_eq!(names.len(), n, "duplicate kernel names in all_kernels");
    assert!(names
        .iter()
        .any(|n| n.starts_with("threshold_top_p_s1024_g4")));
}

/// Every configuration the SpGEMV plan fits to its grid for the bundle's GQA shape (head_dim
/// 128, groups of 4, 4-bit codes) is in the stock bundle: a plan made through the Python
/// package or the C ABI, which cannot compile PTX, never picks a kernel it cannot load.
#[test]
fn stock_bundle_holds_every_fitted_spgemv() {
    use dusk_kernels::spgemv::{self, SpgemvConfig};
    let names: Vec<String> = stock::kernels()
        .unwrap()
        .into_iter()
        .map(|k| k.kernel.name)
        .collect();
    for sms in [1, 132] {
        for rows in [1, 8, 64, 256, 2048] {
            for longest in [1, 100, 1024, 8192, 131072] {
                let cfg = SpgemvConfig::new(128, 16, 4, 4).fit_grid(rows, longest, sms);
                let name = spgemv::build(&cfg).unwrap().name;
                assert!(
                    names.contains(&name),
                    "{name} (rows {rows}, longest {longest}, {sms} SMs) is not in the stock bundle"
                );
            }
        }
    }
}

/// Every kernel a pipeline the Python package offers loads when planned at the stock
/// shapes (`stock::plan_offered_pipelines`: Quest with and without top-p, Full with top-p,
/// group varlen attention, the append of their state; head_dim 128, pages of 16, f16, GQA
/// groups of 1, 4 and 8) is in the committed stock bundle, found there by name and IR hash
/// as a GPU plan looks it up: the package, which cannot compile PTX, plans them without
/// `NotInBundle`. Planned on the CPU against the bundle (the SpGEMV's grid fitting, which
/// only a GPU does, is covered by `stock_bundle_holds_every_fitted_spgemv`).
#[test]
fn stock_bundle_holds_every_offered_pipeline() {
    use dusk_kernels::ops::Dusk;
    use std::sync::Arc;

    let bundle = Arc::new(Bundle::open(committed()).unwrap());
    let dusk = Dusk::with_bundle(Device::cpu(), bundle).unwrap();
    stock::plan_offered_pipelines(&dusk).unwrap();
    let loaded = dusk.loaded_kernels();
    assert!(loaded.iter().any(|k| k.name().starts_with("quest_score")));
    let missing: std::collections::BTreeSet<String> = loaded
        .iter()
        .filter(|k| dusk.bundle_entry(k.ir()).is_none())
        .map(|k| k.name().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "kernels the Python package's pipelines load and the stock bundle lacks: {missing:?}"
    );
}
