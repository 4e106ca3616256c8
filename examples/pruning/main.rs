//! A user-written pruning policy (`policy.rs`) run by the fused threshold search, on the GPU
//! when there is one and through the interpreter otherwise, checked against the oracle.
//!
//!     cargo run --release --example pruning

mod policy;

fn main() -> std::process::ExitCode {
    // Errors are printed with `Display` (one line saying what and where), not the `Debug`
    // that `fn main() -> Result<..>` would print.
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let dusk = dusk::Dusk::new(dusk::runtime::Device::best())?;
    println!("device: {}", dusk.device().name());
    let budgets = policy::run(&dusk, 64, 3)?;
    let kept: i64 = budgets.iter().map(|b| *b as i64).sum();
    println!(
        "top_p_quarter on {} rows: {kept} candidates kept, every row equal to the oracle",
        budgets.len()
    );
    Ok(())
}
