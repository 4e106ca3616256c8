//! Double Sparsity (Yang et al. 2024): a calibration picks, per KV head, the `r` channels of
//! K that carry most of `q . k` ([`DsCalibration`], saved and loaded as JSON); a label
//! cache keeps those channels of every token ([`DsState`], written at append by
//! [`super::ds_kernels::ds_update`]); every step scores each token on its labels and keeps
//! the top tokens of each (sequence, KV head) with the shared top-k ([`DsPlan`]).
//!
//! DS sits beside the [`super::Selector`] API rather than in it: its kernels take a
//! calibration (the channels, an input that is neither state computed from K nor q), are
//! specialised by `r` (which the API's builders, `fn(&KvShape)`, cannot see), and score
//! tokens rather than pages (another grid and a token-offsets parameter). It shares the
//! rest: [`PageUpdates`], the top-k ([`TopKPlan`] over [`Items::Tokens`]), the budgets.
//!
//! ```
//! use dusk_kernels::ops::Dusk;
//! use dusk_kernels::paged::{KvShape, PageTable};
//! use dusk_kernels::selectors::{Budget, DsCalibration, DsOptions, DsPlan, PageUpdates};
//! use dusk_runtime::Device;
//! use half::f16;
//!
//! # fn main() -> Result<(), dusk_kernels::DuskError> {
//! let dusk = Dusk::new(Device::best())?;
//! let kv = KvShape { num_pages: 8, page_size: 16, num_kv_heads: 2, head_dim: 64 };
//! // Calibration from 32 sample tokens (4 query heads, 2 KV heads), 8 channels a KV head.
//! let f = |i: usize| f16::from_f32(((i * 7919) % 23) as f32 / 8.0 - 1.4);
//! let q: Vec<f16> = (0..32 * 4 * 64).map(f).collect();
//! let k: Vec<f16> = (0..32 * 2 * 64).map(|i| f(i + 5)).collect();
//! let cal = DsCalibration::calibrate(&q, &k, 4, 2, 64, 8)?;
//! let json = cal.to_json();                  // what a deployment saves
//! let cal = DsCalibration::from_json(&json)?; // validated on load
//!
//! // One sequence of 70 tokens on pages 7, 2, 5, 0, 1; keep 20 tokens, the last 4 always.
//! let table = PageTable::from_lengths(&[70], 16, vec![7, 2, 5, 0, 1])?;
//! let cache: Vec<f16> = (0..kv.elements()).map(f).collect();
//! let cache = dusk.device().upload(&cache)?;
//! let opts = DsOptions { sink: 0, recent: 4 };
//! let mut plan = DsPlan::new(&dusk, kv, &cal, 4, &table, Budget::Tokens(20), opts)?;
//! plan.update(&dusk, &cache, &PageUpdates::all(&dusk, &kv, &table)?)?; // every label
//! plan.select(&dusk, &dusk.device().upload(&q[..4 * 64])?)?;  // scores, top tokens
//! assert_eq!(plan.shape().sel_indptr, [0, 20, 40]);
//! let lists = plan.sel_indices().download()?;
//! assert_eq!(&lists[16..20], &[66, 67, 68, 69]); // the recent window, always kept
//! # Ok(()) }
//! ```

use super::ds_kernels::{ds_score, ds_update};
use super::selector::{Build, PageUpdates};
use super::topk::{Budget, Items, Keep, SelectionShape, TopKConfig, TopKPlan};
use crate::error::{ensure, invalid, Result};
use crate::ops::Dusk;
use crate::paged::{KvShape, PageTable};
use dusk_runtime::{Arg, Buffer, LoadedKernel};
use half::f16;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The label widths (`r`) dusk holds kernels for: the paper's `head_dim / 8` at 64, 128
/// and 256, and its neighbours.
pub const LABEL_WIDTHS: [usize; 3] = [8, 16, 32];

