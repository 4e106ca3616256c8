//! The stock kernels through the CPU interpreter, against the host references, on random
//! shapes: odd lengths, one token, partly filled last pages, GQA ratios 1, 4 and 8, 4 and
//! 8 bits, all tokens and random page selections. And the error paths.

use dusk_kernels::ops::{Dusk, QuantizedK, SpgemvPlan};
use dusk_kernels::paged::{KvShape, PageTable, TokenLists};
use dusk_kernels::reference;
use dusk_kernels::spgemv::{self, SpgemvConfig};
use dusk_runtime::Device;
use half::f16;
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

#[path = "support/inputs.rs"]
mod inputs;
use inputs::*;

fn table_for(seq_lens: &[usize], page_size: usize, rng: &mut SmallRng) -> (PageTable, usize) {
    let total = PageTable::pages_needed(seq_lens, page_size);
    let mut ids: Vec<i32> = (0..total as i32).collect();
    ids.shuffle(rng);
    (
        PageTable::from_lengths(seq_lens, page_size, ids).unwrap(),
        total.max(1),
    )
}

fn random_f16(rng: &mut SmallRng, n: usize) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(rng.random_range(-3.0f32..3.0)))
        .collect()
}

/// Every (page, slot, KV head) of a cache.
fn every_row(kv: &KvShape) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    (0..kv.num_pages).flat_map(move |p| {
        (0..kv.page_size).flat_map(move |s| (0..kv.num_kv_heads).map(move |h| (p, s, h)))
    })
}

/// Quantizes and scores one random case on the interpreter; checks both against the
/// references.
fn check(
    seed: u64,
    seq_lens: &[usize],
    kv_heads: usize,
    group: usize,
    bits: u32,
    head_dim: usize,
    page_frac: Option<f64>,
) {
    check_with(
        seed, seq_lens, kv_heads, group, bits, head_dim, page_frac, false,
    )
}

/// As `check`, choosing the tensor-core scoring kernel or the `dp2a` one.
#[allow(clippy::too_many_arguments)]
fn check_with(
    seed: u64,
    seq_lens: &[usize],
    kv_heads: usize,
    group: usize,
    bits: u32,
    head_dim: usize,
    page_frac: Option<f64>,
    tensor_cores: bool,
) {
    check_tuned(
        seed,
        seq_lens,
        kv_heads,
        group,
        bits,
        head_dim,
        page_frac,
        |c| {
            if !tensor_cores {
                *c = SpgemvConfig::dp2a(c.head_dim, c.page_size, c.group, c.bits)
            }
        },
    )
}

/// As `check`, with `tune` choosing the scoring kernel's configuration.
#[allow(clippy::too_many_arguments)]
fn check_tuned(
    seed: u64,
    seq_lens: &[usize],
    kv_heads: usize,
    group: usize,
    bits: u32,
    head_dim: usize,
    page_frac: Option<f64>,
    tune: impl FnOnce(&mut SpgemvConfig),
) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let dev = dusk.device();
    let page_size = 16;
    let (table, num_pages) = table_for(seq_lens, page_size, &mut rng);
    let kv = KvShape {
        num_pages,
        page_size,
        num_kv_heads: kv_heads,
        head_dim,
    };
    let k_host = random_f16(&mut rng, kv.elements());
    let k = dev.upload(&k_host).unwrap();
    let qk = dusk.quantize_k(&k, kv, bits).unwrap();
    let got = reference::QuantizedRows {
        packed: qk.packed.download().unwrap(),
        scale: qk.scale.download().unwrap(),
        zero: qk.zero.download().unwrap(),
    };
    assert_eq!(
        got,
        reference::quantize(&k_host, &kv, bits),
        "quantize_k differs from the reference"
    );
    // Dequantized values lie within half a step of the input (K in the engine's layout,
    // the quantized copy head-major).
    for (page, slot, head) in every_row(&kv) {
        let (src, r) = (
            kv.k_row(page, slot, head),
            kv.quantized_row(page, slot, head),
        );
        for i in 0..head_dim {
            let x = k_host[src * head_dim + i].to_f64();
            let step = got.scale[r].to_f64();
            let err = (reference::dequant(&got, head_dim, bits, r, i) - x).abs();
            assert!(
                err <= step * 0.5 + 1e-3 * (1.0 + x.abs()),
                "row {r} elem {i}: {x} dequantizes {err} away (step {step})"
            );
        }
    }
    let cand = match page_frac {
        None => TokenLists::all_tokens(&table, page_size, kv_heads),
        Some(f) => {
            let mut pages = vec![];
            for b in 0..table.batch() {
                let n = table.seq_len(b, page_size).div_ceil(page_size);
                for _ in 0..kv_heads {
                    pages.push((0..n).filter(|_| rng.random_bool(f)).collect());
                }
            }
            TokenLists::from_pages(&table, page_size, kv_heads, &pages)
        }
    };
    let q_heads = kv_heads * group;
    let q_host = random_f16(&mut rng, table.batch() * q_heads * head_dim);
    let q = dev.upload(&q_host).unwrap();
    let plan = SpgemvPlan::with_config(&dusk, kv, q_heads, bits, &table, &cand, tune).unwrap();
    let mut scores = dev.upload(&vec![f32::NAN; plan.num_scores()]).unwrap();
    plan.run(&dusk, &q, &qk, &mut scores).unwrap();
    let got_s = scores.download().unwrap();
    let want = reference::spgemv(&q_host, q_heads, &got, bits, &kv, &table, &cand);
    let err = reference::rel_error(&got_s, &want);
    assert!(
        err < 1e-3 || want.is_empty(),
        "spgemv relative error {err:.2e}"
    );
}

