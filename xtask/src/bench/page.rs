//! The benchmark page `docs/benchmarks.md` as a sequence of sections between markers
//! (`<!-- bench:NAME -->` ... `<!-- /bench:NAME -->`), so that a run replaces only the
//! sections it measured and keeps the rest of the page as it was.

/// Known sections, in page order; a missing section is inserted at its place in this order.
pub(crate) const ORDER: &[&str] =
    &["overhead", "epp", "policies", "quality", "replicas", "real", "reproduce"];

/// The page's opening, written when the page is new or had no markers yet.
pub(crate) const HEADER: &str = "# Benchmarks\n\nWritten by `cargo xtask bench`. Each section is \
replaced only by a run that measures it (`--only` runs one), and says which command produced it \
on which machine; the machine is shared and noisy, so compare rows of one section, not sections \
or runs.\n";

/// Pre-marker headings and the section each one becomes when an old page is first spliced.
const LEGACY: &[(&str, &str)] = &[
    ("## Router overhead", "overhead"),
    ("## Policies", "policies"),
    ("## Mooncake traces", "quality"),
    ("## Routing quality under load", "quality"),
    ("## Reproduce", "reproduce"),
];

#[derive(Debug, PartialEq)]
enum Block {
    Text(String),
    Section(String, String),
}

/// `page` with the body of each of `sections` (name, markdown) replaced, or inserted at its
/// place in [`ORDER`] when absent; everything else is kept. A page without markers is split at
/// its known `## ` headings first, and its opening replaced by [`HEADER`].
pub(crate) fn splice(page: &str, sections: &[(&str, String)]) -> String {
    let mut blocks = if page.contains("<!-- bench:") { parse(page) } else { migrate(page) };
    for (name, body) in sections {
        let found = blocks.iter_mut().find_map(|b| match b {
            Block::Section(n, old) if n == name => Some(old),
            _ => None,
        });
        match found {
            Some(old) => old.clone_from(body),
            None => {
                let at = insertion_point(&blocks, name);
                blocks.insert(at, Block::Section((*name).to_owned(), body.clone()));
            }
        }
    }
    let mut out = Vec::new();
    for block in &blocks {
        match block {
            Block::Text(text) => {
                let text = text.trim_matches('\n');
                if !text.is_empty() {
                    out.push(format!("{text}\n"));
                }
            }
            Block::Section(name, body) => out.push(format!(
                "<!-- bench:{name} -->\n{}\n<!-- /bench:{name} -->\n",
                body.trim_matches('\n')
            )),
        }
    }
    out.join("\n")
}

fn rank(name: &str) -> usize {
    ORDER.iter().position(|n| *n == name).unwrap_or(ORDER.len())
}

/// After the last section that comes before `name`, else before the first that comes after,
/// else at the end.
fn insertion_point(blocks: &[Block], name: &str) -> usize {
    let ranked = |b: &Block| match b {
        Block::Section(n, _) => Some(rank(n)),
        Block::Text(_) => None,
    };
    let me = rank(name);
    if let Some(i) = blocks.iter().rposition(|b| ranked(b).is_some_and(|r| r <= me)) {
        return i + 1;
    }
    blocks.iter().position(|b| ranked(b).is_some()).unwrap_or(blocks.len())
}

/// Splits a page with markers; an unclosed section runs to the end of the page.
fn parse(page: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut rest = page;
    while let Some(open) = rest.find("<!-- bench:") {
        let after = &rest[open + "<!-- bench:".len()..];
        let Some(end) = after.find(" -->") else { break };
        let name = after[..end].trim().to_owned();
        blocks.push(Block::Text(rest[..open].to_owned()));
        let body = &after[end + " -->".len()..];
        let close = format!("<!-- /bench:{name} -->");
        match body.find(&close) {
            Some(at) => {
                blocks.push(Block::Section(name, body[..at].to_owned()));
                rest = &body[at + close.len()..];
            }
            None => {
                blocks.push(Block::Section(name, body.to_owned()));
                rest = "";
            }
        }
    }
    blocks.push(Block::Text(rest.to_owned()));
    blocks
}

