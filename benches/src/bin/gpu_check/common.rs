//! What every check shares: the error type and the command-line lookup.

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The value after `name` on the command line.
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}
