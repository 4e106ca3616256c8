//! What every check shares: the error type and the command-line lookup.

use dusk::runtime::{median, Device};

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The device-to-device copy rate (bytes read plus bytes written per second, in GB/s) of
/// 1 GiB each way: the bandwidth every figure is a fraction of.
pub fn copy_gbps(dev: &Device) -> Res<f64> {
    let n = 1usize << 30;
    let src = dev.upload(&vec![0x5Au8; n])?;
    let mut dst = dev.alloc::<u8>(n)?;
    let t = dev.time_us(20, 3, || dst.copy_from(&src).map_err(|e| e.to_string()))?;
    let gbps = 2.0 * n as f64 / (median(&t) * 1e-6) / 1e9;
    println!("device copy: {gbps:.0} GB/s (read + write)");
    Ok(gbps)
}

/// The value after `name` on the command line.
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Whether `name` is on the command line.
pub fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

/// The `q`-quantile of `xs` (sorted here), nearest rank.
fn quantile(xs: &mut [f64], q: f64) -> f64 {
    xs.sort_by(f64::total_cmp);
    if xs.is_empty() {
        return f64::NAN;
    }
    xs[((xs.len() - 1) as f64 * q).round() as usize]
}

/// `min / p10 / p50 / p90 / max` of `xs` in microseconds.
pub fn spread(mut xs: Vec<f64>) -> String {
    let q: Vec<String> = [0.0, 0.1, 0.5, 0.9, 1.0]
        .iter()
        .map(|&p| format!("{:.1}", quantile(&mut xs, p)))
        .collect();
    q.join(" / ")
}