/// Token slots the update gathers at once (any page size: shorter pages are masked, longer
/// ones loop).
const SLOTS: usize = 16;

/// Tokens a score program covers: 4096 labels, 256 tokens at `r = 16`, on 4 warps (32
/// labels a thread, four 16-byte loads).
pub const fn score_tile(r: usize) -> usize {
    4096 / r
}

/// Per KV head, the `r` channels of K that DS keeps as labels: a calibration from sample
/// queries and keys, or one of the caller's. Valid by construction: `r` in `1..=head_dim`,
/// every channel in `0..head_dim`, no channel twice in a head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DsCalibration {
    head_dim: usize,
    r: usize,
    /// `num_kv_heads * r` channels, head-major (ascending within each head when
    /// calibrated; as given by `from_channels`).
    channels: Vec<usize>,
    /// Sample tokens the calibration was made from (0 for channels given directly).
    samples: usize,
}

/// The JSON form of a calibration (`DsCalibration::to_json`).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CalibrationFile {
    format: String,
    version: u32,
    head_dim: usize,
    num_kv_heads: usize,
    r: usize,
    samples: usize,
    /// One list of `r` channels per KV head.
    channels: Vec<Vec<usize>>,
}

const FORMAT: &str = "dusk-double-sparsity-calibration";
const VERSION: u32 = 1;

impl DsCalibration {
    /// Calibrates from `samples` tokens' queries and keys: `q` `[samples, num_q_heads,
    /// head_dim]` and `k` `[samples, num_kv_heads, head_dim]` (f16, f32 or f64). Per KV head
    /// `h` and channel `c`, the mean over the samples `s` and the group's query heads `g`
    /// of `|q_{s,g,c} * k_{s,h,c}|` (in f64, in a fixed order: the same samples give the
    /// same calibration); the `r` largest kept (ties toward the lower channel), listed
    /// ascending.
    pub fn calibrate<T: Copy + Into<f64>>(
        q: &[T],
        k: &[T],
        num_q_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        r: usize,
    ) -> Result<DsCalibration> {
        check_r(r, head_dim)?;
        ensure!(num_kv_heads > 0, "num_kv_heads", "at least 1", num_kv_heads);
        ensure!(
            num_q_heads > 0 && num_q_heads.is_multiple_of(num_kv_heads),
            "num_q_heads",
            format!("a positive multiple of num_kv_heads ({num_kv_heads})"),
            num_q_heads,
        );
        let q_row = num_q_heads * head_dim;
        ensure!(
            !q.is_empty() && q.len().is_multiple_of(q_row),
            "q",
            format!(
                "samples x num_q_heads x head_dim values, at least one sample ({q_row} a sample)"
            ),
            q.len(),
        );
        let samples = q.len() / q_row;
        ensure!(
            k.len() == samples * num_kv_heads * head_dim,
            "k",
            format!(
                "{} values ({samples} samples x num_kv_heads x head_dim)",
                samples * num_kv_heads * head_dim
            ),
            k.len(),
        );
        if let Some(i) = q.iter().position(|x| !(*x).into().is_finite()) {
            return Err(invalid(
                "q",
                "finite sample values",
                format!("a non-finite value at {i}"),
            ));
        }
        if let Some(i) = k.iter().position(|x| !(*x).into().is_finite()) {
            return Err(invalid(
                "k",
                "finite sample values",
                format!("a non-finite value at {i}"),
            ));
        }
        let group = num_q_heads / num_kv_heads;
        let mut channels = Vec::with_capacity(num_kv_heads * r);
        for h in 0..num_kv_heads {
            let mut stat = vec![0.0f64; head_dim];
            for s in 0..samples {
                let kr = (s * num_kv_heads + h) * head_dim;
                for g in 0..group {
                    let qr = (s * num_q_heads + h * group + g) * head_dim;
                    for (c, st) in stat.iter_mut().enumerate() {
                        *st += (q[qr + c].into() * k[kr + c].into()).abs();
                    }
                }
            }
            // The mean's divisor is the same for every channel: rank the sums.
            let mut order: Vec<usize> = (0..head_dim).collect();
            order.sort_by(|&a, &b| stat[b].total_cmp(&stat[a]).then(a.cmp(&b)));
            let mut kept = order[..r].to_vec();
            kept.sort_unstable();
            channels.extend(kept);
        }
        Ok(DsCalibration {
            head_dim,
            r,
            channels,
            samples,
        })
    }

