//! The append at a benchmark shape, for the GPU check: a cache of the full size (every
//! sequence's pages scattered over it) with the state of the parts' selector (Quest's,
//! Double Sparsity's labels, or SparQ's transposed copy, in blocks of its own scattered as
//! well, and sums of V), as many step inputs (a page table, SparQ's block table, new K and
//! V) as the timing harness rotates through, a check of the touched list on fresh inputs,
//! and the harness's timing of one step. The state's contents do not matter to the time;
//! the bit-exact checks are [`super::check`]'s.
//!
//! ```
//! use dusk_kernels::cache::bench::{AppendBench, AppendCase};
//! use dusk_kernels::ops::Dusk;
//! use dusk_runtime::Device;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dusk = Dusk::new(Device::cpu())?;
//! let case = AppendCase { batch: 3, context: 100, num_kv_heads: 2, ..AppendCase::default() };
//! let mut bench = AppendBench::new(&dusk, &case)?;
//! assert_eq!(bench.check(&dusk)?, 3); // sequences whose touched entry is right
//! let t = bench.time(&dusk)?;          // graph-timed on a GPU, wall clock here
//! assert!(t.median_us() > 0.0);
//! # Ok(()) }
//! ```

use super::append::{AppendConfig, AppendParts, AppendPlan, AppendTargets};
use crate::engines::CsrPages;
use crate::error::Result;
use crate::ops::{Dusk, QuantizedK};
use crate::paged::{KvShape, PageTable};
use crate::selectors::bench::Rng;
use crate::selectors::sparq_kernels::SPARQ_RUN;
use crate::selectors::{DsCalibration, DsState, SelectorState, SparqBlocks, SparqState, QUEST};
use dusk_runtime::{Buffer, Measured};
use half::f16;

/// A benchmark shape: one new token for each of `batch` sequences.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AppendCase {
    pub batch: usize,
    /// Tokens of sequence 0 after the append; in rotation set `i` sequence `b` holds
    /// `context - (b + i) % page_size`, so the new tokens fall on every slot of a page
    /// (the first, which starts Quest's state afresh, included), and with SparQ's part on
    /// every place of a run of its copy (each row copies the slice of the run before its
    /// token's that the place names), different sequences in different sets.
    pub context: usize,
    /// Every sequence holds `context` tokens instead (a multiple of 16): with SparQ's
    /// part every new token finishes a run at once, every row copying the last slice of
    /// the run before (the step in which every row moved a whole run into the copy, when
    /// runs were copied whole as they finished).
    pub finish_runs: bool,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub page_size: usize,
    pub parts: AppendParts,
    pub config: AppendConfig,
    /// Tokens in a block of SparQ's transposed copy (with `parts.sparq`).
    pub sparq_block_size: usize,
    pub seed: u64,
}

impl Default for AppendCase {
    /// Batch 64, 32k tokens, 8 KV heads of 128, pages of 16, INT4 and Quest (SparQ's
    /// blocks, when asked for, of 256 tokens).
    fn default() -> Self {
        AppendCase {
            batch: 64,
            context: 32768,
            finish_runs: false,
            num_kv_heads: 8,
            head_dim: 128,
            page_size: 16,
            parts: AppendParts {
                quantized: Some(4),
                quest: true,
                ..AppendParts::default()
            },
            config: AppendConfig::default(),
            sparq_block_size: 256,
            seed: 0xa99,
        }
    }
}

impl AppendCase {
    /// The sequences' lengths after the append (in rotation set 0).
    pub fn lens(&self) -> Vec<usize> {
        self.lens_at(0)
    }

    /// The sequences' lengths after the append in rotation set `set`.
    pub fn lens_at(&self, set: usize) -> Vec<usize> {
        (0..self.batch)
            .map(|b| match self.finish_runs {
                true => self.context,
                false => self.context - (b + set) % self.page_size,
            })
            .collect()
    }

    /// Pages of `size` tokens the sequences take in the set that takes the most.
    fn most_pages(&self, size: usize) -> usize {
        (0..self.page_size)
            .map(|set| PageTable::pages_needed(&self.lens_at(set), size))
            .max()
            .unwrap_or(0)
    }

    /// With SparQ's part, the (sequence, KV head) rows whose new token has a run before its
    /// own, of which it copies a slice into the copy (every row but those of sequences in
    /// their first run; each row stages its token).
    fn sparq_copying_rows(&self) -> usize {
        let run = self.sparq_block_size.min(SPARQ_RUN);
        let copying = self.lens().iter().filter(|n| **n > run).count();
        copying * self.num_kv_heads
    }
}

/// One step's inputs: the page table after the append and the new tokens.
struct StepInputs {
    table: CsrPages,
    k_new: Buffer<f16>,
    v_new: Buffer<f16>,
    /// SparQ's block table after the append (with `parts.sparq`).
    blocks: Option<CsrPages>,
    /// Each sequence's last page, for the check.
    last_pages: Vec<i32>,
}

