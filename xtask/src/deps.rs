//! `cargo xtask deps`: the layering check.
//!
//! The allowed internal edges are read from the table in the root `ARCHITECTURE.md` (section
//! "Dependency direction"), so the document and the check cannot drift apart. Every workspace
//! member must have a row; every normal or build dependency on another member must be listed in
//! the depending crate's row. Some external crates are confined to the crates that need them
//! (`anyhow` to binaries, `axum` to the HTTP servers). Dev-dependencies are not checked: tests
//! may use whatever helps them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, Result, bail};
use cargo_metadata::{DependencyKind, MetadataCommand};

/// External crates that only some members may depend on, with the members allowed to.
const CONFINED: &[(&str, &[&str])] = &[
    ("anyhow", &["router-server", "router-sim", "xtask", "router-e2e"]),
    ("axum", &["router-server", "router-sim"]),
];

/// A member and the members it depends on (normal and build dependencies only).
#[derive(Debug, Default)]
pub(crate) struct Graph {
    pub(crate) internal: BTreeMap<String, BTreeSet<String>>,
    pub(crate) external: BTreeMap<String, BTreeSet<String>>,
}

/// Checks the real workspace against the root `ARCHITECTURE.md`.
pub(crate) fn check_workspace(root: &Path) -> Result<()> {
    let doc =
        std::fs::read_to_string(root.join("ARCHITECTURE.md")).context("reading ARCHITECTURE.md")?;
    let allowed = parse_table(&doc)?;
    let graph = workspace_graph(root)?;
    let problems = violations(&allowed, &graph);
    if problems.is_empty() {
        Ok(())
    } else {
        bail!("layering violations:\n  {}", problems.join("\n  "))
    }
}

fn workspace_graph(root: &Path) -> Result<Graph> {
    let metadata = MetadataCommand::new()
        .current_dir(root)
        .no_deps()
        .exec()
        .context("running cargo metadata")?;
    let members: BTreeSet<String> =
        metadata.workspace_packages().iter().map(|p| p.name.to_string()).collect();
    let mut graph = Graph::default();
    for package in metadata.workspace_packages() {
        let name = package.name.to_string();
        let internal = graph.internal.entry(name.clone()).or_default();
        let mut external = BTreeSet::new();
        for dep in &package.dependencies {
            if dep.kind == DependencyKind::Development {
                continue;
            }
            if members.contains(&dep.name) {
                internal.insert(dep.name.clone());
            } else {
                external.insert(dep.name.clone());
            }
        }
        graph.external.insert(name, external);
    }
    Ok(graph)
}

/// Parses the rows `| crate | allowed, allowed |` of the dependency table. A dash means none.
pub(crate) fn parse_table(doc: &str) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let section = doc
        .split("### Dependency direction")
        .nth(1)
        .context("ARCHITECTURE.md has no '### Dependency direction' section")?;
    let mut table = BTreeMap::new();
    for line in section.lines().skip_while(|l| !l.starts_with('|')) {
        let Some(row) = line.strip_prefix('|') else { break };
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let [krate, allowed, ..] = cells.as_slice() else { continue };
        let krate = krate.trim_matches('`');
        if krate == "crate" || krate.starts_with("---") || krate.is_empty() {
            continue;
        }
        let deps = allowed
            .split([',', ';'])
            .map(|d| d.trim().trim_matches('`'))
            .filter(|d| d.starts_with("router-"))
            .map(|d| d.split_whitespace().next().unwrap_or(d).to_owned())
            .collect();
        table.insert(krate.to_owned(), deps);
    }
    if table.is_empty() {
        bail!("the dependency table in ARCHITECTURE.md has no rows");
    }
    Ok(table)
}

/// Every edge or member the table does not allow, as a readable line.
pub(crate) fn violations(
    allowed: &BTreeMap<String, BTreeSet<String>>,
    graph: &Graph,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (krate, deps) in &graph.internal {
        let Some(ok) = allowed.get(krate) else {
            problems.push(format!(
                "{krate} is a workspace member missing from the table in ARCHITECTURE.md"
            ));
            continue;
        };
        for dep in deps.difference(ok) {
            problems.push(format!("{krate} -> {dep} is not an allowed dependency edge"));
        }
    }
    for (krate, deps) in &graph.external {
        for (confined, owners) in CONFINED {
            if deps.contains(*confined) && !owners.contains(&krate.as_str()) {
                problems.push(format!(
                    "{krate} -> {confined}: {confined} is only for {}",
                    owners.join(", ")
                ));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "intro\n### Dependency direction\n\n| crate | may depend on |\n|---|---|\n\
        | router-workers | — |\n| router-state-kv | router-workers |\n\
        | router-affinity | router-workers |\n\nafter the table\n";

    fn graph(edges: &[(&str, &[&str])]) -> Graph {
        let mut graph = Graph::default();
        for (krate, deps) in edges {
            graph
                .internal
                .insert((*krate).to_owned(), deps.iter().map(|d| (*d).to_owned()).collect());
            graph.external.insert((*krate).to_owned(), BTreeSet::new());
        }
        graph
    }

    #[test]
    fn parses_rows_and_dashes() {
        let table = parse_table(DOC).expect("table");
        assert_eq!(table.len(), 3);
        assert!(table["router-workers"].is_empty());
        assert!(table["router-affinity"].contains("router-workers"));
    }

    #[test]
    fn a_forbidden_edge_fails_naming_both_crates() {
        let table = parse_table(DOC).expect("table");
        let graph = graph(&[
            ("router-workers", &[]),
            ("router-state-kv", &["router-workers"]),
            ("router-affinity", &["router-workers", "router-state-kv"]),
        ]);
        let problems = violations(&table, &graph);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("router-affinity -> router-state-kv"), "{problems:?}");
    }

    #[test]
    fn a_member_missing_from_the_table_fails() {
        let table = parse_table(DOC).expect("table");
        let graph = graph(&[("router-workers", &[]), ("router-mystery", &["router-workers"])]);
        let problems = violations(&table, &graph);
        assert!(problems.iter().any(|p| p.contains("router-mystery")), "{problems:?}");
    }

    #[test]
    fn anyhow_in_a_library_crate_fails() {
        let table = parse_table(DOC).expect("table");
        let mut graph = graph(&[("router-workers", &[])]);
        graph.external.insert("router-workers".into(), ["anyhow".to_owned()].into());
        let problems = violations(&table, &graph);
        assert!(problems.iter().any(|p| p.contains("router-workers -> anyhow")), "{problems:?}");
    }

    /// The real workspace obeys the real table: a wrong edge fails `cargo test` as well.
    #[test]
    fn workspace_layering_matches_architecture_md() {
        check_workspace(&crate::workspace_root()).expect("layering");
    }
}
