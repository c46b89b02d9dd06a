//! Processes of the benchmark: release binaries started on loopback, read until ready, killed
//! on drop, with their CPU time read from `/proc`; one-shot commands run under a deadline; and
//! the tools the benchmark runs (nginx, valgrind) found or installed from Debian's packages.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use router_test_support::process::read_until_ready;

/// A child process killed on drop.
pub(crate) struct Proc {
    child: Child,
    pub(crate) lines: Vec<String>,
    /// The standard error tail of a process started by [`Proc::spawn`].
    stderr: Option<JoinHandle<String>>,
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
        let lines = match read_until_ready(stdout, ready, Duration::from_secs(30)) {
            Ok(lines) => lines,
            Err(why) => {
                // Give a dying process a moment to finish its error message, then say why.
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
                    if stderr.is_empty() { why.to_string() } else { stderr }
                );
            }
        };
        Ok(Self { child, lines, stderr: None })
    }

    /// The text after `prefix` on the first line that has it.
    pub(crate) fn after(&self, prefix: &str) -> Result<String> {
        self.lines
            .iter()
            .find_map(|l| l.split_once(prefix).map(|(_, rest)| rest.trim().to_owned()))
            .with_context(|| format!("no {prefix:?} in {:?}", self.lines))
    }

    /// Starts `bin args` without waiting for any output (for programs, like Envoy, that print
    /// nothing on stdout); the caller waits for readiness its own way, and [`Proc::check`]
    /// reports an early exit.
    pub(crate) fn spawn(bin: &Path, args: &[String]) -> Result<Self> {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stderr = tail(child.stderr.take().context("stderr")?);
        Ok(Self { child, lines: Vec::new(), stderr: Some(stderr) })
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails, with the last lines of its standard error, once the process has exited.
    pub(crate) fn check(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let stderr = self.stderr.take().and_then(|t| t.join().ok()).unwrap_or_default();
            bail!("exited ({status}): {stderr}");
        }
        Ok(())
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

    /// User plus system CPU time so far from `/proc/<pid>/stat` (`utime` + `stime`, in clock
    /// ticks of `ticks_per_sec`): coarse, but the figure `top` and `ps` report.
    pub(crate) fn stat_cpu_time(&self, ticks_per_sec: u64) -> Result<Duration> {
        let (user, system) = self.stat_user_system(ticks_per_sec)?;
        Ok(user + system)
    }

    /// User and system CPU time so far from `/proc/<pid>/stat` (`utime`, `stime`), apart.
    pub(crate) fn stat_user_system(&self, ticks_per_sec: u64) -> Result<(Duration, Duration)> {
        let path = format!("/proc/{}/stat", self.child.id());
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        let (user, system) =
            stat_ticks(&text).with_context(|| format!("no utime/stime in {path}"))?;
        let time = |ticks: u64| Duration::from_secs_f64(ticks as f64 / ticks_per_sec.max(1) as f64);
        Ok((time(user), time(system)))
    }
}

/// `utime` and `stime` of a `/proc/<pid>/stat` line. The command name (field 2) is in parentheses
/// and may hold spaces, so fields are counted after its closing `)`: state is the first there,
/// utime (field 14) the twelfth and stime the thirteenth.
fn stat_ticks(stat: &str) -> Option<(u64, u64)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime, stime))
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`), 100 when it cannot be asked.
pub(crate) fn clock_ticks_per_sec() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(100)
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

/// The program `name`, on `PATH` or in `/usr/sbin`, else installed from Debian's `package`.
pub(crate) fn debian_tool(name: &str, package: &str) -> Result<PathBuf> {
    if let Some(found) = find(name) {
        return Ok(found);
    }
    eprintln!("xtask bench: {name} not found, installing Debian's package {package}");
    let root = Command::new("id").arg("-u").output().is_ok_and(|out| out.stdout == b"0\n");
    let mut install = if root { Command::new("apt-get") } else { sudo_apt() };
    let status = install
        .args(["install", "-y", "--no-install-recommends", package])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get")?;
    if !status.success() {
        bail!("apt-get install {package} failed ({status}); install {name} and run again");
    }
    find(name).with_context(|| format!("{name} installed but not found on PATH or in /usr/sbin"))
}

fn sudo_apt() -> Command {
    let mut command = Command::new("sudo");
    command.args(["-n", "apt-get"]);
    command
}

fn find(name: &str) -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join(name));
    on_path.chain([Path::new("/usr/sbin").join(name)]).find(|path| path.is_file())
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

#[cfg(test)]
mod tests {
    use super::stat_ticks;

    #[test]
    fn reads_utime_and_stime_after_the_command_name() {
        // A command name with a space and a parenthesis, as `/proc/<pid>/stat` may hold.
        let stat = "4242 (envoy (main)) S 1 4242 4242 0 -1 4194560 1234 0 0 0 317 42 0 0 20 0 9 0";
        assert_eq!(stat_ticks(stat), Some((317, 42)));
        assert_eq!(stat_ticks("4242 (x) S 1"), None);
    }
}
