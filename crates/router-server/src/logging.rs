//! Structured logs: human-readable or JSON lines, filtered by `RUST_LOG` (when set and not
//! empty) or else `server.log_level` (default `info`), written to standard error (coloured only
//! on a terminal) or appended to `server.log_dir/router-server.log`. Request handlers run inside
//! a `request` span carrying the request id, so every line they write names it.

use std::io::IsTerminal;
use std::path::Path;

use tracing_subscriber::EnvFilter;

use router_config::ServerSection;

/// The file logs go to inside `server.log_dir`.
pub const LOG_FILE: &str = "router-server.log";

/// Installs the global subscriber as `server` says (`log_json`, `log_level`, `log_dir`).
/// Calling it twice keeps the first. Fails on a level that is no filter directive or a log
/// directory that cannot be written, naming the key.
pub fn init(server: &ServerSection) -> Result<(), String> {
    // An empty `RUST_LOG` counts as unset.
    let from_env = std::env::var("RUST_LOG").ok().filter(|v| !v.trim().is_empty());
    let filter = match from_env.map(EnvFilter::try_new) {
        Some(Ok(filter)) => filter,
        _ => EnvFilter::try_new(&server.log_level)
            .map_err(|err| format!("server.log_level {:?}: {err}", server.log_level))?,
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match &server.log_dir {
        Some(dir) => {
            let file = open_log_file(dir)
                .map_err(|err| format!("server.log_dir {}: {err}", dir.display()))?;
            #[expect(
                clippy::disallowed_types,
                reason = "tracing-subscriber writes through std's Mutex (its MakeWriter impl)"
            )]
            let writer = std::sync::Mutex::new(file);
            let builder = builder.with_writer(writer).with_ansi(false);
            if server.log_json {
                builder.json().with_current_span(true).with_span_list(false).try_init()
            } else {
                builder.try_init()
            }
        }
        None => {
            // Colours only for a person at a terminal: a pipe, journald or `kubectl logs`
            // gets plain text (and the router skips styling every line and span).
            let ansi = std::io::stderr().is_terminal();
            let builder = builder.with_writer(std::io::stderr).with_ansi(ansi);
            if server.log_json {
                builder.json().with_current_span(true).with_span_list(false).try_init()
            } else {
                builder.try_init()
            }
        }
    };
    Ok(())
}

/// `dir/router-server.log`, created with its directory, opened for appending.
fn open_log_file(dir: &Path) -> std::io::Result<std::fs::File> {
    std::fs::create_dir_all(dir)?;
    std::fs::OpenOptions::new().create(true).append(true).open(dir.join(LOG_FILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_that_is_no_directive_names_its_key() {
        let server = ServerSection { log_level: "loud=!!".into(), ..ServerSection::default() };
        if std::env::var("RUST_LOG").map_or(true, |v| v.trim().is_empty()) {
            let err = init(&server).expect_err("not a directive");
            assert!(err.starts_with("server.log_level"), "{err}");
        }
    }

    #[test]
    fn the_log_file_is_created_with_its_directory_and_appended_to() {
        let dir = std::env::temp_dir().join(format!("router-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        use std::io::Write;
        open_log_file(&dir.join("nested")).expect("opens").write_all(b"one\n").expect("writes");
        open_log_file(&dir.join("nested")).expect("opens").write_all(b"two\n").expect("writes");
        let text = std::fs::read_to_string(dir.join("nested").join(LOG_FILE)).expect("reads");
        assert_eq!(text, "one\ntwo\n");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
