//! A `nats-server` of the demo's own (`demo --event-plane nats`): Debian's,
//! installed by `bash scripts/prepare-nats-server`, on a 127.0.0.1 port it
//! picks itself, killed with the pool.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
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
    /// Starts one on a port it picks itself (`-p -1`, read from its ports
    /// file: no other process can take the port between the choice and the
    /// bind, as one probed and released first could be) and waits until it
    /// listens there.
    pub(crate) fn start() -> anyhow::Result<NatsServer> {
        static STARTED: AtomicU32 = AtomicU32::new(0);
        // Relaxed: only a unique number.
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("loadgate-demo-nats-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let started = NatsServer::spawn_in(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        started
    }

    /// Starts one writing its ports file into `dir`.
    fn spawn_in(dir: &Path) -> anyhow::Result<NatsServer> {
        let mut command = Command::new("nats-server");
        command.args(["-a", "127.0.0.1", "-p", "-1", "--ports_file_dir"]).arg(dir);
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        let mut process = Process::spawn(&mut command)
            .context("cannot start nats-server (demo --event-plane nats): run `bash scripts/prepare-nats-server`")?;
        let file = dir.join(format!("nats-server_{}.ports", process.id()));
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Some(port) = listed_port(&file) {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Ok(NatsServer { url: format!("nats://127.0.0.1:{port}"), process });
                }
            }
            anyhow::ensure!(process.exited().is_none(), "nats-server exited at start");
            anyhow::ensure!(Instant::now() < deadline, "nats-server did not listen within {STARTUP:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The client port a nats-server's ports file lists (`{"nats":
/// ["nats://127.0.0.1:PORT"], ...}`), once it is written whole.
fn listed_port(file: &Path) -> Option<u16> {
    let text = std::fs::read(file).ok()?;
    let ports: serde_json::Value = serde_json::from_slice(&text).ok()?;
    ports["nats"].get(0)?.as_str()?.rsplit(':').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ports_file_names_the_client_port() {
        let dir = std::env::temp_dir().join(format!("loadgate-ports-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("nats-server_1.ports");
        let cases: [(&str, Option<u16>); 5] = [
            (r#"{"nats":["nats://127.0.0.1:41985"],"monitoring":[]}"#, Some(41985)),
            (r#"{"nats":["nats://127.0.0.1:4"#, None),
            (r#"{"nats":[]}"#, None),
            (r#"{"nats":["nats://127.0.0.1:99999"]}"#, None),
            ("", None),
        ];
        for (text, port) in cases {
            std::fs::write(&file, text).unwrap();
            assert_eq!(listed_port(&file), port, "{text}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(listed_port(&file), None, "no file yet");
    }
}
