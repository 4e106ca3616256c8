//! Config spaces, declared next to each kernel family, with a pruning hook and tuning keys.
//!
//! A space lists the configurations a family can be compiled in; [`Limits`] and each
//! family's resource estimate ([`spgemv_fit`], [`search_fit`]) drop the ones that cannot
//! fit a multiprocessor (registers per thread, the register file at the requested
//! occupancy, shared memory, threads) before anything is compiled. A [`TuneKey`] buckets
//! shapes to powers of two, so one tuning result serves every shape of its bucket.
//!
//! ```
//! use dusk_aot::space::{self, Limits};
//! let all = space::spgemv(128, 4, 4);
//! assert!(all.contains(&dusk_kernels::spgemv::SpgemvConfig::new(128, 16, 4, 4)));
//! // Top-p search over rows of up to 8192 candidates: held in the registers of 4 warps,
//! // 64 a thread would not fit; streamed they would.
//! let (kept, pruned) = space::prune(space::search(8192, 1), &Limits::H100, space::search_fit);
//! assert!(!kept.iter().any(|c| !c.stream && c.num_warps == 4));
//! assert!(kept.iter().any(|c| c.stream && c.num_warps == 4));
//! assert!(!pruned.is_empty());
//! ```

use dusk_kernels::spgemv::{specialised_configs, words_per_row, SpgemvConfig};
use dusk_kernels::threshold::{shared_row_capacity, SearchConfig, MAX_BLOCK, MIN_BLOCK};
use serde::{Deserialize, Serialize};
use std::fmt;

/// What one multiprocessor offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_regs_per_thread: u32,
    pub regs_per_sm: u32,
    pub smem_per_program: u32,
    pub max_threads: u32,
}

impl Limits {
    /// Hopper (H100, H200) and Ampere (A100) alike: 255 registers a thread, 64K a
    /// multiprocessor, 227 KiB of shared memory a program, 1024 threads.
    pub const H100: Limits = Limits {
        max_regs_per_thread: 255,
        regs_per_sm: 65536,
        smem_per_program: 227 * 1024,
        max_threads: 1024,
    };
}

/// A config's estimated needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fit {
    pub threads: u32,
    pub regs_per_thread: u32,
    pub smem_bytes: u32,
    /// Programs per multiprocessor asked of ptxas (0: none).
    pub min_programs_per_sm: u32,
}

impl Fit {
    /// Why `self` cannot fit `limits`, if it cannot.
    pub fn check(&self, limits: &Limits) -> Result<(), String> {
        if self.threads == 0 || self.threads > limits.max_threads {
            return Err(format!("{} threads a program", self.threads));
        }
        let cap = if self.min_programs_per_sm > 0 {
            (limits.regs_per_sm / (self.min_programs_per_sm * self.threads))
                .min(limits.max_regs_per_thread)
        } else {
            limits.max_regs_per_thread
        };
        if self.regs_per_thread > cap {
            return Err(format!(
                "about {} registers a thread, at most {cap} fit",
                self.regs_per_thread
            ));
        }
        if self.smem_bytes > limits.smem_per_program {
            return Err(format!("{} bytes of shared memory", self.smem_bytes));
        }
        Ok(())
    }
}

/// Splits `space` into the configs that fit `limits` and the pruned ones with the reason.
pub fn prune<C>(space: Vec<C>, limits: &Limits, fit: fn(&C) -> Fit) -> (Vec<C>, Vec<(C, String)>) {
    let mut kept = vec![];
    let mut pruned = vec![];
    for c in space {
        match fit(&c).check(limits) {
            Ok(()) => kept.push(c),
            Err(why) => pruned.push((c, why)),
        }
    }
    (kept, pruned)
}

