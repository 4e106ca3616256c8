//! The Twilight pipeline example (select, INT4 quantization and scores, top-p with group
//! unions, varlen attention over the pruner's lists) through the CPU interpreter, and its
//! verdicts.

#[path = "../examples/twilight/pipeline.rs"]
mod pipeline;

use pipeline::Report;

fn run() -> Report {
    let dusk = dusk::Dusk::new(dusk::runtime::Device::cpu()).unwrap();
    pipeline::run(&dusk, &[200, 17, 96], 0.9, 3).unwrap()
}

#[test]
fn select_estimate_prune_attend() {
    let r = run();
    assert!(r.kept > 0 && r.kept <= r.candidates);
    let names: Vec<&str> = r.stages.iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        [
            "select (pages to tokens)",
            "quantize K to INT4",
            "estimate (INT4 SpGEMV)",
            "prune (top-p)",
            "attend (kept tokens)"
        ]
    );
    let table = r.to_string();
    assert!(r.passed(), "{table}");
    assert!(
        table.ends_with("PASS: 5 of 5 stages within tolerance"),
        "{table}"
    );
    assert!(!table.contains("FAIL"), "{table}");
    // The interpreter repeats the host quantizer's steps exactly.
    assert_eq!(r.stages[1].error, 0.0);
}

#[test]
fn a_stage_over_tolerance_fails_the_run() {
    let mut r = run();
    let attend = &mut r.stages[4];
    attend.error = attend.tolerance * 1.5;
    attend.detail = Some("row 3 is off".into());
    assert!(!r.stages[4].passed());
    assert!(!r.passed());
    let table = r.to_string();
    let row = table
        .lines()
        .find(|l| l.starts_with("attend (kept tokens)"))
        .unwrap();
    assert!(row.ends_with("FAIL"), "{row}");
    assert!(row.contains("3.0e-3 rel"), "{row}");
    assert!(
        table.contains("FAIL attend (kept tokens): row 3 is off"),
        "{table}"
    );
    assert!(
        table.ends_with("FAIL: 4 of 5 stages within tolerance"),
        "{table}"
    );
    // Every other row still passes.
    assert_eq!(table.matches("  PASS").count(), 4, "{table}");
}

#[test]
fn verdict_bounds() {
    let mut r = run();
    let prune = &mut r.stages[3];
    prune.error = prune.tolerance;
    assert!(prune.passed(), "an error equal to the tolerance passes");
    prune.error = 1.0;
    assert!(!prune.passed(), "one token off the oracle fails");
    let quantize = &mut r.stages[1];
    quantize.error = f64::NAN;
    assert!(!quantize.passed(), "a NaN error fails");
    assert!(r
        .to_string()
        .ends_with("FAIL: 3 of 5 stages within tolerance"));
}

#[test]
fn the_checks_catch_wrong_outputs() {
    use dusk::kernels::paged::{PageTable, TokenLists};
    use dusk::kernels::reference;
    use half::f16;

    // select: a candidate list one token short.
    let table = PageTable::from_lengths(&[40], 16, vec![2, 0, 1]).unwrap();
    let chosen = vec![vec![0, 2]; pipeline::NUM_KV_HEADS];
    let mut cand = TokenLists::from_pages(&table, 16, pipeline::NUM_KV_HEADS, &chosen);
    assert!(pipeline::check_select(&table, &chosen, &cand).passed());
    cand.indices.remove(3);
    for i in &mut cand.indptr[1..] {
        *i -= 1;
    }
    let s = pipeline::check_select(&table, &chosen, &cand);
    assert_eq!((s.passed(), s.error), (false, 1.0));

    // quantize: one code (K row 1, element 12: byte 64 + 6, low nibble) two steps off.
    let k: Vec<f16> = (0..4 * pipeline::HEAD_DIM)
        .map(|i| f16::from_f32((i % 37) as f32 / 37.0 - 0.5))
        .collect();
    // One page of 4 tokens and one KV head: the head-major rows are the engine's.
    let one_page = dusk::kernels::paged::KvShape {
        num_pages: 1,
        page_size: 4,
        num_kv_heads: 1,
        head_dim: pipeline::HEAD_DIM,
    };
    let want = reference::quantize(&k, &one_page, 4);
    assert!(pipeline::check_quantize(&want, &want).passed());
    let mut got = want.clone();
    let code = got.packed[70] & 15;
    let off = if code < 8 { code + 2 } else { code - 2 };
    got.packed[70] = (got.packed[70] & 0xf0) | off;
    let s = pipeline::check_quantize(&got, &want);
    assert_eq!((s.passed(), s.error), (false, 2.0));
    let detail = s.detail.unwrap();
    assert!(detail.contains("K row 1, element 12:"), "{detail}");

    // prune: at p = 1 every candidate is kept; one dropped, or one that is no candidate.
    let group = 4;
    let cand = TokenLists {
        indptr: vec![0, 5],
        indices: vec![0, 1, 2, 7, 9],
    };
    let scores: Vec<f32> = (0..5 * group).map(|i| (i % 7) as f32).collect();
    let all = vec![cand.indices.clone()];
    assert!(pipeline::check_prune(&cand, group, &scores, 0.1, 1.0, &all).passed());
    let s = pipeline::check_prune(&cand, group, &scores, 0.1, 1.0, &[vec![0, 1, 2, 9]]);
    assert_eq!((s.passed(), s.error), (false, 1.0));
    let s = pipeline::check_prune(&cand, group, &scores, 0.1, 1.0, &[vec![0, 1, 2, 7, 8, 9]]);
    assert_eq!((s.passed(), s.error), (false, 1.0));
    let detail = s.detail.unwrap();
    assert!(detail.contains("kept 8, no candidate"), "{detail}");
}
