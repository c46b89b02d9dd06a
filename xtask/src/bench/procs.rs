//! Processes of the benchmark: release binaries started on loopback, read until ready, killed
//! on drop, with their CPU time read from `/proc`; and one-shot commands run under a deadline.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// A child process killed on drop.
pub(crate) struct Proc {
    child: Child,
    pub(crate) lines: Vec<String>,
}

impl Proc {
    /// Starts `bin args` and waits for a stdout line containing `ready`.
    pub(crate) fn start(bin: &Path, args: &[String], ready: &str) -> Result<Self> {
        let mut child = Command::new(bin)
            .args(args)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().context("stdout")?;
        let stderr = tail(child.stderr.take().context("stderr")?);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut lines = Vec::new();
        loop {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(line) => {
                    let done = line.contains(ready);
                    lines.push(line);
                    if done {
                        break;
                    }
                }
                Err(_) => {
                    // Exited (stdout closed) or silent for too long: give a dying process a
                    // moment to finish its error message, then report why.
                    let deadline = Instant::now() + Duration::from_secs(1);
                    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let _ = child.kill();
                    let _ = child.wait();
                    let name = bin.file_name().map_or_else(
                        || bin.display().to_string(),
                        |n| n.to_string_lossy().into_owned(),
                    );
                    let stderr = stderr.join().unwrap_or_default();
                    bail!(
                        "{name} did not become ready: {}",
                        if stderr.is_empty() { format!("stdout {lines:?}") } else { stderr }
                    );
                }
            }
        }
        std::thread::spawn(move || while rx.recv().is_ok() {});
        Ok(Self { child, lines })
    }

    /// The text after `prefix` on the first line that has it.
    pub(crate) fn after(&self, prefix: &str) -> Result<String> {
        self.lines
            .iter()
            .find_map(|l| l.split_once(prefix).map(|(_, rest)| rest.trim().to_owned()))
            .with_context(|| format!("no {prefix:?} in {:?}", self.lines))
    }

    /// CPU time consumed so far by every thread, in nanoseconds of run time from
    /// `/proc/<pid>/task/*/schedstat` (precise, unlike the 10 ms ticks of `/proc/<pid>/stat`).
    pub(crate) fn cpu_time(&self) -> Result<Duration> {
        let tasks = format!("/proc/{}/task", self.child.id());
        let mut total = 0u64;
        for entry in std::fs::read_dir(&tasks).with_context(|| format!("reading {tasks}"))? {
            let path = entry?.path().join("schedstat");
            // A thread may exit between listing and reading.
            if let Ok(text) = std::fs::read_to_string(&path) {
                total +=
                    text.split_whitespace().next().and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
            }
        }
        Ok(Duration::from_nanos(total))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Drains `reader` on a thread, so the child never blocks on a full pipe; the thread ends with
/// the pipe and returns the last lines, joined by ` / `.
fn tail(reader: impl Read + Send + 'static) -> JoinHandle<String> {
    const KEEP: usize = 8;
    std::thread::spawn(move || {
        let mut kept = VecDeque::with_capacity(KEEP);
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            if kept.len() == KEEP {
                kept.pop_front();
            }
            kept.push_back(line);
        }
        Vec::from(kept).join(" / ")
    })
}

/// What a command printed, once it exited.
pub(crate) struct Finished {
    pub(crate) success: bool,
    pub(crate) stdout: String,
    /// The last lines of its standard error.
    pub(crate) stderr: String,
}

/// Runs `command` to its end, killing it after `timeout`.
pub(crate) fn run_with_timeout(command: &mut Command, timeout: Duration) -> Result<Finished> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the command")?;
    let mut stdout = child.stdout.take().context("stdout")?;
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let stderr = tail(child.stderr.take().context("stderr")?);
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("no answer after {} s, killed", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    Ok(Finished { success: status.success(), stdout, stderr })
}

/// The release binaries.
pub(crate) struct Bins {
    pub(crate) server: PathBuf,
    pub(crate) sim: PathBuf,
}

impl Bins {
    pub(crate) fn release(root: &Path) -> Self {
        Self::in_profile(root, "release")
    }

    /// The binaries of cargo profile directory `profile` (`release`, or `debug` for
    /// `--debug`).
    pub(crate) fn in_profile(root: &Path, profile: &str) -> Self {
        let dir = root.join("target").join(profile);
        Self { server: dir.join("router-server"), sim: dir.join("router-sim") }
    }
}

/// Starts one simulated engine; returns it and its URL.
pub(crate) fn engine(bins: &Bins, extra: &[&str]) -> Result<(Proc, String)> {
    let mut args: Vec<String> =
        ["engine", "--port", "0", "--model", "m"].iter().map(|s| (*s).to_owned()).collect();
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let proc = Proc::start(&bins.sim, &args, "listening on ")?;
    let url = proc.after("listening on ")?;
    Ok((proc, url))
}

/// Starts the router with a configuration file written to a temporary path.
pub(crate) fn router_with_config(bins: &Bins, yaml: &str) -> Result<(Proc, String)> {
    let path = std::env::temp_dir().join(format!("xtask-bench-{}.yaml", std::process::id()));
    std::fs::write(&path, yaml)?;
    let args = vec!["--config".to_owned(), path.display().to_string()];
    let proc = Proc::start(&bins.server, &args, "router listening on ")?;
    let url = proc.after("router listening on ")?;
    Ok((proc, url))
}
