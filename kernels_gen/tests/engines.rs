//! The engine converters through the interpreter, against vLLM's and SGLang's layouts: the
//! CSR they write must be the page table those layouts describe (checked against plain
//! Rust and `PageTable::from_lengths`), on batches longer than one scan step, sequences of
//! more pages than one program copies, empty and cut sequences, pool rows and page ids out
//! of range, and padding rows and strides.

use dusk_kernels::engines::{self, CsrPages, EngineTable};
use dusk_kernels::ops::Dusk;
use dusk_kernels::paged::{KvShape, PageTable};
use dusk_kernels::DuskError;
use dusk_runtime::Device;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The table the converters must write: `(kv_indptr, pages, kv_last_page_len)`.
fn reference(
    lens: &[i32],
    page_size: i32,
    max_pages: i32,
    num_pages: i32,
    page_of: impl Fn(usize, i32) -> Option<i32>,
) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    let (mut indptr, mut pages, mut last) = (vec![0], vec![], vec![]);
    for (b, &len) in lens.iter().enumerate() {
        let len = len.max(0);
        let whole = (len + page_size - 1) / page_size;
        let mut n = whole.min(max_pages);
        if page_of(b, 0).is_none() {
            n = 0; // SGLang: a pool row out of range
        }
        for j in 0..n {
            pages.push(page_of(b, j).unwrap().clamp(0, num_pages - 1));
        }
        indptr.push(pages.len() as i32);
        last.push(match n {
            0 => 0,
            _ if n == whole => len - (n - 1) * page_size,
            _ => page_size,
        });
    }
    (indptr, pages, last)
}

fn poisoned(dusk: &Dusk, batch: usize, max_pages: usize) -> CsrPages {
    let mut out = CsrPages::alloc(dusk, batch, max_pages).unwrap();
    let dev = dusk.device();
    dev.fill_bytes(&mut out.kv_indptr, 0xAB).unwrap();
    dev.fill_bytes(&mut out.kv_page_indices, 0xAB).unwrap();
    dev.fill_bytes(&mut out.kv_last_page_len, 0xAB).unwrap();
    out
}

fn check_out(out: &CsrPages, want: &(Vec<i32>, Vec<i32>, Vec<i32>)) {
    let (indptr, pages, last) = want;
    assert_eq!(&out.kv_indptr.download().unwrap(), indptr);
    let got = out.kv_page_indices.download().unwrap();
    assert_eq!(&got[..pages.len()], &pages[..]);
    // Past the last page nothing is written.
    let poison = i32::from_ne_bytes([0xAB; 4]);
    assert!(got[pages.len()..].iter().all(|&p| p == poison));
    assert_eq!(
        &out.kv_last_page_len.download().unwrap()[..last.len()],
        &last[..]
    );
}

#[test]
fn vllm_block_table_to_csr() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let dev = dusk.device();
    let mut rng = SmallRng::seed_from_u64(7);
    let (page_size, num_pages) = (16usize, 5000usize);
    for (batch, max_pages, stride, extra_rows) in [(3, 4, 4, 0), (140, 9, 12, 5), (5, 300, 301, 2)]
    {
        let rows = batch + extra_rows;
        // Padding entries (past a row's pages, and the stride's tail) hold garbage.
        let table: Vec<i32> = (0..rows * stride)
            .map(|_| rng.random_range(-3..num_pages as i32 + 3))
            .collect();
        let cap = (max_pages * page_size) as i32;
        let mut lens: Vec<i32> = (0..batch).map(|_| rng.random_range(0..=cap)).collect();
        lens[0] = 0; // empty
        if batch > 2 {
            lens[1] = cap + 40; // longer than the row: cut to max_pages full pages
            lens[2] = page_size as i32; // exactly one page
        }
        let want = reference(
            &lens,
            page_size as i32,
            max_pages as i32,
            num_pages as i32,
            |b, j| Some(table[b * stride + j as usize]),
        );
        let mut out = poisoned(&dusk, batch, max_pages);
        let shape = EngineTable {
            rows,
            row_stride: stride,
            row_len: max_pages,
        };
        engines::vllm_to_csr(
            &dusk,
            &dev.upload(&table).unwrap(),
            shape,
            &dev.upload(&lens).unwrap(),
            page_size,
            num_pages,
            &mut out,
        )
        .unwrap();
        check_out(&out, &want);
    }
}

