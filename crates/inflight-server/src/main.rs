//! `inflight`: parses the settings, opens the store, and runs `serve` or `proxy`.

use anyhow::Context;
use inflight::store::ListingLane;
use inflight::{AnyStore, MemoryStore, RedisStore, Store};
use inflight_server::bench::BenchArgs;
use inflight_server::config::{
    plain_fields, Cli, Command, Layered, Layout, LineTime, LogFormat, ProxySettings,
};
use inflight_server::server::{self, Workers};
use inflight_server::{Settings, Shared};
use tracing_subscriber::EnvFilter;

// mimalloc serves hyper's small, short-lived allocations (BENCHMARKS.md compares it with the system's).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let (cli, matches) = inflight_server::config::env::parse();
    // `check-history` reads files: no runtime, and exit codes of its own.
    if let Command::CheckHistory { files, json } = &cli.command {
        return check_history(files, *json);
    }
    // `serve` and `proxy` answer on worker threads of their own (server/), each with its limiter and
    // store; this runtime, one thread, waits for signals and for the workers. `bench` runs on `--threads`
    // threads (a multi-thread runtime even for one: the main thread only waits for the tasks).
    let runtime = match &cli.command {
        Command::Bench(args) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(usize::from(args.threads))
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("inflight: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let matches = matches
        .subcommand()
        .map(|(_, m)| m.clone())
        .unwrap_or_default();
    match runtime.block_on(start(cli, matches)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One plain line (with its causes), never a backtrace: these are the operator's errors.
            eprintln!("inflight: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `inflight check-history` (the inflight-history crate): the report on stdout, as text or one JSON
/// object; exits 0 (nothing certain went wrong), 1 (a certain over-admission or a token going backwards)
/// or 2 (a file or line that cannot be read, named on stderr).
fn check_history(files: &[std::path::PathBuf], json: bool) -> std::process::ExitCode {
    let report = match inflight_history::check_files(files) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("inflight check-history: {error}");
            return std::process::ExitCode::from(2);
        }
    };
    match json {
        true => println!(
            "{}",
            serde_json::to_string(&report).expect("a report is JSON")
        ),
        false => print!("{}", report.text()),
    }
    std::process::ExitCode::from(u8::from(!report.ok))
}

async fn start(cli: Cli, matches: clap::ArgMatches) -> anyhow::Result<()> {
    let (settings, proxy) = match &cli.command {
        Command::Serve(args) => (args.layered(&matches)?, None),
        Command::Proxy(args) => {
            let proxy = args.layered(&matches)?;
            (proxy.serve.clone(), Some(proxy))
        }
        Command::Bench(args) => {
            // `bench` has no log settings: text, at INFLIGHT_LOG's level (info when unset or invalid).
            let level = std::env::var("INFLIGHT_LOG").unwrap_or_default();
            let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
            drop(init_logging(LogFormat::Text, filter));
            return bench(args).await;
        }
        Command::CheckConfig(args) => {
            let command = inflight_server::config::check(args)?;
            println!(
                "{}: ok (the settings of `inflight {command}`)",
                args.file.display()
            );
            return Ok(());
        }
        Command::CheckHistory { .. } => unreachable!("`check-history` returns before the runtime"),
    };
    let log = init_logging(settings.logging.log_format, settings.logging.filter()?);
    let shared = Shared::new(&settings)?;
    let tls = server::Tls::load(&settings.tls)?;
    reload_on_hangup(cli.command, matches, shared.clone(), tls.clone(), log);
    let store = stores(&settings);
    run(settings, proxy, shared, tls, store).await
}

/// Puts another filter of log lines in force.
type LogReload = Box<dyn Fn(EnvFilter) -> Result<(), tracing_subscriber::reload::Error> + Send>;

/// Logs to stderr, in `format`, the lines that `filter` lets through; returns what replaces the filter.
fn init_logging(format: LogFormat, filter: EnvFilter) -> LogReload {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_timer(LineTime)
        // A log that cannot be written (stderr closed or full) is lost, not a panic of the server.
        .log_internal_errors(false);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let lines = match format {
        // Coloured for a terminal; else plain, written at half the cost (an access line a request).
        LogFormat::Text if ansi => lines.with_target(false).with_ansi(true).boxed(),
        LogFormat::Text => lines
            .with_target(false)
            .with_ansi(false)
            .fmt_fields(plain_fields())
            .boxed(),
        // One object a line, the event's fields at its top level, with its target (inflight::access
        // for the proxy's access lines).
        LogFormat::Json => lines
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .boxed(),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(lines)
        .init();
    Box::new(move |filter| handle.reload(filter))
}

/// On SIGHUP, reads the settings again and puts their limits (permits held stay held), the TLS
/// certificate and key (for new connections) and the log level in force in every worker; other settings
/// need a restart. Bad settings keep the limits, the certificate and the log level as they are.
fn reload_on_hangup(
    command: Command,
    matches: clap::ArgMatches,
    shared: Shared,
    tls: Option<server::Tls>,
    log: LogReload,
) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            return;
        };
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                let settings = match &command {
                    Command::Serve(args) => args.layered(&matches),
                    Command::Proxy(args) => args.layered(&matches).map(|proxy| proxy.serve),
                    Command::Bench(_) | Command::CheckConfig(_) | Command::CheckHistory { .. } => {
                        return
                    }
                };
                let reloaded = settings.and_then(|settings| {
                    let policy = settings.policy()?;
                    let filter = settings.logging.filter()?;
                    if let Some(tls) = &tls {
                        tls.reload(&settings.tls)?;
                    }
                    Ok((policy, filter, settings.logging.log_level))
                });
                match reloaded {
                    Ok((policy, filter, log_level)) => {
                        let rules = policy.rules().len();
                        shared.policy.set(policy);
                        if let Err(error) = log(filter) {
                            tracing::error!(%error, "the log level could not be changed");
                        }
                        tracing::info!(rules, tls = tls.is_some(), %log_level, "limits reloaded");
                    }
                    Err(error) => {
                        tracing::error!(
                            %error,
                            "reload refused: the limits, the certificate and the log level stay as they were"
                        );
                    }
                }
            }
        });
    }
    #[cfg(not(unix))]
    let _ = (command, matches, shared, tls, log);
}

