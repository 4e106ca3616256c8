//! The main job (examples/twilight) through the CPU interpreter at a small size: every
//! pipeline equal to the f64 reference of its algorithm, the outputs written, and
//! Twilight's claims on the synthetic heads: budgets adapt per head (focused heads keep
//! tens of tokens, diffuse ones hundreds or more), and Quest+Twilight's output error is no
//! worse than Quest's top-k at the same average budget.

#[path = "../examples/centroid_selector/selector.rs"]
mod centroid;
#[path = "../examples/twilight/check.rs"]
mod check;
#[path = "../examples/twilight/claims.rs"]
mod claims;
#[path = "../examples/twilight/job.rs"]
mod job;
#[path = "../examples/twilight/methods.rs"]
mod methods;
#[path = "../examples/twilight/plot.rs"]
mod plot;
#[path = "../examples/twilight/report.rs"]
mod report;

use dusk::kernels::selectors::DsCalibration;

/// 2 sequences of 2048 tokens, GQA 16/4 (one KV head of each kind), into a fresh folder.
fn small_job() -> (job::Job, std::path::PathBuf) {
    let dusk = dusk::Dusk::new(dusk::runtime::Device::cpu()).unwrap();
    let out = std::env::temp_dir().join(format!("dusk-twilight-{}", std::process::id()));
    let o = job::Options {
        batch: 2,
        context: 2048,
        q_heads: 16,
        kv_heads: 4,
        check_seqs: 2,
        out: out.clone(),
        ..job::Options::for_device(false)
    };
    (job::run(&dusk, &o).unwrap(), out)
}

#[test]
fn the_main_job_passes_its_checks_and_twilights_claims_hold() {
    let (mut job, out) = small_job();
    let names: Vec<&str> = job.results.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names.len(), 8, "{names:?}");
    assert_eq!(
        [names[0], names[1], names[2], names[4], names[5], names[6], names[7]],
        [
            "Full (dense)",
            "Quest",
            "Quest+Twilight",
            "DS+Twilight",
            "SparQ",
            "Full+Twilight",
            "Centroid+Twilight"
        ]
    );
    assert!(names[3].starts_with("Quest ("), "{names:?}");
    assert_eq!(job.kinds, ["focused", "peaked", "spread", "diffuse"]);
    let report = job.to_string();
    assert!(job.passed(), "{report}");
    assert!(
        report.ends_with("PASS: 8 of 8 pipelines equal to their reference"),
        "{report}"
    );
    // Every pipeline with a pruner checked its INT4 copy, SparQ its mix.
    for c in &job.checks {
        let stages: Vec<&str> = c.stages.iter().map(|s| s.stage).collect();
        assert!(stages.contains(&"attend"), "{}: {stages:?}", c.method);
        if c.method.contains("Twilight") {
            assert!(stages.contains(&"quantize (steps)"), "{stages:?}");
            assert!(stages.contains(&"prune"), "{stages:?}");
        }
    }
    let sparq = job.checks.iter().find(|c| c.method == "SparQ").unwrap();
    assert!(sparq.stages.iter().any(|s| s.stage == "mix (alpha)"));

    // The claims: both Twilight pipelines adapt, Quest+Twilight no worse than Quest.
    assert_eq!(job.claims.len(), 3, "{report}");
    for c in &job.claims {
        assert!(c.holds, "{}", c.text);
    }
    let kinds = job.kinds.clone();
    for name in ["Full+Twilight", "Quest+Twilight"] {
        let r = job.results.iter().find(|r| r.name == name).unwrap();
        let focused = report::mean_budget_of_kind(r, &kinds, "focused").unwrap();
        let diffuse = report::mean_budget_of_kind(r, &kinds, "diffuse").unwrap();
        assert!(
            focused < 100.0 && diffuse >= 100.0,
            "{name}: {focused}, {diffuse}"
        );
    }
    let (qt, quest) = (&job.results[2], &job.results[3]);
    assert!(qt.mean_error() <= quest.mean_error() && quest.mean_budget() >= qt.mean_budget());
    // Quest at a quarter keeps 512 tokens a row; dense every one.
    assert!(job.results[1].budgets.iter().all(|b| *b == 512));
    assert!(job.results[0].errors.iter().all(|e| *e == 0.0));

    // The files: the calibration loads back, the table is the report's, the plot an SVG.
    let cal = DsCalibration::load(&out.join("ds_calibration.json")).unwrap();
    assert_eq!((cal.r(), cal.num_kv_heads(), cal.samples()), (16, 4, 256));
    let md = std::fs::read_to_string(out.join("table.md")).unwrap();
    assert!(report.contains(&md), "{md}");
    let svg = std::fs::read_to_string(out.join("budgets.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("Centroid+Twilight"));
    std::fs::remove_dir_all(&out).unwrap();

    // A stage out of tolerance fails the job, and the report says which.
    let stage = &mut job.checks[2].stages[1];
    stage.error = stage.tolerance + 1.0;
    let report = job.to_string();
    assert!(!job.passed());
    assert!(
        report.contains("  FAIL Quest+Twilight: ")
            && report.ends_with("FAIL: 7 of 8 pipelines equal to their reference"),
        "{report}"
    );
}
