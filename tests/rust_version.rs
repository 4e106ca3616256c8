//! The workspace's `rust-version` (Cargo.toml, `[workspace.package]`, inherited by the
//! crates) is the oldest Rust that builds dusk: no locked dependency may need a newer one.
//!
//! Our own code's side is guarded by clippy: its `incompatible_msrv` lint (on by default)
//! reads `rust-version` and flags any std item stabilised after it, so
//! `cargo clippy --all-targets -- -D warnings` fails on one. Only one toolchain is installed
//! here, so no test compiles the workspace with that old compiler itself.

use std::process::Command;

/// "1.88" or "1.88.0" as (1, 88, 0).
fn parse(v: &str) -> (u64, u64, u64) {
    let mut n = v.split('.').map(|x| {
        x.parse::<u64>()
            .unwrap_or_else(|_| panic!("rust-version {v:?} is no version"))
    });
    let (a, b, c) = (n.next(), n.next(), n.next());
    (a.unwrap_or(0), b.unwrap_or(0), c.unwrap_or(0))
}

#[test]
fn no_locked_dependency_needs_a_newer_rust() {
    // The facade crate inherits the workspace's rust-version.
    let ours = env!("CARGO_PKG_RUST_VERSION");
    assert!(
        !ours.is_empty(),
        "Cargo.toml: the dusk package needs `rust-version.workspace = true`"
    );
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked"])
        .args(["--manifest-path", manifest])
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo metadata --locked failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let members: Vec<&str> = meta["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    let (mut too_new, mut highest) = (vec![], ours.to_string());
    for p in meta["packages"].as_array().expect("packages") {
        let Some(rv) = p["rust_version"].as_str() else {
            continue;
        };
        let (name, version) = (p["name"].as_str(), p["version"].as_str());
        let (name, version) = (name.unwrap_or("?"), version.unwrap_or("?"));
        if members.contains(&p["id"].as_str().unwrap_or("")) {
            assert_eq!(
                parse(rv),
                parse(ours),
                "the workspace crate {name} states rust-version {rv}, the workspace {ours}: \
                 give it `rust-version.workspace = true` instead"
            );
        } else if parse(rv) > parse(ours) {
            too_new.push(format!("{name} {version} needs Rust {rv}"));
            if parse(rv) > parse(&highest) {
                highest = rv.to_string();
            }
        }
    }
    assert!(
        too_new.is_empty(),
        "locked dependencies need a newer Rust than rust-version = \"{ours}\" in Cargo.toml's \
         [workspace.package]:\n  {}\nraise it to \"{highest}\" (and the Rust that README.md's set-up \
         asks for), or hold those dependencies back (cargo update -p NAME --precise VERSION)",
        too_new.join("\n  ")
    );
}
