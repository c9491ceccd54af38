//! A `nats-server` of the demo's own (`demo --event-plane nats`): Debian's,
//! installed by `bash scripts/prepare-nats-server`, on a free 127.0.0.1
//! port, killed with the pool.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::demo::child::Process;

/// How long nats-server may take to listen.
const STARTUP: Duration = Duration::from_secs(10);

/// A running nats-server and its URL.
pub(crate) struct NatsServer {
    pub(crate) url: String,
    pub(crate) process: Process,
}

impl NatsServer {
    /// Starts one on a free port and waits until it listens.
    pub(crate) fn start() -> anyhow::Result<NatsServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut command = Command::new("nats-server");
        command.args(["-a", "127.0.0.1", "-p", &port.to_string()]).stdin(Stdio::null()).stdout(Stdio::null());
        command.stderr(Stdio::null());
        let mut process = Process::spawn(&mut command)
            .context("cannot start nats-server (demo --event-plane nats): run `bash scripts/prepare-nats-server`")?;
        let deadline = Instant::now() + STARTUP;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            anyhow::ensure!(process.exited().is_none(), "nats-server exited at start (port {port})");
            anyhow::ensure!(Instant::now() < deadline, "nats-server did not listen on {port} within {STARTUP:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(NatsServer { url: format!("nats://127.0.0.1:{port}"), process })
    }
}
