//! Minimal SVG bar charts for the benchmark page: one bar per label, value printed beside it.

use std::fmt::Write as _;

/// A horizontal bar chart of `(label, value)` rows.
pub(crate) fn bars(title: &str, unit: &str, rows: &[(String, f64)]) -> String {
    let width = 640.0;
    let label_width = 180.0;
    let bar_space = width - label_width - 90.0;
    let row_height = 26.0;
    let height = 40.0 + row_height * rows.len() as f64 + 10.0;
    let max = rows.iter().map(|(_, v)| *v).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="13">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(svg, r#"<text x="10" y="22" font-weight="bold">{}</text>"#, escape(title));
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
}
