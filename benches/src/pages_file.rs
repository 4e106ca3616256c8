//! The pages a selector picked, per (sequence, KV head), as a file: what our benchmark
//! writes and `benches/baselines/pipeline_peers.py` reads, so that its `flashinfer-pages`
//! peer decodes exactly the pages our selector picked (DESIGN.md section 10).
//!
//! The format, little-endian throughout (`benches/baselines/pages_file.py` reads it):
//!
//! | bytes | what |
//! |---|---|
//! | 8 | the magic `DUSKPAGE` |
//! | 4 x i32 | version (1), `batch`, `num_q_heads`, `num_kv_heads` |
//! | i32 | `page_size` (tokens a page) |
//! | `batch` x i32 | each sequence's length in tokens |
//! | `batch * num_kv_heads + 1` x i32 | `indptr`: row `b * num_kv_heads + h` is `pages[indptr[r]..indptr[r + 1]]` |
//! | `indptr[rows]` x i32 | `pages`: page numbers within the row's sequence (0 is its first page), ascending |
//!
//! This is the CSR a selector plan gives (`SelectorPlan::sel_page_indptr`, `sel_pages`),
//! with the batch's shape in front; physical page ids stay out, since the peer makes a
//! cache of its own.

use std::error::Error;
use std::path::Path;

/// The file's first 8 bytes.
pub const MAGIC: &[u8; 8] = b"DUSKPAGE";
/// The format's version.
pub const VERSION: i32 = 1;

/// A selection of pages per (sequence, KV head) and the batch's shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageSelection {
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub page_size: usize,
    /// Tokens per sequence.
    pub seq_lens: Vec<usize>,
    /// `batch * num_kv_heads + 1` row offsets.
    pub indptr: Vec<i32>,
    /// Page numbers within each row's sequence, ascending per row.
    pub pages: Vec<i32>,
}

type Res<T> = Result<T, Box<dyn Error>>;

impl PageSelection {
    pub fn batch(&self) -> usize {
        self.seq_lens.len()
    }

