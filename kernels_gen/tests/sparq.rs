//! SparQ Attention through the CPU interpreter against Algorithm 1 computed in f64
//! (`selectors::sparq_reference`): the state written at append (the transposed copy of K,
//! the sums of V), the components, scores, kept tokens (ties as the top-k breaks them),
//! token lists, alpha, the mean of V and the mixed attention output, on fresh random inputs
//! with the outputs poisoned first; the edge cases; the error paths.

use dusk_kernels::attention_ops::AttentionPlan;
use dusk_kernels::ops::Dusk;
use dusk_kernels::paged::{KvShape, PageTable};
use dusk_kernels::reference;
use dusk_kernels::selectors::reference::top_k_row;
use dusk_kernels::selectors::sparq_bench::{ScoreConfig, SparqBench, SparqCase};
use dusk_kernels::selectors::sparq_reference::{
    paged_key, sparq_alpha, sparq_row, staged_rows, transpose_blocks, value_sums, SparqRow,
};
use dusk_kernels::selectors::{
    Budget, Keep, SparqBlocks, SparqEntry, SparqOptions, SparqPlan, SparqState, SparqUpdates,
};
use dusk_macros::kernel;
use half::f16;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

#[path = "support/inputs.rs"]
mod inputs;
use inputs::*;

/// Continuous values with a spread of magnitudes.
fn smooth(rng: &mut SmallRng, n: usize, scale: f32) -> Vec<f16> {
    (0..n)
        .map(|_| {
            let x: f32 = rng.random_range(-1.0..1.0) + rng.random_range(-1.0..1.0);
            f16::from_f32(x * scale)
        })
        .collect()
}

/// q on the grid of 1/16 in [-2, 2]: the group's sums of magnitudes are exact in f32 (the
/// components chosen are the reference's) and often tie (the tie rule is exercised).
fn grid_query(rng: &mut SmallRng, n: usize) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(rng.random_range(-32..=32) as f32 / 16.0))
        .collect()
}

/// Sequences of `lens` tokens on distinct random pages of a cache of `num_pages`.
fn table(rng: &mut SmallRng, lens: &[usize], page_size: usize, num_pages: usize) -> PageTable {
    let need = PageTable::pages_needed(lens, page_size);
    let mut ids: Vec<i32> = (0..num_pages as i32).collect();
    ids.shuffle(rng);
    ids.truncate(need);
    PageTable::from_lengths(lens, page_size, ids).unwrap()
}

struct Case {
    lens: Vec<usize>,
    num_kv_heads: usize,
    group: usize,
    head_dim: usize,
    page_size: usize,
    /// Tokens in a block of the transposed copy; `None`: the cache's pages
    /// (`SparqBlocks::pages_of`, the page table as the block table).
    block_size: Option<usize>,
    options: SparqOptions,
    /// Every page a copy of one of two pages: whole runs of scores tie exactly.
    tied: bool,
}

fn case(lens: &[usize], kv_heads: usize, group: usize, r: usize, k: Budget, window: usize) -> Case {
    Case {
        lens: lens.to_vec(),
        num_kv_heads: kv_heads,
        group,
        head_dim: 64,
        page_size: 16,
        block_size: None,
        options: SparqOptions { r, k, window },
        tied: false,
    }
}

/// Everything one run gave, downloaded.
struct Run {
    kv: KvShape,
    table: PageTable,
    q: Vec<f16>,
    k: Vec<f16>,
    v: Vec<f16>,
    plan: SparqPlan,
    kept: Vec<Vec<usize>>,
    alpha: Vec<f32>,
    flags: Vec<i32>,
    out: Vec<f16>,
}

