//! Logging setup shared by every role.
//!
//! Without `RUST_LOG` the filter is [`DEFAULT_FILTER`]: `info`, with the
//! frontend's per-request access log (target `loadgate::access`, one line
//! per request, see `frontend/observe`) off, so a loaded frontend (or the
//! demo, which runs several servers in one process) does not write a line
//! per request. `RUST_LOG` replaces the default whole:
//!
//! | `RUST_LOG` | logs |
//! |---|---|
//! | unset | `info`, no access log |
//! | `info` | `info`, access log included |
//! | `info,loadgate::access=off` | the default |
//! | `warn,loadgate::access=info` | warnings and the access log only |
//!
//! Whatever the filter, the NATS client's own lines (target `async_nats`)
//! stop at `warn` unless `RUST_LOG` names that target: it writes one at
//! `info` for each of its events, and it raises one for every message a
//! subscription drops (a flood past `--nats-buffer`). The event plane logs
//! those events itself (`nats::args`), the dropped messages at most once a
//! second.

/// The filter when `RUST_LOG` is unset (or invalid).
pub(crate) const DEFAULT_FILTER: &str = "info,loadgate::access=off";

/// Added to a filter that does not name the NATS client (see the module docs).
const QUIET_NATS_CLIENT: &str = "async_nats=warn";

/// Logs to stderr (coloured on a terminal only) with `RUST_LOG`'s filter,
/// else [`DEFAULT_FILTER`]; a second call (the demo runs several servers
/// in one process) is a no-op.
pub(crate) fn init_logging() {
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_FILTER));
    let names_nats = std::env::var("RUST_LOG").is_ok_and(|spec| spec.contains("async_nats"));
    if let (false, Ok(quiet)) = (names_nats, QUIET_NATS_CLIENT.parse::<tracing_subscriber::filter::Directive>()) {
        filter = filter.add_directive(quiet);
    }
    // Colours only on a terminal: a pipe or a file gets plain `key=value` lines.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(ansi).with_env_filter(filter).try_init();
}
