//! The routers we measure ourselves against, as their projects ship them on PyPI: each in a
//! venv of its own under `~/.cache/router-bench/`, installed once (pinned) and started in front
//! of a fleet of router-sim engines.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::procs::Proc;
use super::real::http;

/// A peer router: its PyPI package, pinned, and the command it installs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Peer {
    /// As the page names it.
    pub(crate) name: &'static str,
    package: &'static str,
    version: &'static str,
    command: &'static str,
    /// What comes before the flags (a subcommand).
    subcommand: Option<&'static str>,
}

/// SGLang's router (sglang-router 0.3.2).
pub(crate) const SGLANG_ROUTER: Peer = Peer {
    name: "sglang-router 0.3.2",
    package: "sglang-router",
    version: "0.3.2",
    command: "sglang-router",
    subcommand: Some("launch"),
};

/// vLLM's router (vllm-router 0.1.17).
pub(crate) const VLLM_ROUTER: Peer = Peer {
    name: "vllm-router 0.1.17",
    package: "vllm-router",
    version: "0.1.17",
    command: "vllm-router",
    subcommand: None,
};

impl Peer {
    /// Its command, installing it first into `~/.cache/router-bench/PACKAGE-VERSION` unless
    /// that venv has it already.
    pub(crate) fn install(&self) -> Result<PathBuf> {
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
        let venv =
            home.join(".cache/router-bench").join(format!("{}-{}", self.package, self.version));
        let command = venv.join("bin").join(self.command);
        if command.exists() {
            return Ok(command);
        }
        eprintln!(
            "xtask bench: installing {}=={} into {}",
            self.package,
            self.version,
            venv.display()
        );
        let run = |program: &std::path::Path, args: &[&str]| -> Result<()> {
            let status = Command::new(program).args(args).status()?;
            if !status.success() {
                bail!("{} {} failed ({status})", program.display(), args.join(" "));
            }
            Ok(())
        };
        run("python3".as_ref(), &["-m", "venv", &venv.display().to_string()])?;
        let pinned = format!("{}=={}", self.package, self.version);
        run(
            &venv.join("bin/pip"),
            &["install", "--quiet", "--disable-pip-version-check", &pinned],
        )?;
        if !command.exists() {
            bail!("{pinned} installed no {}", command.display());
        }
        Ok(command)
    }

    /// Starts it on a free port with `policy` in front of `engines`; its process and URL once
    /// it answers `/health`.
    pub(crate) async fn start(&self, policy: &str, engines: &[String]) -> Result<(Proc, String)> {
        let command = self.install()?;
        let port = free_port()?;
        let mut args: Vec<String> = self.subcommand.iter().map(|s| (*s).to_owned()).collect();
        args.extend(["--host".to_owned(), "127.0.0.1".to_owned()]);
        args.extend(["--port".to_owned(), port.to_string(), "--policy".to_owned(), policy.into()]);
        args.push("--worker-urls".to_owned());
        args.extend(engines.iter().cloned());
        let mut proc = Proc::spawn(&command, &args)?;
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            proc.check().with_context(|| format!("{} exited while starting", self.name))?;
            let health = http("GET", &format!("{url}/health"), None).await;
            if health.is_ok_and(|(status, _)| (200..300).contains(&status)) {
                return Ok((proc, url));
            }
            if Instant::now() > deadline {
                bail!("{} did not answer {url}/health within 60 s", self.name);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A loopback port free now (bound and released: another process could take it first, which
/// the start then reports).
pub(crate) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
