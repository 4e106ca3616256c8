//! The tuner: every candidate config is compiled, checked against the reference, and only
//! then timed; the fastest config that passed wins. Results go to a persistent
//! [`TuneCache`] keyed by (kernel hash, device name, compute capability, driver, tuning
//! key). A config that fails to compile, load or launch, or gives wrong results, is
//! recorded with the reason and skipped: tuning goes on.
//!
//! A family is tuned by giving [`run`] its [`Candidate`]s (see
//! [`spgemv_tune`](crate::spgemv_tune) for `spgemv_quant`).

use crate::{fnv_hex, io, Result};
use dusk_runtime::{Device, Measured};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One config of a tuning run, ready to be tried.
pub trait Candidate {
    /// How reports name it: its config's `key=value` text ([`crate::config_text`]).
    fn label(&self) -> String;
    /// The configuration, as the manifest records it.
    fn config(&self) -> serde_json::Value;
    /// The hash of the kernel's IR (the manifest's `ir_hash`), from building the IR only:
    /// part of the cache key, known before anything is compiled.
    fn kernel_hash(&self) -> Result<String, String>;
    /// Compiles and loads the kernel(s) and allocates what a run needs.
    fn prepare(&mut self) -> Result<(), String>;
    /// Runs once on outputs poisoned with NaN and compares with the reference.
    fn check(&mut self) -> Result<(), Rejection>;
    /// Times it with the harness (`Device::time_calls`: calls captured in a CUDA graph and
    /// replayed, inputs rotated past twice the L2).
    fn time(&mut self) -> Result<Measured, String>;
}

/// Why a candidate was not timed, or not trusted.
#[derive(Clone, Debug, PartialEq)]
pub enum Rejection {
    /// It ran, and its output differs from the reference.
    Wrong(String),
    /// It could not run.
    Failed(String),
}

/// What happened to one candidate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum Status {
    /// Checked and timed: the median per call, and how the harness timed it (`graph`,
    /// `queued` or `cpu`; absent in records written before it was kept).
    Ok {
        us: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timing: Option<String>,
    },
    /// Its output differed from the reference: never eligible.
    Wrong { error: String },
    /// Compile, load, launch or timing failed at `stage`.
    Failed { stage: String, error: String },
    /// Dropped before compiling (it cannot fit).
    Pruned { reason: String },
}

/// A candidate's record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    pub label: String,
    pub config: serde_json::Value,
    /// The kernel hash (empty when it did not compile).
    pub ir_hash: String,
    #[serde(flatten)]
    pub status: Status,
}

/// The outcome of a tuning run for one key on one device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneRecord {
    pub key: String,
    pub device: String,
    pub compute_capability: String,
    pub driver: String,
    /// Index into `trials` of the fastest config that passed the check.
    pub best: Option<usize>,
    /// Index of the default config (the first candidate).
    pub default: usize,
    pub trials: Vec<Trial>,
}

impl TuneRecord {
    pub fn best_trial(&self) -> Option<&Trial> {
        self.best.map(|i| &self.trials[i])
    }
    fn us(&self, i: usize) -> Option<f64> {
        match self.trials.get(i)?.status {
            Status::Ok { us, .. } => Some(us),
            _ => None,
        }
    }
    /// The default's time and the best's time, when both were timed.
    pub fn default_and_best_us(&self) -> Option<(f64, f64)> {
        Some((self.us(self.default)?, self.us(self.best?)?))
    }

    /// Why no config won, when none did: how many configs failed in which way, and the
    /// first one's reason (`none of the 8 configs passed (8 failed at compile); the first,
    /// 64x2/0 mma, failed at compile: ...`). `None` when a config passed.
    pub fn why_none_passed(&self) -> Option<String> {
        if self.best.is_some() {
            return None;
        }
        let mut counts: Vec<(String, usize)> = vec![];
        for t in &self.trials {
            let kind = match &t.status {
                Status::Ok { .. } => "timed".to_string(),
                Status::Wrong { .. } => "wrong output".to_string(),
                Status::Failed { stage, .. } => format!("failed at {stage}"),
                Status::Pruned { .. } => "pruned".to_string(),
            };
            match counts.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, n)) => *n += 1,
                None => counts.push((kind, 1)),
            }
        }
        let Some(first) = self.trials.first() else {
            return Some("the space has no configs".to_string());
        };
        let why = match &first.status {
            Status::Ok { us, .. } => format!("was timed at {us} us"),
            Status::Wrong { error } => format!("gave wrong output: {error}"),
            Status::Failed { stage, error } => format!("failed at {stage}: {error}"),
            Status::Pruned { reason } => format!("was pruned: {reason}"),
        };
        let counts = counts
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect::<Vec<_>>()
            .join(", ");
        Some(if self.trials.len() == 1 {
            format!("its only config, {}, {why}", first.label)
        } else {
            format!(
                "none of the {} configs passed ({counts}); the first, {}, {why}",
                self.trials.len(),
                first.label
            )
        })
    }
}

