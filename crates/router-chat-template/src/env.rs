//! The minijinja environment configured as transformers configures Jinja2 for chat templates.
//!
//! transformers compiles templates in an `ImmutableSandboxedEnvironment` with `trim_blocks`,
//! `lstrip_blocks`, the `loopcontrols` extension (`break`, `continue`) and its
//! `{% generation %}` tag, plus `raise_exception`, `strftime_now` and a `tojson` like Python's
//! `json.dumps`. Jinja2 prints values with Python's `str()`. This module adds the same:
//! minijinja-contrib's pycompat answers the Python methods templates call (`.strip()`,
//! `.items()`, `.startswith()`, ...), and a formatter and `string` filter print `None`, `True`,
//! lists and dicts as Python does (`trim` too, which Jinja2 applies to `str(value)`).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::Value;
use minijinja::{Environment, Error, ErrorKind};

/// The clock `strftime_now` reads.
pub(crate) type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The payload of the error `raise_exception` returns, found again by
/// [`raised_message`].
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// A fresh environment with transformers' settings and helpers.
pub(crate) fn environment(clock: Clock) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(|out, _state, value| {
        if let Some(text) = crate::python::str_of(value) {
            out.write_str(&text)?;
        }
        Ok(())
    });
    env.add_filter("string", |value: &Value| {
        Value::from(crate::python::str_of(value).unwrap_or_default())
    });
    env.add_filter("trim", trim);
    env.add_filter("tojson", crate::json::tojson);
    env.add_function("raise_exception", raise_exception);
    set_clock(&mut env, clock);
    env
}

/// Points `strftime_now` at `clock`.
pub(crate) fn set_clock(env: &mut Environment<'static>, clock: Clock) {
    env.add_function("strftime_now", move |format: String| {
        let now = clock();
        let secs = match now.duration_since(UNIX_EPOCH) {
            Ok(since) => i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
            Err(before) => -i64::try_from(before.duration().as_secs()).unwrap_or(i64::MAX),
        };
        crate::strftime::strftime(secs, &format)
    });
}

/// The system clock, which transformers' `datetime.now()` reads (as UTC here).
pub(crate) fn system_clock() -> Clock {
    Arc::new(SystemTime::now)
}

/// Jinja2's `trim`: `str(value).strip(chars)`, so a list prints as Python's `repr` first.
fn trim(value: &Value, chars: Option<String>) -> String {
    let text = crate::python::str_of(value).unwrap_or_default();
    match chars {
        Some(chars) => text.trim_matches(|c| chars.contains(c)).to_owned(),
        None => text.trim_matches(crate::python::is_space).to_owned(),
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, "raise_exception called")
        .with_source(Raised(message)))
}

/// The message of a `raise_exception` call somewhere in `err`'s chain.
pub(crate) fn raised_message(err: &Error) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(current) = cause {
        if let Some(Raised(message)) = current.downcast_ref::<Raised>() {
            return Some(message.clone());
        }
        cause = current.source();
    }
    None
}

/// Rewrites transformers' `{% generation %}` … `{% endgeneration %}` (which marks assistant
/// text for training masks and renders its body unchanged) as `{% if true %}` … `{% endif %}`,
/// keeping whitespace-control markers, so the block trims exactly as Jinja2 trims it.
pub(crate) fn rewrite_generation_tags(source: &str) -> Cow<'_, str> {
    if !source.contains("generation") {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        match generation_tag(tag) {
            Some((len, replacement)) => {
                out.push_str(&replacement);
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// When `tag` starts with a `generation` or `endgeneration` block tag: its length and the
/// replacement.
fn generation_tag(tag: &str) -> Option<(usize, String)> {
    let body = tag.strip_prefix("{%")?;
    let (open, body) = marker(body);
    let trimmed = body.trim_start();
    let (word, replacement) = if let Some(after) = trimmed.strip_prefix("endgeneration") {
        (after, "endif")
    } else if let Some(after) = trimmed.strip_prefix("generation") {
        (after, "if true")
    } else {
        return None;
    };
    let after = word.trim_start();
    let (close, after) = match after.strip_prefix('-').or_else(|| after.strip_prefix('+')) {
        Some(rest) => (&after[..1], rest),
        None => ("", after),
    };
    let end = after.strip_prefix("%}")?;
    Some((tag.len() - end.len(), format!("{{%{open} {replacement} {close}%}}")))
}

/// A leading `-` or `+` whitespace-control marker.
fn marker(body: &str) -> (&str, &str) {
    match body.chars().next() {
        Some('-' | '+') => (&body[..1], &body[1..]),
        _ => ("", body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_plain_blocks() {
        assert_eq!(
            rewrite_generation_tags(
                "a{%- generation -%}b{% endgeneration %}c{% if x %}{% endif %}"
            ),
            "a{%- if true -%}b{% endif %}c{% if x %}{% endif %}"
        );
        assert_eq!(rewrite_generation_tags("{%+generation%}"), "{%+ if true %}");
        assert!(matches!(rewrite_generation_tags("{{ x }}"), Cow::Borrowed(_)));
        assert_eq!(
            rewrite_generation_tags("{% set generation = 1 %}{{ generation }}"),
            "{% set generation = 1 %}{{ generation }}"
        );
    }

    #[test]
    fn printing_and_string_follow_python() {
        let env = environment(system_clock());
        let text = env
            .render_str(
                "{{ none }}|{{ true }}|{{ [1, 'a', none] }}|{{ {'k': false} | string }}|{{ missing }}|{{ 2.0 }}",
                (),
            )
            .expect("renders");
        assert_eq!(text, "None|True|[1, 'a', None]|{'k': False}||2.0");
        let text = env
            .render_str(
                "{{ [' a'] | trim }}|{{ '\x1c x \n' | trim }}|{{ 'xxhixx' | trim('x') }}",
                (),
            )
            .expect("renders");
        assert_eq!(text, "[' a']|x|hi");
    }

    #[test]
    fn raise_exception_keeps_its_message() {
        let env = environment(system_clock());
        let err = env
            .render_str("{{ raise_exception('roles must alternate') }}", ())
            .expect_err("raises");
        assert_eq!(raised_message(&err).as_deref(), Some("roles must alternate"));
        let other = env.render_str("{{ 1 + 'a' }}", ()).expect_err("type error");
        assert_eq!(raised_message(&other), None);
    }

    #[test]
    fn strftime_now_reads_the_clock() {
        let fixed: Clock = Arc::new(|| UNIX_EPOCH + std::time::Duration::from_secs(1_721_952_000));
        let env = environment(fixed);
        assert_eq!(
            env.render_str("{{ strftime_now('%d %b %Y') }}", ()).expect("renders"),
            "26 Jul 2024"
        );
        let env = environment(system_clock());
        let year: i32 =
            env.render_str("{{ strftime_now('%Y') }}", ()).expect("renders").parse().expect("year");
        assert!(year >= 2024);
    }
}
