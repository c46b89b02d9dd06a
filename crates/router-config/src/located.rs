//! Every problem of a configuration file, each at its line and column, for `check-config`.
//!
//! Reading a file stops at its first type error, so when the whole file does not read, each
//! part is read on its own (every top-level section; each model with its workers and buckets
//! read one by one), and every part that fails is one problem: a bad value in one worker does
//! not hide a bad value in the next. The problems that reading finds (a type error, an unknown
//! key) and those that building finds (a duplicate id, a policy that can see no cache) name a
//! field path, `models[0].buckets[1].groups.pd.prefill.policy`; [`Positions`] places a path at
//! the line and column of the key (or list item) that spells it in the file, or of the nearest
//! enclosing one there when the key was left to its default. A syntax error has its own place.
//!
//! The positions come from granit-parser's event stream (the YAML parser of serde-saphyr,
//! which kube already builds), since the parser that reads the file keeps none.

use std::collections::HashMap;
use std::fmt;

use granit_parser::{Event, Parser};
use serde::de::DeserializeOwned;
use serde_yaml_ng::Value;

use super::Problem;
use super::file::{BucketConfig, ConfigFile, ModelConfig};

/// A problem at its place in the file (lines and columns count from 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    /// The line.
    pub line: usize,
    /// The column.
    pub column: usize,
    /// The problem.
    pub problem: Problem,
}

impl fmt::Display for Located {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.column, self.problem)
    }
}

/// Reads `text`, or says every problem reading finds, each at its place.
pub fn read(text: &str) -> Result<ConfigFile, Vec<Located>> {
    let first = match ConfigFile::parse(text) {
        Ok(config) => return Ok(config),
        Err(first) => first,
    };
    let value: Value = match serde_yaml_ng::from_str(text) {
        Ok(value) => value,
        Err(err) => {
            let (line, column) = err.location().map_or((1, 1), |at| (at.line(), at.column()));
            let problem = Problem { path: ".".into(), message: err.to_string() };
            return Err(vec![Located { line, column, problem }]);
        }
    };
    let mut problems = part_problems(&value);
    if problems.is_empty() {
        // The parts read but the whole did not: say what the whole said.
        problems.push(Problem { path: ".".into(), message: first });
    }
    Err(Positions::of(text).locate(problems))
}

/// The problems of reading each part of `value` on its own.
fn part_problems(value: &Value) -> Vec<Problem> {
    let mut problems = Vec::new();
    let Value::Mapping(top) = value else {
        if !value.is_null() {
            problems.push(Problem { path: ".".into(), message: "expected a mapping".into() });
        }
        return problems;
    };
    for (key, section) in top {
        let Some(key) = key.as_str() else {
            problems.push(Problem { path: ".".into(), message: format!("a key {key:?}") });
            continue;
        };
        match key {
            "server" => check::<super::server::ServerSection>(key, section, &mut problems),
            "health" => check::<crate::HealthSection>(key, section, &mut problems),
            "load" => check::<super::file::LoadSection>(key, section, &mut problems),
            "kv" => check::<super::file::KvSection>(key, section, &mut problems),
            "telemetry" => check::<crate::TelemetrySection>(key, section, &mut problems),
            "discovery" => check::<Option<super::DiscoverySection>>(key, section, &mut problems),
            "models" => models(section, &mut problems),
            other => problems.push(Problem {
                path: other.to_owned(),
                message: "unknown section, expected one of server, health, load, kv, models, \
                          discovery, telemetry"
                    .into(),
            }),
        }
    }
    problems
}