    /// A calibration of the caller's: `channels[h]` the channels of KV head `h` (each
    /// list `r` long, as given: label `j` of a token is channel `channels[h][j]`).
    pub fn from_channels(head_dim: usize, channels: &[Vec<usize>]) -> Result<DsCalibration> {
        Self::validated(head_dim, channels, 0)
    }

    fn validated(
        head_dim: usize,
        channels: &[Vec<usize>],
        samples: usize,
    ) -> Result<DsCalibration> {
        ensure!(head_dim > 0, "head_dim", "at least 1", head_dim);
        ensure!(
            !channels.is_empty(),
            "channels",
            "one list per KV head, at least one",
            "none",
        );
        let r = channels[0].len();
        check_r(r, head_dim)?;
        for (h, list) in channels.iter().enumerate() {
            ensure!(
                list.len() == r,
                "channels",
                format!("{r} channels for every KV head (as many as head 0)"),
                format!("{} for head {h}", list.len()),
            );
            if let Some(c) = list.iter().find(|c| **c >= head_dim) {
                return Err(invalid(
                    "channels",
                    format!("channels in 0..{head_dim}"),
                    format!("{c} for head {h}"),
                ));
            }
            let mut seen = vec![false; head_dim];
            for c in list {
                ensure!(
                    !seen[*c],
                    "channels",
                    "distinct channels in each head",
                    format!("{c} twice for head {h}"),
                );
                seen[*c] = true;
            }
        }
        Ok(DsCalibration {
            head_dim,
            r,
            channels: channels.concat(),
            samples,
        })
    }

    /// The calibration as JSON (`format`, `version`, `head_dim`, `num_kv_heads`, `r`,
    /// `samples`, `channels`: one list per KV head); the same calibration gives the same
    /// text.
    pub fn to_json(&self) -> String {
        let file = CalibrationFile {
            format: FORMAT.into(),
            version: VERSION,
            head_dim: self.head_dim,
            num_kv_heads: self.num_kv_heads(),
            r: self.r,
            samples: self.samples,
            channels: self
                .channels
                .chunks(self.r)
                .map(<[usize]>::to_vec)
                .collect(),
        };
        serde_json::to_string_pretty(&file).expect("a calibration serialises")
    }

    /// A calibration from [`DsCalibration::to_json`]'s text, validated as
    /// [`DsCalibration::from_channels`] validates (errors name `calibration` for text that
    /// is not such a file, else `r`, `channels`, `num_kv_heads`).
    pub fn from_json(text: &str) -> Result<DsCalibration> {
        let file: CalibrationFile = serde_json::from_str(text).map_err(|e| {
            invalid(
                "calibration",
                "a dusk Double Sparsity calibration (JSON)",
                e,
            )
        })?;
        ensure!(
            file.format == FORMAT && file.version == VERSION,
            "calibration",
            format!("format `{FORMAT}` version {VERSION}"),
            format!("format `{}` version {}", file.format, file.version),
        );
        ensure!(
            file.channels.len() == file.num_kv_heads,
            "num_kv_heads",
            format!("as many as the channel lists ({})", file.channels.len()),
            file.num_kv_heads,
        );
        ensure!(
            file.channels.first().is_none_or(|l| l.len() == file.r),
            "r",
            "the length of every channel list",
            file.r,
        );
        Self::validated(file.head_dim, &file.channels, file.samples)
    }