/// Builds the state with `SparqUpdates::all` (over a poisoned copy of K, in blocks of
/// `c.block_size` scattered over a copy with spare blocks), checks it,
/// selects for a fresh query with the outputs poisoned, and attends; `q_edit` changes the
/// query first.
fn run(dusk: &Dusk, rng: &mut SmallRng, c: &Case, q_edit: impl FnOnce(&mut [f16])) -> Run {
    let ps = c.page_size;
    let pages = PageTable::pages_needed(&c.lens, ps) + 3;
    let kv = KvShape {
        num_pages: pages,
        page_size: ps,
        num_kv_heads: c.num_kv_heads,
        head_dim: c.head_dim,
    };
    let t = table(rng, &c.lens, ps, pages);
    let hq = c.num_kv_heads * c.group;
    let mut k = smooth(rng, kv.elements(), 1.5);
    if c.tied {
        let per_page = ps * kv.num_kv_heads * kv.head_dim;
        for i in 0..k.len() {
            k[i] = k[(i / per_page % 2) * per_page + i % per_page];
        }
    }
    let v = smooth(rng, kv.elements(), 1.0);
    let mut q = grid_query(rng, c.lens.len() * hq * c.head_dim);
    q_edit(&mut q);
    let dev = dusk.device();
    let (kb, vb, qb) = (
        dev.upload(&k).unwrap(),
        dev.upload(&v).unwrap(),
        dev.upload(&q).unwrap(),
    );
    let batch = c.lens.len();
    let (layout, blocks) = match c.block_size {
        None => (SparqBlocks::pages_of(&kv), t.clone()),
        Some(bs) => {
            let n = PageTable::pages_needed(&c.lens, bs) + 2;
            let layout = SparqBlocks {
                num_blocks: n,
                block_size: bs,
            };
            (layout, table(rng, &c.lens, bs, n))
        }
    };
    let mut state = SparqState::new(dusk, kv, batch, layout).unwrap();
    // Poisoned, so that a selection reading a token from where the state does not hold it
    // (an unfinished run's slots of the copy, a staged row past the run) reads NaN.
    let poison = vec![f16::NAN; state.k_t().len()];
    state.k_t_mut().copy_from_host(&poison).unwrap();
    let open_poison = vec![f16::NAN; state.k_open().len()];
    state.k_open_mut().copy_from_host(&open_poison).unwrap();
    let all = SparqUpdates::all(dusk, &state, &t, &blocks).unwrap();
    state.update(dusk, &kb, &vb, &all).unwrap();

    // The state: every finished run's tokens transposed into their blocks, the unfinished
    // runs staged, the sums of V.
    let (mut want_kt, mut want_open) = (poison.clone(), open_poison);
    let bs = layout.block_size;
    transpose_blocks(&k, &kv, &t, &blocks, bs, &mut want_kt, &mut want_open);
    let bits = |x: &[f16]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&state.k_t().download().unwrap()),
        bits(&want_kt),
        "k_t"
    );
    assert_eq!(
        bits(&state.k_open().download().unwrap()),
        bits(&want_open),
        "k_open"
    );
    let want_sums = value_sums(&v, &kv, &t);
    for (i, (g, w)) in state
        .v_sum()
        .download()
        .unwrap()
        .iter()
        .zip(&want_sums)
        .enumerate()
    {
        assert!(
            (*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "v_sum {i}: {g}, want {w}"
        );
    }

    let mut plan = SparqPlan::new(dusk, state, hq, &t, &blocks, c.options).unwrap();
    plan.poison_outputs(dusk, 0xFF).unwrap();
    plan.select(dusk, &qb).unwrap();
    let shape = plan.shape().clone();
    let items = plan.top_k_plan().sel_items().download().unwrap();
    let kept = shape
        .sel_item_indptr
        .windows(2)
        .map(|w| {
            items[w[0] as usize..w[1] as usize]
                .iter()
                .map(|i| *i as usize)
                .collect()
        })
        .collect();
    let attn = AttentionPlan::new(dusk, plan.attention_spec()).unwrap();
    let mut meta = plan.attention_meta(dusk, &attn, &t).unwrap();
    let mut out = dev.upload(&vec![f16::NAN; q.len()]).unwrap();
    let mut lse = dev.upload(&vec![f32::NAN; batch * hq]).unwrap();
    plan.attend(dusk, &attn, &mut meta, &qb, &kb, &vb, &mut out, &mut lse)
        .unwrap();
    let mut flags = plan.flags().download().unwrap();
    flags.truncate(shape.rows());
    Run {
        kv,
        alpha: plan.alpha().download().unwrap(),
        out: out.download().unwrap(),
        table: t,
        q,
        k,
        v,
        plan,
        kept,
        flags,
    }
}

/// Algorithm 1 in f64 for every row of a run.
fn reference_rows(r: &Run) -> Vec<SparqRow> {
    let (kv, t) = (&r.kv, &r.table);
    let opts = r.plan.options();
    let hq = r.q.len() / t.batch() / kv.head_dim;
    let mut rows = vec![];
    for b in 0..t.batch() {
        for h in 0..kv.num_kv_heads {
            let key = paged_key(&r.k, kv, t, b, h);
            let n = t.seq_len(b, kv.page_size);
            rows.push(sparq_row(
                &r.q,
                hq,
                kv.num_kv_heads,
                kv.head_dim,
                b,
                h,
                opts.r,
                n,
                &key,
            ));
        }
    }
    rows
}

