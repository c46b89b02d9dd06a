//! Every flag of sglang-router 0.3.2 (`python -m sglang_router.launch_router`), smg 1.13.0
//! (`smg launch`) and vllm-router 0.1.17, and what this router does with it: honour it (a flag
//! of its own command line with that meaning), accept it with a warning that it has no effect
//! here, or refuse it naming what replaces it. [`screen`] applies the table to the raw
//! arguments before clap parses them, so that no incumbent flag ever meets clap's generic
//! "unexpected argument". docs/incumbent-flags.md is this table, rendered
//! by `markdown` (a test compares the two).

mod table;

pub(crate) use table::FLAGS;

/// The routers a flag comes from, as bits.
pub(crate) const SGLANG_ROUTER: u8 = 1;
/// smg 1.13.0.
pub(crate) const SMG: u8 = 2;
/// vllm-router 0.1.17.
pub(crate) const VLLM_ROUTER: u8 = 4;

/// How many values follow a flag on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Values {
    /// A switch.
    None,
    /// One value.
    One,
    /// Any number of values, up to the next flag.
    Many,
}

/// What this router does with an incumbent flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Treatment {
    /// A flag of this router's command line with the incumbent's meaning: what it sets.
    Honoured(&'static str),
    /// Accepted with a warning: it has no effect here, for this reason.
    Ignored(&'static str),
    /// Refused (exit status 2): why, and what replaces it.
    Refused(&'static str),
}

/// One incumbent flag.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IncumbentFlag {
    /// The flag as the incumbents spell it, `--name` (or `-h`).
    pub name: &'static str,
    /// The routers that have it ([`SGLANG_ROUTER`], [`SMG`], [`VLLM_ROUTER`]).
    pub routers: u8,
    /// The values that follow it.
    pub values: Values,
    /// What this router does with it.
    pub treatment: Treatment,
}

impl IncumbentFlag {
    /// The routers that have it, by name.
    pub(crate) fn from(&self) -> String {
        let names = [(SGLANG_ROUTER, "sglang-router"), (SMG, "smg"), (VLLM_ROUTER, "vllm-router")];
        let names = names.iter().filter(|(bit, _)| self.routers & bit != 0).map(|(_, name)| *name);
        names.collect::<Vec<_>>().join(", ")
    }
}

/// The entry of `name`, when an incumbent has that flag.
pub(crate) fn find(name: &str) -> Option<&'static IncumbentFlag> {
    FLAGS.iter().find(|flag| flag.name == name)
}

/// The arguments clap is to parse, with every ignored incumbent flag (and its values) taken
/// out, and a warning for each.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Screened {
    /// The arguments left, the program name first.
    pub args: Vec<String>,
    /// One line per ignored flag: what it was and why it has no effect.
    pub warnings: Vec<String>,
}

/// Applies the table to `args` (the program name first): the first refused flag is an error
/// naming it and its replacement; ignored flags are taken out with their values, each with a
/// warning; the rest is left for clap. `--version-verbose` is `--version`.
pub fn screen(args: &[String]) -> Result<Screened, String> {
    let mut screened = Screened::default();
    let mut rest = args.iter().peekable();
    if let Some(program) = rest.next() {
        screened.args.push(program.clone());
    }
    while let Some(arg) = rest.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, _)) if name.starts_with("--") => (name, true),
            _ => (arg.as_str(), false),
        };
        let Some(flag) = find(name) else {
            screened.args.push(arg.clone());
            continue;
        };
        match flag.treatment {
            Treatment::Refused(why) => {
                return Err(format!("{name} ({}) is not supported: {why}", flag.from()));
            }
            Treatment::Honoured(_) if name == "--version-verbose" => {
                screened.args.push("--version".to_owned());
            }
            Treatment::Honoured(_) => screened.args.push(arg.clone()),
            Treatment::Ignored(why) => {
                let mut values = Vec::new();
                if !inline {
                    match flag.values {
                        Values::None => {}
                        Values::One => values.extend(rest.next().cloned()),
                        Values::Many => {
                            while let Some(value) = rest.next_if(|v| !is_flag(v)) {
                                values.push(value.clone());
                            }
                        }
                    }
                }
                let given = std::iter::once(arg.as_str()).chain(values.iter().map(String::as_str));
                let given = given.collect::<Vec<_>>().join(" ");
                let from = flag.from();
                screened.warnings.push(format!("{given} ({from}) has no effect here: {why}"));
            }
        }
    }
    Ok(screened)
}

/// Whether `arg` starts another flag (a negative number is a value).
fn is_flag(arg: &str) -> bool {
    arg.starts_with('-') && arg.parse::<f64>().is_err()
}

/// The table as docs/incumbent-flags.md shows it: one row per flag, in name order.
#[cfg(test)]
pub(crate) fn markdown() -> String {
    let mut flags: Vec<&IncumbentFlag> = FLAGS.iter().collect();
    flags.sort_by_key(|flag| flag.name.trim_start_matches('-'));
    let mut out = String::from(
        "| flag | sglang-router | smg | vllm-router | here |\n|---|:-:|:-:|:-:|---|\n",
    );
    let mark = |flag: &IncumbentFlag, bit: u8| if flag.routers & bit != 0 { "x" } else { "" };
    for flag in flags {
        let here = match flag.treatment {
            Treatment::Honoured(what) => format!("**honoured**: {what}"),
            Treatment::Ignored(why) => format!("ignored, with a warning: {why}"),
            Treatment::Refused(why) => format!("**refused**: {why}"),
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            flag.name,
            mark(flag, SGLANG_ROUTER),
            mark(flag, SMG),
            mark(flag, VLLM_ROUTER),
            here.replace('|', "\\|"),
        ));
    }
    out
}

#[cfg(test)]
mod tests;
