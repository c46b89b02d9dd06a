//! Structured logs: human-readable or JSON lines, filtered by `RUST_LOG` (default `info`).
//! Request handlers run inside a `request` span carrying the request id, so every line they
//! write names it.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Calling it twice keeps the first.
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if json {
        builder.json().with_current_span(true).with_span_list(false).try_init()
    } else {
        builder.try_init()
    };
}
