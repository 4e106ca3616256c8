//! Builds each C example (`examples/c/*.c`) with gcc against this crate's
//! `libdusk_capi.so` and the committed bundle's `dusk.h`, then runs it: on a machine with
//! a GPU it checks its kernels against its C references (exit 0); with none it exits 77,
//! which counts as a pass here (it still proved that the program compiles and links).

use std::path::Path;
use std::process::Command;

fn build_and_run(example: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The test binary lives in target/<profile>/deps, next to the cdylib.
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    assert!(
        deps.join("libdusk_capi.so").exists(),
        "libdusk_capi.so not found in {}",
        deps.display()
    );
    let out = deps.join(format!("dusk-{example}-c"));
    let gcc = Command::new("gcc")
        .args(["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(root.join("kernels_gen/bundle"))
        .arg(root.join(format!("examples/c/{example}.c")))
        .arg("-L")
        .arg(deps)
        .args(["-ldusk_capi", "-ldl", "-lm", "-Wl,-rpath,$ORIGIN", "-o"])
        .arg(&out)
        .output();
    let Ok(gcc) = gcc else {
        eprintln!("gcc not found: skipping");
        return;
    };
    assert!(
        gcc.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&gcc.stderr)
    );
    let run = Command::new(&out)
        .arg(root.join("kernels_gen/bundle"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        matches!(run.status.code(), Some(0) | Some(77)),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

#[test]
fn spgemv_example_builds_links_and_runs() {
    build_and_run("spgemv");
}

#[test]
fn attention_example_builds_links_and_runs() {
    build_and_run("attention");
}

#[test]
fn prune_example_builds_links_and_runs() {
    build_and_run("prune");
}