    /// Writes [`DsCalibration::to_json`] to `path` (an error naming `path` when it cannot).
    pub fn save(&self, path: &std::path::Path) -> Result<()> {
        std::fs::write(path, self.to_json()).map_err(|e| {
            invalid(
                "path",
                "a writable file",
                format!("{}: {e}", path.display()),
            )
        })
    }

    /// Reads a calibration saved by [`DsCalibration::save`].
    pub fn load(path: &std::path::Path) -> Result<DsCalibration> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            invalid(
                "path",
                "a readable file",
                format!("{}: {e}", path.display()),
            )
        })?;
        Self::from_json(&text)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }
    pub fn num_kv_heads(&self) -> usize {
        self.channels.len() / self.r
    }
    /// Labels per token and KV head.
    pub fn r(&self) -> usize {
        self.r
    }
    /// Sample tokens it was calibrated on (0 for channels given directly).
    pub fn samples(&self) -> usize {
        self.samples
    }
    /// The channels of KV head `h`.
    pub fn head(&self, h: usize) -> &[usize] {
        &self.channels[h * self.r..(h + 1) * self.r]
    }
    /// Every head's channels, head-major (`[num_kv_heads, r]`), as the kernels take them.
    pub fn channels(&self) -> &[usize] {
        &self.channels
    }
}

fn check_r(r: usize, head_dim: usize) -> Result<()> {
    ensure!(
        r >= 1 && r <= head_dim,
        "r",
        format!("1 to head_dim ({head_dim}) channels a KV head"),
        r,
    );
    Ok(())
}

/// The labels of a cache of one shape for one calibration, on the device, and the
/// compiled update kernel. Per physical page (f16 `[num_pages, num_kv_heads, page_size,
/// r]`), so it outlives the plans of successive steps.
pub struct DsState {
    kv: KvShape,
    calibration: DsCalibration,
    channels: Buffer<i32>,
    labels: Buffer<f16>,
    update: Arc<LoadedKernel>,
}

impl DsState {
    /// Allocates the labels for `kv` (zeroed: update the pages before selecting), uploads
    /// `calibration`'s channels and compiles the update kernel.
    pub fn new(dusk: &Dusk, kv: KvShape, calibration: &DsCalibration) -> Result<DsState> {
        kv.validate()?;
        let r = calibration.r();
        ensure!(
            calibration.head_dim() == kv.head_dim && calibration.num_kv_heads() == kv.num_kv_heads,
            "calibration",
            format!(
                "a calibration for head_dim {} and {} KV heads",
                kv.head_dim, kv.num_kv_heads
            ),
            format!(
                "head_dim {} and {} KV heads",
                calibration.head_dim(),
                calibration.num_kv_heads()
            ),
        );
        let build = update_kernel(&kv, calibration).ok_or_else(|| {
            invalid(
                "r",
                format!("a label width dusk has kernels for ({LABEL_WIDTHS:?})"),
                r,
            )
        })?;
        let len = kv.rows() * r;
        ensure!(len < (1usize << 40), "kv shape", "under 2^40 labels", len);
        let update = dusk.kernel(format!("ds update {kv:?} r {r}"), build)?;
        let dev = dusk.device();
        let mut labels = dev.alloc::<f16>(len)?;
        dev.fill_bytes(&mut labels, 0)?;
        let ch: Vec<i32> = calibration.channels().iter().map(|c| *c as i32).collect();
        Ok(DsState {
            kv,
            calibration: calibration.clone(),
            channels: dev.upload(&ch)?,
            labels,
            update,
        })
    }

