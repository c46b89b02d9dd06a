//! nginx beside the router in the overhead benchmark: found on the machine or installed from
//! Debian's packages, started in the foreground as one process with the repository's
//! configuration (`nginx.conf`) in front of one engine, and killed on drop.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::procs::{self, Proc};

/// The configuration, with `{dir}`, `{listen}` and `{upstream}` to fill in.
const CONFIG: &str = include_str!("nginx.conf");

/// A running nginx proxying to one engine.
pub(crate) struct Nginx {
    pub(crate) process: Proc,
    pub(crate) url: String,
    /// Its prefix directory (configuration, pid and temporary files), removed on drop.
    dir: PathBuf,
}

impl Nginx {
    /// Starts nginx in front of `engine_url` (`http://host:port`) on a free loopback port.
    pub(crate) fn start(bin: &Path, engine_url: &str) -> Result<Self> {
        Self::start_under(bin, &[], engine_url)
    }

    /// Starts `program leading... nginx-arguments` (nginx itself, or a tool such as valgrind
    /// given nginx's path among `leading`) in front of `engine_url`, as [`Nginx::start`] does.
    pub(crate) fn start_under(
        program: &Path,
        leading: &[String],
        engine_url: &str,
    ) -> Result<Self> {
        let upstream = engine_url.strip_prefix("http://").unwrap_or(engine_url);
        let listen = free_port()?;
        let dir = std::env::temp_dir().join(format!(
            "xtask-bench-nginx-{}-{}",
            std::process::id(),
            listen.port()
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let config = CONFIG
            .replace("{dir}", &dir.display().to_string())
            .replace("{listen}", &listen.to_string())
            .replace("{upstream}", upstream);
        let path = dir.join("nginx.conf");
        std::fs::write(&path, config)?;
        let nginx_args = ["-p", &dir.display().to_string(), "-c", &path.display().to_string()]
            .map(str::to_owned);
        let args = [leading, &nginx_args].concat();
        let mut process = Proc::spawn(program, &args)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(listen).is_err() {
            process.check().context("nginx")?;
            if Instant::now() >= deadline {
                bail!("nginx did not listen on {listen} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self { process, url: format!("http://{listen}"), dir })
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The nginx binary: on `PATH` or in `/usr/sbin`, else installed with Debian's `apt-get`.
pub(crate) fn binary() -> Result<PathBuf> {
    procs::debian_tool("nginx", "nginx")
}

/// A loopback address nothing listens on (the port is released for nginx to take).
fn free_port() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?)
}
