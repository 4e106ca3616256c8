//! The README's `cargo dusk` lines, run through the built binary so that they cannot drift:
//! those that need no GPU must succeed, and those that time kernels on a GPU (`tune` and
//! `bench` without `--interpreter`) must refuse with exit status 3 where none is visible.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `cargo dusk` lines of the README's block of shell commands in the section on the
/// `dusk` command, as arguments (comments dropped).
fn readme_lines() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Bundles, the C ABI and the `dusk` command"))
        .expect("the README has the section on the `dusk` command");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the section has a ```sh block");
    block
        .lines()
        .filter_map(|l| l.strip_prefix("cargo dusk"))
        .map(|l| {
            let l = l.split(" #").next().unwrap();
            l.split_whitespace().map(String::from).collect()
        })
        .collect()
}

#[test]
fn the_cargo_alias_runs_this_binary() {
    let config = std::fs::read_to_string(root().join(".cargo/config.toml")).unwrap();
    let alias = config
        .split("[alias]")
        .nth(1)
        .expect(".cargo/config.toml has an [alias] table");
    assert!(
        alias.contains("dusk = \"run --release -p dusk-cli --\""),
        "{alias}"
    );
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(readme.contains("`cargo install --path cli --locked`"));
}

#[test]
fn every_readme_line_runs_as_written() {
    let lines = readme_lines();
    assert!(lines.len() >= 8, "{lines:?}");
    for cmd in ["list", "compile", "inspect", "tune", "bench"] {
        assert!(
            lines
                .iter()
                .any(|l| l.first().map(String::as_str) == Some(cmd)),
            "no `cargo dusk {cmd}` line in the README"
        );
    }
    // Relative paths (my-bundle, dump, tuned.json) land in a folder of the test's own.
    let dir = std::env::temp_dir().join(format!("dusk-cli-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for args in &lines {
        let needs_gpu = matches!(args[0].as_str(), "tune" | "bench")
            && !args.iter().any(|a| a == "--interpreter");
        let out = Command::new(env!("CARGO_BIN_EXE_dusk"))
            .args(args)
            .current_dir(&dir)
            .env("DUSK_CACHE_DIR", dir.join("cache"))
            // No GPU, even on a machine with one: the GPU lines must refuse, not run.
            .env("CUDA_VISIBLE_DEVICES", "")
            .output()
            .expect("dusk runs");
        let err = String::from_utf8_lossy(&out.stderr);
        let line = format!("cargo dusk {}", args.join(" "));
        if needs_gpu {
            assert_eq!(out.status.code(), Some(3), "{line}: {err}");
            assert!(
                err.starts_with("error: no CUDA GPU was found"),
                "{line}: {err}"
            );
        } else {
            assert!(out.status.success(), "{line}: {err}");
            assert!(!out.stdout.is_empty(), "{line} printed nothing");
        }
    }
    assert!(dir.join("my-bundle/manifest.json").exists());
    assert!(dir
        .join("dump/stages/spgemv_quant_mma_d128_g4_b4_t64_w4_o0_x16_l2.ptx")
        .exists());
    assert!(
        !dir.join("cache/tuning.json").exists(),
        "the interpreter wrote the tuning cache"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
