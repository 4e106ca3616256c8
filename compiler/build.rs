//! Fingerprints the compiler's own source for the PTX cache key (`codegen/cache.rs`): a
//! change to how kernels are lowered must not reuse PTX compiled before it, even while the
//! crate's version stays the same.

use std::path::Path;

fn main() {
    let mut files = vec![];
    collect(Path::new("src"), &mut files);
    files.sort();
    // FNV-1a over every file's path and contents, in a fixed order.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in &files {
        let text = std::fs::read(f).unwrap_or_default();
        for b in f.to_string_lossy().bytes().chain(text) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    println!("cargo:rustc-env=DUSK_COMPILER_SOURCE={h:016x}");
    println!("cargo:rerun-if-changed=src");
}

fn collect(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else {
            out.push(p);
        }
    }
}