#[test]
fn vllm_csr_is_the_page_table_of_the_lengths() {
    // With ids in range and no cut, the result is `PageTable::from_lengths` and validates.
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let dev = dusk.device();
    let lens = [1usize, 16, 17, 100, 33];
    let max_pages = 8;
    let mut table = vec![0i32; lens.len() * max_pages];
    let mut ids = vec![];
    let mut next = 0;
    for (b, n) in lens.iter().enumerate() {
        for j in 0..n.div_ceil(16) {
            table[b * max_pages + j] = next;
            ids.push(next);
            next += 3;
        }
    }
    let mut out = CsrPages::alloc(&dusk, lens.len(), max_pages).unwrap();
    let shape = EngineTable {
        rows: lens.len(),
        row_stride: max_pages,
        row_len: max_pages,
    };
    let seq: Vec<i32> = lens.iter().map(|&n| n as i32).collect();
    engines::vllm_to_csr(
        &dusk,
        &dev.upload(&table).unwrap(),
        shape,
        &dev.upload(&seq).unwrap(),
        16,
        1000,
        &mut out,
    )
    .unwrap();
    let want = PageTable::from_lengths(&lens, 16, ids).unwrap();
    let indptr = out.kv_indptr.download().unwrap();
    let got = PageTable {
        kv_page_indices: out.kv_page_indices.download().unwrap()[..indptr[lens.len()] as usize]
            .to_vec(),
        kv_indptr: indptr,
        kv_last_page_len: out.kv_last_page_len.download().unwrap(),
    };
    assert_eq!(got, want);
    let kv = KvShape {
        num_pages: 1000,
        page_size: 16,
        num_kv_heads: 1,
        head_dim: 128,
    };
    got.validate(&kv).unwrap();
}

#[test]
fn sglang_req_to_token_to_csr() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let dev = dusk.device();
    let mut rng = SmallRng::seed_from_u64(11);
    for (page_size, batch, pool_rows, max_context, stride) in [
        (1usize, 6usize, 9usize, 40usize, 40usize),
        (16, 150, 160, 256, 260),
        (16, 4, 6, 16 * 300, 16 * 300),
    ] {
        let num_pages = 20_000usize;
        // Each pool row's tokens sit in pages of `page_size` consecutive slots.
        let mut req_to_token = vec![-1i32; pool_rows * stride];
        for r in 0..pool_rows {
            for p in 0..max_context / page_size {
                let page = rng.random_range(0..num_pages as i32);
                for s in 0..page_size {
                    req_to_token[r * stride + p * page_size + s] =
                        page * page_size as i32 + s as i32;
                }
            }
        }
        req_to_token[3 * stride] = -(page_size as i32) * 5; // a bad slot: clamped to page 0
        let mut pool: Vec<i32> = (0..batch)
            .map(|_| rng.random_range(0..pool_rows as i32))
            .collect();
        pool[batch - 1] = pool_rows as i32 + 2; // outside the pool: an empty sequence
        if batch > 4 {
            pool[1] = -1;
        }
        let mut lens: Vec<i32> = (0..batch)
            .map(|_| rng.random_range(0..=max_context as i32))
            .collect();
        lens[0] = max_context as i32; // a full row
        let max_pages = max_context / page_size;
        let want = reference(
            &lens,
            page_size as i32,
            max_pages as i32,
            num_pages as i32,
            |b, j| {
                let r = pool[b];
                (0..pool_rows as i32).contains(&r).then(|| {
                    req_to_token[r as usize * stride + j as usize * page_size] / page_size as i32
                })
            },
        );
        let mut out = poisoned(&dusk, batch, max_pages);
        let shape = EngineTable {
            rows: pool_rows,
            row_stride: stride,
            row_len: max_context,
        };
        engines::sglang_to_csr(
            &dusk,
            &dev.upload(&req_to_token).unwrap(),
            shape,
            &dev.upload(&pool).unwrap(),
            &dev.upload(&lens).unwrap(),
            page_size,
            num_pages,
            &mut out,
        )
        .unwrap();
        check_out(&out, &want);
    }
}

#[test]
fn converters_check_their_shapes() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let dev = dusk.device();
    let table = dev.upload(&[0i32; 4 * 8]).unwrap();
    let lens = dev.upload(&[3i32, 4, 5]).unwrap();
    let shape = EngineTable {
        rows: 4,
        row_stride: 8,
        row_len: 8,
    };
    let arg = |e: DuskError| match e {
        DuskError::InvalidArgument { arg, .. } => arg,
        other => panic!("{other}"),
    };
    // Outputs sized for another batch.
    let mut small = CsrPages::alloc(&dusk, 2, 8).unwrap();
    let e = engines::vllm_to_csr(&dusk, &table, shape, &lens, 16, 100, &mut small).unwrap_err();
    assert_eq!(arg(e), "kv_indptr");
    let mut out = CsrPages::alloc(&dusk, 3, 8).unwrap();
    // A table shorter than its shape says.
    let short = EngineTable { rows: 5, ..shape };
    let e = engines::vllm_to_csr(&dusk, &table, short, &lens, 16, 100, &mut out).unwrap_err();
    assert_eq!(arg(e), "table");
    // Fewer rows than sequences.
    let few = EngineTable { rows: 2, ..shape };
    let e = engines::vllm_to_csr(&dusk, &table, few, &lens, 16, 100, &mut out).unwrap_err();
    assert_eq!(arg(e), "block_table");
    let e = engines::vllm_to_csr(&dusk, &table, shape, &lens, 12, 100, &mut out).unwrap_err();
    assert_eq!(arg(e), "page_size");
    let pool = dev.upload(&[0i32, 1]).unwrap();
    let e =
        engines::sglang_to_csr(&dusk, &table, shape, &pool, &lens, 1, 100, &mut out).unwrap_err();
    assert_eq!(arg(e), "req_pool_indices");
}
