//! The main job's report (examples/twilight/report.rs and plot.rs): the table's figures from
//! plain data, the per-row errors, the checks on malformed data, and the SVG plot.

#[path = "../examples/twilight/plot.rs"]
mod plot;
#[path = "../examples/twilight/report.rs"]
mod report;

use report::{kind_table, mean_error_of_kind, row_errors, table, MethodResult};

/// Two sequences of four heads.
fn methods() -> Vec<MethodResult> {
    vec![
        MethodResult {
            name: "Quest".into(),
            heads: 4,
            budgets: vec![64; 8],
            errors: vec![0.1, 0.3],
            step_us: Some(123.456),
        },
        MethodResult {
            name: "Quest+Twilight".into(),
            heads: 4,
            budgets: vec![3, 40, 9, 1000, 5, 20, 0, 2000],
            errors: vec![0.01, 0.02, 0.03],
            step_us: None,
        },
    ]
}

#[test]
fn the_table_summarises_each_method() {
    let t = table(&methods()).unwrap();
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 4, "{t}");
    assert!(lines[0].starts_with("| method | budget mean | budget min | budget max |"));
    assert_eq!(
        lines[2],
        "| Quest | 64.0 | 64 | 64 | 2.00e-1 | 3.00e-1 | 123.5 |"
    );
    // (3 + 40 + 9 + 1000 + 5 + 20 + 0 + 2000) / 8 = 384.625
    assert_eq!(
        lines[3],
        "| Quest+Twilight | 384.6 | 0 | 2000 | 2.00e-2 | 3.00e-2 | - |"
    );
}

#[test]
fn the_kind_table_averages_each_kind_of_head() {
    // Heads 0 and 2 focused, 1 and 3 diffuse; one query row a head (errors as budgets).
    let mut m = methods();
    m[1].errors = vec![0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8];
    let kinds = ["focused", "diffuse", "focused", "diffuse"];
    let t = kind_table(&m[1..], &kinds).unwrap();
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(
        lines[0],
        "| method | focused: budget, error | diffuse: budget, error |"
    );
    // Focused budgets 3, 9, 5, 0: 4.25; errors 0.1, 0.3, 0.5, 0.7: 0.4. Diffuse 40, 1000,
    // 20, 2000: 765; errors 0.5 on average.
    assert_eq!(
        lines[2],
        "| Quest+Twilight | 4.2, 4.00e-1 | 765.0, 5.00e-1 |"
    );
    // Two query rows a head: heads 0 and 2 are rows 0, 1, 4, 5 of sequence 0 and 8, 9,
    // 12, 13 of sequence 1 (52 / 8).
    m[1].errors = (0..16).map(|i| i as f64).collect();
    assert_eq!(mean_error_of_kind(&m[1], &kinds, "focused"), Some(6.5));
    // Errors that are not whole groups of rows have no kind.
    m[1].errors.pop();
    assert_eq!(mean_error_of_kind(&m[1], &kinds, "focused"), None);
    assert_eq!(mean_error_of_kind(&m[1], &kinds, "peaked"), None);
}

#[test]
fn row_errors_are_relative_per_row() {
    let dense = [3.0, 4.0, 0.0, 0.0, 1.0, 0.0];
    let approx = [3.0f32, 4.0, 0.0, 0.0, 1.0, 1.0];
    let e = row_errors(&approx, &dense, 2);
    assert_eq!(e, [0.0, 0.0, 1.0]);
    assert_eq!(row_errors(&[0.5, 0.0], &[0.0, 0.0], 2), [f64::INFINITY]);
    assert!((row_errors(&[3.0, 3.0], &[3.0, 4.0], 2)[0] - 0.2).abs() < 1e-12);
}

#[test]
fn malformed_results_are_errors() {
    let mut m = methods();
    m[1].budgets.pop();
    assert!(table(&m)
        .unwrap_err()
        .to_string()
        .contains("not whole sequences of 4 heads"));
    let mut m = methods();
    m[0].errors[1] = f64::NAN;
    assert!(table(&m).unwrap_err().to_string().contains("\"Quest\""));
    let mut m = methods();
    m[0].heads = 0;
    assert!(table(&m).is_err());
    let dir = std::env::temp_dir().join(format!("dusk-plot-{}", std::process::id()));
    assert!(plot::budget_plot(&dir.join("none.svg"), "t", &[]).is_err());
}

#[test]
fn the_plot_has_a_panel_per_method_and_a_bar_per_head() {
    let dir = std::env::temp_dir().join(format!("dusk-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("budgets.svg");
    plot::budget_plot(&path, "per-head budgets", &methods()).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
    for text in ["per-head budgets", "Quest", "Quest+Twilight", "tokens"] {
        assert!(
            svg.contains(&format!(">{text}<")) || svg.contains(&format!(">\n{text}\n<")),
            "no {text:?}"
        );
    }
    // A background, a plot-area rectangle per panel, and one bar per (method, head).
    let bars = svg.matches("<rect").count();
    assert!(bars >= 2 * 4, "{bars} rectangles");
    // A min-max line per head and method.
    assert!(svg.matches("<polyline").count() + svg.matches("<path").count() >= 8);
}
