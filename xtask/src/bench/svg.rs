//! Minimal SVG charts for the benchmark page: horizontal bars (one per label, value printed
//! beside it) and line plots (one polyline with point markers per series, and a legend).

use std::fmt::Write as _;

/// A horizontal bar chart of `(label, value)` rows.
pub(crate) fn bars(title: &str, unit: &str, rows: &[(String, f64)]) -> String {
    let width = 640.0;
    let label_width = 180.0;
    let bar_space = width - label_width - 90.0;
    let row_height = 26.0;
    let height = 40.0 + row_height * rows.len() as f64 + 10.0;
    let max = rows.iter().map(|(_, v)| *v).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let mut svg = open(width, height, title);
    for (i, (label, value)) in rows.iter().enumerate() {
        let y = 36.0 + row_height * i as f64;
        let length = if max > 0.0 && value.is_finite() { value / max * bar_space } else { 0.0 };
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            label_width - 8.0,
            y + 15.0,
            escape(label)
        );
        let _ = writeln!(
            svg,
            r##"<rect x="{label_width}" y="{}" width="{length:.1}" height="18" fill="#4a7ab5"/>"##,
            y + 2.0
        );
        let text = if value.is_finite() { format!("{value:.3} {unit}") } else { "n/a".to_owned() };
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{}">{}</text>"#,
            label_width + length + 6.0,
            y + 15.0,
            escape(&text)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// One line of a [`lines`] chart: `(x, y)` points, drawn in x order; non-finite points are
/// left out.
#[derive(Clone, Debug)]
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) points: Vec<(f64, f64)>,
    /// Drawn dashed and without markers: a bound or a reference, not a measurement. A dashed
    /// series of one point is drawn across the whole plot at its value.
    pub(crate) dashed: bool,
}

const COLORS: &[&str] = &[
    "#4a7ab5", "#d1603d", "#3a9a5b", "#8a5cb8", "#c9a227", "#2aa1b3", "#b5487a", "#6b6b6b",
    "#8c6d31", "#222222",
];

