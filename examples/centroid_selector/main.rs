//! A selector of one's own (`selector.rs`, the centroid of each page) planned and run by
//! dusk, on the GPU when there is one and through the interpreter otherwise; every stage
//! checked against plain Rust (`check.rs`).
//!
//!     cargo run --release --example centroid_selector

mod check;
mod selector;

fn main() -> std::process::ExitCode {
    // Errors are printed with `Display` (one line saying what and where).
    let dusk = match dusk::Dusk::new(dusk::runtime::Device::best()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    println!("device: {}", dusk.device().name());
    match check::run(&dusk, &[1000, 257, 40, 3000], 256, 7) {
        Ok(kept) => {
            println!("centroid selector: {} rows, tokens kept {kept:?}; centroids, scores and lists as in plain Rust", kept.len());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
