//! A real `nats-server` for the NATS-plane tests (Debian's, installed by
//! `scripts/prepare-nats-server`), and frontends on it.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::Frontend;

/// A `nats-server` on a free port, killed on drop.
pub struct Nats {
    child: Child,
    pub url: String,
}

impl Nats {
    /// On a port nats-server picks itself (`-p -1`), read from its ports
    /// file: no other process can take the port between its choice and
    /// the bind, as one probed and released first could be.
    pub fn start(extra: &[&str]) -> Nats {
        static STARTED: AtomicU32 = AtomicU32::new(0);
        // Relaxed: only a unique number.
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("loadgate-nats-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the ports file");
        let child = Nats::spawn("-1", &["--ports_file_dir", dir.to_str().expect("a UTF-8 path")], extra);
        let file = dir.join(format!("nats-server_{}.ports", child.id()));
        let deadline = Instant::now() + Duration::from_secs(10);
        let port = loop {
            let ports =
                std::fs::read(&file).ok().and_then(|text| serde_json::from_slice::<serde_json::Value>(&text).ok());
            let url = ports.as_ref().and_then(|p| p["nats"][0].as_str()).map(str::to_owned);
            if let Some(port) = url.and_then(|u| u.rsplit(':').next()?.parse().ok()) {
                break port;
            }
            assert!(Instant::now() < deadline, "nats-server wrote no ports file in {}", dir.display());
            std::thread::sleep(Duration::from_millis(20));
        };
        let _ = std::fs::remove_dir_all(&dir);
        Nats::listening(child, port)
    }

    /// On `port` (a port it listened on before: a restart).
    pub fn start_on(port: u16, extra: &[&str]) -> Nats {
        Nats::listening(Nats::spawn(&port.to_string(), &[], extra), port)
    }

    fn spawn(port: &str, own: &[&str], extra: &[&str]) -> Child {
        Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", port])
            .args(own)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server (bash scripts/prepare-nats-server)")
    }

    /// Once `child` accepts connections on `port`.
    fn listening(child: Child, port: u16) -> Nats {
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Nats { child, url: format!("nats://127.0.0.1:{port}") }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The flags of the NATS plane on `nats`.
pub fn plane(nats: &Nats) -> Vec<String> {
    ["--event-plane", "nats", "--nats-url", nats.url.as_str()].map(str::to_owned).to_vec()
}

/// A frontend (with the secret) on the NATS plane of `nats`.
pub fn frontend(nats: &Nats, extra: &[&str]) -> Frontend {
    let mut flags = plane(nats);
    flags.extend(extra.iter().map(|s| (*s).to_owned()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Frontend::secured(&flags)
}
