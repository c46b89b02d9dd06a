//! The `tojson` filter transformers installs: Python's `json.dumps(value, ensure_ascii=False,
//! indent=None, separators=None, sort_keys=False)` with those keyword arguments, never HTML
//! escaping (Jinja2's own `tojson` escapes `<`, `>`, `&` and `'`).

use std::fmt::Write;

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde_json::Value as Json;

/// How `json.dumps` was asked to print.
struct Style {
    ensure_ascii: bool,
    /// `None`: one line; `Some(unit)`: one item a line, indented by `unit` per level.
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

/// The filter: `value | tojson(indent=4, ensure_ascii=false, separators=(",", ": "), sort_keys=false)`.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(unit) => unit.to_owned(),
            None => {
                let width = i64::try_from(v).map_err(|_| {
                    Error::new(ErrorKind::InvalidOperation, "tojson indent must be an int or str")
                })?;
                " ".repeat(usize::try_from(width).unwrap_or(0))
            }
        }),
    };
    // Python's defaults: (", ", ": ") on one line, ("," , ": ") with an indent.
    let (item_separator, key_separator) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson separators must be an (item_separator, key_separator) pair",
            ));
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let style = Style {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_separator,
        key_separator,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let json = serde_json::to_value(value).map_err(|err| {
        Error::new(ErrorKind::InvalidOperation, "tojson cannot serialize the value")
            .with_source(err)
    })?;
    let mut out = String::new();
    write(&mut out, &json, &style, 0);
    Ok(Value::from_safe_string(out))
}

fn write(out: &mut String, value: &Json, style: &Style, depth: usize) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(unit) = &style.indent {
            out.push('\n');
            out.push_str(&unit.repeat(depth));
        }
    };
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => out.push_str(&float(f)),
            _ => {
                let _ = write!(out, "{n}");
            }
        },
        Json::String(s) => string(out, s, style.ensure_ascii),
        Json::Array(items) if items.is_empty() => out.push_str("[]"),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline(out, depth + 1);
                write(out, item, style, depth + 1);
            }
            newline(out, depth);
            out.push(']');
        }
        Json::Object(map) if map.is_empty() => out.push_str("{}"),
        Json::Object(map) => {
            let mut entries: Vec<(&String, &Json)> = map.iter().collect();
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline(out, depth + 1);
                string(out, key, style.ensure_ascii);
                out.push_str(&style.key_separator);
                write(out, item, style, depth + 1);
            }
            newline(out, depth);
            out.push('}');
        }
    }
}

/// A float as `json.dumps` prints it (`float.__repr__`, with `Infinity` and `NaN`).
fn float(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_owned()
    } else if value.is_infinite() {
        if value > 0.0 { "Infinity" } else { "-Infinity" }.to_owned()
    } else {
        crate::python::float_repr(value)
    }
}

/// A JSON string literal as Python writes it: `\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, other
/// control characters as `\u00XX`; with `ensure_ascii`, everything outside space..`~` as `\uXXXX`
/// (surrogate pairs above the BMP).
fn string(out: &mut String, text: &str, ensure_ascii: bool) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use minijinja::Environment;

    fn render(source: &str, value: serde_json::Value) -> String {
        let mut env = Environment::new();
        env.add_filter("tojson", super::tojson);
        env.render_str(source, minijinja::context! { v => value }).expect("renders")
    }

    #[test]
    fn defaults_are_python_json_dumps() {
        let value = serde_json::json!({"b": [1, 2.5, "x<y&'z'"], "a": {"ü": null, "t": true}});
        assert_eq!(
            render("{{ v | tojson }}", value),
            r#"{"b": [1, 2.5, "x<y&'z'"], "a": {"ü": null, "t": true}}"#
        );
    }

    #[test]
    fn indent_separators_sort_keys_and_ensure_ascii() {
        let value = serde_json::json!({"b": [1], "a": {}, "c": []});
        assert_eq!(
            render("{{ v | tojson(indent=2) }}", value.clone()),
            "{\n  \"b\": [\n    1\n  ],\n  \"a\": {},\n  \"c\": []\n}"
        );
        assert_eq!(
            render("{{ v | tojson(separators=(',', ':'), sort_keys=true) }}", value),
            r#"{"a":{},"b":[1],"c":[]}"#
        );
        assert_eq!(render("{{ v | tojson(indent='\t') }}", serde_json::json!([1])), "[\n\t1\n]");
        assert_eq!(
            render("{{ v | tojson(ensure_ascii=true) }}", serde_json::json!("é🙂\u{1}\u{7f}")),
            r#""\u00e9\ud83d\ude42\u0001\u007f""#
        );
        assert_eq!(render("{{ v | tojson }}", serde_json::json!("\u{7f}\u{8}")), "\"\u{7f}\\b\"");
        assert_eq!(render("{{ v | tojson }}", serde_json::json!(1e-7)), "1e-07");
    }
}
