//! Builds the stock kernels' bundle (`kernels_gen/bundle/`: manifest.json and its PTX
//! files) into the extension, so that the wheel carries its GPU kernels with it and needs
//! no LLVM, CUDA toolkit or data files at run time.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels_gen/bundle");
    let dir = dir.canonicalize().expect("kernels_gen/bundle exists");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("kernels_gen/bundle is readable")
        .map(|e| {
            e.expect("a directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n == "manifest.json" || n.ends_with(".ptx"))
        .collect();
    names.sort();
    let mut out = String::from(
        "/// The stock bundle's files, by name: manifest.json and each PTX file.\n\
         pub const FILES: &[(&str, &str)] = &[\n",
    );
    for n in &names {
        let path = dir.join(n);
        println!("cargo:rerun-if-changed={}", path.display());
        writeln!(
            out,
            "    ({n:?}, include_str!({:?})),",
            path.display().to_string()
        )
        .unwrap();
    }
    out.push_str("];\n");
    let dest = Path::new(&std::env::var("OUT_DIR").unwrap()).join("bundle_files.rs");
    std::fs::write(dest, out).unwrap();
}