/// What each worker opens its store with: a clone of the one embedded store (clones share it), or a
/// Redis store of its own, its listings of busy keys taking turns with the other workers' (one page at
/// a time in the process).
fn stores(settings: &Settings) -> impl Fn() -> anyhow::Result<AnyStore> + Send + Sync + 'static {
    let memory = settings
        .store
        .starts_with("memory://")
        .then(|| MemoryStore::new().max_overrides(settings.max_overrides));
    let settings = settings.clone();
    let lane = ListingLane::default();
    move || match &memory {
        Some(store) => Ok(AnyStore::from(store.clone())),
        None => redis_store(&settings, lane.clone()),
    }
}

/// A worker's own Redis store (on the worker's runtime), in the key layout `--layout` names.
fn redis_store(settings: &Settings, lane: ListingLane) -> anyhow::Result<AnyStore> {
    let builder = RedisStore::builder(settings.store.clone())
        .listing_lane(lane)
        .prefix(settings.redis.redis_prefix.clone())
        .pipeline(settings.redis.redis_pipeline)
        .max_overrides(settings.max_overrides)
        .wait_replicas(
            settings.redis.redis_wait_replicas,
            settings.redis.redis_wait_timeout,
        );
    #[cfg(feature = "tls")]
    let builder = match settings.redis.redis_ca_cert()? {
        Some(pem) => builder.root_cert(pem),
        None => builder,
    };
    let store = match settings.redis.layout {
        Layout::Inflight => builder.open().map(AnyStore::from),
        Layout::Dify => builder
            .dify()
            .stale_after(settings.redis.dify_stale_after)
            .key_prefix(settings.redis.redis_key_prefix.clone())
            .open()
            .map(AnyStore::from),
    };
    store.map_err(|e| anyhow::anyhow!("invalid setting `store`: {e}"))
}