    /// Checks the shape and the CSR: every row's pages inside its sequence, ascending.
    pub fn validate(&self) -> Res<()> {
        let rows = self.batch() * self.num_kv_heads;
        if rows == 0 || self.page_size == 0 || !self.num_q_heads.is_multiple_of(self.num_kv_heads) {
            return Err(format!(
                "pages file: batch {}, heads {}/{}, page_size {}: expected at least one \
                 sequence and KV head, query heads a multiple of the KV heads, pages of 1 or more",
                self.batch(),
                self.num_q_heads,
                self.num_kv_heads,
                self.page_size
            )
            .into());
        }
        if self.indptr.len() != rows + 1 || self.indptr[0] != 0 {
            return Err(format!(
                "pages file: indptr of {} entries from {:?}: expected {} from 0",
                self.indptr.len(),
                self.indptr.first(),
                rows + 1
            )
            .into());
        }
        if self.indptr.windows(2).any(|w| w[0] > w[1])
            || self.indptr[rows] as usize != self.pages.len()
        {
            return Err(format!(
                "pages file: indptr not non-decreasing up to the {} pages",
                self.pages.len()
            )
            .into());
        }
        for r in 0..rows {
            let n = self.seq_lens[r / self.num_kv_heads].div_ceil(self.page_size) as i32;
            let row = &self.pages[self.indptr[r] as usize..self.indptr[r + 1] as usize];
            let ascending = row.windows(2).all(|w| w[0] < w[1]);
            if !ascending || row.iter().any(|p| *p < 0 || *p >= n) {
                return Err(format!(
                    "pages file: row {r}: expected ascending pages in 0..{n}, found {row:?}"
                )
                .into());
            }
        }
        Ok(())
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Res<Vec<u8>> {
        self.validate()?;
        let header = [
            VERSION,
            self.batch() as i32,
            self.num_q_heads as i32,
            self.num_kv_heads as i32,
            self.page_size as i32,
        ];
        let lens = self.seq_lens.iter().map(|n| *n as i32);
        let words = header
            .into_iter()
            .chain(lens)
            .chain(self.indptr.iter().copied());
        let mut out = MAGIC.to_vec();
        out.extend(
            words
                .chain(self.pages.iter().copied())
                .flat_map(i32::to_le_bytes),
        );
        Ok(out)
    }

    /// Reads the file's bytes back (checked).
    pub fn from_bytes(bytes: &[u8]) -> Res<PageSelection> {
        let body = bytes
            .strip_prefix(MAGIC)
            .ok_or("pages file: no DUSKPAGE magic at the start")?;
        if body.len() % 4 != 0 {
            return Err(format!(
                "pages file: {} bytes after the magic, not whole i32s",
                body.len()
            )
            .into());
        }
        let words: Vec<i32> = body
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut at = 5;
        let take = |at: &mut usize, n: usize| -> Res<Vec<i32>> {
            let end = at.checked_add(n).ok_or("pages file: sizes overflow")?;
            let part = words
                .get(*at..end)
                .ok_or("pages file: shorter than its header says")?;
            *at = end;
            Ok(part.to_vec())
        };
        let header = take(&mut 0, 5)?;
        if header[0] != VERSION {
            return Err(format!("pages file: version {}, this reads {VERSION}", header[0]).into());
        }
        let count =
            |v: i32| usize::try_from(v).map_err(|_| format!("pages file: negative size {v}"));
        let (batch, num_q_heads, num_kv_heads, page_size) = (
            count(header[1])?,
            count(header[2])?,
            count(header[3])?,
            count(header[4])?,
        );
        let seq_lens = take(&mut at, batch)?
            .into_iter()
            .map(count)
            .collect::<Result<_, _>>()?;
        let indptr = take(&mut at, batch * num_kv_heads + 1)?;
        let nnz = count(*indptr.last().expect("at least one entry"))?;
        let pages = take(&mut at, nnz)?;
        if at != words.len() {
            return Err(format!("pages file: {} words past the pages", words.len() - at).into());
        }
        let s = PageSelection {
            num_q_heads,
            num_kv_heads,
            page_size,
            seq_lens,
            indptr,
            pages,
        };
        s.validate()?;
        Ok(s)
    }

    /// Writes the file.
    pub fn write(&self, path: &Path) -> Res<()> {
        std::fs::write(path, self.to_bytes()?)
            .map_err(|e| format!("{}: {e}", path.display()).into())
    }

    /// Reads a file.
    pub fn read(path: &Path) -> Res<PageSelection> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        PageSelection::from_bytes(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sequences (40 and 16 tokens, pages of 16), 4 query heads over 2 KV heads.
    fn selection() -> PageSelection {
        PageSelection {
            num_q_heads: 4,
            num_kv_heads: 2,
            page_size: 16,
            seq_lens: vec![40, 16],
            indptr: vec![0, 2, 3, 4, 4],
            pages: vec![0, 2, 2, 0],
        }
    }

    #[test]
    fn the_bytes_are_the_documented_layout() {
        let b = selection().to_bytes().unwrap();
        let words: Vec<i32> = b[8..]
            .chunks(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(&b[..8], b"DUSKPAGE");
        assert_eq!(words, [1, 2, 4, 2, 16, 40, 16, 0, 2, 3, 4, 4, 0, 2, 2, 0]);
        assert_eq!(PageSelection::from_bytes(&b).unwrap(), selection());
    }

    #[test]
    fn bad_selections_and_files_are_errors() {
        let mut s = selection();
        s.pages[1] = 3; // sequence 0 has pages 0..3
        assert!(s.to_bytes().unwrap_err().to_string().contains("row 0"));
        let mut s = selection();
        s.pages = vec![2, 0, 2, 0]; // not ascending
        assert!(s.validate().is_err());
        let mut s = selection();
        s.indptr.pop();
        assert!(s.validate().is_err());
        let mut s = selection();
        s.num_q_heads = 3;
        assert!(s.validate().is_err());
        let b = selection().to_bytes().unwrap();
        assert!(PageSelection::from_bytes(&b[..b.len() - 4]).is_err());
        assert!(PageSelection::from_bytes(&[b.as_slice(), &[0; 4]].concat()).is_err());
        assert!(PageSelection::from_bytes(&b[1..]).is_err());
        let mut v2 = b.clone();
        v2[8] = 2;
        assert!(PageSelection::from_bytes(&v2)
            .unwrap_err()
            .to_string()
            .contains("version 2"));
    }

    /// The Python reader the peer script uses reads what this writes.
    #[test]
    fn the_python_reader_reads_it() {
        let dir = std::env::temp_dir().join(format!("dusk-pages-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sel.pages");
        selection().write(&path).unwrap();
        let baselines = concat!(env!("CARGO_MANIFEST_DIR"), "/baselines");
        let out = std::process::Command::new("python3")
            .args([
                &format!("{baselines}/pages_file.py"),
                path.to_str().unwrap(),
            ])
            .output()
            .expect("python3 runs");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            text.trim(),
            r#"{"batch": 2, "num_q_heads": 4, "num_kv_heads": 2, "page_size": 16, "seq_lens": [40, 16], "indptr": [0, 2, 3, 4, 4], "pages": [0, 2, 2, 0]}"#
        );
    }
}