/// The append planned at a benchmark shape.
pub struct AppendBench {
    case: AppendCase,
    kv: KvShape,
    plan: AppendPlan,
    k_cache: Buffer<f16>,
    v_cache: Buffer<f16>,
    quantized: Option<QuantizedK>,
    quest: Option<SelectorState>,
    ds: Option<DsState>,
    sparq: Option<SparqState>,
    sets: Vec<StepInputs>,
    last_lens: Vec<i32>,
}

impl AppendBench {
    /// The cache, the parts' state and the rotation sets of step inputs for `case` (each
    /// set its own lengths, [`AppendCase::lens_at`], and random placement of the
    /// sequences' pages).
    pub fn new(dusk: &Dusk, case: &AppendCase) -> Result<AppendBench> {
        let mut rng = Rng(case.seed);
        let ps = case.page_size;
        let num_pages = case.most_pages(ps);
        let kv = KvShape {
            num_pages,
            page_size: ps,
            num_kv_heads: case.num_kv_heads,
            head_dim: case.head_dim,
        };
        let plan = AppendPlan::with_config(dusk, kv, case.batch, case.parts, |c| *c = case.config)?;
        let dev = dusk.device();
        let quantized = match case.parts.quantized {
            Some(bits) => {
                let rows = kv.rows();
                Some(QuantizedK {
                    packed: dev.alloc(rows * kv.head_dim * bits as usize / 8)?,
                    scale: dev.alloc(rows)?,
                    zero: dev.alloc(rows)?,
                    kv,
                    bits,
                })
            }
            None => None,
        };
        let quest = match case.parts.quest {
            true => Some(SelectorState::new(dusk, &QUEST, kv)?),
            false => None,
        };
        // DS's channels: every (head_dim / r)-th.
        let ds = match case.parts.ds {
            Some(r) => {
                let channels = vec![(0..r).map(|i| i * kv.head_dim / r).collect(); kv.num_kv_heads];
                let cal = DsCalibration::from_channels(kv.head_dim, &channels)?;
                Some(DsState::new(dusk, kv, &cal)?)
            }
            None => None,
        };
        let bs = case.sparq_block_size;
        let num_blocks = case.most_pages(bs);
        let sparq = match case.parts.sparq {
            true => {
                let blocks = SparqBlocks {
                    num_blocks,
                    block_size: bs,
                };
                Some(SparqState::new(dusk, kv, case.batch, blocks)?)
            }
            false => None,
        };
        let token_values = case.batch * kv.num_kv_heads * kv.head_dim;
        let mut sets = vec![];
        for set in 0..dev.rotation_sets(Self::read_bytes_of(case, &kv)) {
            let lens = case.lens_at(set);
            let mut ids: Vec<i32> = (0..num_pages as i32).collect();
            for i in (1..ids.len()).rev() {
                ids.swap(i, rng.below(i + 1));
            }
            ids.truncate(PageTable::pages_needed(&lens, ps));
            let table = PageTable::from_lengths(&lens, ps, ids)?;
            let last_pages = (0..case.batch)
                .map(|b| table.kv_page_indices[table.kv_indptr[b + 1] as usize - 1])
                .collect();
            let mut token = || -> Vec<f16> {
                (0..token_values)
                    .map(|_| f16::from_f32(rng.unit() * 3.0))
                    .collect()
            };
            let (k_new, v_new) = (token(), token());
            let blocks = match case.parts.sparq {
                true => {
                    let mut ids: Vec<i32> = (0..num_blocks as i32).collect();
                    for i in (1..ids.len()).rev() {
                        ids.swap(i, rng.below(i + 1));
                    }
                    ids.truncate(PageTable::pages_needed(&lens, bs));
                    let t = PageTable::from_lengths(&lens, bs, ids)?;
                    Some(CsrPages {
                        kv_indptr: dev.upload(&t.kv_indptr)?,
                        kv_page_indices: dev.upload(&t.kv_page_indices)?,
                        kv_last_page_len: dev.upload(&t.kv_last_page_len)?,
                    })
                }
                false => None,
            };
            sets.push(StepInputs {
                table: plan.upload_table(dusk, &table)?,
                k_new: dev.upload(&k_new)?,
                v_new: dev.upload(&v_new)?,
                blocks,
                last_pages,
            });
        }
        let last_lens = case
            .lens()
            .iter()
            .map(|n| ((n - 1) % ps + 1) as i32)
            .collect();
        Ok(AppendBench {
            case: *case,
            kv,
            plan,
            k_cache: dev.alloc(kv.elements())?,
            v_cache: dev.alloc(kv.elements())?,
            quantized,
            quest,
            ds,
            sparq,
            sets,
            last_lens,
        })
    }