/// A line plot of `series` against a shared x axis, its y axis starting at zero.
pub(crate) fn lines(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let (width, height) = (680.0, 380.0);
    let (left, right, top, bottom) = (70.0, width - 180.0, 40.0, height - 50.0);
    let finite: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    let mut xs: Vec<f64> = finite.iter().map(|(x, _)| *x).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let (x_min, x_max) = match (xs.first(), xs.last()) {
        (Some(&a), Some(&b)) if b > a => (a, b),
        (Some(&a), _) => (a - 0.5, a + 0.5),
        _ => (0.0, 1.0),
    };
    let pad = (x_max - x_min) * 0.06;
    let (x_lo, x_hi) = (x_min - pad, x_max + pad);
    let y_top = finite.iter().map(|(_, y)| *y).fold(0.0, f64::max);
    let y_step = nice_step(if y_top > 0.0 { y_top } else { 1.0 } / 5.0);
    let y_hi = (y_top / y_step).ceil().max(1.0) * y_step;
    let px = |x: f64| left + (x - x_lo) / (x_hi - x_lo) * (right - left);
    let py = |y: f64| bottom - y / y_hi * (bottom - top);

    let mut svg = open(width, height, title);
    // Grid and y ticks.
    let mut tick = 0.0;
    while tick <= y_hi + y_step / 2.0 {
        let y = py(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#e4e4e4"/>"##
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            left - 6.0,
            y + 4.0,
            number(tick, y_step)
        );
        tick += y_step;
    }
    // X ticks: every distinct x when there are few, else five even steps.
    let x_ticks: Vec<f64> = if (1..=12).contains(&xs.len()) {
        xs.clone()
    } else {
        (0..=4).map(|i| x_min + (x_max - x_min) * f64::from(i) / 4.0).collect()
    };
    let x_step = x_ticks.windows(2).map(|w| w[1] - w[0]).fold(f64::INFINITY, f64::min);
    for x in &x_ticks {
        let at = px(*x);
        let _ = writeln!(
            svg,
            r##"<line x1="{at:.1}" y1="{bottom}" x2="{at:.1}" y2="{}" stroke="#333"/>"##,
            bottom + 5.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{at:.1}" y="{}" text-anchor="middle">{}</text>"#,
            bottom + 20.0,
            number(*x, if x_step.is_finite() { x_step } else { 0.1 })
        );
    }
    let _ = writeln!(
        svg,
        r##"<polyline points="{left},{top} {left},{bottom} {right},{bottom}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
        (left + right) / 2.0,
        height - 12.0,
        escape(x_label)
    );
    let _ = writeln!(
        svg,
        r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">{}</text>"#,
        (top + bottom) / 2.0,
        (top + bottom) / 2.0,
        escape(y_label)
    );
    // One polyline, markers and legend entry per series.
    for (i, line) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut points: Vec<(f64, f64)> =
            line.points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let dash = if line.dashed { r#" stroke-dasharray="6 4""# } else { "" };
        if line.dashed && points.len() == 1 {
            let y = py(points[0].1);
            let _ = writeln!(
                svg,
                r#"<polyline points="{left},{y:.1} {right},{y:.1}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#
            );
        } else if points.len() > 1 {
            let coords: Vec<String> =
                points.iter().map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y))).collect();
            let _ = writeln!(
                svg,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
                coords.join(" ")
            );
        }
        if !line.dashed {
            for (x, y) in &points {
                let _ = writeln!(
                    svg,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"/>"#,
                    px(*x),
                    py(*y)
                );
            }
        }
        let ly = top + 8.0 + 20.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>"#,
            right + 16.0,
            right + 40.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}">{}</text>"#,
            right + 46.0,
            ly + 4.0,
            escape(&line.name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The 1, 2 or 5 times a power of ten at or above `raw`.
fn nice_step(raw: f64) -> f64 {
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(raw)
}

/// `value` with as many decimals as a tick step of `step` needs.
fn number(value: f64, step: f64) -> String {
    let decimals = if step >= 1.0 { 0 } else { (-step.log10()).ceil() as usize };
    format!("{value:.decimals$}")
}

/// The opening of a chart: the `<svg>` element, a white background and the title.
fn open(width: f64, height: f64, title: &str) -> String {
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="13">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(svg, r#"<text x="10" y="22" font-weight="bold">{}</text>"#, escape(title));
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_largest_value_and_escape_labels() {
        let svg =
            bars("t <1>", "ms", &[("a&b".into(), 2.0), ("c".into(), 1.0), ("d".into(), f64::NAN)]);
        assert!(svg.contains("t &lt;1&gt;"));
        assert!(svg.contains("a&amp;b"));
        assert!(svg.contains("n/a"));
        let widths: Vec<f64> = svg
            .lines()
            .filter_map(|l| l.split("width=\"").nth(1))
            .filter_map(|w| w.split('"').next()?.parse().ok())
            .collect();
        // The canvas width, then the three bars: full, half, and empty for NaN.
        assert_eq!(widths.len(), 4, "{svg}");
        assert!((widths[1] - 2.0 * widths[2]).abs() < 0.2, "{widths:?}");
        assert_eq!(widths[3], 0.0);
    }

    fn attr(line: &str, name: &str) -> f64 {
        line.split(&format!(" {name}=\""))
            .nth(1)
            .and_then(|v| v.split('"').next()?.parse().ok())
            .unwrap_or(f64::NAN)
    }

    #[test]
    fn lines_skip_missing_points_and_put_larger_values_higher() {
        let series = [
            Series {
                name: "a<b".into(),
                points: vec![(0.5, 10.0), (0.7, f64::NAN), (0.9, 40.0)],
                dashed: false,
            },
            Series { name: "single".into(), points: vec![(0.8, 20.0)], dashed: false },
            Series { name: "bound".into(), points: vec![(0.5, 5.0), (0.9, 5.0)], dashed: true },
            Series { name: "reference".into(), points: vec![(0.8, 30.0)], dashed: true },
        ];
        let svg = lines("p99", "offered load", "ms", &series);
        assert!(!svg.contains("NaN"), "{svg}");
        assert!(svg.contains("a&lt;b"));
        let circles: Vec<&str> = svg.lines().filter(|l| l.starts_with("<circle")).collect();
        // Three finite measured points; the dashed bound has no markers.
        assert_eq!(circles.len(), 3, "{svg}");
        let (low, high) = (attr(circles[0], "cy"), attr(circles[1], "cy"));
        assert!(high < low, "40 is drawn above 10: {low} {high}");
        assert!(attr(circles[0], "cx") < attr(circles[1], "cx"));
        // The single point sits between the two x extremes.
        let middle = attr(circles[2], "cx");
        assert!(attr(circles[0], "cx") < middle && middle < attr(circles[1], "cx"));
        let polylines: Vec<&str> = svg
            .lines()
            .filter(|l| l.starts_with("<polyline") && l.contains("stroke-width"))
            .collect();
        // One polyline each for "a<b" (two points), the bound and the one-point reference
        // (drawn across the plot); none for the single measured point.
        assert_eq!(polylines.len(), 3, "{svg}");
        assert!(polylines[1].contains("stroke-dasharray"));
        assert!(polylines[2].contains("points=\"70,"), "{}", polylines[2]);
        // Every x tick is labelled: the three distinct x values.
        for label in [">0.5<", ">0.8<", ">0.9<"] {
            assert!(svg.contains(label), "{label} in {svg}");
        }
    }

    #[test]
    fn tick_steps_are_round() {
        for (raw, step) in [(0.13, 0.2), (7.0, 10.0), (300.0, 500.0), (1.0, 1.0)] {
            assert!((nice_step(raw) - step).abs() < 1e-9, "{raw}: {}", nice_step(raw));
        }
        assert_eq!(number(0.3, 0.1), "0.3");
        assert_eq!(number(250.0, 100.0), "250");
    }
}
