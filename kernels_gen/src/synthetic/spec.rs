//! What to generate: the batch's lengths, the head counts and sizes, a profile per query
//! head, and the seed; checked once, before anything is made.

use super::hash::{mix, stream_key, Stream};
use super::profile::HeadProfile;
use crate::error::{ensure, Result};
use crate::paged::{KvShape, PageTable};

/// A synthetic decode batch: sequences of `seq_lens` tokens in a paged K/V cache
/// (`page_size` tokens a page), `num_q_heads` query heads over `num_kv_heads` KV heads of
/// `head_dim` channels, one [`HeadProfile`] per query head, all drawn from `seed`.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticSpec {
    pub seq_lens: Vec<usize>,
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub page_size: usize,
    /// One per query head.
    pub heads: Vec<HeadProfile>,
    pub seed: u64,
}

impl SyntheticSpec {
    /// Sequences of `seq_lens` tokens with the default layer of profiles
    /// ([`HeadProfile::layer`]).
    pub fn new(
        seq_lens: Vec<usize>,
        num_q_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        page_size: usize,
        seed: u64,
    ) -> SyntheticSpec {
        SyntheticSpec {
            heads: HeadProfile::layer(num_q_heads),
            seq_lens,
            num_q_heads,
            num_kv_heads,
            head_dim,
            page_size,
            seed,
        }
    }

    /// The paper's shape (Twilight Section 5.2): `batch` sequences of 32768 tokens, head_dim
    /// 128, pages of 16 (2 GiB each of K and V at batch 32 and 8 KV heads).
    pub fn paper(
        batch: usize,
        num_q_heads: usize,
        num_kv_heads: usize,
        seed: u64,
    ) -> SyntheticSpec {
        SyntheticSpec::new(vec![32768; batch], num_q_heads, num_kv_heads, 128, 16, seed)
    }

    pub fn batch(&self) -> usize {
        self.seq_lens.len()
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.num_q_heads / self.num_kv_heads.max(1)
    }

    /// The cache's shape: exactly the pages the batch needs.
    pub fn kv_shape(&self) -> KvShape {
        KvShape {
            num_pages: PageTable::pages_needed(&self.seq_lens, self.page_size),
            page_size: self.page_size,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
        }
    }

    /// The batch's page table: every page of the cache used once, in an order drawn from the
    /// seed (so that a sequence's pages are scattered, as in a serving engine's cache).
    pub fn page_table(&self) -> Result<PageTable> {
        self.validate()?;
        let n = self.kv_shape().num_pages;
        let key = stream_key(self.seed, Stream::Pages);
        // Sort by a hash of the index: a permutation that depends on the seed alone.
        let mut ids: Vec<i32> = (0..n as i32).collect();
        ids.sort_by_key(|i| (mix(key ^ *i as u32), *i));
        PageTable::from_lengths(&self.seq_lens, self.page_size, ids)
    }

    /// Checks every field; each error names the field.
    pub fn validate(&self) -> Result<()> {
        ensure!(
            !self.seq_lens.is_empty(),
            "seq_lens",
            "at least one sequence",
            "none",
        );
        if let Some(b) = self.seq_lens.iter().position(|n| *n == 0) {
            return Err(crate::error::invalid(
                "seq_lens",
                "sequences of at least one token",
                format!("0 tokens in sequence {b}"),
            ));
        }
        ensure!(
            self.num_kv_heads > 0,
            "num_kv_heads",
            "at least 1",
            self.num_kv_heads,
        );
        ensure!(
            self.num_q_heads > 0 && self.num_q_heads.is_multiple_of(self.num_kv_heads),
            "num_q_heads",
            format!(
                "a positive multiple of num_kv_heads ({})",
                self.num_kv_heads
            ),
            self.num_q_heads,
        );
        ensure!(
            self.heads.len() == self.num_q_heads,
            "heads",
            format!("one profile per query head ({})", self.num_q_heads),
            self.heads.len(),
        );
        self.heads.iter().try_for_each(HeadProfile::validate)?;
        // Ids the kernels hash: (sequence, head) pairs and positions fit in an i32.
        ensure!(
            self.batch() * self.num_q_heads < i32::MAX as usize,
            "seq_lens",
            "batch * num_q_heads under 2^31",
            self.batch() * self.num_q_heads,
        );
        ensure!(
            self.seq_lens.iter().all(|n| *n < i32::MAX as usize),
            "seq_lens",
            "sequences under 2^31 tokens",
            self.seq_lens.iter().max().copied().unwrap_or(0),
        );
        ensure!(
            self.page_size > 0,
            "page_size",
            "at least 1",
            self.page_size,
        );
        self.kv_shape().validate()
    }
}
