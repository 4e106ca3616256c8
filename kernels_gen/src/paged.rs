//! Host-side descriptions of a paged KV cache and of token selections, validated once so
//! that kernels never read out of bounds.
//!
//! Shapes follow the serving engines' convention (FlashInfer, vLLM, SGLang): pages of
//! `[page_size, num_kv_heads, head_dim]` ("NHD"), a batch's pages in CSR form.

use crate::error::{ensure, invalid, Result};

/// The shape of a paged KV cache: `[num_pages, page_size, num_kv_heads, head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub num_pages: usize,
    pub page_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl KvShape {
    /// Rows of `head_dim` values: one per (page, slot, head).
    pub fn rows(&self) -> usize {
        self.num_pages * self.page_size * self.num_kv_heads
    }
    pub fn elements(&self) -> usize {
        self.rows() * self.head_dim
    }
    /// The row of token slot `slot` of physical page `page` for KV head `head` in this
    /// (engine, "NHD") layout: `(page * page_size + slot) * num_kv_heads + head`.
    pub fn k_row(&self, page: usize, slot: usize, head: usize) -> usize {
        (page * self.page_size + slot) * self.num_kv_heads + head
    }
    /// The same token's row in dusk's quantized copy of K ([`crate::ops::QuantizedK`]),
    /// which is head-major, `[num_pages, num_kv_heads, page_size]` rows: `(page *
    /// num_kv_heads + head) * page_size + slot`. One KV head's page is one contiguous run of
    /// `page_size` rows.
    pub fn quantized_row(&self, page: usize, slot: usize, head: usize) -> usize {
        (page * self.num_kv_heads + head) * self.page_size + slot
    }
    pub(crate) fn validate(&self) -> Result<()> {
        ensure!(
            self.num_pages > 0,
            "num_pages",
            "at least 1",
            self.num_pages,
        );
        ensure!(
            self.page_size.is_power_of_two(),
            "page_size",
            "a power of two",
            self.page_size,
        );
        ensure!(
            self.num_kv_heads > 0,
            "num_kv_heads",
            "at least 1",
            self.num_kv_heads,
        );
        ensure!(
            matches!(self.head_dim, 64 | 128 | 256),
            "head_dim",
            "64, 128 or 256",
            self.head_dim,
        );
        ensure!(
            self.elements() < (1usize << 40),
            "kv shape",
            "under 2^40 elements",
            self.elements(),
        );
        Ok(())
    }
}

/// Which pages hold each sequence of a batch: `kv_indptr[batch + 1]`, `kv_page_indices[nnz]`
/// and `kv_last_page_len[batch]` (tokens used in each sequence's last page).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageTable {
    pub kv_indptr: Vec<i32>,
    pub kv_page_indices: Vec<i32>,
    pub kv_last_page_len: Vec<i32>,
}

impl PageTable {
    /// Pages that sequences of `seq_lens` tokens occupy in all.
    pub fn pages_needed(seq_lens: &[usize], page_size: usize) -> usize {
        seq_lens.iter().map(|n| n.div_ceil(page_size)).sum()
    }

    /// The table of sequences of `seq_lens` tokens whose pages are, in order, `page_ids`
    /// (one id per page, [`PageTable::pages_needed`] of them).
    pub fn from_lengths(
        seq_lens: &[usize],
        page_size: usize,
        page_ids: Vec<i32>,
    ) -> Result<PageTable> {
        ensure!(page_size > 0, "page_size", "at least 1", page_size);
        let needed = Self::pages_needed(seq_lens, page_size);
        ensure!(
            page_ids.len() == needed,
            "page_ids",
            format!("{needed} ids, one per page used"),
            page_ids.len(),
        );
        let mut kv_indptr = vec![0i32];
        let mut kv_last_page_len = vec![];
        for n in seq_lens {
            let pages = n.div_ceil(page_size);
            kv_indptr.push(kv_indptr[kv_indptr.len() - 1] + pages as i32);
            kv_last_page_len.push(if pages == 0 {
                0
            } else {
                (n - (pages - 1) * page_size) as i32
            });
        }
        Ok(PageTable {
            kv_indptr,
            kv_page_indices: page_ids,
            kv_last_page_len,
        })
    }

