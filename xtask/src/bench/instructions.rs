//! Instructions per request, counted by callgrind: the router and nginx each run under
//! valgrind in front of the same instant engine, warmed up, then counted over a fixed number
//! of requests. User-space instructions are deterministic where CPU time on a shared machine
//! is not, so a change to the data path shows as a number that does not move between runs
//! (kernel work, which both proxies share, is not counted).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::nginx::{self, Nginx};
use super::overhead::{PLAIN, STREAM, blast};
use super::procs::{self, Bins, Proc, engine};

/// One kind of request counted through both proxies.
#[derive(Debug)]
pub(crate) struct Counted {
    pub(crate) name: &'static str,
    /// Thousands of instructions per request.
    pub(crate) router_k: f64,
    /// The router under `--http1 hyper`.
    pub(crate) hyper_k: f64,
    pub(crate) nginx_k: f64,
}

/// Set, the callgrind dumps are kept for a profile and their directory printed: per engine
/// `router-<engine>.out.N` and `nginx-<engine>.out.N`, one dump per kind of request in the
/// order of [`ENGINES`].
const KEEP_DUMPS: &str = "ROUTER_BENCH_KEEP_CALLGRIND";

/// Requests counted per proxy and kind (valgrind runs a program some 50x slower).
pub(crate) const REQUESTS: usize = 1_000;

/// A router-sim engine (answering at once) that both proxies are counted in front of.
struct Counting {
    /// Names its dumps.
    name: &'static str,
    /// router-sim's options beyond answering at once.
    options: &'static [&'static str],
    /// The kinds of request counted through it: a name and a body.
    kinds: &'static [(&'static str, &'static str)],
}

const ENGINES: [Counting; 2] = [
    Counting {
        name: "sim",
        options: &[],
        kinds: &[("plain", PLAIN), ("stream, 1 token per event", STREAM)],
    },
    Counting {
        name: "sim16",
        options: &["--stream-interval", "16"],
        kinds: &[("stream, 16 events per write", STREAM)],
    },
];