/// Identifies the device in cache keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceId {
    pub name: String,
    pub compute_capability: String,
    pub driver: String,
}

impl DeviceId {
    pub fn of(dev: &Device) -> DeviceId {
        let cc = dev
            .compute_capability()
            .map(|(a, b)| format!("{a}.{b}"))
            .unwrap_or_else(|| "cpu".into());
        let driver = dev
            .driver_version()
            .map(|(a, b)| format!("{a}.{b}"))
            .unwrap_or_else(|| "none".into());
        DeviceId {
            name: dev.name().to_string(),
            compute_capability: cc,
            driver,
        }
    }
}

/// Tuning results on disk: a JSON object from cache key to [`TuneRecord`]. The key is
/// `<hash of the space's kernels>|<device>|<compute capability>|<driver>|<tuning key>`: a
/// change to any kernel of the space, another GPU or driver, or a shape in another bucket
/// is another entry.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TuneCache {
    pub entries: BTreeMap<String, TuneRecord>,
    #[serde(skip)]
    path: Option<PathBuf>,
}

impl TuneCache {
    /// `$DUSK_CACHE_DIR/tuning.json` (see the compile cache for the folder), or `None`
    /// when the cache is off.
    pub fn default_path() -> Option<PathBuf> {
        dusk_compiler::codegen::cache::cache_dir().map(|d| d.join("tuning.json"))
    }