    pub fn batch(&self) -> usize {
        self.kv_indptr.len().saturating_sub(1)
    }

    /// Tokens in sequence `b`.
    pub fn seq_len(&self, b: usize, page_size: usize) -> usize {
        let pages = (self.kv_indptr[b + 1] - self.kv_indptr[b]) as usize;
        if pages == 0 {
            0
        } else {
            (pages - 1) * page_size + self.kv_last_page_len[b] as usize
        }
    }

    /// Checks the CSR structure, every page index against `kv`, and each last-page length.
    pub fn validate(&self, kv: &KvShape) -> Result<()> {
        ensure!(
            !self.kv_indptr.is_empty(),
            "kv_indptr",
            "batch + 1 entries",
            "an empty array",
        );
        let batch = self.batch();
        ensure!(
            batch > 0,
            "kv_indptr",
            "at least 2 entries (batch >= 1)",
            self.kv_indptr.len(),
        );
        ensure!(
            self.kv_indptr[0] == 0,
            "kv_indptr",
            "kv_indptr[0] == 0",
            self.kv_indptr[0],
        );
        for w in self.kv_indptr.windows(2) {
            ensure!(
                w[0] <= w[1],
                "kv_indptr",
                "non-decreasing offsets",
                format!("{} then {}", w[0], w[1]),
            );
        }
        let nnz = *self.kv_indptr.last().expect("non-empty") as usize;
        ensure!(
            nnz == self.kv_page_indices.len(),
            "kv_page_indices",
            format!("{nnz} entries (kv_indptr[batch])"),
            self.kv_page_indices.len(),
        );
        if let Some(bad) = self
            .kv_page_indices
            .iter()
            .find(|p| **p < 0 || **p as usize >= kv.num_pages)
        {
            return Err(invalid(
                "kv_page_indices",
                format!("page ids in 0..{}", kv.num_pages),
                bad,
            ));
        }
        ensure!(
            self.kv_last_page_len.len() == batch,
            "kv_last_page_len",
            format!("{batch} entries"),
            self.kv_last_page_len.len(),
        );
        for b in 0..batch {
            let pages = self.kv_indptr[b + 1] - self.kv_indptr[b];
            let last = self.kv_last_page_len[b];
            let ok = if pages == 0 {
                last == 0
            } else {
                last >= 1 && last as usize <= kv.page_size
            };
            ensure!(
                ok,
                "kv_last_page_len",
                format!("1..={} for a sequence with pages, 0 without", kv.page_size),
                format!("{last} for sequence {b}"),
            );
        }
        Ok(())
    }
}

/// Candidate (or selected) token positions in CSR form, one row per (batch, KV head):
/// row `b * num_kv_heads + h` lists positions in sequence `b`, ascending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenLists {
    pub indptr: Vec<i32>,
    pub indices: Vec<i32>,
}

impl TokenLists {
    /// Every token of every sequence, for each KV head (dense scoring).
    pub fn all_tokens(table: &PageTable, page_size: usize, num_kv_heads: usize) -> TokenLists {
        let mut indptr = vec![0i32];
        let mut indices = vec![];
        for b in 0..table.batch() {
            let n = table.seq_len(b, page_size) as i32;
            for _ in 0..num_kv_heads {
                indices.extend(0..n);
                indptr.push(indices.len() as i32);
            }
        }
        TokenLists { indptr, indices }
    }

