//! [`NatsArgs`]: the event plane's kind and how to reach NATS, shared by
//! `loadgate frontend` and `loadgate worker`, and [`NatsArgs::connect`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

use super::subjects::valid_namespace;
use crate::throttle::LogThrottle;

/// Lines about messages a subscription dropped: the NATS client raises an
/// event for each (its buffer full: a flood, or `--nats-buffer` too small
/// for the traffic), so a client without the secret could write a line per
/// message it sends.
static SLOW_CONSUMER: LogThrottle = LogThrottle::per_second(1);

/// Logs one of the NATS client's events (those about dropped messages at
/// most once a second, with how many were not logged).
fn log_event(event: &async_nats::Event) {
    match event {
        async_nats::Event::SlowConsumer(_) => {
            if let Some(suppressed) = SLOW_CONSUMER.admit() {
                tracing::warn!(%event, suppressed, "NATS messages dropped: the subscription's buffer is full (a flood, or --nats-buffer too small)");
            }
        }
        _ => tracing::info!(%event, "NATS"),
    }
}

/// Which event plane carries registrations and load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum EventPlaneKind {
    /// Each worker connects to each frontend (`--frontend` on the worker).
    #[default]
    Tcp,
    /// Every worker and frontend connects to NATS (`--nats-url`).
    Nats,
}

/// The event plane's kind and how to reach NATS.
#[derive(clap::Args, Clone, Debug, Default)]
pub(crate) struct NatsArgs {
    /// The event plane: `tcp` (each worker connects to each frontend) or `nats` (one NATS for
    /// every frontend and worker; needs the event secret). A worker with `nats` and --frontend
    /// publishes to both (a migration).
    #[arg(long, env = "DYN_EVENT_PLANE", value_enum, default_value = "tcp")]
    pub(crate) event_plane: EventPlaneKind,
    /// The NATS server: `nats://HOST:PORT`, or `tls://HOST:PORT` for TLS.
    #[arg(long, env = "NATS_SERVER", value_name = "URL", default_value = "nats://127.0.0.1:4222")]
    pub(crate) nats_url: String,
    /// The subjects' first tokens: frontends and workers of one fleet share it.
    #[arg(long, env = "LOADGATE_NATS_NAMESPACE", value_name = "NS", default_value = "loadgate")]
    pub(crate) nats_namespace: String,
    /// A file holding the NATS token (first line); or set LOADGATE_NATS_TOKEN.
    #[arg(long, env = "LOADGATE_NATS_TOKEN_FILE", value_name = "PATH")]
    pub(crate) nats_token_file: Option<PathBuf>,
    /// A file holding the NATS user (first line) and password (second); or set
    /// LOADGATE_NATS_USER and LOADGATE_NATS_PASSWORD.
    #[arg(long, env = "LOADGATE_NATS_USER_FILE", value_name = "PATH")]
    pub(crate) nats_user_file: Option<PathBuf>,
    /// A file holding an nkey seed (first line); or set LOADGATE_NATS_NKEY.
    #[arg(long, env = "LOADGATE_NATS_NKEY_FILE", value_name = "PATH")]
    pub(crate) nats_nkey_file: Option<PathBuf>,
    /// A PEM file of the CAs that sign the NATS server's certificate (TLS required then).
    #[arg(long, env = "LOADGATE_NATS_TLS_CA_FILE", value_name = "PATH")]
    pub(crate) nats_tls_ca_file: Option<PathBuf>,
    /// The longest wait for the first connection to NATS at start (seconds; a failure then is an
    /// error). Later disconnections reconnect by themselves, with backoff.
    #[arg(long, env = "LOADGATE_NATS_CONNECT_TIMEOUT_SECS", value_name = "S", default_value_t = 5, value_parser = crate::flag_limits::secs_within(1, 300))]
    pub(crate) nats_connect_timeout_secs: u64,
    /// Messages buffered per subscription (a frontend's view of every worker's frames; past it
    /// the client drops new ones, logged at most once a second) and, up to 65,536, for publishing
    /// (past it a publisher waits; nothing is published while NATS is away).
    #[arg(long, env = "LOADGATE_NATS_BUFFER", value_name = "N", default_value_t = 65_536, value_parser = clap::value_parser!(u64).range(64..=4_194_304))]
    pub(crate) nats_buffer: u64,
}