#[test]
fn one_token() {
    check(1, &[1], 1, 1, 4, 128, None);
}

/// The quantized copy of K is head-major, `[num_pages, num_kv_heads, page_size]` rows (one
/// KV head's page one contiguous block, which `spgemv_quant` depends on for its speed on
/// pages chosen per KV head), while K stays in the engine's `[num_pages, page_size,
/// num_kv_heads]` rows. Row (page p, slot s, head h) of K holds `id + (i % 16)` at element
/// `i`, `id = (p * page_size + s) * num_kv_heads + h`: it quantizes to zero `id`, scale 1
/// and codes `i % 16` (4 bits; 8 bits: scale 15 / 255), found at row
/// `(p * num_kv_heads + h) * page_size + s` of the copy. Page sizes 16 and 8 (the latter
/// with a last program of 8 rows).
#[test]
fn quantized_copy_is_head_major() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    for (num_pages, page_size, num_kv_heads) in [(3, 16, 3), (3, 8, 1), (2, 8, 5)] {
        let kv = KvShape {
            num_pages,
            page_size,
            num_kv_heads,
            head_dim: 64,
        };
        let mut k = vec![f16::ZERO; kv.elements()];
        for (p, s, h) in every_row(&kv) {
            let id = (p * page_size + s) * num_kv_heads + h;
            assert_eq!(kv.k_row(p, s, h), id);
            for i in 0..64 {
                k[id * 64 + i] = f16::from_f32((id + i % 16) as f32);
            }
        }
        let dev_k = dusk.device().upload(&k).unwrap();
        for bits in [4u32, 8] {
            let qk = dusk.quantize_k(&dev_k, kv, bits).unwrap();
            let (packed, scale, zero) = (
                qk.packed.download().unwrap(),
                qk.scale.download().unwrap(),
                qk.zero.download().unwrap(),
            );
            let row_bytes = 64 * bits as usize / 8;
            for (p, s, h) in every_row(&kv) {
                let id = (p * page_size + s) * num_kv_heads + h;
                // Written out, not through the helper, so that a change to either shows.
                let row = (p * num_kv_heads + h) * page_size + s;
                assert_eq!(kv.quantized_row(p, s, h), row);
                let at = format!("page {p} slot {s} head {h} ({bits} bits, {kv:?})");
                assert_eq!(zero[row].to_f32(), id as f32, "zero of {at}");
                let step = if bits == 4 { 1.0 } else { 15.0 / 255.0 };
                assert_eq!(scale[row], f16::from_f32(step), "scale of {at}");
                let codes = &packed[row * row_bytes..][..row_bytes];
                for i in 0..64 {
                    let want = if bits == 4 {
                        (i % 16) as u8
                    } else {
                        // As the kernel rounds: times the inverse of the f16 step.
                        let inv = 1.0 / f16::from_f32(step).to_f32();
                        ((i % 16) as f32 * inv + 0.5).min(255.0) as u8
                    };
                    assert_eq!(reference::code(codes, i, bits), want, "code {i} of {at}");
                }
            }
        }
    }
}