    /// Row `r` holds the first `lens[r]` token positions (`0..lens[r]`): every token of
    /// sequences of those lengths, one row each.
    pub fn leading(lens: &[usize]) -> TokenLists {
        let mut indptr = vec![0i32];
        let mut indices = vec![];
        for &n in lens {
            indices.extend(0..n as i32);
            indptr.push(indices.len() as i32);
        }
        TokenLists { indptr, indices }
    }

    /// The tokens of the chosen pages: `pages[b * num_kv_heads + h]` lists page numbers
    /// within sequence `b` (as a Quest selection gives), ascending.
    pub fn from_pages(
        table: &PageTable,
        page_size: usize,
        num_kv_heads: usize,
        pages: &[Vec<usize>],
    ) -> TokenLists {
        let mut indptr = vec![0i32];
        let mut indices = vec![];
        for (r, ps) in pages.iter().enumerate() {
            let n = table.seq_len(r / num_kv_heads, page_size);
            for p in ps {
                let lo = p * page_size;
                indices.extend((lo..(lo + page_size).min(n)).map(|t| t as i32));
            }
            indptr.push(indices.len() as i32);
        }
        TokenLists { indptr, indices }
    }

    pub fn rows(&self) -> usize {
        self.indptr.len().saturating_sub(1)
    }
    pub fn row(&self, r: usize) -> &[i32] {
        &self.indices[self.indptr[r] as usize..self.indptr[r + 1] as usize]
    }
    pub fn max_row_len(&self) -> usize {
        self.indptr
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0)
    }

    /// Checks the row offsets of lists whose positions a previous stage writes on the
    /// device (a selector's, a pruner's): one row per (batch, KV head) of `table`, offsets
    /// from 0, non-decreasing, and no row longer than its sequence (positions are distinct).
    pub fn validate_indptr(
        arg: &'static str,
        indptr: &[i32],
        table: &PageTable,
        page_size: usize,
        num_kv_heads: usize,
    ) -> Result<()> {
        let rows = table.batch() * num_kv_heads;
        ensure!(
            indptr.len() == rows + 1,
            arg,
            format!("{} indptr entries (batch * num_kv_heads + 1)", rows + 1),
            indptr.len(),
        );
        ensure!(indptr[0] == 0, arg, "indptr[0] == 0", indptr[0]);
        for (r, w) in indptr.windows(2).enumerate() {
            let n = table.seq_len(r / num_kv_heads, page_size) as i64;
            let len = w[1] as i64 - w[0] as i64;
            ensure!(
                (0..=n).contains(&len),
                arg,
                format!("row {r} of 0..={n} positions (non-decreasing offsets)"),
                len,
            );
        }
        Ok(())
    }

    /// Checks the CSR structure and that every position lies inside its sequence.
    pub fn validate(
        &self,
        arg: &'static str,
        table: &PageTable,
        page_size: usize,
        num_kv_heads: usize,
    ) -> Result<()> {
        let rows = table.batch() * num_kv_heads;
        ensure!(
            self.indptr.len() == rows + 1,
            arg,
            format!("{} indptr entries (batch * num_kv_heads + 1)", rows + 1),
            self.indptr.len(),
        );
        ensure!(self.indptr[0] == 0, arg, "indptr[0] == 0", self.indptr[0]);
        for w in self.indptr.windows(2) {
            ensure!(
                w[0] <= w[1],
                arg,
                "non-decreasing indptr",
                format!("{} then {}", w[0], w[1]),
            );
        }
        let nnz = *self.indptr.last().expect("non-empty") as usize;
        ensure!(
            nnz == self.indices.len(),
            arg,
            format!("{nnz} indices (indptr[rows])"),
            self.indices.len(),
        );
        for r in 0..rows {
            let n = table.seq_len(r / num_kv_heads, page_size) as i32;
            if let Some(bad) = self.row(r).iter().find(|t| **t < 0 || **t >= n) {
                return Err(invalid(
                    arg,
                    format!("token positions in 0..{n} for row {r}"),
                    bad,
                ));
            }
        }
        Ok(())
    }
}