/// Checks a run against Algorithm 1 in f64, row by row (rows in `skip` are flagged ones,
/// checked only for staying in bounds); returns the near-ties seen.
fn check(r: &Run, skip: &[usize]) -> usize {
    let (kv, t) = (&r.kv, &r.table);
    let opts = *r.plan.options();
    let shape = r.plan.shape();
    let hk = kv.num_kv_heads;
    let group = r.alpha.len() / t.batch() / hk;
    let rp = r.plan.padded_r();
    let dims = r.plan.dims().download().unwrap();
    let qs = r.plan.sparse_query().download().unwrap();
    let scores = r.plan.scores().download().unwrap();
    let lists = r.plan.sel_indices().download().unwrap();
    let v_mean = r.plan.v_mean().download().unwrap();
    let keep = Keep {
        sink: 0,
        recent: opts.window,
    };
    let want = reference_rows(r);
    let mut near_ties = 0;
    let mut want_alpha = vec![0f32; r.alpha.len()];
    let mut want_vmean = vec![0f32; v_mean.len()];
    let sums = value_sums(&r.v, kv, t);
    for (row, w) in want.iter().enumerate() {
        let (b, n) = (row / hk, t.seq_len(row / hk, kv.page_size));
        let d = kv.head_dim;
        for i in 0..d {
            want_vmean[row * d + i] = (sums[row * d + i] / n as f64) as f32;
        }
        if skip.contains(&row) {
            continue;
        }
        let got_dims: Vec<usize> = dims[row * rp..row * rp + opts.r]
            .iter()
            .map(|x| *x as usize)
            .collect();
        assert_eq!(got_dims, w.dims, "row {row}: components");
        assert!(
            dims[row * rp + opts.r..(row + 1) * rp]
                .iter()
                .all(|x| *x == 0),
            "row {row}: padding"
        );
        for g in 0..group {
            for (j, want_q) in w.sparse_query[g].iter().enumerate() {
                let got = qs[(row * rp + j) * group + g] as f64;
                assert!(
                    (got - want_q).abs() <= 1e-5 * (1.0 + want_q.abs()),
                    "row {row} head {g}: sparse query {j}"
                );
            }
        }
        let base = shape.item_indptr[b] as usize * hk + (row % hk) * n;
        let got: Vec<f64> = scores[base..base + n].iter().map(|s| *s as f64).collect();
        let scale = w.scores.iter().fold(1e-30f64, |m, s| m.max(s.abs()));
        let tol = 1e-5 * scale;
        for (i, (g, s)) in got.iter().zip(&w.scores).enumerate() {
            assert!(
                (g - s).abs() <= tol,
                "row {row} token {i}: score {g}, want {s}"
            );
        }
        // Kept: exactly the sort-based top-k of the kernel's own scores, and the f64
        // reference's but for near-ties at the cut.
        let k = shape.k_items[b] as usize;
        let kept = &r.kept[row];
        assert_eq!(kept, &top_k_row(&got, k, keep), "row {row}: kept tokens");
        let want_kept = top_k_row(&w.scores, k, keep);
        let cut = want_kept
            .iter()
            .filter(|&&i| i + opts.window < n)
            .map(|&i| w.scores[i])
            .fold(f64::INFINITY, f64::min);
        for i in kept.iter().filter(|i| !want_kept.contains(i)) {
            assert!(
                (w.scores[*i] - cut).abs() <= 2.0 * tol,
                "row {row}: token {i} kept, not a near-tie"
            );
            near_ties += 1;
        }
        let (lo, hi) = (
            shape.sel_indptr[row] as usize,
            shape.sel_indptr[row + 1] as usize,
        );
        let listed: Vec<usize> = lists[lo..hi].iter().map(|x| *x as usize).collect();
        assert_eq!(&listed, kept, "row {row}: token list");
        for g in 0..group {
            let a = if k >= n {
                1.0
            } else {
                sparq_alpha(&w.logits[g], kept)
            };
            let got_a = r.alpha[row * group + g];
            if k >= n {
                assert_eq!(got_a, 1.0, "row {row}: everything kept, alpha exactly 1");
            }
            assert!(
                (got_a as f64 - a).abs() <= 1e-5,
                "row {row} head {g}: alpha {got_a}, want {a}"
            );
            want_alpha[row * group + g] = a as f32;
        }
        for i in 0..kv.head_dim {
            let got = v_mean[row * kv.head_dim + i].to_f64();
            let want = want_vmean[row * kv.head_dim + i] as f64;
            assert!(
                (got - want).abs() <= 1e-3 * (1.0 + want.abs()),
                "row {row}: v_mean[{i}]"
            );
        }
        assert_eq!(r.flags[row], 0, "row {row} flagged");
    }
    // The output: attention over each KV head's kept tokens, mixed by alpha with the mean.
    let hq = hk * group;
    let tokens: Vec<Vec<i32>> = (0..t.batch() * hq)
        .map(|qr| {
            r.kept[(qr / hq) * hk + (qr % hq) / group]
                .iter()
                .map(|i| *i as i32)
                .collect()
        })
        .collect();
    let f = |x: &[f16]| x.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
    let (want_out, _) = reference::attention(
        &f(&r.q),
        &f(&r.k),
        &f(&r.v),
        hq,
        kv,
        t,
        &tokens,
        1.0 / (kv.head_dim as f64).sqrt(),
        Some((&want_alpha, &want_vmean)),
    );
    let d = kv.head_dim;
    let rows: Vec<usize> = (0..t.batch() * hq)
        .filter(|qr| !skip.contains(&((qr / hq) * hk + (qr % hq) / group)))
        .collect();
    let got: Vec<f32> = rows
        .iter()
        .flat_map(|qr| f(&r.out[qr * d..(qr + 1) * d]))
        .collect();
    let want: Vec<f64> = rows
        .iter()
        .flat_map(|qr| want_out[qr * d..(qr + 1) * d].to_vec())
        .collect();
    let err = reference::rel_error(&got, &want);
    assert!(err < 2e-3, "output rel err {err:.2e}");
    near_ties
}

