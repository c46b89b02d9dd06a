//! `cargo xtask tidy`: the checks no compiler makes.
//!
//! - Every `.rs` file opens with a `//!` line saying what it is (or with
//!   `#![doc = include_str!(...)]`); generated files are exempt when their first line says
//!   `@generated`.
//! - No module of a crate target imports, directly or through others, a module that imports it
//!   back (the graph and its strongly connected components are in [`modules`]).
//! - Every `*.md` a file names exists in the repository (a path relative to the file or to the
//!   repository root, a bare name anywhere in it), and nothing names a document in the shared
//!   folder beside the checkout: such documents are vendored into `docs/design/` and cited
//!   there. Data sets in that folder's `data/` may be named (they are large and optional: the
//!   benchmark falls back to the slices the repository carries).
//!
//! Third-party crates patched in under `patches/` are kept as their authors wrote them and are
//! not checked.
//!
//! Each problem names its file and line. The checks read the working tree; nothing is built.

mod lex;
mod modules;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use anyhow::{Context, Result, bail};
use cargo_metadata::MetadataCommand;

use modules::{Cycle, display};

/// Files whose text is read: Rust for the headers and the module graph, these for references.
const TEXT_EXTENSIONS: &[&str] = &["rs", "md", "proto", "toml", "txt", "py", "yml", "yaml"];

/// Paths into the shared folder beside the checkout, spelled in pieces so that this file does
/// not name them itself.
const OUTSIDE: &[&str] = &[concat!("..", "/shared/"), concat!("/work", "/shared")];

/// The part of the shared folder that may be named: data sets, not documents.
const SHARED_DATA: &str = concat!("..", "/shared/data/");

/// Copies of documents written elsewhere, kept as written: their first line may name where
/// they came from, so their references are not checked.
const VENDORED: &str = "docs/design/";

/// Third-party crates patched in through `[patch.crates-io]`, kept as published apart from the
/// changes their `PATCH.md` lists (so that the diff stays minimal and could go upstream): their
/// files follow their authors' conventions, not ours, so neither headers nor references are
/// checked. They stay in the tree, so that a document may name their `PATCH.md`.
const PATCHED_CRATES: &str = "patches/";

/// The working tree as the checks see it: repository-relative paths (with `/`) and their text.
pub(crate) type Tree = BTreeMap<String, String>;

/// A crate target: its name for messages and its root file.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) root: String,
}

