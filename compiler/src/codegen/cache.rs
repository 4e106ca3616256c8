//! Compiled PTX, kept so that a kernel is compiled once per process and, across processes,
//! once per machine.
//!
//! The key is the kernel's printed IR (every op, type, constant and launch hint), the
//! target, the PTX ISA, the versions of dusk and LLVM, and a fingerprint of the compiler's
//! own source (`build.rs`, so a change to the lowering is a new key between releases too):
//! any change to one of them is a different key. On disk each entry holds its full key
//! next to the PTX and is used only when the key matches exactly, so a hash collision
//! costs a recompile, never a wrong kernel.
//! The folder is `$DUSK_CACHE_DIR`, else `$XDG_CACHE_HOME/dusk`, else `~/.cache/dusk`;
//! `DUSK_CACHE_DIR=off` keeps the cache in memory only.

use super::{compile, Target};
use crate::ir::Kernel;
use crate::print::print_kernel;
use crate::CompileError;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// Where a PTX came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Compiled by LLVM just now.
    Compiled,
    /// Found in this process's memory.
    Memory,
    /// Read from the disk cache.
    Disk,
}

fn memory() -> &'static Mutex<HashMap<String, Arc<str>>> {
    static MEMORY: OnceLock<Mutex<HashMap<String, Arc<str>>>> = OnceLock::new();
    MEMORY.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The folder of the disk cache, or `None` when it is turned off.
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("DUSK_CACHE_DIR") {
        Some(v) if v == "off" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|d| d.join("dusk")),
    }
}

fn key(kernel: &Kernel, target: &Target) -> String {
    let (major, minor, patch) = inkwell::support::get_llvm_version();
    format!(
        "dusk {} ({}) llvm {major}.{minor}.{patch} target {} ptx {}.{}\n{}",
        env!("CARGO_PKG_VERSION"),
        env!("DUSK_COMPILER_SOURCE"),
        target.arch_name(),
        target.ptx_isa.0,
        target.ptx_isa.1,
        print_kernel(kernel)
    )
}

/// `<kernel>-<FNV-1a of the key>.ptx`: stable across runs (the file holds the key itself, so
/// a collision only costs a recompile).
fn file_name(kernel: &Kernel, key: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{}-{h:016x}.ptx", kernel.name)
}

const SEPARATOR: &str = "\n// ---- ptx ----\n";

/// The PTX of `kernel` for `target`, from memory, from disk, or compiled (and then kept in
/// both). Disk errors are not fatal: the cache is skipped.
pub fn compile_cached(
    kernel: &Kernel,
    target: &Target,
) -> Result<(Arc<str>, Source), CompileError> {
    let key = key(kernel, target);
    if let Some(ptx) = memory().lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok((ptx.clone(), Source::Memory));
    }
    let path = cache_dir().map(|d| d.join(file_name(kernel, &key)));
    let from_disk = path
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|text| {
            let (stored_key, ptx) = text.split_once(SEPARATOR)?;
            (stored_key == key).then(|| Arc::<str>::from(ptx))
        });
    let (ptx, source) = match from_disk {
        Some(ptx) => (ptx, Source::Disk),
        None => {
            let ptx: Arc<str> = compile(kernel, target)?.into();
            if let Some(p) = &path {
                // Written whole to a temporary name, then renamed: readers never see half a file.
                let tmp = p.with_extension(format!("tmp{}", std::process::id()));
                let ok = p
                    .parent()
                    .is_some_and(|d| std::fs::create_dir_all(d).is_ok())
                    && std::fs::write(&tmp, format!("{key}{SEPARATOR}{ptx}")).is_ok();
                if ok {
                    let _ = std::fs::rename(&tmp, p);
                }
            }
            (ptx, Source::Compiled)
        }
    };
    memory()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, ptx.clone());
    Ok((ptx, source))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, KernelBuilder};

    fn tiny(name: &str) -> Kernel {
        let mut b = KernelBuilder::new(name);
        let p = b.param_ptr("p", DType::F32);
        let x = b.f32(1.0);
        b.store(p, x);
        b.finish().unwrap()
    }

    #[test]
    fn memory_then_disk_and_only_on_an_exact_key() {
        let dir = std::env::temp_dir().join(format!("dusk-cache-test-{}", std::process::id()));
        std::env::set_var("DUSK_CACHE_DIR", &dir);
        let t = Target::sm90a();

        let a = tiny("cache_test_a");
        let (ptx, src) = compile_cached(&a, &t).unwrap();
        assert_eq!(src, Source::Compiled);
        assert!(ptx.contains(".entry cache_test_a"));
        assert_eq!(compile_cached(&a, &t).unwrap().1, Source::Memory);
        let file = dir.join(file_name(&a, &key(&a, &t)));
        assert!(std::fs::read_to_string(&file).unwrap().ends_with(&*ptx));

        // A kernel this process has not compiled is read from disk when its key matches...
        let b = tiny("cache_test_b");
        let kb = key(&b, &t);
        std::fs::write(
            dir.join(file_name(&b, &kb)),
            format!("{kb}{SEPARATOR}// planted"),
        )
        .unwrap();
        let (ptx, src) = compile_cached(&b, &t).unwrap();
        assert_eq!((&*ptx, src), ("// planted", Source::Disk));

        // ...and compiled afresh when the stored key differs (another target here).
        let c = tiny("cache_test_c");
        let kc = key(&c, &t);
        std::fs::write(
            dir.join(file_name(&c, &kc)),
            format!("{}{SEPARATOR}// stale", key(&c, &Target::sm80())),
        )
        .unwrap();
        let (ptx, src) = compile_cached(&c, &t).unwrap();
        assert_eq!(src, Source::Compiled);
        assert!(ptx.contains(".entry cache_test_c"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