#[test]
fn sparq_matches_algorithm_1() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(0x5a41);
    let mut cases = vec![
        // MHA, GQA 4 and 8; r a power of two, not one, and the whole head; partial pages.
        case(&[300, 37, 129], 2, 1, 8, Budget::Tokens(40), 8),
        case(&[250, 100], 2, 4, 12, Budget::Fraction(0.25), 16),
        case(&[200], 1, 8, 64, Budget::Tokens(50), 0),
        case(&[90, 161], 2, 2, 3, Budget::Fraction(0.125), 4),
    ];
    let mut wide = case(&[150, 47], 2, 4, 16, Budget::Tokens(30), 5);
    wide.head_dim = 128;
    cases.push(wide);
    // Cache pages of 8 and 32; the copy in blocks longer than a page, shorter than one,
    // and longer than a sequence.
    for (ps, bs) in [
        (8, None),
        (32, None),
        (16, Some(64)),
        (16, Some(8)),
        (8, Some(256)),
    ] {
        let mut c = case(&[190, 70], 2, 2, 8, Budget::Tokens(33), 6);
        c.page_size = ps;
        c.block_size = bs;
        cases.push(c);
    }
    let mut long = case(&[300, 129], 1, 4, 16, Budget::Fraction(0.2), 16);
    long.block_size = Some(128);
    cases.push(long);
    let mut tied = case(&[160, 96], 1, 1, 8, Budget::Tokens(37), 3);
    tied.tied = true;
    cases.push(tied);
    // Lengths just past a run's end, staging 16 to 31 tokens (the run before the unfinished
    // one copied in part), with the staged tokens crossing a score tile's end (261: tiles of
    // 256 up to 4 heads; 135: of 128 with one head over pages of 16, and from 8 heads on).
    cases.push(case(&[261, 16, 17, 31, 32], 2, 4, 8, Budget::Tokens(20), 4));
    cases.push(case(&[135, 47, 33], 2, 1, 8, Budget::Tokens(19), 2));
    let mut g8 = case(&[135, 40], 1, 8, 16, Budget::Tokens(30), 8);
    g8.block_size = Some(32);
    cases.push(g8);
    // Blocks of 8 (runs of 8, rings of 16): 8 to 15 tokens staged, and fewer.
    for lens in [&[263, 8, 9, 15, 16][..], &[70, 23, 3]] {
        let mut c = case(lens, 2, 2, 8, Budget::Tokens(12), 3);
        c.block_size = Some(8);
        cases.push(c);
    }
    for c in &cases {
        let r = run(&dusk, &mut rng, c, |_| {});
        check(&r, &[]);
    }
}

/// Tied pages: the kept tokens among equal scores are the lowest positions, as the top-k
/// breaks ties (the kernel's own scores tie exactly, and so do the reference's).
#[test]
fn ties_keep_the_lower_positions() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(7);
    let mut c = case(&[64], 1, 1, 8, Budget::Tokens(5), 0);
    c.tied = true;
    let r = run(&dusk, &mut rng, &c, |_| {});
    assert_eq!(check(&r, &[]), 0);
    // Tokens on physical pages of the same parity, at the same slot, have equal keys: a
    // kept token's equals at lower positions are kept too.
    let page = |i: usize| r.table.kv_page_indices[i / 16] % 2;
    let kept = &r.kept[0];
    for &i in kept {
        for j in (0..i).filter(|j| page(*j) == page(i) && j % 16 == i % 16) {
            assert!(kept.contains(&j), "{j} ties {i} and comes first: {kept:?}");
        }
    }
}

/// A sequence no longer than k keeps everything with alpha exactly 1 (the output is dense
/// attention); one page, and one token.
#[test]
fn short_sequences_keep_everything() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(11);
    for c in [
        case(&[40, 100], 2, 2, 8, Budget::Tokens(100), 8),
        case(&[11], 1, 4, 8, Budget::Tokens(4), 2),
        case(&[1, 16], 2, 1, 4, Budget::Tokens(8), 1),
        case(&[20], 1, 1, 8, Budget::Tokens(2), 20),
    ] {
        let r = run(&dusk, &mut rng, &c, |_| {});
        check(&r, &[]);
        for (row, kept) in r.kept.iter().enumerate() {
            let n = r.table.seq_len(row / c.num_kv_heads, c.page_size);
            let k = r.plan.shape().k_items[row / c.num_kv_heads] as usize;
            assert_eq!(kept.len(), k.min(n));
            if kept.len() == n {
                let g = c.group;
                assert!(r.alpha[row * g..(row + 1) * g].iter().all(|a| *a == 1.0));
            }
        }
    }
}

