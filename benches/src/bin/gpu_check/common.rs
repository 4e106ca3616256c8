//! What every check shares: the options every subcommand takes, the copy rate, the peers'
//! file, and the result format of DESIGN.md section 8 (each case saying how each side was
//! timed).

use clap::Args;
use dusk::runtime::{Device, Measured};
use serde_json::{json, Value};
use std::path::PathBuf;

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Options of every subcommand.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Stop after the correctness checks (what compute-sanitizer runs).
    #[arg(long)]
    pub check_only: bool,
    /// The peers' timings: the JSON the peer script (benches/baselines/) wrote in the same
    /// command.
    #[arg(long, value_name = "FILE")]
    pub peers: Option<PathBuf>,
    /// Where to write the results (JSON, DESIGN.md section 8).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// The commit measured, copied into the results.
    #[arg(long)]
    pub commit: Option<String>,
    /// The date of the run, copied into the results.
    #[arg(long)]
    pub date: Option<String>,
    /// Draw the same inputs in every process (by default each process draws its own).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl Common {
    /// The peers' results, when `--peers` was given; a missing or malformed file is an
    /// error, never a silent run without peers.
    pub fn peers(&self) -> Res<Option<Value>> {
        let Some(path) = &self.peers else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--peers {}: {e}", path.display()))?;
        let v = serde_json::from_str(&text)
            .map_err(|e| format!("--peers {}: not JSON: {e}", path.display()))?;
        Ok(Some(v))
    }

    /// The random generator's seed: `--seed`, or one of this process's own.
    pub fn seed_or(&self, salt: u64) -> u64 {
        self.seed.unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            t ^ std::process::id() as u64 ^ salt
        })
    }

    /// The results' header fields, then `extra`, then the cases; written to `--out`.
    pub fn write_results(
        &self,
        dev: &Device,
        copy_gbps: f64,
        peers: Option<&Value>,
        extra: Value,
        cases: Vec<Value>,
    ) -> Res<()> {
        let mut result = json!({
            "device": dev.name(),
            "driver": dev.driver_version().map(|(a, b)| format!("{a}.{b}")),
            "commit": self.commit,
            "date": self.date,
            "copy_gbps": copy_gbps,
            "copy_timing": "queued",
            "peer_copy_gbps": peers.and_then(|p| p["copy_gbps"].as_f64()),
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "run_by": std::env::var("DUSK_BENCH_COMMAND").ok(),
            "peer_versions": peers.map(|p| json!({"torch": p["torch"], "flashinfer": p["flashinfer"], "triton": p["triton"]})),
        });
        if let (Some(o), Some(e)) = (result.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        result["cases"] = Value::Array(cases);
        let text = serde_json::to_string_pretty(&result)?;
        println!("{text}");
        if let Some(path) = &self.out {
            std::fs::write(path, text).map_err(|e| format!("--out {}: {e}", path.display()))?;
        }
        Ok(())
    }
}

/// The device-to-device copy rate of 1 GiB each way ([`Device::copy_gbps`], the harness's
/// yardstick), printed.
pub fn copy_gbps(dev: &Device) -> Res<f64> {
    let gbps = dev.copy_gbps(1 << 30)?;
    println!("device copy: {gbps:.0} GB/s (read + write; queued copies)");
    Ok(gbps)
}

/// A peer's time for a case and how the peer script timed it (`graph` or `queued`).
pub struct PeerTime {
    pub us: Option<f64>,
    pub timing: Option<String>,
}

impl PeerTime {
    /// `key`'s time (`{key}_us`) and timing (`{key}_timing`) in the peers' case `case`.
    pub fn from_case(case: Option<&Value>, key: &str) -> PeerTime {
        let get = |suffix: &str| case.map(|c| c[format!("{key}_{suffix}")].clone());
        PeerTime {
            us: get("us").and_then(|v| v.as_f64()),
            timing: get("timing").and_then(|v| v.as_str().map(String::from)),
        }
    }
}

/// One result case (DESIGN.md section 8): ours against a peer, the bytes the kernel must
/// move, and how each side was timed. `extra`'s fields are added as they are.
#[allow(clippy::too_many_arguments)]
pub fn case_json(
    case: &str,
    shape: Value,
    ours: &Measured,
    peer: &str,
    peer_time: &PeerTime,
    bytes: f64,
    copy_gbps: f64,
    extra: Value,
) -> Value {
    let us = ours.median_us();
    let gbps = bytes / (us * 1e-6) / 1e9;
    let mut c = json!({
        "case": case,
        "shape": shape,
        "ours_us": us,
        "peer": peer,
        "peer_us": peer_time.us,
        "speedup_vs_peer": peer_time.us.map(|p| p / us),
        "bytes": bytes as u64,
        "gbps": gbps,
        "frac_of_copy_bw": gbps / copy_gbps,
        "timing": {"ours": ours.timing.as_str(), "peer": peer_time.timing},
        "ours_spread_us": spread(ours.samples_us.clone()),
    });
    if let (Some(o), Some(e)) = (c.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    c
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