/// Splits a page written before the markers at its known headings. The old opening said which
/// run produced the whole page: that line moves into each section that came from it.
fn migrate(page: &str) -> Vec<Block> {
    let produced = page
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .find(|l| l.starts_with("Produced by "))
        .map(|l| format!("{}.\n", l.split(" (").next().unwrap_or(l).trim_end_matches('.')));
    let mut blocks = vec![Block::Text(HEADER.to_owned())];
    let mut current: Option<Block> = None;
    for line in page.split_inclusive('\n') {
        if line.starts_with("## ") {
            blocks.extend(current.take());
            let heading = line.trim_end();
            current = Some(match LEGACY.iter().find(|(h, _)| *h == heading) {
                Some((_, name)) => Block::Section((*name).to_owned(), String::new()),
                None => Block::Text(String::new()),
            });
            if let Some(Block::Section(name, body)) = &mut current {
                body.push_str(line);
                if let Some(produced) = produced.as_ref().filter(|_| name != "reproduce") {
                    body.push('\n');
                    body.push_str(produced);
                }
                continue;
            }
        }
        // Lines before the first heading are the old opening, which HEADER replaces.
        if let Some(Block::Text(body) | Block::Section(_, body)) = &mut current {
            body.push_str(line);
        }
    }
    blocks.extend(current);
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(name: &str, body: &str) -> (&'static str, String) {
        let name: &'static str = ORDER.iter().find(|n| **n == name).expect("a known section");
        (name, body.to_owned())
    }

    #[test]
    fn a_new_page_gets_the_header_and_sections_in_order() {
        let page = splice("", &[section("quality", "## Q\n"), section("overhead", "## O\n")]);
        assert_eq!(
            page,
            format!(
                "{HEADER}\n<!-- bench:overhead -->\n## O\n<!-- /bench:overhead -->\n\n\
                 <!-- bench:quality -->\n## Q\n<!-- /bench:quality -->\n"
            )
        );
    }

    #[test]
    fn only_the_measured_sections_change() {
        let page = splice(
            "",
            &[
                section("overhead", "## O\nold overhead\n"),
                section("policies", "## P\nold policies\n"),
                section("reproduce", "## R\n"),
            ],
        );
        let page = page.replace("Written by", "Hand-edited intro. Written by");
        let next = splice(&page, &[section("policies", "## P\nnew policies\n")]);
        assert!(next.contains("old overhead"), "{next}");
        assert!(next.contains("new policies") && !next.contains("old policies"), "{next}");
        assert!(next.contains("Hand-edited intro."));
        // A section new to the page goes to its place in ORDER, before `reproduce`.
        let next = splice(&next, &[section("quality", "## Q\n")]);
        let at = |text: &str| next.find(text).expect(text);
        assert!(at("## P") < at("## Q") && at("## Q") < at("## R"), "{next}");
        // Splicing is idempotent.
        assert_eq!(splice(&next, &[section("quality", "## Q\n")]), next);
    }

    #[test]
    fn an_old_page_without_markers_is_wrapped_once() {
        let old = "# Benchmarks\n\nProduced by x (overwritten by each run).\n\n## Router overhead\n\n\
                   | a |\n\n## Policies\n\n| b |\n\n## Mooncake traces\n\n| c |\n\n## Notes\n\nkeep \
                   me\n\n## Reproduce\n\nold\n";
        let page = splice(old, &[section("quality", "## Routing quality under load\n\n| q |\n")]);
        assert!(page.starts_with(HEADER), "{page}");
        assert!(!page.contains("overwritten by each run"));
        assert!(page.contains(
            "<!-- bench:overhead -->\n## Router overhead\n\nProduced by x.\n\n| a |\n<!-- /bench:overhead -->"
        ), "the old opening's provenance moves into the section: {page}");
        assert!(
            page.contains(
                "<!-- bench:policies -->\n## Policies\n\nProduced by x.\n\n| b |\n<!-- /bench:policies -->"
            )
        );
        assert!(!page.contains("Mooncake traces") && page.contains("| q |"), "{page}");
        assert!(page.contains("## Notes\n\nkeep me\n"), "unknown headings stay: {page}");
        assert!(
            page.contains(
                "<!-- bench:reproduce -->\n## Reproduce\n\nold\n<!-- /bench:reproduce -->"
            )
        );
        // Once wrapped, a second splice only replaces.
        assert_eq!(splice(&page, &[]), page);
    }

    #[test]
    fn an_unclosed_section_runs_to_the_end() {
        let page = "intro\n<!-- bench:quality -->\n## Q\nhalf";
        let next = splice(page, &[section("quality", "## Q2\n")]);
        assert_eq!(next, "intro\n\n<!-- bench:quality -->\n## Q2\n<!-- /bench:quality -->\n");
    }
}