/// A NaN in one query head flags its row (its KV head's), leaves the other rows' results
/// exact, and reads and writes nothing out of bounds (the interpreter checks every access).
#[test]
fn nan_in_q_is_flagged() {
    let dusk = dusk();
    let mut rng = SmallRng::seed_from_u64(13);
    let c = case(&[120, 80], 2, 2, 8, Budget::Tokens(24), 4);
    // Sequence 1, query head 3 (KV head 1): a NaN.
    let hq = 4;
    let r = run(&dusk, &mut rng, &c, |q| q[(hq + 3) * 64 + 5] = f16::NAN);
    assert_eq!(r.flags, [0, 0, 0, 1]);
    check(&r, &[3]);
    let s = r.plan.shape();
    let lists = r.plan.sel_indices().download().unwrap();
    let n = r.table.seq_len(1, 16) as i32;
    assert!(lists[s.sel_indptr[3] as usize..s.sel_indptr[4] as usize]
        .iter()
        .all(|t| (0..n).contains(t)));
}

/// Two states hold the same copy of `table`'s tokens: the copy bit for bit (both were
/// zeroed, and a run is written whole), the unfinished runs' staged rows bit for bit, the
/// sums of V within f32 rounding.
fn same_state(a: &SparqState, b: &SparqState, table: &PageTable) {
    let (kv, run) = (a.kv(), a.run());
    assert_eq!(a.k_t().download().unwrap(), b.k_t().download().unwrap());
    let staged = |s: &SparqState| staged_rows(&s.k_open().download().unwrap(), &kv, table, run);
    assert_eq!(staged(a), staged(b));
    let (x, y) = (a.v_sum().download().unwrap(), b.v_sum().download().unwrap());
    for (x, y) in x.iter().zip(&y) {
        assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()));
    }
}

