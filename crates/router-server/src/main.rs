//! `router-server`: serve, validate a configuration, run the KV indexer, run as an endpoint
//! picker for Envoy, or run the demo.
#![expect(clippy::print_stdout, reason = "the binary reports its address and summaries on stdout")]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use router_config::{
    Cli, Command, ConfigFile, Positions, read_located, reject_dropped_options, screen, summary,
};
use router_server::app::AppContext;
use router_server::server::Serving;

/// mimalloc instead of the system allocator: a request allocates and frees many small buffers
/// across threads, which glibc's malloc serves with more locking and consolidation.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    // The incumbents' flags first: each is honoured, ignored with a warning, or refused with
    // its replacement, never met by clap's generic "unexpected argument".
    let screened = match screen(&args) {
        Ok(screened) => screened,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    for warning in &screened.warnings {
        eprintln!("warning: {warning}");
    }
    if let Err(message) = reject_dropped_options(&screened.args[1..]) {
        eprintln!("error: {message}");
        return ExitCode::from(2);
    }
    let cli = Cli::parse_from(&screened.args);
    if let Err(message) = cli.check() {
        eprintln!("error: {message}");
        return ExitCode::from(2);
    }
    // This runtime runs the background services (subscriptions, health checks, the demo fleet,
    // the kv-indexer); clients are served by the event-loop threads of `Serving`.
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: starting the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Some(Command::CheckConfig { file }) => Ok(check_config(&file)),
        Some(Command::KvIndexer { config, listen }) => kv_indexer(&config, &listen).await,
        Some(Command::Epp { config, grpc_port, fallbacks }) => {
            epp(&config, grpc_port, router_server::epp::EppSettings { fallbacks }).await
        }
        None => serve(cli.serve, cli.worker_threads.map(usize::from)).await,
    }
}

fn check_config(file: &std::path::Path) -> ExitCode {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(err) => {
            // "reading f.yaml: No such file or directory (os error 2)".
            eprintln!("error: reading {}: {err}", file.display());
            return ExitCode::FAILURE;
        }
    };
    // Every problem, each at its line and column: those of reading, else those of building.
    let located = match read_located(&text) {
        Ok(config) => match AppContext::build(&config) {
            Ok(ctx) => {
                println!("{}: ok", file.display());
                print!("{}", summary(ctx.models(), ctx.registry()));
                return ExitCode::SUCCESS;
            }
            Err(problems) => Positions::of(&text).locate(problems),
        },
        Err(located) => located,
    };
    for problem in &located {
        eprintln!("error: {}:{problem}", file.display());
    }
    eprintln!("{}: {} problem(s)", file.display(), located.len());
    ExitCode::FAILURE
}

async fn serve(args: router_config::ServeArgs, worker_threads: Option<usize>) -> Result<ExitCode> {
    let mut demo = None;
    let mut config = if let Some(path) = &args.config {
        ConfigFile::load(path)?
    } else if args.is_quick_start() {
        let mut config = args.quick_start_config().map_err(anyhow::Error::msg)?;
        if args.dp_aware {
            router_config::learn_dp_sizes(&mut config).await.map_err(anyhow::Error::msg)?;
        }
        config
    } else if args.demo {
        let (fleet, config) = router_server::demo::start(args.port.unwrap_or(8080)).await?;
        demo = Some(fleet);
        config
    } else {
        anyhow::bail!(
            "nothing to serve: give --config FILE, --worker-urls, --pd-disaggregation or --demo"
        )
    };
    args.apply_overrides(&mut config).map_err(anyhow::Error::msg)?;
    if let Some(host) = &args.host {
        config.server.host.clone_from(host);
    }
    if let Some(port) = args.port {
        config.server.port = port;
    }
    config.server.log_json |= args.log_json;
    if let Some(front) = args.http1 {
        config.server.http1 = front;
    }
    router_server::logging::init(&config.server).map_err(anyhow::Error::msg)?;

    let ctx = AppContext::build(&config).map_err(|problems| {
        let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
        anyhow::anyhow!("invalid configuration:\n  {}", lines.join("\n  "))
    })?;
    router_server::telemetry::init(&config.telemetry).context("setting up trace export")?;
    let ctx = Arc::new(ctx);
    let addr = format!("{}:{}", config.server.host, config.server.port);
    let event_loops = worker_threads
        .or(config.server.worker_threads)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    // Like `TcpListener::bind`, try every address the host resolves to until one binds.
    let mut serving = None;
    let mut last_error = None;
    for socket_addr in
        tokio::net::lookup_host(&addr).await.with_context(|| format!("resolving {addr}"))?
    {
        match Serving::start(Arc::clone(&ctx), socket_addr, event_loops) {
            Ok(started) => {
                serving = Some(started);
                break;
            }
            Err(err) => last_error = Some(err),
        }
    }
    let serving = match (serving, last_error) {
        (Some(serving), _) => serving,
        (None, Some(err)) => return Err(err).with_context(|| format!("listening on {addr}")),
        (None, None) => anyhow::bail!("{addr} resolves to no address"),
    };
    tracing::info!(addr = %serving.addr, "router listening");
    let metrics = metrics_listener(&ctx, &config.server).await?;
    if let Some(fleet) = &demo {
        print!("{}", router_server::demo::banner(serving.addr, fleet.tokenizer()));
    } else {
        println!("router listening on http://{}", serving.addr);
    }

    shutdown_signal().await;
    tracing::info!("shutting down: draining in-flight requests (a second signal exits at once)");
    let drain = Duration::from_secs(config.server.shutdown_drain_secs);
    tokio::select! {
        () = serving.stop(drain) => {}
        () = shutdown_signal() => {
            tracing::warn!("a second signal: exiting without waiting for the drain");
            std::process::exit(SECOND_SIGNAL_EXIT);
        }
    }
    if let Some(metrics) = metrics {
        metrics.stop().await;
    }
    router_server::telemetry::shutdown().await;
    if let Some(fleet) = demo {
        fleet.stop();
    }
    Ok(ExitCode::SUCCESS)
}