/// Err when the store refuses outright (a Redis older than inflight supports, say), so that the start
/// fails with the reason; a store that cannot be reached yet is left to the workers, which keep trying.
async fn refused_outright(store: &AnyStore) -> anyhow::Result<()> {
    let asked = tokio::time::timeout(std::time::Duration::from_secs(5), store.maintain()).await;
    match asked {
        Ok(Err(inflight::StoreError::Rejected(why))) => anyhow::bail!("the store refused: {why}"),
        _ => Ok(()),
    }
}

/// Serves until a signal, each worker with an app over a store from `store`.
async fn run(
    settings: Settings,
    proxy: Option<ProxySettings>,
    shared: Shared,
    tls: Option<server::Tls>,
    store: impl Fn() -> anyhow::Result<AnyStore> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let listeners = server::bind(settings.listen, settings.workers())
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    let listen = listeners[0].local_addr()?;
    let upstream = proxy.as_ref().map(inflight_server::upstream).transpose()?;
    let shutdown = server::shutdown_signal();
    refused_outright(&store()?).await?;
    let app = {
        let settings = settings.clone();
        move || Ok(inflight_server::app(&settings, &shared, store()?)?)
    };
    // The proxy's API answers on a listener of its own, which proxied clients do not reach.
    let admin = match &proxy {
        Some(proxy) if !proxy.admin_on_proxy_port => {
            let bound = server::bind(proxy.admin_listen, 1).with_context(|| {
                format!("cannot listen on {} (--admin-listen)", proxy.admin_listen)
            })?;
            bound.into_iter().next()
        }
        Some(_) | None => None,
    };
    let admin_listen = admin.as_ref().map(|admin| admin.local_addr()).transpose()?;
    let tls_on = tls.is_some();
    let bounds = server::Bounds {
        tls,
        ..(&settings).into()
    };
    let workers = Workers::start(listeners, app, upstream, bounds, admin).await?;
    if settings.default_limit == 0 && settings.limits.is_empty() {
        tracing::warn!(
            "no limit is set: every key is unlimited until one is (--default-limit N, --limit \
             'PATTERN=N', or an override: PUT /v1/keys/{{key}}/limit)"
        );
    }
    tracing::info!(
        command = if proxy.is_some() { "proxy" } else { "serve" },
        %listen,
        tls = tls_on,
        admin = admin_listen.map(|admin| admin.to_string()),
        workers = settings.workers(),
        max_connections = workers.max_connections(),
        store = %settings.store_for_logs(),
        store_from = settings.store_source(),
        layout = ?settings.redis.layout,
        default_limit = settings.default_limit,
        max_limit = settings.max_limit,
        rules = settings.limits.len(),
        lease = ?settings.lease,
        upstream = proxy.as_ref().and_then(|p| p.upstream.clone()),
        "inflight started"
    );
    if proxy
        .as_ref()
        .is_some_and(|proxy| proxy.admin_on_proxy_port)
    {
        tracing::warn!(
            "--admin-on-proxy-port: the API answers under /_inflight/ on the proxied port, so any \
             proxied client can take permits on any key and, without an admin token, change limits"
        );
    }
    workers.run(shutdown).await?;
    Ok(())
}

async fn bench(args: &BenchArgs) -> anyhow::Result<()> {
    let store = if args.store.starts_with("memory://") {
        AnyStore::from(MemoryStore::new())
    } else {
        let store = RedisStore::builder(args.store.clone())
            .prefix(args.redis_prefix.clone())
            .pipeline(args.redis_pipeline)
            .wait_replicas(args.redis_wait_replicas, args.redis_wait_timeout)
            .open()
            .map_err(|e| anyhow::anyhow!("invalid setting `store`: {e}"))?;
        store
            .maintain()
            .await
            .map_err(|e| anyhow::anyhow!("the store is unreachable: {e}"))?;
        AnyStore::from(store)
    };
    let report = inflight_server::bench::run(args, store).await?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
