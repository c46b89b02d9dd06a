//! `cargo xtask lint`: formatting, clippy and rustdoc, all with warnings as errors.

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
    Ok(())
}