    /// Writes the labels of `updates`' pages from `k` (f16, the cache of this state's
    /// shape): one launch, no allocation, no sync.
    pub fn update(&mut self, dusk: &Dusk, k: &Buffer<f16>, updates: &PageUpdates) -> Result<()> {
        let kv = self.kv;
        ensure!(
            k.len() == kv.elements(),
            "k",
            format!("{} f16 values ({kv:?})", kv.elements()),
            k.len(),
        );
        if updates.is_empty() {
            return Ok(());
        }
        let args = [
            Arg::from(k),
            Arg::from(updates.pages()),
            Arg::from(updates.lens()),
            Arg::I32(kv.num_pages as i32),
            Arg::I32(kv.num_kv_heads as i32),
            Arg::I32(kv.page_size as i32),
            Arg::from(&self.channels),
            Arg::from(&self.labels),
        ];
        let grid = [updates.len() as u32, kv.num_kv_heads as u32, 1];
        dusk.device().launch(&self.update, grid, &args)?;
        Ok(())
    }

    pub fn kv(&self) -> KvShape {
        self.kv
    }
    pub fn calibration(&self) -> &DsCalibration {
        &self.calibration
    }
    /// The channels on the device, i32 `[num_kv_heads, r]` (what an append kernel passes
    /// to [`super::ds_kernels::write_token_labels`]).
    pub fn channels(&self) -> &Buffer<i32> {
        &self.channels
    }
    /// The label cache, f16 `[num_pages, num_kv_heads, page_size, r]`.
    pub fn labels(&self) -> &Buffer<f16> {
        &self.labels
    }
    /// The label cache, to write (labels computed elsewhere, an append kernel's).
    pub fn labels_mut(&mut self) -> &mut Buffer<f16> {
        &mut self.labels
    }
}

/// What DS always keeps beside the top-scoring tokens (they count toward the budget).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DsOptions {
    /// The first tokens of each sequence (attention sinks).
    pub sink: usize,
    /// The last tokens of each sequence (a local window).
    pub recent: usize,
}

impl DsOptions {
    pub fn keep(&self) -> Keep {
        Keep {
            sink: self.sink,
            recent: self.recent,
        }
    }
}

/// DS's update kernel for a cache of shape `kv` and `calibration`'s label width, when
/// dusk holds one.
pub fn update_kernel(kv: &KvShape, calibration: &DsCalibration) -> Option<Build> {
    Some(match (kv.head_dim, calibration.r()) {
        (64, 8) => ds_update::build::<64, 8, SLOTS>,
        (64, 16) => ds_update::build::<64, 16, SLOTS>,
        (64, 32) => ds_update::build::<64, 32, SLOTS>,
        (128, 8) => ds_update::build::<128, 8, SLOTS>,
        (128, 16) => ds_update::build::<128, 16, SLOTS>,
        (128, 32) => ds_update::build::<128, 32, SLOTS>,
        (256, 8) => ds_update::build::<256, 8, SLOTS>,
        (256, 16) => ds_update::build::<256, 16, SLOTS>,
        (256, 32) => ds_update::build::<256, 32, SLOTS>,
        _ => return None,
    })
}

macro_rules! score_table {
    ($($d:literal: $($g:literal)*;)*) => {
        /// DS's score kernel for head_dim `d`, a group of `g` and `r` labels.
        fn score_build(d: usize, g: usize, r: usize) -> Option<Build> {
            Some(match (d, g, r) {
                $($(
                    ($d, $g, 8) => ds_score::build::<$d, $g, 8, { score_tile(8) }, 4> as Build,
                    ($d, $g, 16) => ds_score::build::<$d, $g, 16, { score_tile(16) }, 4> as Build,
                    ($d, $g, 32) => ds_score::build::<$d, $g, 32, { score_tile(32) }, 4> as Build,
                )*)*
                _ => return None,
            })
        }
    };
}

score_table! {
    64: 1 2 4 8 16;
    128: 1 2 4 8 16;
    256: 1 2 4 8 16;
}

