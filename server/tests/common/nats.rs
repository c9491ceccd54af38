//! A real `nats-server` for the NATS-plane tests (Debian's, installed by
//! `scripts/prepare-nats-server`), and frontends on it.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::Frontend;

/// A `nats-server` on a free port, killed on drop.
pub struct Nats {
    child: Child,
    pub url: String,
}

impl Nats {
    pub fn start(extra: &[&str]) -> Nats {
        let port = {
            let probe = TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        Nats::start_on(port, extra)
    }

    pub fn start_on(port: u16, extra: &[&str]) -> Nats {
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server (bash scripts/prepare-nats-server)");
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