/// `spgemv_quant` (both scorers) reads the head-major copy: with every code 0, scale 0 and
/// zero the row's own index in the copy, a candidate's score is `zero * sum(q)`, so each
/// score names the row read. Token `pos` of sequence `b` for KV head `h` must read row
/// `(page * num_kv_heads + h) * 16 + pos % 16`, `page` its physical page.
#[test]
fn spgemv_reads_the_head_major_copy() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let dev = dusk.device();
    let kv = KvShape {
        num_pages: 5,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let table = PageTable {
        kv_indptr: vec![0, 3, 5],
        kv_page_indices: vec![4, 1, 3, 0, 2],
        kv_last_page_len: vec![9, 16],
    };
    let rows = kv.rows();
    let qk = QuantizedK {
        packed: dev.upload(&vec![0u8; rows * 32]).unwrap(),
        scale: dev.upload(&vec![f16::ZERO; rows]).unwrap(),
        zero: dev
            .upload(
                &(0..rows)
                    .map(|r| f16::from_f32(r as f32))
                    .collect::<Vec<_>>(),
            )
            .unwrap(),
        kv,
        bits: 4,
    };
    let cand = TokenLists::all_tokens(&table, 16, 2);
    for (group, tensor_cores) in [(1, false), (4, false), (4, true)] {
        let q_heads = 2 * group;
        let q = dev.upload(&vec![f16::ONE; 2 * q_heads * 64]).unwrap();
        let plan = SpgemvPlan::with_config(&dusk, kv, q_heads, 4, &table, &cand, |c| {
            if !tensor_cores {
                *c = SpgemvConfig::dp2a(64, 16, group, 4)
            }
        })
        .unwrap();
        assert_eq!(plan.config().tensor_cores, tensor_cores);
        let mut scores = dev.upload(&vec![f32::NAN; plan.num_scores()]).unwrap();
        plan.run(&dusk, &q, &qk, &mut scores).unwrap();
        let scores = scores.download().unwrap();
        for r in 0..cand.rows() {
            let (b, h) = (r / 2, r % 2);
            let (start, toks) = (cand.indptr[r] as usize, cand.row(r));
            for (j, &pos) in toks.iter().enumerate() {
                let pos = pos as usize;
                let page = table.kv_page_indices[table.kv_indptr[b] as usize + pos / 16] as usize;
                let row = (page * 2 + h) * 16 + pos % 16;
                for g in 0..group {
                    assert_eq!(
                        scores[start * group + g * toks.len() + j],
                        (row * 64) as f32,
                        "sequence {b} head {h} token {pos}, query head {g} of {group} \
                         (tensor cores: {tensor_cores})"
                    );
                }
            }
        }
    }
}

#[test]
fn gqa_ratios_and_ragged_last_pages() {
    check(2, &[37, 16, 5], 2, 4, 4, 128, None);
    check(3, &[70, 1], 1, 8, 4, 64, None);
    check(4, &[33], 4, 1, 8, 128, None);
}

#[test]
fn page_selections_and_256_dims() {
    check(5, &[100, 200], 2, 4, 4, 256, Some(0.3));
    check(6, &[129, 64, 3], 2, 1, 8, 64, Some(0.5));
}

#[test]
fn tensor_core_scoring() {
    check_with(7, &[37, 16, 5], 2, 4, 4, 128, None, true);
    check_with(8, &[70, 1], 1, 8, 4, 64, Some(0.5), true);
    check_with(9, &[100], 2, 2, 4, 256, None, true);
}

/// Every specialisation of several tiles a program (`spgemv_quant_mma_tiles`, with and
/// without the L2 prefetch) against the reference: rows shorter than one tile, rows ending
/// inside a program's first or a later tile (so programs whose later tiles lie past the
/// row's end), and random page selections; outputs poisoned with NaN. The interpreter
/// checks that every load and prefetch stays inside its buffer.
#[test]
fn tensor_core_scoring_several_tiles_a_program() {
    let configs: Vec<SpgemvConfig> = spgemv::specialised_configs()
        .into_iter()
        .filter(|c| c.tiles > 1)
        .collect();
    assert!(configs.iter().any(|c| c.l2_prefetch), "{configs:?}");
    for (i, cfg) in configs.iter().enumerate() {
        let seed = 100 + 2 * i as u64;
        let per_program = cfg.program_tokens();
        let lens = [
            1,
            40,
            per_program + 37,
            2 * per_program + 3 * cfg.block_tokens + 5,
        ];
        let tune = |c: &mut SpgemvConfig| *c = *cfg;
        check_tuned(seed, &lens, 2, cfg.group, 4, cfg.head_dim, None, tune);
        check_tuned(
            seed + 1,
            &lens[1..],
            1,
            cfg.group,
            4,
            cfg.head_dim,
            Some(0.4),
            tune,
        );
    }
}

