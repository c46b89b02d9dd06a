//! `cargo xtask lint`: formatting, clippy and rustdoc, all with warnings as errors, and
//! cargo-deny's licenses, bans (a second version of a crate) and sources (deny.toml).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::cargo;

pub(crate) fn run(root: &Path) -> Result<()> {
    cargo(root, &["fmt", "--all", "--check"])?;
    // fuzz/ is a workspace of its own, which `--all` does not reach.
    cargo(root, &["fmt", "--manifest-path", "fuzz/Cargo.toml", "--check"])?;
    cargo(root, &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
    eprintln!("xtask: cargo doc --workspace --no-deps (RUSTDOCFLAGS=-D warnings)");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .args(["doc", "--workspace", "--no-deps", "--document-private-items"])
        .env("RUSTDOCFLAGS", "-D warnings")
        .current_dir(root)
        .status()
        .context("running cargo doc")?;
    if !status.success() {
        bail!("cargo doc failed ({status})");
    }
    deny(root)
}

/// The cargo-deny release deny.toml is written for, and where .ci/run installs it.
const DENY_VERSION: &str = "0.20.2";

/// `cargo deny check licenses bans sources`, offline (the lock file and the local index are all
/// it reads; advisories would need the RustSec database, which is not checked here).
fn deny(root: &Path) -> Result<()> {
    let cached = std::env::var_os("HOME").map(|home| {
        Path::new(&home).join(format!(".cache/router-ci/cargo-deny-{DENY_VERSION}/bin/cargo-deny"))
    });
    let binary = match std::env::var_os("ROUTER_CARGO_DENY") {
        Some(path) => path.into(),
        None => cached.filter(|path| path.exists()).with_context(|| {
            format!(
                "cargo-deny {DENY_VERSION} not found (.ci/run installs it): cargo install \
                 cargo-deny --version {DENY_VERSION} --locked --root \
                 ~/.cache/router-ci/cargo-deny-{DENY_VERSION}, or set ROUTER_CARGO_DENY"
            )
        })?,
    };
    eprintln!("xtask: cargo deny --offline check licenses bans sources");
    let status = Command::new(binary)
        .args(["--offline", "check", "licenses", "bans", "sources"])
        .current_dir(root)
        .status()
        .context("running cargo-deny")?;
    if !status.success() {
        bail!("cargo deny failed ({status}): see deny.toml");
    }
    Ok(())
}
