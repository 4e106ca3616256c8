//! The plot of per-head budgets beside the main job's table, as Twilight's Figure 11 shows
//! them for real models: one panel per method, a bar per head (the mean over the batch's
//! sequences) with a line from the smallest to the largest, tokens on a log scale. Written
//! as SVG with `plotters` (its SVG backend only: no font or image libraries to build, and a
//! text file a browser shows).

use super::report::MethodResult;
use plotters::prelude::*;
use std::error::Error;
use std::path::Path;

/// Height of one method's panel, in pixels.
const PANEL: u32 = 180;

/// Writes the plot of `results` to `path` (SVG), titled `title`.
pub fn budget_plot(
    path: &Path,
    title: &str,
    results: &[MethodResult],
) -> Result<(), Box<dyn Error>> {
    for r in results {
        r.validate()?;
    }
    if results.is_empty() {
        return Err("budget_plot: no methods to plot".into());
    }
    let heads = results.iter().map(|r| r.heads).max().unwrap_or(1);
    let top = results
        .iter()
        .flat_map(|r| &r.budgets)
        .copied()
        .max()
        .unwrap_or(1);
    // Whole decades, so the log axis' labels are round.
    let y_max = 10f64.powi(((top.max(1) as f64).log10().floor() as i32) + 1);
    let width = (60 + 24 * heads as u32).max(480);
    let root =
        SVGBackend::new(path, (width, 40 + PANEL * results.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 18))?;
    let panels = root.split_evenly((results.len(), 1));
    for (i, (panel, r)) in panels.iter().zip(results).enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let mut chart = ChartBuilder::on(panel)
            .caption(&r.name, ("sans-serif", 14))
            .margin(6)
            .x_label_area_size(34)
            .y_label_area_size(56)
            .build_cartesian_2d(-0.5f64..heads as f64 - 0.5, (1f64..y_max).log_scale())?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(heads.min(32))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .x_desc("head")
            .y_desc("tokens")
            .draw()?;
        let stats: Vec<(f64, f64, f64)> = (0..r.heads)
            .map(|h| {
                let b: Vec<f64> = r.head_budgets(h).map(|x| x.max(1) as f64).collect();
                let mean = b.iter().sum::<f64>() / b.len() as f64;
                let lo = b.iter().copied().fold(f64::INFINITY, f64::min);
                (mean, lo, b.iter().copied().fold(0.0, f64::max))
            })
            .collect();
        chart.draw_series(stats.iter().enumerate().map(|(h, (mean, _, _))| {
            let x = h as f64;
            Rectangle::new([(x - 0.35, 1.0), (x + 0.35, *mean)], color.filled())
        }))?;
        chart.draw_series(stats.iter().enumerate().map(|(h, (_, lo, hi))| {
            PathElement::new(
                vec![(h as f64, *lo), (h as f64, *hi)],
                BLACK.stroke_width(1),
            )
        }))?;
    }
    root.present()?;
    Ok(())
}
