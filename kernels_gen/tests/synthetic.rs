//! The synthetic batch generator through the CPU interpreter: its kernels equal the host
//! reference bit for bit (outputs poisoned first), a seed gives the same batch every time
//! and another seed another, the planted structure is there to measure (focused heads'
//! heaviest tokens are their planted ones, top-p budgets small for focused heads and large
//! for diffuse ones, a group's heads planted apart), and bad arguments are typed errors.

use dusk_kernels::paged::PageTable;
use dusk_kernels::synthetic::analysis::{attention_weights, top_p_budget, top_positions};
use dusk_kernels::synthetic::{
    reference, write_cache, write_queries, HeadProfile, SyntheticCache, SyntheticSpec,
};
use dusk_kernels::DuskError;
use half::f16;

#[path = "support/inputs.rs"]
mod inputs;
use inputs::*;

/// Bit patterns, so that a NaN or a signed zero compares exactly.
fn bits(x: &[f16]) -> Vec<u16> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// The kernels' cache and queries against the host's, into poisoned buffers.
fn check_against_reference(spec: &SyntheticSpec) {
    let dusk = dusk();
    let dev = dusk.device();
    let table = spec.page_table().unwrap();
    let n = spec.kv_shape().elements();
    let (mut k, mut v) = (dev.alloc::<f16>(n).unwrap(), dev.alloc::<f16>(n).unwrap());
    dev.fill_bytes(&mut k, 0xFF).unwrap();
    dev.fill_bytes(&mut v, 0xFF).unwrap();
    let planted = write_cache(&dusk, spec, &table, &mut k, &mut v).unwrap();
    let (want_k, want_v) = reference::cache(spec, &table, spec.kv_shape().num_pages);
    assert_eq!(bits(&k.download().unwrap()), bits(&want_k), "K");
    assert_eq!(bits(&v.download().unwrap()), bits(&want_v), "V");
    assert!(!planted.tokens.is_empty());
    let mut q = dev
        .alloc::<f16>(spec.batch() * spec.num_q_heads * spec.head_dim)
        .unwrap();
    for step in [0, 1, 7] {
        dev.fill_bytes(&mut q, 0xFF).unwrap();
        write_queries(&dusk, spec, step, &mut q).unwrap();
        let got = q.download().unwrap();
        assert_eq!(
            bits(&got),
            bits(&reference::queries(spec, step)),
            "q, step {step}"
        );
    }
}

#[test]
fn kernels_equal_the_host_reference_gqa() {
    // GQA 4, head_dim 64, pages of 16; lengths not multiples of the page.
    check_against_reference(&SyntheticSpec::new(vec![300, 37, 129], 8, 2, 64, 16, 11));
}

#[test]
fn kernels_equal_the_host_reference_mha_other_pages() {
    // MHA at head_dim 128 with pages of 8 (masked slots) and of 32 (two chunks a page).
    for page in [8, 32] {
        check_against_reference(&SyntheticSpec::new(vec![70, 200], 4, 4, 128, page, 5));
    }
}

#[test]
fn a_seed_gives_the_same_batch_and_another_seed_another() {
    let dusk = dusk();
    let make = |seed| {
        let c = SyntheticCache::generate(
            &dusk,
            &SyntheticSpec::new(vec![100, 60], 4, 2, 64, 16, seed),
        )
        .unwrap();
        (
            bits(&c.k.download().unwrap()),
            bits(&c.v.download().unwrap()),
            bits(&c.q.download().unwrap()),
            c.table,
            c.planted,
        )
    };
    let (a, b, c) = (make(3), make(3), make(4));
    assert!(a == b, "the same seed made different batches");
    assert_ne!(a.0, c.0);
    assert_ne!(a.1, c.1);
    assert_ne!(a.2, c.2);
    assert_ne!(a.3, c.3, "page order");
    assert_ne!(a.4, c.4, "planted tokens");
}