/// A decode step: one token appended to each sequence, added with `last_tokens`, gives the
/// state a rebuild over the new table gives (the copy in blocks of 32 over pages of 16; one
/// token finishes its run, copying the last slice of the run before, the other starts a
/// run, copying the first slice of the run before; each slice an entry of its own);
/// device-written entries out of range are skipped.
#[test]
fn appending_matches_a_rebuild() {
    let dusk = dusk();
    let dev = dusk.device();
    let mut rng = SmallRng::seed_from_u64(17);
    let kv = KvShape {
        num_pages: 12,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let layout = SparqBlocks {
        num_blocks: 5,
        block_size: 32,
    };
    let before = PageTable::from_lengths(&[31, 48], 16, vec![4, 9, 1, 7, 0]).unwrap();
    let after = PageTable::from_lengths(&[32, 49], 16, vec![4, 9, 1, 7, 0, 11]).unwrap();
    let blocks_before = PageTable::from_lengths(&[31, 48], 32, vec![2, 0, 3]).unwrap();
    let blocks_after = PageTable::from_lengths(&[32, 49], 32, vec![2, 0, 3]).unwrap();
    let (k, v) = (
        smooth(&mut rng, kv.elements(), 1.0),
        smooth(&mut rng, kv.elements(), 1.0),
    );
    let (kb, vb) = (dev.upload(&k).unwrap(), dev.upload(&v).unwrap());
    let mut stepped = SparqState::new(&dusk, kv, 2, layout).unwrap();
    let all = SparqUpdates::all(&dusk, &stepped, &before, &blocks_before).unwrap();
    stepped.update(&dusk, &kb, &vb, &all).unwrap();
    let last = SparqUpdates::last_tokens(&dusk, &stepped, &after, &blocks_after).unwrap();
    assert_eq!(last.len(), 4);
    stepped.update(&dusk, &kb, &vb, &last).unwrap();
    // Entries a device would write with bad values (a page, a slot, a sequence, a block,
    // a block slot out of range, a staged token off its place or past the ring, components
    // outside the key or backwards, `values` neither 0 nor 1): all skipped.
    let fine = SparqEntry {
        page: 3,
        start: 0,
        count: 1,
        seq: 0,
        block: 1,
        block_start: 0,
        stage: -1,
        copy_from: 0,
        copy_to: 64,
        values: true,
    };
    let mut bad: Vec<i32> = [
        SparqEntry { page: -1, ..fine },
        SparqEntry { page: 12, ..fine },
        SparqEntry {
            start: 15,
            count: 2,
            ..fine
        },
        SparqEntry { start: -1, ..fine },
        SparqEntry { seq: 2, ..fine },
        SparqEntry { block: 5, ..fine },
        SparqEntry {
            block_start: 31,
            count: 2,
            ..fine
        },
        SparqEntry {
            block_start: 3,
            stage: 2,
            ..fine
        },
        SparqEntry {
            block_start: 15,
            count: 2,
            stage: 31,
            ..fine
        },
        SparqEntry {
            copy_to: 65,
            ..fine
        },
        SparqEntry {
            copy_from: 9,
            copy_to: 8,
            ..fine
        },
        SparqEntry {
            copy_from: -1,
            ..fine
        },
    ]
    .iter()
    .flat_map(SparqEntry::fields)
    .collect();
    // And `values` 2.
    bad.extend([3, 0, 1, 0, 1, 0, -1, 0, 64, 2]);
    let bad = SparqUpdates::from_device(dev.upload(&bad).unwrap()).unwrap();
    assert_eq!(bad.len(), 13);
    stepped.update(&dusk, &kb, &vb, &bad).unwrap();
    let mut rebuilt = SparqState::new(&dusk, kv, 2, layout).unwrap();
    let all = SparqUpdates::all(&dusk, &rebuilt, &after, &blocks_after).unwrap();
    rebuilt.update(&dusk, &kb, &vb, &all).unwrap();
    same_state(&stepped, &rebuilt, &after);
    stepped.clear_values(&dusk).unwrap();
    assert!(stepped
        .v_sum()
        .download()
        .unwrap()
        .iter()
        .all(|x| *x == 0.0));
}

/// A decode step's append as `crate::cache`'s kernel makes it, with only SparQ's part: the
/// rows' tokens placed by the cache's own helpers, then `sparq_token`.
#[kernel(crate = "dusk_kernels::dusk_paths", num_warps = 1)]
#[allow(clippy::too_many_arguments)]
fn append_sparq<const D: usize, const ROWS: usize>(
    k_new: Ptr<f16>,
    v_new: Ptr<f16>,
    kv_indptr: Ptr<i32>,
    kv_page_indices: Ptr<i32>,
    kv_last_page_len: Ptr<i32>,
    blk_indptr: Ptr<i32>,
    blk_indices: Ptr<i32>,
    batch: i32,
    num_kv_heads: i32,
    page_size: i32,
    num_pages: i32,
    num_indices: i32,
    num_blk_indices: i32,
    num_blocks: i32,
    block_size: i32,
    k_t: Ptr<f16>,
    k_open: Ptr<f16>,
    v_sum: Ptr<f32>,
) {
    let rows = program_id(0) * ROWS + arange(0, ROWS);
    let row_ok = rows < batch * num_kv_heads;
    let b = rows / num_kv_heads;
    let h = rows % num_kv_heads;
    let page = dusk_kernels::cache::token::token_page(
        kv_indptr,
        kv_page_indices,
        kv_last_page_len,
        b,
        row_ok,
        page_size,
        num_pages,
        num_indices,
    );
    let slot = dusk_kernels::cache::token::token_slot(kv_last_page_len, b, page);
    dusk_kernels::selectors::sparq_kernels::sparq_token::<D, ROWS>(
        k_new,
        v_new,
        rows,
        h,
        page,
        slot,
        num_kv_heads,
        page_size,
        kv_indptr,
        blk_indptr,
        blk_indices,
        num_blk_indices,
        num_blocks,
        block_size,
        k_t,
        k_open,
        v_sum,
    );
}

/// `sparq_token`, SparQ's part of the one-launch append: a decode step whose new tokens
/// open a new page and a new block gives the state a rebuild over the new tables gives.
#[test]
fn the_append_part_matches_a_rebuild() {
    let dusk = dusk();
    let dev = dusk.device();
    let mut rng = SmallRng::seed_from_u64(19);
    let kv = KvShape {
        num_pages: 10,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let layout = SparqBlocks {
        num_blocks: 6,
        block_size: 32,
    };
    // Sequence 0 grows from 32 tokens to 33 (a new page, 9, and a new block, 5: its token
    // is staged, and the first slice of the run before it, in block 3, copied); sequence 1
    // from 47 to 48, finishing its run (the last slice of the run before copied, that run
    // now complete).
    let before = PageTable::from_lengths(&[32, 47], 16, vec![4, 2, 7, 0, 3]).unwrap();
    let after = PageTable::from_lengths(&[33, 48], 16, vec![4, 2, 9, 7, 0, 3]).unwrap();
    let blocks_before = PageTable::from_lengths(&[32, 47], 32, vec![1, 3, 0]).unwrap();
    let blocks_after = PageTable::from_lengths(&[33, 48], 32, vec![1, 5, 3, 0]).unwrap();
    let (k, v) = (
        smooth(&mut rng, kv.elements(), 1.0),
        smooth(&mut rng, kv.elements(), 1.0),
    );
    let (kb, vb) = (dev.upload(&k).unwrap(), dev.upload(&v).unwrap());
    // The new tokens' rows, [batch, num_kv_heads, D], taken from where they sit in the cache.
    let d = kv.head_dim;
    let new_row = |x: &[f16]| -> Vec<f16> {
        (0..2)
            .flat_map(|b| {
                let n = after.seq_len(b, 16) - 1;
                let page = after.kv_page_indices[after.kv_indptr[b] as usize + n / 16] as usize;
                (0..2)
                    .flat_map(|h| x[kv.k_row(page, n % 16, h) * d..][..d].to_vec())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let (k_new, v_new) = (
        dev.upload(&new_row(&k)).unwrap(),
        dev.upload(&new_row(&v)).unwrap(),
    );
    let mut stepped = SparqState::new(&dusk, kv, 2, layout).unwrap();
    let all = SparqUpdates::all(&dusk, &stepped, &before, &blocks_before).unwrap();
    stepped.update(&dusk, &kb, &vb, &all).unwrap();
    let up = |v: &[i32]| dev.upload(v).unwrap();
    let kernel = dusk.load(append_sparq::build::<64, 4>().unwrap()).unwrap();
    append_sparq::launch::<64, 4>(
        dev,
        &kernel,
        [1, 1, 1],
        &k_new,
        &v_new,
        &up(&after.kv_indptr),
        &up(&after.kv_page_indices),
        &up(&after.kv_last_page_len),
        &up(&blocks_after.kv_indptr),
        &up(&blocks_after.kv_page_indices),
        2,
        2,
        16,
        10,
        after.kv_page_indices.len() as i32,
        blocks_after.kv_page_indices.len() as i32,
        6,
        32,
        stepped.k_t(),
        stepped.k_open(),
        stepped.v_sum(),
    )
    .unwrap();
    let mut rebuilt = SparqState::new(&dusk, kv, 2, layout).unwrap();
    let all = SparqUpdates::all(&dusk, &rebuilt, &after, &blocks_after).unwrap();
    rebuilt.update(&dusk, &kb, &vb, &all).unwrap();
    same_state(&stepped, &rebuilt, &after);
}

#[test]
fn bad_arguments_are_typed_errors() {
    let dusk = dusk();
    let dev = dusk.device();
    let kv = KvShape {
        num_pages: 8,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let pages = SparqBlocks::pages_of(&kv);
    let t = PageTable::from_lengths(&[40, 20], 16, vec![0, 1, 2, 3, 4]).unwrap();
    let opts = SparqOptions {
        r: 8,
        k: Budget::Tokens(16),
        window: 4,
    };
    let state = || SparqState::new(&dusk, kv, 2, pages).unwrap();
    let plan = |o: SparqOptions| {
        SparqPlan::new(&dusk, state(), 4, &t, &t, o)
            .err()
            .map(arg_of)
    };
    assert_eq!(plan(SparqOptions { r: 0, ..opts }), Some("r"));
    assert_eq!(plan(SparqOptions { r: 65, ..opts }), Some("r"));
    let k = |k| SparqOptions { k, ..opts };
    assert_eq!(plan(k(Budget::Tokens(0))), Some("k"));
    assert_eq!(plan(k(Budget::Fraction(0.0))), Some("k"));
    assert_eq!(plan(k(Budget::Fraction(1.5))), Some("k"));
    assert_eq!(plan(SparqOptions { r: 64, ..opts }), None);
    let empty = PageTable::from_lengths(&[40, 0], 16, vec![0, 1, 2]).unwrap();
    let e = SparqPlan::new(&dusk, state(), 4, &empty, &empty, opts);
    assert_eq!(arg_of(e.err().unwrap()), "kv_indptr");
    let three = PageTable::from_lengths(&[1, 1, 1], 16, vec![0, 1, 2]).unwrap();
    let e = SparqPlan::new(&dusk, state(), 4, &three, &three, opts);
    assert_eq!(arg_of(e.err().unwrap()), "kv_indptr");
    let e = SparqPlan::new(&dusk, state(), 6, &t, &t, opts);
    assert_eq!(arg_of(e.err().unwrap()), "num_q_heads");
    let e = SparqPlan::new(&dusk, state(), 3, &t, &t, opts);
    assert_eq!(arg_of(e.err().unwrap()), "num_q_heads");
    // A block table of other lengths, or of blocks the copy has not.
    let shorter = PageTable::from_lengths(&[40, 19], 16, vec![0, 1, 2, 3, 4]).unwrap();
    let e = SparqPlan::new(&dusk, state(), 4, &t, &shorter, opts);
    assert_eq!(arg_of(e.err().unwrap()), "blocks");
    let outside = PageTable::from_lengths(&[40, 20], 16, vec![0, 1, 2, 3, 8]).unwrap();
    let e = SparqPlan::new(&dusk, state(), 4, &t, &outside, opts);
    assert_eq!(arg_of(e.err().unwrap()), "blocks");
    let e = SparqState::new(&dusk, KvShape { head_dim: 96, ..kv }, 2, pages);
    assert_eq!(arg_of(e.err().unwrap()), "head_dim");
    for block_size in [4, 512, 24] {
        let layout = SparqBlocks {
            num_blocks: 4,
            block_size,
        };
        let e = SparqState::new(&dusk, kv, 2, layout);
        assert_eq!(arg_of(e.err().unwrap()), "blocks");
    }
    let e = SparqState::new(&dusk, kv, 0, pages);
    assert_eq!(arg_of(e.err().unwrap()), "num_seqs");

    let mut p = SparqPlan::new(&dusk, state(), 4, &t, &t, opts).unwrap();
    let short = dev.upload(&[f16::ZERO; 10]).unwrap();
    assert_eq!(arg_of(p.select(&dusk, &short).unwrap_err()), "q");
    let cache = dev.upload(&vec![f16::ZERO; kv.elements()]).unwrap();
    let all = SparqUpdates::all(&dusk, p.state(), &t, &t).unwrap();
    assert_eq!(
        arg_of(p.update(&dusk, &short, &cache, &all).unwrap_err()),
        "k"
    );
    assert_eq!(
        arg_of(p.update(&dusk, &cache, &short, &all).unwrap_err()),
        "v"
    );
    let entry = SparqEntry {
        page: 1,
        start: 3,
        count: 13,
        seq: 1,
        block: 2,
        block_start: 3,
        stage: -1,
        copy_from: 0,
        copy_to: 64,
        values: true,
    };
    let upd = |e: SparqEntry| SparqUpdates::new(&dusk, p.state(), &[e]).err().map(arg_of);
    assert_eq!(upd(entry), None);
    assert_eq!(upd(SparqEntry { page: 8, ..entry }), Some("pages"));
    assert_eq!(upd(SparqEntry { block: -1, ..entry }), Some("blocks"));
    assert_eq!(upd(SparqEntry { seq: 2, ..entry }), Some("seqs"));
    assert_eq!(upd(SparqEntry { start: 4, ..entry }), Some("counts"));
    assert_eq!(upd(SparqEntry { count: 0, ..entry }), Some("counts"));
    assert_eq!(
        upd(SparqEntry {
            block_start: 4,
            ..entry
        }),
        Some("counts")
    );
    // Staged tokens at their place in the run (slot 3 of a block is place 3 of a run, row 3
    // or 19 of the ring of 32), inside the ring or past it, and off their place.
    let staged = SparqEntry {
        stage: 3,
        count: 1,
        ..entry
    };
    assert_eq!(upd(staged), None);
    assert_eq!(
        upd(SparqEntry {
            count: 13,
            ..staged
        }),
        None
    );
    assert_eq!(upd(SparqEntry { stage: 19, ..entry }), None);
    assert_eq!(upd(SparqEntry { stage: 2, ..staged }), Some("stages"));
    assert_eq!(
        upd(SparqEntry {
            stage: 20,
            ..staged
        }),
        Some("stages")
    );
    assert_eq!(
        upd(SparqEntry {
            stage: 35,
            ..staged
        }),
        Some("stages")
    );
    // Components copied: a slice, none, past the key, backwards.
    let part = |copy_from, copy_to| SparqEntry {
        copy_from,
        copy_to,
        ..entry
    };
    assert_eq!(upd(part(8, 16)), None);
    assert_eq!(upd(part(0, 0)), None);
    assert_eq!(upd(part(0, 65)), Some("copies"));
    assert_eq!(upd(part(9, 8)), Some("copies"));
    assert_eq!(upd(part(-1, 8)), Some("copies"));
    let e = SparqUpdates::from_device(dev.upload(&[0; 15]).unwrap());
    assert_eq!(arg_of(e.err().unwrap()), "entries");

    // The attention plan must be the one the selection asks for.
    let mut spec = p.attention_spec();
    spec.sparq = false;
    let attn = AttentionPlan::new(&dusk, spec).unwrap();
    assert_eq!(
        arg_of(p.attention_meta(&dusk, &attn, &t).err().unwrap()),
        "attn"
    );
}

/// The score kernel's other configurations (those the benchmark times,
/// `ScoreConfig::alternatives`: tiles, components in flight, with and without a group's
/// weights) give the plan's scores and softmax statistics, for MHA and a group of 4, on a
/// sequence that ends inside a block and inside a tile.
#[test]
fn score_configurations_agree_with_the_plan() {
    let dusk = dusk();
    for (hq, hkv) in [(4, 4), (8, 2)] {
        let case = SparqCase {
            batch: 2,
            context: 700,
            num_q_heads: hq,
            num_kv_heads: hkv,
            k: Budget::Tokens(64),
            window: 16,
            ..SparqCase::default()
        };
        let mut bench = SparqBench::new(&dusk, &case, |_| {}).unwrap();
        bench.check(&dusk, 4).unwrap();
        let configs = ScoreConfig::alternatives(hq / hkv);
        assert!(configs.len() >= 5);
        for cfg in configs {
            bench.check_score_config(&dusk, cfg).unwrap();
        }
    }
}
