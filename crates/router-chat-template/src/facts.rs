//! [`TemplateFacts`]: what a template's source tells an engine about how to hand it a request,
//! read the way the engines read it.
//!
//! - Content format: whether message `content` reaches the template as a string (text parts
//!   joined) or as a list of parts. vLLM looks for a `for` loop over a message's `content`
//!   (a message being a loop variable over `messages` or a variable set from it), or over a
//!   variable named `content`; SGLang says "list" when the source names images, audio, video or
//!   vision at all, else looks for a loop over `message.content`, `msg.content` or `m.content`.
//!   Both engines walk Jinja2's syntax tree; this reads the `{% for %}` and `{% set %}` tags of
//!   the source, which is the same question for every template in `testdata/templates/`.
//! - Whether the source names the `developer` role (vLLM turns developer messages into system
//!   messages for a template that does not).
//! - The variables the template reads without setting them: vLLM passes a request's
//!   `chat_template_kwargs` only when the template reads them.

use std::collections::HashSet;

/// How a template reads message content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentFormat {
    /// `content` is a string: text parts are joined before rendering.
    String,
    /// `content` is a list of parts (`{"type": "text", "text": ...}`), as OpenAI sends it.
    OpenAi,
}

/// What one template's source tells the engines.
#[derive(Clone, Debug)]
pub(crate) struct TemplateFacts {
    /// The content format vLLM detects.
    pub vllm_format: ContentFormat,
    /// The content format SGLang detects.
    pub sglang_format: ContentFormat,
    /// The source names the `developer` role in quotes.
    pub developer_role: bool,
    /// The source contains `content` (transformers' check before continuing a final message).
    pub mentions_content: bool,
    /// Variables the template reads without setting them.
    pub variables: HashSet<String>,
}

impl TemplateFacts {
    /// The facts of `source`, whose undeclared variables minijinja found.
    pub(crate) fn of(source: &str, variables: HashSet<String>) -> Self {
        let tags = Tags::of(source);
        Self {
            vllm_format: if tags.vllm_iterates_content() {
                ContentFormat::OpenAi
            } else {
                ContentFormat::String
            },
            sglang_format: if tags.sglang_iterates_content(source) {
                ContentFormat::OpenAi
            } else {
                ContentFormat::String
            },
            developer_role: source.contains("\"developer\"") || source.contains("'developer'"),
            mentions_content: source.contains("content"),
            variables,
        }
    }
}

/// The `for` loops and `set` assignments of a template, as (target, expression) pairs with the
/// expression normalised by [`access`].
struct Tags {
    loops: Vec<(String, String)>,
    sets: Vec<(String, String)>,
}

impl Tags {
    fn of(source: &str) -> Self {
        let (mut loops, mut sets) = (Vec::new(), Vec::new());
        let mut rest = source;
        while let Some(start) = rest.find("{%") {
            let after = &rest[start + 2..];
            let Some(end) = after.find("%}") else { break };
            let tag =
                after[..end].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
            rest = &after[end + 2..];
            if let Some(body) = tag.strip_prefix("for ") {
                if let Some((target, iter)) = split_keyword(body, " in ") {
                    let iter = cut_at_keyword(iter, &[" if ", " recursive"]);
                    loops.push((target.trim().to_owned(), access(iter)));
                }
            } else if let Some(body) = tag.strip_prefix("set ")
                && let Some((target, value)) = body.split_once('=')
                && !value.starts_with('=')
            {
                sets.push((target.trim().to_owned(), access(value)));
            }
        }
        Self { loops, sets }
    }

    /// vLLM's rule: a loop over a message's `content`, or over a variable named `content`.
    fn vllm_iterates_content(&self) -> bool {
        let mut lists = vec!["messages".to_owned()];
        let mut i = 0;
        while i < lists.len() {
            for (target, value) in &self.sets {
                if *value == lists[i] && !lists.contains(target) {
                    lists.push(target.clone());
                }
            }
            i += 1;
        }
        let messages: Vec<&str> = self
            .loops
            .iter()
            .filter(|(_, iter)| lists.contains(iter))
            .map(|(target, _)| target.as_str())
            .collect();
        self.loops.iter().any(|(_, iter)| {
            iter == "content"
                || iter.strip_suffix(".content").is_some_and(|var| messages.contains(&var))
        })
    }

    /// SGLang's rule: media named anywhere, or a loop over `message`, `msg` or `m`'s content.
    fn sglang_iterates_content(&self, source: &str) -> bool {
        ["image", "audio", "video", "vision"].iter().any(|word| source.contains(word))
            || self.loops.iter().any(|(_, iter)| {
                ["message.content", "msg.content", "m.content"].contains(&iter.as_str())
            })
    }
}