#[test]
fn the_page_table_is_a_permutation_of_the_cache() {
    let spec = SyntheticSpec::new(vec![100, 1, 33], 4, 2, 64, 16, 9);
    let table = spec.page_table().unwrap();
    let mut ids = table.kv_page_indices.clone();
    assert_ne!(ids, (0..ids.len() as i32).collect::<Vec<_>>(), "scattered");
    ids.sort();
    assert_eq!(
        ids,
        (0..spec.kv_shape().num_pages as i32).collect::<Vec<_>>()
    );
    assert_eq!(
        table,
        PageTable::from_lengths(&[100, 1, 33], 16, table.kv_page_indices.clone()).unwrap()
    );
}

/// A batch of the default layer (GQA 4: a focused group, then a mixed one) at 1024 tokens.
fn layer_batch() -> (SyntheticSpec, PageTable, Vec<f16>, Vec<f16>, SyntheticCache) {
    let dusk = dusk();
    let spec = SyntheticSpec::new(vec![1024, 600], 8, 2, 128, 16, 21);
    let c = SyntheticCache::generate(&dusk, &spec).unwrap();
    let (k, q) = (c.k.download().unwrap(), c.q.download().unwrap());
    (spec, c.table.clone(), k, q, c)
}

#[test]
fn planted_structure_is_measurable() {
    let (spec, table, k, q, c) = layer_batch();
    let group = spec.group();
    for b in 0..spec.batch() {
        let n = spec.seq_lens[b];
        for qh in 0..spec.num_q_heads {
            let profile = spec.heads[qh];
            let w = attention_weights(&spec, &table, &k, &q, b, qh);
            let budget = top_p_budget(&w, 0.95);
            let planted = c.planted.positions(b, qh);
            assert_eq!(planted.len(), profile.planted.min(n / (2 * group)));
            if profile.planted > 0 {
                // Focused: the planted tokens hold 95% of the mass, and every token top-p
                // keeps is a planted one.
                let mass: f64 = planted.iter().map(|p| w[*p]).sum();
                assert!(mass > 0.95, "seq {b} head {qh}: planted mass {mass}");
                assert!(
                    budget <= planted.len(),
                    "seq {b} head {qh}: budget {budget}"
                );
                for p in top_positions(&w, budget) {
                    assert!(
                        planted.contains(&p),
                        "seq {b} head {qh}: top token {p} not planted"
                    );
                }
            } else if profile.kind() == "diffuse" {
                // Diffuse: a large part of the sequence.
                assert!(
                    budget * 5 > n,
                    "seq {b} head {qh}: diffuse budget {budget} of {n}"
                );
            } else {
                // Peaked and spread heads: a few tokens to a few percent (how many depends
                // much on the query: 1 to 1373 of 32k at scale 11 among four sequences).
                assert!(budget * 4 < n, "seq {b} head {qh}: budget {budget} of {n}");
            }
        }
    }
}