/// One thing the checks found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Problem {
    /// A `.rs` file that does not open with `//!`.
    Header { file: String },
    /// A module cycle inside one target, not one of [`KNOWN_CYCLES`].
    Cycle { target: String, cycle: Cycle },
    /// A cycle between top-level modules of one target, not one of [`KNOWN_CYCLES`].
    TopLevelCycle { target: String, cycle: Cycle },
    /// A cycle of [`KNOWN_CYCLES`] that is no longer there as listed: the list only shrinks.
    KnownCycleGone { target: String, modules: Vec<String> },
    /// A reference to a document that is not in the repository.
    Reference { file: String, line: usize, reference: String, outside: bool },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Header { file } => write!(
                f,
                "{file}:1: no `//!` header: a file opens with `//!` lines saying what it is \
                 (or `#![doc = include_str!(...)]`)"
            ),
            Self::Reference { file, line, reference, outside: true } => write!(
                f,
                "{file}:{line}: `{reference}` is outside the repository: vendor the document \
                 into docs/design/ and cite it there"
            ),
            Self::Reference { file, line, reference, outside: false } => write!(
                f,
                "{file}:{line}: `{reference}` does not exist in the repository (a path is read \
                 from the file's folder or the repository root, a bare name anywhere)"
            ),
            Self::KnownCycleGone { target, modules } => write!(
                f,
                "the known cycle of {} in {target} is no longer there as listed: update \
                 KNOWN_CYCLES (xtask/src/tidy/mod.rs)",
                modules.join(", ")
            ),
            Self::Cycle { target, cycle } | Self::TopLevelCycle { target, cycle } => {
                let names: Vec<String> = cycle.modules.iter().map(|m| display(m)).collect();
                let kind = match self {
                    Self::TopLevelCycle { .. } => "top-level module cycle",
                    _ => "module cycle",
                };
                write!(f, "{kind} in {target}: {}", names.join(", "))?;
                for (from, to, places) in &cycle.edges {
                    for place in places {
                        write!(
                            f,
                            "\n    {}:{}: {} -> {}: {}",
                            place.file,
                            place.line,
                            display(from),
                            display(to),
                            place.text
                        )?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// Runs every check on the working tree at `root` and fails listing what it found.
pub(crate) fn check_workspace(root: &Path) -> Result<()> {
    let problems = workspace_problems(root)?;
    if problems.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
    bail!("{} tidy problem(s):\n  {}", problems.len(), lines.join("\n  "))
}

/// Every problem in the working tree at `root`.
pub(crate) fn workspace_problems(root: &Path) -> Result<Vec<Problem>> {
    let mut tree = Tree::new();
    read_tree(root, root, &mut tree)?;
    Ok(check(&tree, &targets(root)?))
}

/// Whether a cycle joins modules, or the top-level modules they belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CycleKind {
    /// Modules that lean on each other, re-exports followed to the module an item comes from.
    Modules,
    /// Top-level modules joined by the edges of their modules.
    TopLevel,
}

/// The cycles that exist today, by kind, target and modules: debt, found when the checks
/// began following re-exports and comparing top-level modules (router-server's assembly
/// modules lean on each other, and crate roots' re-exports hid two-way uses elsewhere). Each
/// must be found exactly as listed, so that the list only shrinks: a module leaving a cycle, or
/// a cycle going away, fails the check until the list says so; a new cycle fails it too.
pub(crate) const KNOWN_CYCLES: &[(CycleKind, &str, &[&str])] = &[
    (CycleKind::Modules, "router-workers", &["error", "worker"]),
    (CycleKind::TopLevel, "router-workers", &["error", "worker"]),
    (CycleKind::Modules, "router-buckets", &["bucket", "group", "pair"]),
    (CycleKind::TopLevel, "router-buckets", &["bucket", "group", "pair"]),
    (CycleKind::Modules, "router-policies", &["admission", "affinity", "cache::memo", "contract"]),
    (
        CycleKind::Modules,
        "router-policies",
        &[
            "cache::policy",
            "config",
            "config::cache_aware",
            "config::predicted_ttft",
            "power_of_two",
            "predicted_ttft",
            "random",
            "sampler",
            "session_aware",
        ],
    ),
    (
        CycleKind::TopLevel,
        "router-policies",
        &[
            "admission",
            "affinity",
            "cache",
            "config",
            "contract",
            "handles",
            "least_load",
            "power_of_two",
            "predicted_ttft",
            "random",
            "rendezvous",
            "round_robin",
            "sampler",
            "session_aware",
            "sticky",
            "ttft_model",
        ],
    ),
    (CycleKind::Modules, "router-state-kv", &["index", "predicted"]),
    (CycleKind::TopLevel, "router-state-kv", &["index", "predicted"]),
    (CycleKind::Modules, "router-state-load", &["report", "table::status"]),
    (CycleKind::TopLevel, "router-state-load", &["load", "report", "table"]),
];

/// Every problem in `tree`, whose crate targets are `targets`.
pub(crate) fn check(tree: &Tree, targets: &[Target]) -> Vec<Problem> {
    check_with(tree, targets, KNOWN_CYCLES)
}

/// [`check`] with `known` as the tolerated cycles.
pub(crate) fn check_with(
    tree: &Tree,
    targets: &[Target],
    known: &[(CycleKind, &str, &[&str])],
) -> Vec<Problem> {
    let mut problems = headers(tree);
    let mut seen = Vec::new();
    for target in targets {
        let found = modules::cycles(tree, &target.root)
            .into_iter()
            .map(|cycle| (CycleKind::Modules, cycle))
            .chain(
                modules::top_level_cycles(tree, &target.root)
                    .into_iter()
                    .map(|cycle| (CycleKind::TopLevel, cycle)),
            );
        for (kind, cycle) in found {
            let names: Vec<String> = cycle.modules.iter().map(|m| display(m)).collect();
            let listed = known
                .iter()
                .any(|(k, t, m)| *k == kind && *t == target.name && *m == names.as_slice());
            let name = target.name.clone();
            match (listed, kind) {
                (true, _) => seen.push((kind, name, names)),
                (false, CycleKind::Modules) => {
                    problems.push(Problem::Cycle { target: name, cycle })
                }
                (false, CycleKind::TopLevel) => {
                    problems.push(Problem::TopLevelCycle { target: name, cycle });
                }
            }
        }
    }
    let checked: Vec<&str> = targets.iter().map(|t| t.name.as_str()).collect();
    for (kind, target, modules) in known {
        let found =
            seen.iter().any(|(k, t, m)| k == kind && t == target && m.as_slice() == *modules);
        if checked.contains(target) && !found {
            let modules = modules.iter().map(|m| (*m).to_owned()).collect();
            problems.push(Problem::KnownCycleGone { target: (*target).to_owned(), modules });
        }
    }
    problems.extend(references(tree));
    problems
}

fn headers(tree: &Tree) -> Vec<Problem> {
    tree.iter()
        .filter(|(path, _)| path.ends_with(".rs") && !path.starts_with(PATCHED_CRATES))
        .filter(|(_, text)| {
            let first = text.lines().next().unwrap_or_default();
            let generated = first.starts_with("//") && first.contains("@generated");
            !(first.starts_with("//!") || first.starts_with("#![doc = include_str!(") || generated)
        })
        .map(|(path, _)| Problem::Header { file: path.clone() })
        .collect()
}

fn references(tree: &Tree) -> Vec<Problem> {
    let mut problems = Vec::new();
    let checked = |file: &String| !file.starts_with(VENDORED) && !file.starts_with(PATCHED_CRATES);
    for (file, text) in tree.iter().filter(|(file, _)| checked(file)) {
        for (index, line) in text.lines().enumerate() {
            let line_no = index + 1;
            let line = without_urls(line);
            for marker in OUTSIDE {
                for (at, _) in line.match_indices(marker) {
                    if line[at..].starts_with(SHARED_DATA) {
                        continue;
                    }
                    let end = line[at..]
                        .find(|c: char| c.is_whitespace() || "`'\")]>,;".contains(c))
                        .map_or(line.len(), |e| at + e);
                    problems.push(Problem::Reference {
                        file: file.clone(),
                        line: line_no,
                        reference: line[at..end].to_owned(),
                        outside: true,
                    });
                }
            }
            for reference in md_names(&line) {
                if OUTSIDE.iter().any(|m| reference.contains(m.trim_end_matches('/'))) {
                    continue; // reported above
                }
                if !exists(tree, file, reference) {
                    problems.push(Problem::Reference {
                        file: file.clone(),
                        line: line_no,
                        reference: reference.to_owned(),
                        outside: reference.starts_with('/'),
                    });
                }
            }
        }
    }
    problems
}

/// `line` with every `http(s)://...` address blanked out.
fn without_urls(line: &str) -> String {
    let mut out = line.to_owned();
    for scheme in ["https://", "http://"] {
        while let Some(at) = out.find(scheme) {
            let end = out[at..]
                .find(|c: char| c.is_whitespace() || ")>`\"'".contains(c))
                .map_or(out.len(), |e| at + e);
            out.replace_range(at..end, &" ".repeat(end - at));
        }
    }
    out
}

/// The `*.md` names and paths in a line.
fn md_names(line: &str) -> Vec<&str> {
    let is_stem = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let is_path = |c: char| is_stem(c) || c == '.' || c == '/';
    let mut out = Vec::new();
    for (at, _) in line.match_indices(".md") {
        let after = line[at + 3..].chars().next();
        if after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        if !line[..at].chars().next_back().is_some_and(is_stem) {
            continue;
        }
        let start = line[..at].rfind(|c: char| !is_path(c)).map_or(0, |i| i + 1);
        out.push(&line[start..at + 3]);
    }
    out
}

/// Whether `reference`, written in `file`, names a file of the tree.
fn exists(tree: &Tree, file: &str, reference: &str) -> bool {
    if !reference.contains('/') {
        return tree.keys().any(|path| path.rsplit('/').next() == Some(reference));
    }
    let folder = file.rfind('/').map_or("", |i| &file[..=i]);
    [format!("{folder}{reference}"), reference.to_owned()]
        .iter()
        .filter_map(|candidate| normalize(candidate))
        .any(|candidate| tree.contains_key(&candidate))
}

/// `a/./b/../c` as `a/c`; `None` when it climbs out of the repository or is absolute.
fn normalize(path: &str) -> Option<String> {
    if path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

/// Reads the text files below `dir` into `tree`, skipping build output and hidden folders.
fn read_tree(root: &Path, dir: &Path, tree: &mut Tree) -> Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if entry.file_type()?.is_dir() {
            if name != "target" && !name.starts_with('.') {
                read_tree(root, &path, tree)?;
            }
            continue;
        }
        let text_file =
            path.extension().and_then(|e| e.to_str()).is_some_and(|e| TEXT_EXTENSIONS.contains(&e));
        if !text_file {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let relative = path.strip_prefix(root).context("a file outside the root")?;
        tree.insert(relative.to_string_lossy().replace('\\', "/"), text);
    }
    Ok(())
}

/// The library and binary targets of the workspace members.
fn targets(root: &Path) -> Result<Vec<Target>> {
    let metadata = MetadataCommand::new()
        .current_dir(root)
        .no_deps()
        .exec()
        .context("running cargo metadata")?;
    let mut targets = Vec::new();
    for package in metadata.workspace_packages() {
        for target in &package.targets {
            let library = target.is_lib() || target.is_proc_macro();
            if !library && !target.is_bin() {
                continue;
            }
            let Ok(relative) = target.src_path.as_std_path().strip_prefix(root) else { continue };
            let name = if library {
                package.name.to_string()
            } else {
                format!("{} (bin {})", package.name, target.name)
            };
            targets.push(Target { name, root: relative.to_string_lossy().replace('\\', "/") });
        }
    }
    Ok(targets)
}