/// Each model read without its workers and buckets, and each of those on its own.
fn models(section: &Value, problems: &mut Vec<Problem>) {
    let Value::Sequence(models) = section else {
        return check::<Vec<ModelConfig>>("models", section, problems);
    };
    for (i, model) in models.iter().enumerate() {
        let path = format!("models[{i}]");
        let Value::Mapping(fields) = model else {
            check::<ModelConfig>(&path, model, problems);
            continue;
        };
        let mut bare = fields.clone();
        for (list, read) in [
            ("workers", check::<router_workers::WorkerSpec> as fn(&str, &Value, &mut Vec<Problem>)),
            ("buckets", check::<BucketConfig>),
        ] {
            // Anything but a list is reported by reading the model with it.
            if let Some(Value::Sequence(items)) = fields.get(list) {
                for (j, item) in items.iter().enumerate() {
                    read(&format!("{path}.{list}[{j}]"), item, problems);
                }
                bare.insert(list.into(), Value::Sequence(Vec::new()));
            }
        }
        check::<ModelConfig>(&path, &Value::Mapping(bare), problems);
    }
}

/// Reads `value` as a `T` at `path`, adding its problem if it does not read.
fn check<T: DeserializeOwned>(path: &str, value: &Value, problems: &mut Vec<Problem>) {
    if let Err(err) = serde_path_to_error::deserialize::<_, T>(value.clone()) {
        let inner = err.path().to_string();
        let path = match inner.as_str() {
            "." => path.to_owned(),
            inner if inner.starts_with('[') => format!("{path}{inner}"),
            inner => format!("{path}.{inner}"),
        };
        problems.push(Problem { path, message: err.into_inner().to_string() });
    }
}

/// The place of every key and list item of a YAML text, by field path.
#[derive(Debug, Default)]
pub struct Positions {
    at: HashMap<String, (usize, usize)>,
}

/// A collection being walked.
enum Frame {
    Mapping { path: String, key: Option<String> },
    Sequence { path: String, next: usize },
}

impl Positions {
    /// The places in `text` (of the first document; none past a syntax error).
    pub fn of(text: &str) -> Self {
        let mut positions = Self::default();
        let mut stack: Vec<Frame> = Vec::new();
        for event in Parser::new_from_str(text) {
            let Ok((event, span)) = event else { break };
            let here = (span.start.line(), span.start.col() + 1);
            match event {
                Event::Scalar(text, ..) => {
                    if let Some(Frame::Mapping { path, key: key @ None }) = stack.last_mut() {
                        let full = join(path, &text);
                        positions.at.entry(full).or_insert(here);
                        *key = Some(text.into_owned());
                    } else {
                        positions.value_at(&mut stack, here);
                    }
                }
                Event::MappingStart(..) | Event::SequenceStart(..) => {
                    let path = positions.value_at(&mut stack, here).unwrap_or_default();
                    stack.push(match event {
                        Event::MappingStart(..) => Frame::Mapping { path, key: None },
                        _ => Frame::Sequence { path, next: 0 },
                    });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                }
                Event::DocumentEnd => break,
                _ => {}
            }
        }
        positions
    }

    /// A value starts at `here` in the innermost collection: its path (an item's place is
    /// recorded; a key's was, at the key), and the collection moves past it.
    fn value_at(&mut self, stack: &mut [Frame], here: (usize, usize)) -> Option<String> {
        match stack.last_mut()? {
            Frame::Mapping { path, key } => Some(join(path, &key.take()?)),
            Frame::Sequence { path, next } => {
                let item = format!("{path}[{next}]");
                *next += 1;
                self.at.entry(item.clone()).or_insert(here);
                Some(item)
            }
        }
    }

    /// The place of `path`, or of its nearest enclosing path the text spells; else 1:1.
    pub fn find(&self, path: &str) -> (usize, usize) {
        let mut path = path;
        loop {
            if let Some(&at) = self.at.get(path) {
                return at;
            }
            match path.rfind(['.', '[']) {
                Some(cut) if cut > 0 => path = &path[..cut],
                _ => return (1, 1),
            }
        }
    }

    /// `problems` at their places, in the order of the file.
    pub fn locate(&self, problems: Vec<Problem>) -> Vec<Located> {
        let mut located: Vec<Located> = problems
            .into_iter()
            .map(|problem| {
                let (line, column) = self.find(&problem.path);
                Located { line, column, problem }
            })
            .collect();
        located.sort_by_key(|l| (l.line, l.column));
        located
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") }
}

#[cfg(test)]
mod tests;