#[test]
fn a_groups_heads_disagree() {
    let (spec, table, k, q, c) = layer_batch();
    let group = spec.group();
    for b in 0..spec.batch() {
        for h in 0..spec.num_kv_heads {
            let heads: Vec<usize> = (h * group..(h + 1) * group)
                .filter(|qh| spec.heads[*qh].planted > 0)
                .collect();
            for (i, a) in heads.iter().enumerate() {
                let pa = c.planted.positions(b, *a);
                for other in &heads[i + 1..] {
                    // Planted apart, and each head's heaviest tokens are its own.
                    assert!(c
                        .planted
                        .positions(b, *other)
                        .iter()
                        .all(|p| !pa.contains(p)));
                    let wo = attention_weights(&spec, &table, &k, &q, b, *other);
                    let top = top_positions(&wo, top_p_budget(&wo, 0.95));
                    assert!(
                        top.iter().all(|p| !pa.contains(p)),
                        "seq {b}: heads {a} and {other}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_later_steps_queries_keep_the_planted_tokens_on_top() {
    let (spec, table, k, q0, c) = layer_batch();
    let dusk = dusk();
    let mut q = dusk.device().alloc::<f16>(q0.len()).unwrap();
    c.queries_into(&dusk, 5, &mut q).unwrap();
    let q5 = q.download().unwrap();
    assert_ne!(bits(&q5), bits(&q0));
    for qh in (0..spec.num_q_heads).filter(|qh| spec.heads[*qh].planted > 0) {
        let w = attention_weights(&spec, &table, &k, &q5, 0, qh);
        let planted = c.planted.positions(0, qh);
        let mass: f64 = planted.iter().map(|p| w[*p]).sum();
        assert!(mass > 0.9, "head {qh}: planted mass {mass} at step 5");
    }
}

#[test]
fn short_sequences_plant_what_fits() {
    let dusk = dusk();
    let spec = SyntheticSpec::new(vec![1, 7, 40], 8, 2, 64, 16, 2);
    let c = SyntheticCache::generate(&dusk, &spec).unwrap();
    // At most len / (2 * group) per head: none in 1 or 7 tokens, 5 in 40.
    for qh in 0..8 {
        assert!(c.planted.positions(0, qh).is_empty());
        assert!(c.planted.positions(1, qh).is_empty());
        let want = spec.heads[qh].planted.min(5);
        assert_eq!(c.planted.positions(2, qh).len(), want, "head {qh}");
    }
}

#[test]
fn bad_arguments_are_typed_errors() {
    let dusk = dusk();
    let good = SyntheticSpec::new(vec![64, 20], 8, 2, 64, 16, 1);
    let bad = |f: &dyn Fn(&mut SyntheticSpec)| {
        let mut s = good.clone();
        f(&mut s);
        arg_of(SyntheticCache::generate(&dusk, &s).err().expect("an error"))
    };
    assert_eq!(bad(&|s| s.seq_lens.clear()), "seq_lens");
    assert_eq!(bad(&|s| s.seq_lens[1] = 0), "seq_lens");
    assert_eq!(bad(&|s| s.num_kv_heads = 0), "num_kv_heads");
    assert_eq!(bad(&|s| s.num_q_heads = 7), "num_q_heads");
    assert_eq!(bad(&|s| s.heads.truncate(3)), "heads");
    assert_eq!(bad(&|s| s.heads[2].scale = 0.0), "heads");
    assert_eq!(bad(&|s| s.heads[2].scale = f32::NAN), "heads");
    assert_eq!(bad(&|s| s.heads[2].scale = 100.0), "heads");
    assert_eq!(bad(&|s| s.heads[0].strength = -1.0), "heads");
    assert_eq!(bad(&|s| s.heads[0].strength = 16.0), "heads");
    assert_eq!(bad(&|s| s.head_dim = 96), "head_dim");
    assert_eq!(bad(&|s| s.page_size = 0), "page_size");
    assert_eq!(bad(&|s| s.page_size = 12), "page_size");

    let dev = dusk.device();
    let table = good.page_table().unwrap();
    let n = good.kv_shape().elements();
    let (mut k, mut v) = (dev.alloc::<f16>(n).unwrap(), dev.alloc::<f16>(n).unwrap());
    let mut short = dev.alloc::<f16>(n - 1).unwrap();
    fn e<T>(r: Result<T, DuskError>) -> &'static str {
        arg_of(r.err().expect("an error"))
    }
    assert_eq!(
        e(write_cache(&dusk, &good, &table, &mut short, &mut v)),
        "k"
    );
    assert_eq!(
        e(write_cache(&dusk, &good, &table, &mut k, &mut short)),
        "v"
    );
    let other = PageTable::from_lengths(&[64, 21], 16, table.kv_page_indices.clone()).unwrap();
    assert_eq!(
        e(write_cache(&dusk, &good, &other, &mut k, &mut v)),
        "table"
    );
    let one = PageTable::from_lengths(&[64], 16, vec![0, 1, 2, 3]).unwrap();
    assert_eq!(e(write_cache(&dusk, &good, &one, &mut k, &mut v)), "table");
    let mut far = table.clone();
    far.kv_page_indices[0] = 99;
    assert_eq!(
        e(write_cache(&dusk, &good, &far, &mut k, &mut v)),
        "kv_page_indices"
    );
    let mut q = dev.alloc::<f16>(2 * 8 * 64).unwrap();
    assert_eq!(e(write_queries(&dusk, &good, 1 << 31, &mut q)), "step");
    let mut q = dev.alloc::<f16>(2 * 8 * 64 + 1).unwrap();
    assert_eq!(e(write_queries(&dusk, &good, 0, &mut q)), "q");
    let mut focused = good.clone();
    focused.heads = vec![HeadProfile::focused(4); 8];
    assert!(SyntheticCache::generate(&dusk, &focused).is_ok());
}