/// The default's tiles follow the grid (`SpgemvConfig::fit_grid`), on the shapes measured on
/// an H100 (132 SMs): 16 tiles where 16 leave half a wave of programs, then 8, else one tile
/// on 2 warps; every configuration it can choose is compiled in; other configurations are
/// left alone.
#[test]
fn the_default_tiles_follow_the_grid() {
    let fit = |rows: usize, longest: usize| {
        let c = SpgemvConfig::new(128, 16, 4, 4).fit_grid(rows, longest, 132);
        (c.tiles, c.num_warps, c.l2_prefetch)
    };
    assert_eq!(fit(32 * 8, 32768), (16, 4, true));
    assert_eq!(fit(32 * 8, 8192), (16, 4, true));
    assert_eq!(fit(8, 131072), (16, 4, true));
    assert_eq!(fit(8 * 8, 8192), (8, 4, true));
    assert_eq!(fit(8 * 8, 2048), (1, 2, false));
    assert_eq!(fit(1, 1), (1, 2, false));
    for head_dim in [64, 128, 256] {
        for group in [2, 4, 8] {
            for (rows, longest) in [(1, 1), (64, 8192), (256, 32768)] {
                let c = SpgemvConfig::new(head_dim, 16, group, 4).fit_grid(rows, longest, 132);
                assert!(spgemv::specialised(&c), "{c:?}");
            }
        }
    }
    let mha = SpgemvConfig::new(128, 16, 1, 4);
    assert_eq!(mha.fit_grid(1, 1, 132), mha);
    let mut one = SpgemvConfig::new(128, 16, 4, 4);
    one.tiles = 1;
    one.l2_prefetch = false;
    assert_eq!(one.fit_grid(1, 1, 132), one);
}

/// Several tiles a program need the tensor cores, and the L2 prefetch needs several tiles.
#[test]
fn several_tiles_need_the_tensor_cores_and_the_prefetch_several_tiles() {
    let (dusk, kv, table, _) = small_setup();
    let cand = TokenLists::all_tokens(&table, 16, 2);
    let e = SpgemvPlan::with_config(&dusk, kv, 8, 4, &table, &cand, |c| {
        c.tensor_cores = false;
        c.tiles = 2;
    })
    .err()
    .unwrap();
    assert_eq!(arg_of(e), "tiles");
    let e = SpgemvPlan::with_config(&dusk, kv, 8, 4, &table, &cand, |c| c.tiles = 0)
        .err()
        .unwrap();
    assert_eq!(arg_of(e), "tiles");
    let e = SpgemvPlan::with_config(&dusk, kv, 8, 4, &table, &cand, |c| {
        c.tiles = 1;
        c.l2_prefetch = true;
    })
    .err()
    .unwrap();
    assert_eq!(arg_of(e), "l2_prefetch");
}

#[test]
fn tensor_cores_need_4_bit_codes_and_a_group() {
    let (dusk, kv, table, _) = small_setup();
    let cand = TokenLists::all_tokens(&table, 16, 2);
    let e = SpgemvPlan::with_config(&dusk, kv, 2, 4, &table, &cand, |c| c.tensor_cores = true)
        .err()
        .unwrap();
    assert_eq!(arg_of(e), "tensor_cores");
    let e = SpgemvPlan::with_config(&dusk, kv, 4, 4, &table, &cand, |c| {
        c.tensor_cores = true;
        c.block_tokens = 16;
        c.num_warps = 2;
    })
    .err()
    .unwrap();
    assert_eq!(arg_of(e), "block_tokens");
}

#[test]
fn configurations_not_compiled_in_are_rejected() {
    let (dusk, kv, table, _) = small_setup();
    let cand = TokenLists::all_tokens(&table, 16, 2);
    let e = SpgemvPlan::with_config(&dusk, kv, 4, 4, &table, &cand, |c| c.block_tokens = 256)
        .err()
        .unwrap();
    assert_eq!(arg_of(e), "config");
    let kv32 = KvShape {
        page_size: 32,
        ..kv
    };
    let table32 = PageTable {
        kv_indptr: vec![0, 1, 2],
        kv_page_indices: vec![0, 1],
        kv_last_page_len: vec![20, 32],
    };
    let cand = TokenLists::all_tokens(&table32, 32, 2);
    let e = SpgemvPlan::new(&dusk, kv32, 4, 4, &table32, &cand)
        .err()
        .unwrap();
    assert_eq!(arg_of(e), "page_size");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, .. ProptestConfig::default() })]
    #[test]
    fn random_shapes(seed in 0u64..1000, lens in proptest::collection::vec(1usize..90, 1..4),
                     heads in 1usize..3, group_log in 0u32..4, bits_8 in any::<bool>(), frac in proptest::option::of(0.1f64..0.9)) {
        check(seed, &lens, heads, 1 << group_log, if bits_8 { 8 } else { 4 }, 64, frac);
    }
}