    /// Reads `path` (an empty cache when it does not exist yet).
    pub fn open(path: &Path) -> Result<TuneCache> {
        let mut c: TuneCache = match std::fs::read_to_string(path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| crate::AotError::Invalid {
                what: path.display().to_string(),
                msg: format!("not a tuning cache: {e}"),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => TuneCache::default(),
            Err(e) => return Err(io(path)(e)),
        };
        c.path = Some(path.to_path_buf());
        Ok(c)
    }

    /// A cache in memory only.
    pub fn in_memory() -> TuneCache {
        TuneCache::default()
    }

    /// Writes the cache back to the file it was opened from (no-op in memory).
    pub fn save(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).map_err(io(d))?;
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let json = serde_json::to_string_pretty(self).expect("a cache serialises");
        std::fs::write(&tmp, json).map_err(io(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io(path))
    }

    /// The cache key of a space (by the hash of its kernels), device and tuning key.
    pub fn key(space_hash: &str, dev: &DeviceId, key: &str) -> String {
        format!(
            "{space_hash}|{}|{}|{}|{key}",
            dev.name, dev.compute_capability, dev.driver
        )
    }

    pub fn get(&self, key: &str) -> Option<&TuneRecord> {
        self.entries.get(key)
    }

    pub fn insert(&mut self, key: String, record: TuneRecord) {
        self.entries.insert(key, record);
    }

    /// Every trial of kernel `ir_hash` (for a bundle manifest's `tuning`).
    pub fn results_for(&self, ir_hash: &str) -> Vec<serde_json::Value> {
        let mut out = vec![];
        for r in self.entries.values() {
            for (i, t) in r.trials.iter().enumerate() {
                if t.ir_hash == ir_hash {
                    // {"status": "ok", "us": ...} and where it was measured.
                    let mut v = serde_json::to_value(&t.status).expect("a status serialises");
                    v["key"] = r.key.clone().into();
                    v["device"] = r.device.clone().into();
                    v["compute_capability"] = r.compute_capability.clone().into();
                    v["driver"] = r.driver.clone().into();
                    v["best"] = (r.best == Some(i)).into();
                    out.push(v);
                }
            }
        }
        out
    }
}

/// The kernel hash of a space in cache keys: of every candidate's kernel hash (its IR),
/// label and config, and dusk's version, so that a changed kernel, a changed space or a
/// new compiler is a new entry.
pub fn space_hash(candidates: &[Box<dyn Candidate + '_>]) -> String {
    space_hash_of(
        candidates
            .iter()
            .map(|c| (c.kernel_hash().unwrap_or_else(|e| e), c.label(), c.config())),
    )
}

/// [`space_hash`] from each candidate's (kernel hash or build error, label, config), for
/// looking a result up without making inputs.
pub fn space_hash_of(
    items: impl IntoIterator<Item = (String, String, serde_json::Value)>,
) -> String {
    let mut s = format!("dusk {}", env!("CARGO_PKG_VERSION"));
    for (hash, label, config) in items {
        s.push_str(&hash);
        s.push_str(&label);
        s.push_str(&config.to_string());
    }
    fnv_hex(&s)
}

/// Tries every candidate in order (the first is the default): prepare, check, time.
/// `pruned` configs are recorded as such. A time that is zero, negative or not finite is
/// recorded as a failure at `time`: no config wins on a broken timer.
///
/// With `progress`, a bar on stderr shows configs done out of all, the time elapsed, the
/// config being tried and the best so far; when stderr is not a terminal (a log, CI), one
/// line a config instead.
pub fn run(
    key: &str,
    dev: &DeviceId,
    mut candidates: Vec<Box<dyn Candidate + '_>>,
    pruned: Vec<(String, serde_json::Value, String)>,
    progress: bool,
) -> TuneRecord {
    let total = candidates.len();
    let mut progress = Progress::new(key, total, progress);
    let mut trials = vec![];
    let mut best: Option<(usize, f64)> = None;
    for c in candidates.iter_mut() {
        let label = c.label();
        progress.trying(&label);
        let config = c.config();
        let ir_hash = c.kernel_hash().unwrap_or_default();
        let status = match c.kernel_hash().and_then(|_| c.prepare()) {
            Err(error) => Status::Failed {
                stage: "compile".into(),
                error,
            },
            Ok(()) => match c.check() {
                Err(Rejection::Wrong(error)) => Status::Wrong { error },
                Err(Rejection::Failed(error)) => Status::Failed {
                    stage: "check".into(),
                    error,
                },
                Ok(()) => match c.time().map(|m| (m.median_us(), m.timing)) {
                    Ok((us, timing)) if us > 0.0 && us.is_finite() => Status::Ok {
                        us,
                        timing: Some(timing.as_str().into()),
                    },
                    Ok((us, _)) => Status::Failed {
                        stage: "time".into(),
                        error: format!("the timer gave {us} us"),
                    },
                    Err(error) => Status::Failed {
                        stage: "time".into(),
                        error,
                    },
                },
            },
        };
        if let Status::Ok { us, .. } = status {
            if best.is_none_or(|(_, b)| us < b) {
                best = Some((trials.len(), us));
                progress.best(&label, us);
            }
        }
        progress.done(trials.len() + 1, &label, &status);
        trials.push(Trial {
            label,
            config,
            ir_hash,
            status,
        });
    }
    progress.finish();
    for (label, config, reason) in pruned {
        trials.push(Trial {
            label,
            config,
            ir_hash: String::new(),
            status: Status::Pruned { reason },
        });
    }
    TuneRecord {
        key: key.to_string(),
        device: dev.name.clone(),
        compute_capability: dev.compute_capability.clone(),
        driver: dev.driver.clone(),
        best: best.map(|(i, _)| i),
        default: 0,
        trials,
    }
}

/// The progress of [`run`]: a bar on a terminal, plain lines elsewhere, or nothing.
enum Progress {
    Off,
    /// The bar, and the best config so far as its message shows it.
    Bar(ProgressBar, String),
    Lines {
        total: usize,
        start: Instant,
    },
}

impl Progress {
    fn new(key: &str, total: usize, on: bool) -> Progress {
        if !on {
            return Progress::Off;
        }
        if !std::io::stderr().is_terminal() {
            eprintln!("{key}: tuning {total} configs");
            return Progress::Lines {
                total,
                start: Instant::now(),
            };
        }
        let bar = ProgressBar::new(total as u64);
        bar.set_style(
            ProgressStyle::with_template("[{bar:30}] {pos}/{len} configs, {elapsed}  {wide_msg}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        // Redrawn every second, so that the time keeps moving through a slow config.
        bar.enable_steady_tick(Duration::from_secs(1));
        Progress::Bar(bar, String::new())
    }

    fn trying(&self, label: &str) {
        if let Progress::Bar(bar, best) = self {
            bar.set_message(format!("trying {label}{best}"));
        }
    }

    fn best(&mut self, label: &str, us: f64) {
        if let Progress::Bar(_, best) = self {
            *best = format!("  (best: {label} {us:.1} us)");
        }
    }

    fn done(&self, n: usize, label: &str, status: &Status) {
        match self {
            Progress::Bar(bar, _) => bar.inc(1),
            Progress::Lines { total, start } => {
                let what = match status {
                    Status::Ok { us, .. } => format!("{us:.1} us"),
                    Status::Wrong { .. } => "wrong output".to_string(),
                    Status::Failed { stage, .. } => format!("failed at {stage}"),
                    Status::Pruned { .. } => "pruned".to_string(),
                };
                eprintln!(
                    "  {n}/{total} configs, {:.1} s: {label}: {what}",
                    start.elapsed().as_secs_f64()
                );
            }
            Progress::Off => {}
        }
    }

    fn finish(&self) {
        if let Progress::Bar(bar, _) = self {
            bar.finish_and_clear();
        }
    }
}