/// `body` split at the first `keyword` outside brackets and strings.
fn split_keyword<'a>(body: &'a str, keyword: &str) -> Option<(&'a str, &'a str)> {
    let at = top_level(body).find(|&i| body[i..].starts_with(keyword))?;
    Some((&body[..at], &body[at + keyword.len()..]))
}

/// `expr` up to the first of `keywords` outside brackets and strings.
fn cut_at_keyword<'a>(expr: &'a str, keywords: &[&str]) -> &'a str {
    top_level(expr)
        .find(|&i| keywords.iter().any(|k| expr[i..].starts_with(k)))
        .map_or(expr, |at| &expr[..at])
}

/// The byte offsets of `text` that lie outside brackets and string literals.
fn top_level(text: &str) -> impl Iterator<Item = usize> + '_ {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    text.char_indices().filter_map(move |(i, c)| {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => depth = depth.saturating_sub(1),
            (None, _) if depth == 0 => return Some(i),
            _ => {}
        }
        None
    })
}

/// An expression reduced to the variable access it is about, as the engines' syntax-tree checks
/// see through filters, tests, slices and parentheses: `message['content'] | trim` and
/// `(message.content)[1:]` are both `message.content`.
fn access(expr: &str) -> String {
    let mut expr = expr.trim();
    // Filters and tests apply to what stands before them.
    if let Some(at) =
        top_level(expr).find(|&i| expr[i..].starts_with('|') || expr[i..].starts_with(" is "))
    {
        expr = expr[..at].trim();
    }
    loop {
        if let Some(inner) = expr.strip_prefix('(').and_then(|e| e.strip_suffix(')')) {
            expr = inner.trim();
        } else if expr.ends_with(']')
            && let Some(open) = expr.rfind('[')
            && expr[open..].contains(':')
        {
            expr = expr[..open].trim();
        } else {
            break;
        }
    }
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(open) = rest.find('[') {
        let (head, tail) = rest.split_at(open);
        out.push_str(head);
        let Some(close) = tail.find(']') else {
            rest = tail;
            break;
        };
        let key = tail[1..close].trim();
        match key.strip_prefix(['\'', '"']).and_then(|k| k.strip_suffix(['\'', '"'])) {
            Some(name) => {
                out.push('.');
                out.push_str(name);
            }
            None => out.push_str(&tail[..=close]),
        }
        rest = &tail[close + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(source: &str) -> TemplateFacts {
        TemplateFacts::of(source, HashSet::new())
    }

    #[test]
    fn an_access_is_read_through_filters_slices_and_brackets() {
        for (expr, want) in [
            ("message['content']", "message.content"),
            (" message[\"content\"] | selectattr('type', 'equalto', 'text') ", "message.content"),
            ("(m.content)[1:]", "m.content"),
            ("messages[1:]", "messages"),
            ("messages", "messages"),
            ("message.content is string", "message.content"),
            ("messages[0]['content']", "messages[0].content"),
        ] {
            assert_eq!(access(expr), want, "{expr:?}");
        }
    }

    #[test]
    fn the_content_format_follows_each_engines_rule() {
        use ContentFormat::{OpenAi, String};
        #[rustfmt::skip]
        let cases = [
            ("a string template", "{% for message in messages %}{{ message['content'] }}{% endfor %}", String, String),
            ("a loop over parts", "{% for message in messages %}{% for part in message['content'] %}{{ part.text }}{% endfor %}{% endfor %}", OpenAi, OpenAi),
            ("through a set list", "{% set loop_messages = messages[1:] %}{%- for msg in loop_messages -%}{% for c in msg.content | reverse %}{% endfor %}{% endfor %}", OpenAi, OpenAi),
            ("another message name", "{% for turn in messages %}{% for c in turn.content %}{% endfor %}{% endfor %}", OpenAi, String),
            ("a loop over content", "{% set content = messages[0].content %}{% for c in content %}{% endfor %}", OpenAi, String),
            ("media named", "{{ messages[0].content }}{# images are not supported #}", String, OpenAi),
            ("a loop over something else", "{% for message in messages %}{% for t in tools %}{% endfor %}{% endfor %}", String, String),
        ];
        for (name, source, vllm, sglang) in cases {
            let facts = facts(source);
            assert_eq!((facts.vllm_format, facts.sglang_format), (vllm, sglang), "{name}");
        }
    }

    #[test]
    fn the_developer_role_and_content_are_noticed_in_quotes() {
        assert!(facts("{% if m.role == 'developer' %}{% endif %}").developer_role);
        assert!(facts(r#"{% if m.role == "developer" %}{% endif %}"#).developer_role);
        assert!(!facts("{# developer notes #}{{ m.content }}").developer_role);
        assert!(facts("{{ m.content }}").mentions_content);
        assert!(!facts("{{ m.text }}").mentions_content);
    }
}