    /// Bytes one step reads: the new K and V, the page table's entries it looks at,
    /// Quest's minimum and maximum of the pages whose new token is not their first, DS's
    /// channels, SparQ's block table entries (the token's block and the previous run's),
    /// sums of V (added to) and the slices of staged tokens copied.
    fn read_bytes_of(case: &AppendCase, kv: &KvShape) -> usize {
        let rows = case.batch * kv.num_kv_heads;
        let tokens = 2 * rows * kv.head_dim * 2;
        let table = case.batch * 4 * 4;
        let ds = case.parts.ds.map_or(0, |r| kv.num_kv_heads * r * 4);
        let sparq = match case.parts.sparq {
            true => {
                let slices = case.sparq_copying_rows() * kv.head_dim * 2;
                case.batch * 4 * 4 + rows * kv.head_dim * 4 + slices
            }
            false => 0,
        };
        let continued = case
            .lens()
            .iter()
            .filter(|n| (*n - 1) % case.page_size != 0)
            .count();
        let quest = match case.parts.quest {
            true => 2 * continued * kv.num_kv_heads * kv.head_dim * 2,
            false => 0,
        };
        tokens + table + quest + ds + sparq
    }

    /// Bytes one step must move: what it reads ([`AppendBench::read_bytes`]), and what it
    /// writes: K and V into the cache, the quantized rows (codes, scale and zero), Quest's
    /// minimum and maximum, DS's labels, SparQ's staged keys, copied slices and sums of V,
    /// the touched list.
    pub fn bytes(&self) -> usize {
        let (kv, b) = (&self.kv, self.case.batch);
        let rows = b * kv.num_kv_heads;
        let cache = 2 * rows * kv.head_dim * 2;
        let quantized = self
            .case
            .parts
            .quantized
            .map_or(0, |bits| rows * (kv.head_dim * bits as usize / 8 + 4));
        let quest = if self.case.parts.quest {
            2 * rows * kv.head_dim * 2
        } else {
            0
        };
        let ds = self.case.parts.ds.map_or(0, |r| rows * r * 2);
        let sparq = if self.case.parts.sparq {
            (rows * 6 + self.case.sparq_copying_rows() * 2) * kv.head_dim
        } else {
            0
        };
        self.read_bytes() + cache + quantized + quest + ds + sparq + b * 8
    }

    /// Bytes one step reads (what the harness sizes its rotation by).
    pub fn read_bytes(&self) -> usize {
        Self::read_bytes_of(&self.case, &self.kv)
    }

    pub fn case(&self) -> &AppendCase {
        &self.case
    }
    pub fn kv(&self) -> KvShape {
        self.kv
    }
    /// Rotation sets (each its own page table and new tokens).
    pub fn sets(&self) -> usize {
        self.sets.len()
    }
    pub fn plan(&self) -> &AppendPlan {
        &self.plan
    }

    /// Plans the step again with `config` (the benchmark's sweep), over the same cache and
    /// inputs.
    pub fn set_config(&mut self, dusk: &Dusk, config: AppendConfig) -> Result<()> {
        let parts = self.case.parts;
        self.plan =
            AppendPlan::with_config(dusk, self.kv, self.case.batch, parts, |c| *c = config)?;
        self.case.config = config;
        Ok(())
    }

    fn step(&mut self, dusk: &Dusk, set: usize) -> Result<()> {
        let s = &self.sets[set];
        let targets = AppendTargets {
            k_cache: &mut self.k_cache,
            v_cache: &mut self.v_cache,
            quantized: self.quantized.as_mut(),
            quest: self.quest.as_mut(),
            ds: self.ds.as_mut(),
            sparq: self.sparq.as_mut().zip(s.blocks.as_ref()),
        };
        self.plan.run(dusk, &s.table, &s.k_new, &s.v_new, targets)
    }

    /// Runs set 0 with the touched list poisoned first and compares it with set 0's table
    /// (each sequence's last page and its tokens there); returns the sequences compared.
    pub fn check(&mut self, dusk: &Dusk) -> std::result::Result<usize, String> {
        let e = |x: crate::DuskError| x.to_string();
        self.plan.poison_outputs(dusk, 0xFF).map_err(e)?;
        self.step(dusk, 0).map_err(e)?;
        let pages = self
            .plan
            .touched()
            .pages()
            .download()
            .map_err(|x| x.to_string())?;
        let lens = self
            .plan
            .touched()
            .lens()
            .download()
            .map_err(|x| x.to_string())?;
        if pages != self.sets[0].last_pages || lens != self.last_lens {
            return Err("the touched list differs from the table's last pages".into());
        }
        Ok(pages.len())
    }

    /// The harness's timing of one step (`Device::time_calls`: graph replays over the
    /// rotation sets on a GPU).
    pub fn time(&mut self, dusk: &Dusk) -> Result<Measured> {
        let sets = self.sets.len();
        let dev = dusk.device().clone();
        Ok(dev.time_calls(sets, |i| self.step(dusk, i))?)
    }
}
