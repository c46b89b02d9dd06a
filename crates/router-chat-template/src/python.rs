//! Python's `str()` of template values, which Jinja2 uses to print `{{ value }}` and the `string`
//! filter: `None`, `True`, `False`, `repr` for lists and dicts, Python's float format.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};

/// Python's `str(value)`; `None` for an undefined value, which Jinja2 prints as nothing.
pub(crate) fn str_of(value: &Value) -> Option<String> {
    match value.kind() {
        ValueKind::Undefined => None,
        ValueKind::String => Some(value.as_str().unwrap_or_default().to_owned()),
        _ => {
            let mut out = String::new();
            repr(&mut out, value);
            Some(out)
        }
    }
}

/// Python's `str.isspace` for one character: Unicode whitespace and the four ASCII
/// separators `\x1c`..`\x1f`.
pub(crate) fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// Python's `repr(value)` for the kinds JSON and templates produce.
fn repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::None | ValueKind::Undefined => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => match f64_of(value) {
            Some(float) => out.push_str(&float_repr(float)),
            None => {
                let _ = write!(out, "{value}");
            }
        },
        ValueKind::String => string_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(out, &item);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(out, &key);
                out.push_str(": ");
                repr(out, &value.get_item(&key).unwrap_or_default());
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// The value as a float when it is one (integers stay integers, as in Python).
fn f64_of(value: &Value) -> Option<f64> {
    if value.as_i64().is_some() || u64::try_from(value.clone()).is_ok() {
        return None;
    }
    f64::try_from(value.clone()).ok()
}

/// Python's `repr(float)`: the shortest round-trip digits, positional from 1e-4 up to 1e16,
/// exponent form (`1e-05`, `1.5e+16`) outside.
pub(crate) fn float_repr(value: f64) -> String {
    if value.is_nan() {
        return "nan".to_owned();
    }
    if value.is_infinite() {
        return if value > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    // Rust's `{:e}` prints the shortest round-trip digits: `-1.25e-7`, `3e16`.
    let sci = format!("{value:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let mut out = String::from(sign);
    if (-4..16).contains(&exponent) {
        let point = exponent + 1; // digits before the decimal point
        if point <= 0 {
            out.push_str("0.");
            out.push_str(&"0".repeat(point.unsigned_abs() as usize));
            out.push_str(&digits);
        } else {
            let point = point as usize;
            if digits.len() <= point {
                out.push_str(&digits);
                out.push_str(&"0".repeat(point - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..point]);
                out.push('.');
                out.push_str(&digits[point..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exponent < 0 { '-' } else { '+' }, exponent.abs());
    }
    out
}

/// Python's `repr(str)`: single quotes unless the text has one and no double quote.
fn string_repr(out: &mut String, text: &str) {
    let quote = if text.contains('\'') && !text.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa1).contains(&(c as u32)) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python() {
        for (value, python) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (1e300, "1e+300"),
            (0.0, "0.0"),
        ] {
            assert_eq!(float_repr(value), python, "{value}");
        }
    }

    #[test]
    fn values_print_like_python_str() {
        let value = Value::from_serialize(serde_json::json!({
            "a": [1, 2.0, null, true, false],
            "it's": "say \"hi\"\n",
            "b": "it's",
        }));
        assert_eq!(
            str_of(&value).as_deref(),
            Some(r#"{'a': [1, 2.0, None, True, False], "it's": 'say "hi"\n', 'b': "it's"}"#)
        );
        assert_eq!(str_of(&Value::from(())).as_deref(), Some("None"));
        assert_eq!(str_of(&Value::from("plain")).as_deref(), Some("plain"));
        assert_eq!(str_of(&Value::UNDEFINED), None);
    }
}