fn small_setup() -> (Dusk, KvShape, PageTable, QuantizedK) {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let kv = KvShape {
        num_pages: 3,
        page_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let table = PageTable {
        kv_indptr: vec![0, 2, 3],
        kv_page_indices: vec![2, 0, 1],
        kv_last_page_len: vec![4, 16],
    };
    let k = dusk
        .device()
        .upload(&vec![f16::from_f32(0.25); kv.elements()])
        .unwrap();
    let qk = dusk.quantize_k(&k, kv, 4).unwrap();
    (dusk, kv, table, qk)
}

#[test]
fn out_of_range_page_ids_are_rejected() {
    let (dusk, kv, mut table, _) = small_setup();
    table.kv_page_indices[1] = 3;
    let cand = TokenLists::all_tokens(&table, 16, 2);
    let e = SpgemvPlan::new(&dusk, kv, 4, 4, &table, &cand)
        .err()
        .unwrap();
    assert_eq!(arg_of(e), "kv_page_indices");
}

#[test]
fn out_of_range_token_positions_are_rejected() {
    let (dusk, kv, table, _) = small_setup();
    let mut cand = TokenLists::all_tokens(&table, 16, 2);
    let last = cand.indices.len() - 1;
    cand.indices[last] = 16; // sequence 1 has 16 tokens: 0..16
    let e = SpgemvPlan::new(&dusk, kv, 4, 4, &table, &cand)
        .err()
        .unwrap();
    assert_eq!(arg_of(e), "cand");
}

#[test]
fn head_dim_not_built_for_is_rejected() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let kv = KvShape {
        num_pages: 1,
        page_size: 16,
        num_kv_heads: 1,
        head_dim: 96,
    };
    let k = dusk.device().upload(&vec![f16::ZERO; 16 * 96]).unwrap();
    assert_eq!(
        arg_of(dusk.quantize_k(&k, kv, 4).err().unwrap()),
        "head_dim"
    );
}

#[test]
fn mismatched_shapes_are_rejected() {
    let (dusk, kv, table, qk) = small_setup();
    let cand = TokenLists::all_tokens(&table, 16, 2);
    // 3 query heads do not divide into 2 KV heads.
    assert_eq!(
        arg_of(
            SpgemvPlan::new(&dusk, kv, 3, 4, &table, &cand)
                .err()
                .unwrap()
        ),
        "num_q_heads"
    );
    let plan = SpgemvPlan::new(&dusk, kv, 4, 4, &table, &cand).unwrap();
    let dev = dusk.device();
    let mut scores = dev.alloc::<f32>(plan.num_scores()).unwrap();
    let short_q = dev.alloc::<f16>(10).unwrap();
    assert_eq!(
        arg_of(plan.run(&dusk, &short_q, &qk, &mut scores).err().unwrap()),
        "q"
    );
    let q = dev.alloc::<f16>(2 * 4 * 64).unwrap();
    let mut short = dev.alloc::<f32>(plan.num_scores() - 1).unwrap();
    assert_eq!(
        arg_of(plan.run(&dusk, &q, &qk, &mut short).err().unwrap()),
        "scores"
    );
    // Codes of another width than planned.
    let k8 = dusk
        .quantize_k(&dev.alloc::<f16>(kv.elements()).unwrap(), kv, 8)
        .unwrap();
    assert_eq!(
        arg_of(plan.run(&dusk, &q, &k8, &mut scores).err().unwrap()),
        "k"
    );
    assert_eq!(
        arg_of(
            dusk.quantize_k(&dev.alloc::<f16>(5).unwrap(), kv, 4)
                .err()
                .unwrap()
        ),
        "k"
    );
    assert_eq!(
        arg_of(
            dusk.quantize_k(&dev.alloc::<f16>(kv.elements()).unwrap(), kv, 3)
                .err()
                .unwrap()
        ),
        "bits"
    );
}

#[test]
fn malformed_page_tables_are_rejected() {
    let (dusk, kv, table, _) = small_setup();
    let cand = TokenLists::all_tokens(&table, 16, 2);
    let mut t = table.clone();
    t.kv_last_page_len[0] = 17;
    assert_eq!(
        arg_of(SpgemvPlan::new(&dusk, kv, 4, 4, &t, &cand).err().unwrap()),
        "kv_last_page_len"
    );
    let mut t = table.clone();
    t.kv_indptr = vec![0, 3, 2];
    assert_eq!(
        arg_of(SpgemvPlan::new(&dusk, kv, 4, 4, &t, &cand).err().unwrap()),
        "kv_indptr"
    );
}