/// The first line of `path`, trimmed, as a credential.
fn first_lines(path: &std::path::Path, n: usize, what: &str) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the NATS {what} file {}", path.display()))?;
    let lines: Vec<String> = text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).take(n).collect();
    anyhow::ensure!(lines.len() == n, "the NATS {what} file {} needs {n} non-empty line(s)", path.display());
    Ok(lines)
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

impl NatsArgs {
    /// Whether the NATS plane is on.
    pub(crate) fn is_nats(&self) -> bool {
        self.event_plane == EventPlaneKind::Nats
    }

    /// Connects to NATS as `name`, with the credentials and TLS asked for;
    /// `on_event` hears the client's events (logged here). The client
    /// drops an event when 128 wait: never count on one arriving. The
    /// first connection must succeed within
    /// `--nats-connect-timeout-secs`; later ones are retried for ever, with
    /// backoff.
    ///
    /// # Errors
    ///
    /// A bad namespace, unreadable or conflicting credentials, or no
    /// connection (wrong credentials included) at start.
    pub(crate) async fn connect(
        &self,
        name: &str,
        on_event: impl Fn(async_nats::Event) + Send + Sync + 'static,
    ) -> anyhow::Result<async_nats::Client> {
        anyhow::ensure!(
            valid_namespace(&self.nats_namespace),
            "--nats-namespace {:?}: tokens of A-Z a-z 0-9 _ - separated by dots",
            self.nats_namespace
        );
        let capacity = usize::try_from(self.nats_buffer).unwrap_or(usize::MAX);
        let on_event = std::sync::Arc::new(on_event);
        let mut options = async_nats::ConnectOptions::new()
            .name(name)
            .connection_timeout(Duration::from_secs(self.nats_connect_timeout_secs))
            .subscription_capacity(capacity)
            .client_capacity(capacity.min(1 << 16))
            .max_reconnects(None)
            // Doubling from 50 ms up to 1 s, jittered (half to all of it):
            // back within a second of the server's return.
            .reconnect_delay_callback(|attempts| {
                let base = 50u64.saturating_mul(1 << attempts.min(5)).min(1000);
                Duration::from_millis(base / 2 + fastrand::u64(0..=base / 2))
            })
            .event_callback(move |event| {
                let on_event = on_event.clone();
                async move {
                    log_event(&event);
                    on_event(event)
                }
            });
        let sources = [
            self.nats_token_file.is_some() || env("LOADGATE_NATS_TOKEN").is_some(),
            self.nats_user_file.is_some() || env("LOADGATE_NATS_USER").is_some(),
            self.nats_nkey_file.is_some() || env("LOADGATE_NATS_NKEY").is_some(),
        ];
        anyhow::ensure!(
            sources.iter().filter(|s| **s).count() <= 1,
            "give one kind of NATS credentials: a token, a user and password, or an nkey seed"
        );
        if let Some(path) = &self.nats_token_file {
            options = options.token(first_lines(path, 1, "token")?.remove(0));
        } else if let Some(token) = env("LOADGATE_NATS_TOKEN") {
            options = options.token(token);
        }
        if let Some(path) = &self.nats_user_file {
            let mut lines = first_lines(path, 2, "user")?;
            let password = lines.pop().expect("two lines");
            options = options.user_and_password(lines.remove(0), password);
        } else if let Some(user) = env("LOADGATE_NATS_USER") {
            let password =
                env("LOADGATE_NATS_PASSWORD").context("LOADGATE_NATS_USER without LOADGATE_NATS_PASSWORD")?;
            options = options.user_and_password(user, password);
        }
        if let Some(path) = &self.nats_nkey_file {
            options = options.nkey(first_lines(path, 1, "nkey seed")?.remove(0));
        } else if let Some(seed) = env("LOADGATE_NATS_NKEY") {
            options = options.nkey(seed);
        }
        if let Some(ca) = &self.nats_tls_ca_file {
            anyhow::ensure!(ca.is_file(), "--nats-tls-ca-file {}: no such file", ca.display());
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        options
            .connect(self.nats_url.as_str())
            .await
            .with_context(|| format!("cannot connect to NATS at {} (credentials, TLS, address?)", self.nats_url))
    }
}
