//! The run's picture (SVG, plotters' SVG backend only): hit rate per router on the trace, with
//! the infinite-cache ceiling, and the TTFT CDF of each router (log time axis).

use super::run::Run;
use plotters::prelude::*;
use std::path::Path;

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("plot: {e}")
}

/// Writes `path`: `title` over the hit-rate bars (`o1` dashed) and the TTFT CDFs of `runs`.
pub fn write(path: &Path, title: &str, runs: &[&Run], o1: f64) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let root = SVGBackend::new(path, (1200, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(err)?;
    let (left, right) = root.split_horizontally(520);

    let n = runs.len();
    let mut bars = ChartBuilder::on(&left)
        .caption(
            "prefix hit rate (cached / prompt tokens)",
            ("sans-serif", 15),
        )
        .margin(10)
        .x_label_area_size(110)
        .y_label_area_size(45)
        .build_cartesian_2d(0.0..n as f64, 0.0..1.0)
        .map_err(err)?;
    bars.configure_mesh()
        .disable_x_mesh()
        .x_labels(n.max(1))
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            runs.get(i).map(|r| r.name.clone()).unwrap_or_default()
        })
        .x_label_style(
            ("sans-serif", 12)
                .into_text_style(&left)
                .transform(FontTransform::Rotate90),
        )
        .draw()
        .map_err(err)?;
    bars.draw_series(runs.iter().enumerate().map(|(i, r)| {
        let c = COLORS[i % COLORS.len()];
        Rectangle::new(
            [(i as f64 + 0.15, 0.0), (i as f64 + 0.85, r.hit())],
            c.filled(),
        )
    }))
    .map_err(err)?;
    bars.draw_series(DashedLineSeries::new(
        [(0.0, o1), (n as f64, o1)],
        6,
        4,
        BLACK.stroke_width(1),
    ))
    .map_err(err)?
    .label(format!("O1 infinite cache {o1:.3}"))
    .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK));
    bars.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;

    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for r in runs {
        let t = r.ttfts();
        if let (Some(a), Some(b)) = (t.first(), t.last()) {
            lo = lo.min(a.max(1e-3));
            hi = hi.max(*b);
        }
    }
    if !lo.is_finite() || hi <= lo {
        (lo, hi) = (1e-3, 1.0);
    }
    let mut cdf = ChartBuilder::on(&right)
        .caption("TTFT CDF (trace seconds, at the pod)", ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(45)
        .build_cartesian_2d((lo..hi * 1.1).log_scale(), 0.0..1.0)
        .map_err(err)?;
    cdf.configure_mesh().draw().map_err(err)?;
    for (i, r) in runs.iter().enumerate() {
        let t = r.ttfts();
        let len = t.len().max(1) as f64;
        let c = COLORS[i % COLORS.len()];
        cdf.draw_series(LineSeries::new(
            t.iter()
                .enumerate()
                .map(|(k, &v)| (v.max(lo), (k + 1) as f64 / len)),
            c.stroke_width(2),
        ))
        .map_err(err)?
        .label(r.name.clone())
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    cdf.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
