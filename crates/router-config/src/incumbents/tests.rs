//! The table against the incumbents' own argument parsers (`incumbent-flags.tsv`, read from
//! their argparse definitions), against this router's command line, and as the docs show it.

use std::collections::BTreeMap;

use clap::CommandFactory;

use super::*;
use crate::Cli;

/// The incumbents' flags: name to (routers, values).
fn incumbents() -> BTreeMap<&'static str, (u8, Values)> {
    let mut flags = BTreeMap::new();
    for line in include_str!("incumbent-flags.tsv").lines().filter(|l| !l.starts_with('#')) {
        let fields: Vec<&str> = line.split('\t').collect();
        let [router, name, values] = fields[..] else { panic!("malformed line {line:?}") };
        let bit = match router {
            "sglang-router" => SGLANG_ROUTER,
            "smg" => SMG,
            "vllm-router" => VLLM_ROUTER,
            other => panic!("unknown router {other}"),
        };
        let values = match values {
            "none" => Values::None,
            "one" => Values::One,
            "many" => Values::Many,
            other => panic!("unknown arity {other}"),
        };
        let entry = flags.entry(name).or_insert((0, values));
        entry.0 |= bit;
        assert_eq!(entry.1, values, "{name} takes the same values in every router");
    }
    flags
}

#[test]
fn the_table_has_every_flag_of_the_three_routers_and_no_other() {
    let incumbents = incumbents();
    assert!(incumbents.len() > 240, "{} flags read", incumbents.len());
    for (name, (routers, values)) in &incumbents {
        let flag = find(name).unwrap_or_else(|| panic!("{name} is not in the table"));
        assert_eq!((flag.routers, flag.values), (*routers, *values), "{name}");
    }
    for flag in FLAGS {
        assert!(incumbents.contains_key(flag.name), "{} is no incumbent's flag", flag.name);
    }
}

#[test]
fn every_honoured_flag_is_one_of_this_routers_and_no_other_flag_is() {
    let command = Cli::command();
    let mut ours: Vec<String> = vec!["--help".into(), "-h".into(), "--version".into(), "-V".into()];
    let mut collect = |command: &clap::Command| {
        for arg in command.get_arguments() {
            ours.extend(
                arg.get_long_and_visible_aliases().into_iter().flatten().map(|l| format!("--{l}")),
            );
            ours.extend(arg.get_short().map(|s| format!("-{s}")));
        }
    };
    collect(&command);
    for flag in FLAGS {
        let known = ours.iter().any(|o| o == flag.name);
        match flag.treatment {
            // `--version-verbose` is rewritten to `--version` before parsing.
            Treatment::Honoured(_) if flag.name == "--version-verbose" => assert!(!known),
            Treatment::Honoured(_) => assert!(known, "{} is honoured but clap lacks it", flag.name),
            _ => assert!(!known, "{} is ours, yet {:?}", flag.name, flag.treatment),
        }
    }
}

fn owned(line: &str) -> Vec<String> {
    std::iter::once("router-server").chain(line.split_whitespace()).map(str::to_owned).collect()
}

#[test]
fn ignored_flags_leave_with_their_values_and_a_warning() {
    let screened = screen(&owned(
        "--worker-urls http://a:1 http://b:2 --worker-startup-timeout-secs 600 \
         --reasoning-parser=qwen3 --tokenizer-cache-enable-l0 --mm-allowed-media-domains a.com \
         --prometheus-duration-buckets 0.1 0.5 -1 --policy cache_aware --version-verbose",
    ))
    .expect("nothing refused");
    assert_eq!(
        screened.args,
        owned("--worker-urls http://a:1 http://b:2 --policy cache_aware --version"),
        "the values of each ignored flag go with it, a negative number too"
    );
    assert_eq!(screened.warnings.len(), 5, "{:#?}", screened.warnings);
    let first = &screened.warnings[0];
    assert!(first.starts_with("--worker-startup-timeout-secs 600 (sglang-router, smg, vllm-router) has no effect here: "), "{first}");
    assert!(screened.warnings[1].starts_with("--reasoning-parser=qwen3 (sglang-router, smg)"));
    assert!(screened.warnings[4].starts_with("--prometheus-duration-buckets 0.1 0.5 -1"));
}

#[test]
fn a_refused_flag_names_itself_its_routers_and_what_replaces_it() {
    for flag in FLAGS {
        let Treatment::Refused(why) = flag.treatment else { continue };
        let value = match flag.values {
            Values::None => "",
            _ => " x",
        };
        let err = screen(&owned(&format!("--worker-urls http://a:1 {}{value}", flag.name)))
            .expect_err(flag.name);
        assert!(
            err.starts_with(&format!("{} ({}) is not supported: ", flag.name, flag.from())),
            "{err}"
        );
        assert!(err.ends_with(why), "{err}");
        assert!(why.len() > 40, "{}: say what replaces it: {why}", flag.name);
    }
    let inline = screen(&owned("--tls-cert-path=/c.pem")).expect_err("refused inline too");
    assert!(inline.starts_with("--tls-cert-path (sglang-router, smg)"), "{inline}");
}

#[test]
fn docs_incumbent_flags_md_is_this_table() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).expect("root");
    let path = root.join("docs/incumbent-flags.md");
    let doc = std::fs::read_to_string(&path).expect("docs/incumbent-flags.md");
    let table = markdown();
    if std::env::var_os("ROUTER_BLESS_DOCS").is_some() && !doc.contains(&table) {
        let start = doc.find("| flag |").expect("the table's head");
        let end = doc[start..].find("\n\n").map_or(doc.len(), |at| start + at + 1);
        std::fs::write(&path, format!("{}{table}{}", &doc[..start], &doc[end..])).expect("write");
        return;
    }
    assert!(
        doc.contains(&table),
        "docs/incumbent-flags.md differs from the table in incumbents/table.rs: rerun \
         this test with ROUTER_BLESS_DOCS=1 to write it"
    );
}