/// DS's score kernel for a cache of shape `kv`, a group of `group` query heads per KV head
/// and `r` labels, when dusk holds one (what the ptxas check assembles).
pub fn score_kernel(kv: &KvShape, group: usize, r: usize) -> Option<Build> {
    score_build(kv.head_dim, group, r)
}

/// DS over one page table: the label scores of every token of every (sequence, KV head)
/// and the top-k of each row as CSR token lists, sized and uploaded once; `select`
/// allocates nothing and never syncs.
pub struct DsPlan {
    state: DsState,
    score: Arc<LoadedKernel>,
    topk: TopKPlan,
    batch: usize,
    num_q_heads: usize,
    kv_indptr: Buffer<i32>,
    kv_page_indices: Buffer<i32>,
    token_indptr: Buffer<i32>,
    scores: Buffer<f32>,
    score_grid: [u32; 3],
}

impl DsPlan {
    /// Allocates the labels for `kv` (zeroed: update the pages before selecting) and plans
    /// selecting `budget` tokens of every sequence of `table` for `num_q_heads` query heads.
    pub fn new(
        dusk: &Dusk,
        kv: KvShape,
        calibration: &DsCalibration,
        num_q_heads: usize,
        table: &PageTable,
        budget: Budget,
        options: DsOptions,
    ) -> Result<DsPlan> {
        let state = DsState::new(dusk, kv, calibration)?;
        Self::with_state(dusk, state, num_q_heads, table, budget, options)
    }

    /// As [`DsPlan::new`] over existing labels (from [`DsPlan::into_state`]): the next
    /// step's plan keeps the cache.
    pub fn with_state(
        dusk: &Dusk,
        state: DsState,
        num_q_heads: usize,
        table: &PageTable,
        budget: Budget,
        options: DsOptions,
    ) -> Result<DsPlan> {
        Self::with_config(dusk, state, num_q_heads, table, budget, options, |_| {})
    }

    /// As [`DsPlan::with_state`], with `tune` changing the top-k's configuration.
    pub fn with_config(
        dusk: &Dusk,
        state: DsState,
        num_q_heads: usize,
        table: &PageTable,
        budget: Budget,
        options: DsOptions,
        tune: impl FnOnce(&mut TopKConfig),
    ) -> Result<DsPlan> {
        let kv = state.kv;
        let r = state.calibration.r();
        ensure!(
            num_q_heads > 0 && num_q_heads.is_multiple_of(kv.num_kv_heads),
            "num_q_heads",
            format!("a positive multiple of num_kv_heads ({})", kv.num_kv_heads),
            num_q_heads,
        );
        let group = num_q_heads / kv.num_kv_heads;
        let build = score_build(kv.head_dim, group, r).ok_or_else(|| {
            invalid(
                "num_q_heads",
                "a GQA group DS has a score kernel for (1, 2, 4, 8 or 16 query heads a KV head)",
                format!("{num_q_heads} query heads: a group of {group}"),
            )
        })?;
        let keep = options.keep();
        let topk = TopKPlan::with_config(dusk, table, kv, Items::Tokens, budget, keep, tune)?;
        let tile = score_tile(r);
        let tiles = topk.shape().max_items().div_ceil(tile).max(1);
        ensure!(
            tiles <= 65535,
            "kv_indptr",
            format!("at most {} tokens a sequence", 65535 * tile),
            topk.shape().max_items(),
        );
        let score = dusk.kernel(format!("ds score {kv:?} group {group} r {r}"), build)?;
        let dev = dusk.device();
        let nonempty = |v: &[i32]| if v.is_empty() { vec![0] } else { v.to_vec() };
        Ok(DsPlan {
            score,
            batch: table.batch(),
            num_q_heads,
            kv_indptr: dev.upload(&table.kv_indptr)?,
            kv_page_indices: dev.upload(&nonempty(&table.kv_page_indices))?,
            token_indptr: dev.upload(&topk.shape().item_indptr)?,
            scores: dev.alloc(topk.shape().num_scores().max(1))?,
            score_grid: [topk.shape().rows() as u32, tiles as u32, 1],
            topk,
            state,
        })
    }