/// Counts the router (round_robin, one event-loop thread; its own HTTP/1.1 loop and hyper's)
/// and nginx per plain request and per
/// streamed request of one event per token, on a router-sim engine that answers at once, and
/// per streamed request on one that writes 16 events at a time.
pub(crate) fn measure(bins: &Bins) -> Result<Vec<Counted>> {
    let valgrind = procs::debian_tool("valgrind", "valgrind")?;
    let control = valgrind.with_file_name("callgrind_control");
    let nginx_bin = nginx::binary()?;
    let dir = std::env::temp_dir().join(format!("xtask-callgrind-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("runtime")?;
    let counting = |proxy: &Proc, proxy_url: &str, out: &Path, body: &'static str| {
        count(&runtime, &control, proxy, proxy_url, out, body)
    };
    let mut counted = Vec::new();
    for Counting { name: engine_name, options, kinds } in ENGINES {
        let fast = ["--prefill-tokens-per-sec", "1e9", "--decode-tokens-per-sec", "1e9"];
        let (_engine, url) = engine(bins, &[&fast[..], options].concat())?;
        let start_router = |out: &Path, front: &str| {
            let router_args: Vec<String> = [
                &callgrind_args(out)[..],
                &[bins.server.display().to_string()],
                &["--worker-urls", &url, "--policy", "round_robin", "--port", "0"]
                    .map(str::to_owned),
                &["--worker-threads", "1", "--http1", front].map(str::to_owned),
            ]
            .concat();
            let router = Proc::start(&valgrind, &router_args, "router listening on ")?;
            let router_url = router.after("router listening on ")?;
            anyhow::Ok((router, router_url))
        };
        let out = dir.join(format!("router-{engine_name}.out"));
        let (router, router_url) = start_router(&out, "own")?;
        let out_hyper = dir.join(format!("router-hyper-{engine_name}.out"));
        let (hyper, hyper_url) = start_router(&out_hyper, "hyper")?;
        let out_nginx = dir.join(format!("nginx-{engine_name}.out"));
        let nginx_args =
            [&callgrind_args(&out_nginx)[..], &[nginx_bin.display().to_string()]].concat();
        let nginx = Nginx::start_under(&valgrind, &nginx_args, &url)?;
        for &(name, body) in kinds {
            let router_k = counting(&router, &router_url, &out, body)?;
            let hyper_k = counting(&hyper, &hyper_url, &out_hyper, body)?;
            let nginx_k = counting(&nginx.process, &nginx.url, &out_nginx, body)?;
            counted.push(Counted { name, router_k, hyper_k, nginx_k });
        }
    }
    if std::env::var_os(KEEP_DUMPS).is_some() {
        eprintln!(
            "xtask bench: callgrind dumps kept in {} (read with callgrind_annotate)",
            dir.display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(counted)
}

/// valgrind's arguments for a program counted from a zeroed start to each dump.
fn callgrind_args(out: &Path) -> Vec<String> {
    ["--tool=callgrind", "--dump-instr=no"]
        .map(str::to_owned)
        .into_iter()
        .chain([format!("--callgrind-out-file={}", out.display())])
        .collect()
}

/// Warms `proxy` up, zeroes its counters, sends [`REQUESTS`] copies of `body` and returns the
/// thousands of instructions per request of the dump that follows.
fn count(
    runtime: &tokio::runtime::Runtime,
    control: &Path,
    proxy: &Proc,
    url: &str,
    out: &Path,
    body: &'static str,
) -> Result<f64> {
    let pid = proxy.pid().to_string();
    let warm = runtime.block_on(blast(url, body, 200, 8))?;
    if warm.errors > 0 {
        bail!("{} of 200 warm-up requests to {url} under valgrind failed", warm.errors);
    }
    callgrind_control(control, &["-z", &pid])?;
    let before = dumps(out)?;
    let run = runtime.block_on(blast(url, body, REQUESTS, 8))?;
    if run.errors > 0 {
        bail!("{} of {REQUESTS} requests to {url} under valgrind failed", run.errors);
    }
    callgrind_control(control, &["-d", &pid])?;
    // The counted process writes the dump itself, a moment after it is asked to.
    let mut waited = Duration::ZERO;
    let dump = loop {
        if let Some(new) = dumps(out)?.into_iter().find(|path| !before.contains(path)) {
            break new;
        }
        if waited > Duration::from_secs(30) {
            bail!("callgrind wrote no dump for {url} within 30 s");
        }
        std::thread::sleep(Duration::from_millis(100));
        waited += Duration::from_millis(100);
    };
    let instructions = summary(&dump)?;
    Ok(instructions as f64 / REQUESTS as f64 / 1000.0)
}

fn callgrind_control(control: &Path, args: &[&str]) -> Result<()> {
    let status = Command::new(control)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running {}", control.display()))?;
    if !status.success() {
        bail!("{} {args:?} failed ({status})", control.display());
    }
    Ok(())
}

/// The dumps written so far next to `out` (`out.1`, `out.2`, ...).
fn dumps(out: &Path) -> Result<Vec<PathBuf>> {
    let dir = out.parent().context("a dump directory")?;
    let stem = out.file_name().context("a dump name")?.to_string_lossy().into_owned() + ".";
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.is_some_and(|n| n.starts_with(&stem)) {
            found.push(path);
        }
    }
    Ok(found)
}

/// The total instructions of a callgrind dump (its `summary:` line, or `totals:`).
fn summary(dump: &Path) -> Result<u64> {
    let text =
        std::fs::read_to_string(dump).with_context(|| format!("reading {}", dump.display()))?;
    text.lines()
        .find_map(|line| line.strip_prefix("summary:").or_else(|| line.strip_prefix("totals:")))
        .and_then(|count| count.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no instruction total in {}", dump.display()))
}

/// One line of the count, for the terminal.
pub(crate) fn line(counted: &Counted) -> String {
    format!(
        "{}: router {:.1}k instructions/request, router (hyper) {:.1}k, nginx {:.1}k ({:.2}x, \
         hyper {:.2}x)",
        counted.name,
        counted.router_k,
        counted.hyper_k,
        counted.nginx_k,
        counted.router_k / counted.nginx_k,
        counted.hyper_k / counted.nginx_k
    )
}

/// The part of the page section `overhead` that shows the count.
pub(crate) fn render(counted: &[Counted]) -> String {
    let mut page = format!(
        "\n### Instructions per request (callgrind)\n\n\
         User-space instructions per request of each proxy, counted by valgrind's callgrind \
         over {REQUESTS} requests after a warm-up, in front of an instant router-sim engine \
         writing each event as it comes, or 16 at a time (the router: round_robin, \
         `--worker-threads 1`). Unlike CPU time they do not move \
         between runs on a shared machine, so they show what a change to the data path did; \
         kernel work (the same system calls for both) is not in them.\n\n\
         | request | router | router, `--http1 hyper` | nginx | router ÷ nginx | hyper ÷ nginx |\n\
         |---|---:|---:|---:|---:|---:|\n"
    );
    for c in counted {
        page.push_str(&format!(
            "| {} | {:.1}k | {:.1}k | {:.1}k | {:.2}x | {:.2}x |\n",
            c.name,
            c.router_k,
            c.hyper_k,
            c.nginx_k,
            c.router_k / c.nginx_k,
            c.hyper_k / c.nginx_k
        ));
    }
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dumps_total_is_its_summary_line_and_only_new_dumps_are_found() {
        let dir = std::env::temp_dir().join(format!("xtask-callgrind-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let out = dir.join("router.out");
        let header = "# callgrind format\nversion: 1\nevents: Ir\n";
        // (dump text, the total read from it)
        let cases = [
            (format!("{header}fn=main\n0 12\nsummary: 123456\ntotals: 123456\n"), Some(123456)),
            (format!("{header}fn=main\n0 12\ntotals: 789\n"), Some(789)),
            (format!("{header}fn=main\n0 12\n"), None),
        ];
        for (i, (text, total)) in cases.iter().enumerate() {
            let before = dumps(&out).expect("listed");
            let path = dir.join(format!("router.out.{}", i + 1));
            std::fs::write(&path, text).expect("written");
            let after = dumps(&out).expect("listed");
            let new: Vec<_> = after.iter().filter(|p| !before.contains(p)).collect();
            assert_eq!(new, [&path], "the dump just written is the new one");
            assert_eq!(summary(&path).ok(), *total, "{text}");
        }
        std::fs::write(dir.join("nginx.out.1"), "summary: 1\n").expect("written");
        assert_eq!(dumps(&out).expect("listed").len(), cases.len(), "another program's dumps");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