/// The separate metrics listener, when `server.metrics_port` asks for one.
async fn metrics_listener(
    ctx: &Arc<AppContext>,
    server: &router_config::ServerSection,
) -> Result<Option<router_server::server::MetricsListener>> {
    let Some(port) = server.metrics_port else { return Ok(None) };
    let host = server.metrics_host.as_deref().unwrap_or(&server.host);
    let addr = format!("{host}:{port}");
    let listener = router_server::server::MetricsListener::start(Arc::clone(ctx), &addr)
        .await
        .with_context(|| format!("listening for metrics on {addr}"))?;
    tracing::info!(addr = %listener.addr, "metrics listening");
    println!("metrics listening on http://{}/metrics", listener.addr);
    Ok(Some(listener))
}

/// Runs the endpoint picker: ext_proc and gRPC health on `server.host:grpc_port`, health,
/// metrics and the admin API on `server.host:server.port`. On SIGTERM readiness turns
/// NOT_SERVING, open streams get `server.shutdown_drain_secs` to finish, then both stop.
async fn epp(
    file: &std::path::Path,
    grpc_port: u16,
    settings: router_server::epp::EppSettings,
) -> Result<ExitCode> {
    let config = ConfigFile::load(file)?;
    router_server::logging::init(&config.server).map_err(anyhow::Error::msg)?;
    let ctx = AppContext::build(&config).map_err(|problems| {
        let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
        anyhow::anyhow!("invalid configuration:\n  {}", lines.join("\n  "))
    })?;
    let ctx = Arc::new(ctx);
    let host = &config.server.host;
    let grpc = format!("{host}:{grpc_port}");
    let listener =
        tokio::net::TcpListener::bind(&grpc).await.with_context(|| format!("binding {grpc}"))?;
    let admin = format!("{host}:{}", config.server.port);
    let admin_addr = tokio::net::lookup_host(&admin)
        .await
        .with_context(|| format!("resolving {admin}"))?
        .next()
        .with_context(|| format!("{admin} resolves to no address"))?;
    // Starts the background services (state subscriptions, health checks) too.
    let app = router_server::server::operations_routes(Arc::clone(&ctx));
    let serving = Serving::start_app(Arc::clone(&ctx), app, admin_addr, 1)
        .with_context(|| format!("listening on {admin}"))?;
    let picker = router_server::epp::EppServer::start(Arc::clone(&ctx), listener, settings)?;
    let metrics = metrics_listener(&ctx, &config.server).await?;
    tracing::info!(grpc = %picker.addr, admin = %serving.addr, "endpoint picker listening");
    println!("epp admin on http://{}", serving.addr);
    println!("epp listening on {}", picker.addr);
    shutdown_signal().await;
    tracing::info!("shutting down: draining open streams");
    let drain = Duration::from_secs(config.server.shutdown_drain_secs);
    picker.stop(drain).await;
    serving.stop(Duration::from_secs(1)).await;
    if let Some(metrics) = metrics {
        metrics.stop().await;
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs only the KV-event subscriptions and the prefix index of the configured engines, and
/// serves the remote-indexer gRPC API for routers whose cache-aware groups use
/// `cache_prefix_provider: indexer`.
async fn kv_indexer(file: &std::path::Path, listen: &str) -> Result<ExitCode> {
    let config = ConfigFile::load(file)?;
    router_server::logging::init(&config.server).map_err(anyhow::Error::msg)?;
    let registry = Arc::new(router_workers::WorkerRegistry::new());
    // The indexer never calls an engine's HTTP API, so it needs no engine key.
    router_config::register_all_workers(&config, &registry, None).map_err(|problems| {
        let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
        anyhow::anyhow!("invalid configuration:\n  {}", lines.join("\n  "))
    })?;
    let index = Arc::new(router_state_kv::KvIndex::new(config.kv_index()));
    let subscriptions = router_state_kv::KvSubscriptions::new(
        Arc::clone(&index),
        Arc::clone(&registry),
        config.kv.subscriptions(),
    );
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let addr = listener.local_addr()?;
    let cancel = tokio_util::sync::CancellationToken::new();
    let subscribed = tokio::spawn(subscriptions.run(cancel.child_token()));
    let service = router_state_kv::remote::KvIndexService::new(index);
    let served =
        tokio::spawn(router_state_kv::remote::serve_with(listener, service, cancel.child_token()));
    println!("kv indexer listening on {addr}");
    tracing::info!(%addr, workers = registry.workers().len(), "kv indexer listening");
    shutdown_signal().await;
    cancel.cancel();
    let _ = subscribed.await;
    served.await?.context("serving the remote indexer")?;
    Ok(ExitCode::SUCCESS)
}

/// The exit status after a second signal cut the drain short (128 + SIGINT, as shells report
/// an interrupted command).
const SECOND_SIGNAL_EXIT: i32 = 130;

/// The first SIGINT (Ctrl-C) or SIGTERM from now.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