    /// Writes the labels of `updates`' pages from `k` ([`DsState::update`]).
    pub fn update(&mut self, dusk: &Dusk, k: &Buffer<f16>, updates: &PageUpdates) -> Result<()> {
        self.state.update(dusk, k, updates)
    }

    /// Scores every token of every row for `q` (f16 `[batch, num_q_heads, head_dim]`) into
    /// [`DsPlan::scores`]: one launch.
    pub fn score(&mut self, dusk: &Dusk, q: &Buffer<f16>) -> Result<()> {
        let kv = self.state.kv;
        let qlen = self.batch * self.num_q_heads * kv.head_dim;
        ensure!(
            q.len() == qlen,
            "q",
            format!("{qlen} f16 values (batch x num_q_heads x head_dim)"),
            q.len(),
        );
        let args = [
            Arg::from(q),
            Arg::from(&self.kv_indptr),
            Arg::from(&self.kv_page_indices),
            Arg::from(&self.token_indptr),
            Arg::from(&self.scores),
            Arg::I32(kv.num_kv_heads as i32),
            Arg::I32(kv.page_size.trailing_zeros() as i32),
            Arg::from(&self.state.channels),
            Arg::from(&self.state.labels),
        ];
        dusk.device().launch(&self.score, self.score_grid, &args)?;
        Ok(())
    }

    /// The top-k of the last scores, as token lists: one launch.
    pub fn top_k(&mut self, dusk: &Dusk) -> Result<()> {
        self.topk.run(dusk, &self.scores)
    }

    /// Scores and selects: two launches, no allocation, no sync.
    pub fn select(&mut self, dusk: &Dusk, q: &Buffer<f16>) -> Result<()> {
        self.score(dusk, q)?;
        self.top_k(dusk)
    }

    /// Fills the scores and every output with `byte` (checks poison them first).
    pub fn poison_outputs(&mut self, dusk: &Dusk, byte: u8) -> Result<()> {
        dusk.device().fill_bytes(&mut self.scores, byte)?;
        self.topk.poison_outputs(dusk, byte)
    }

    pub fn state(&self) -> &DsState {
        &self.state
    }
    pub fn state_mut(&mut self) -> &mut DsState {
        &mut self.state
    }
    /// The labels, for the plan of the next page table.
    pub fn into_state(self) -> DsState {
        self.state
    }
    /// The shared top-k (its configuration, sizes and outputs).
    pub fn top_k_plan(&self) -> &TopKPlan {
        &self.topk
    }
    /// The score kernel's copy of the page table (`kv_indptr`, `kv_page_indices`) and its
    /// tokens before each sequence (`token_indptr`), for a step that writes them on the
    /// device.
    pub(crate) fn table_buffers(&self) -> [&Buffer<i32>; 3] {
        [&self.kv_indptr, &self.kv_page_indices, &self.token_indptr]
    }
    /// The selection's sizes, known at plan time (host copies).
    pub fn shape(&self) -> &SelectionShape {
        self.topk.shape()
    }
    /// Token scores: row `(b, h)` at `tokens before b * num_kv_heads + h * len_b`.
    pub fn scores(&self) -> &Buffer<f32> {
        &self.scores
    }
    /// Token lists' row offsets (`batch * num_kv_heads + 1`, fixed by the plan).
    pub fn sel_indptr(&self) -> &Buffer<i32> {
        self.topk.sel_indptr()
    }
    /// Kept token positions, ascending in each row.
    pub fn sel_indices(&self) -> &Buffer<i32> {
        self.topk.sel_indices()
    }
    /// 1 for a row whose scores held a NaN or an infinity (a NaN in q), else 0.
    pub fn flags(&self) -> &Buffer<i32> {
        self.topk.flags()
    }
}