/// `spgemv_quant`'s space for a head_dim, GQA group and code width: every tiling compiled
/// into dusk-kernels for them (tokens per program, warps, occupancy request, `dp2a` or
/// tensor cores), the default first.
pub fn spgemv(head_dim: usize, group: usize, bits: u32) -> Vec<SpgemvConfig> {
    let default = SpgemvConfig::new(head_dim, 16, group, bits);
    let mut out = vec![default];
    for c in specialised_configs() {
        if (c.head_dim, c.group, c.bits) == (head_dim, group, bits) && !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// `spgemv_quant`'s needs: each thread holds `tokens * words / threads` code words three
/// times (codes, their high nibbles, the i32 accumulator) plus addressing; no shared
/// memory beyond the cross-warp reductions.
pub fn spgemv_fit(c: &SpgemvConfig) -> Fit {
    let threads = c.num_warps * 32;
    let words = words_per_row(c.head_dim, c.bits) as u32;
    let per_thread = (c.block_tokens as u32 * words).div_ceil(threads);
    // Several tiles a program hold the next tile's key rows, scales and zeros besides.
    let ahead = if c.tiles > 1 { per_thread / 2 } else { 0 };
    Fit {
        threads,
        regs_per_thread: 2 * per_thread + ahead + 24,
        smem_bytes: c.num_warps * 8 * 4,
        min_programs_per_sm: c.min_programs_per_sm,
    }
}

/// Staged in shared memory, then the tiles, warps and pivots a step to try.
type StreamedSpace = (bool, &'static [usize], &'static [u32], &'static [u32]);

/// The top-p search's space for rows of up to `max_len` candidates: the default first,
/// then streaming tiles of 1024 to 8192 on 4 to 16 warps with 1 or 3 pivots a step, the
/// weights staged in shared memory where rows fit (tiles of 1024 to 4096, 4 or 8 warps, 1
/// to 3 pivots), and,
/// when rows fit, blocks held
/// in registers on 4 to 32 warps (each at least 128 candidates a warp, what the prefix sum
/// of the compaction needs).
pub fn search(max_len: usize, group: usize) -> Vec<SearchConfig> {
    let mut out = vec![SearchConfig::for_rows(max_len, group)];
    let mut push = |c: SearchConfig| {
        if c.block >= 128 * c.num_warps as usize && !out.contains(&c) {
            out.push(c);
        }
    };
    // Streamed from the global workspace, then (where rows fit) staged in shared memory.
    let streamed: [StreamedSpace; 2] = [
        (false, &[1024, 2048, 4096, 8192], &[4, 8, 16], &[1, 3]),
        (true, &[1024, 2048, 4096], &[4, 8], &[1, 2, 3]),
    ];
    for (shared, blocks, warps, pivots) in streamed {
        if shared && max_len > shared_row_capacity(group) {
            continue;
        }
        for &block in blocks {
            for &num_warps in warps {
                for &pivots in pivots {
                    for histogram in [false, true] {
                        push(SearchConfig {
                            histogram,
                            ..SearchConfig::streamed(block, group, num_warps, pivots, shared)
                        });
                    }
                }
            }
        }
    }
    if max_len <= MAX_BLOCK {
        let mut block = max_len.next_power_of_two().max(MIN_BLOCK);
        while block <= MAX_BLOCK {
            for num_warps in [4, 8, 16, 32] {
                push(SearchConfig {
                    block,
                    group,
                    num_warps,
                    stream: false,
                    pivots: 1,
                    shared: false,
                    histogram: false,
                    recompute: false,
                    prefetch: false,
                    backoff_ns: 0,
                    min_programs_per_sm: 0,
                    timeline: false,
                    split_heads: false,
                });
            }
            block *= 2;
        }
    }
    out
}

/// The search's needs: held in registers, about 4 + 2 x pivots live values per candidate
/// a thread holds (8 a thread take 58 registers, 16 about 100); streamed, two accumulators
/// per pivot and candidate of a tile plus the row's bookkeeping (16 a thread, one pivot,
/// about 110; 32 a thread with four pivots spill and run 20x slower on an H100); a few
/// words of shared memory a warp for the exchanges.
pub fn search_fit(c: &SearchConfig) -> Fit {
    let threads = c.num_warps * 32;
    let per_thread = (c.block as u32).div_ceil(threads);
    let regs_per_thread = if c.stream {
        (2 * c.pivots + 2) * per_thread + 48
    } else {
        (4 + 2 * c.pivots) * per_thread + 8
    };
    Fit {
        threads,
        regs_per_thread,
        smem_bytes: 4 * c.num_warps * 8,
        min_programs_per_sm: 0,
    }
}

/// The bucket of a size: the next power of two (0 stays 0).
pub fn bucket(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        n.next_power_of_two()
    }
}

/// What a tuning result is valid for: a kernel family, the values its code depends on
/// (head_dim, group, bits), and shapes bucketed to powers of two (batch, heads, context,
/// budget).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TuneKey {
    pub family: String,
    /// Exact values: a config for one is not a config for another.
    pub exact: Vec<(String, usize)>,
    /// Powers of two.
    pub buckets: Vec<(String, usize)>,
}

impl TuneKey {
    /// `family`, its exact values, and `sizes` bucketed with [`bucket`].
    pub fn new(family: &str, exact: &[(&str, usize)], sizes: &[(&str, usize)]) -> TuneKey {
        TuneKey {
            family: family.into(),
            exact: exact.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            buckets: sizes
                .iter()
                .map(|(k, v)| (k.to_string(), bucket(*v)))
                .collect(),
        }
    }
}

impl fmt::Display for TuneKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.family)?;
        for (k, v) in &self.exact {
            write!(f, " {k}={v}")?;
        }
        for (k, v) in &self.buckets {
            write!(f, " {k}<={v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_of_one_bucket_share_a_key() {
        let a = TuneKey::new(
            "spgemv_quant",
            &[("head_dim", 128)],
            &[("context", 30000), ("batch", 32)],
        );
        let b = TuneKey::new(
            "spgemv_quant",
            &[("head_dim", 128)],
            &[("context", 32768), ("batch", 17)],
        );
        let c = TuneKey::new(
            "spgemv_quant",
            &[("head_dim", 128)],
            &[("context", 32769), ("batch", 32)],
        );
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(
            a.to_string(),
            "spgemv_quant head_dim=128 context<=32768 batch<=32"
        );
    }

    #[test]
    fn every_spgemv_default_fits_and_an_oversized_one_is_pruned() {
        for c in specialised_configs() {
            assert_eq!(spgemv_fit(&c).check(&Limits::H100), Ok(()), "{c:?}");
        }
        let mut big = SpgemvConfig::new(256, 16, 1, 8);
        big.block_tokens = 512;
        big.num_warps = 1;
        assert!(spgemv_fit(&big).check(&Limits::H100).is_err());
    }
}
