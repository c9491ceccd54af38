//! [`BusyWorker`]: a fake worker on an unauthenticated event plane that
//! reports a full KV cache, so a frontend with a decode threshold sheds
//! every request for its model with 529.

use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use loadgate::wire::Frame;
use loadgate::RankLoad;

use super::encoded;

/// A fake worker registered as `worker` for a model, reporting 90 of 100 KV
/// blocks busy every 100 ms (for at most 120 s) until dropped.
pub struct BusyWorker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BusyWorker {
    /// Registers `worker` for `model` at the frontend's `events` port (no
    /// secret) and starts reporting.
    pub fn start(events: SocketAddr, worker: u64, model: &str) -> BusyWorker {
        let mut conn = TcpStream::connect(events).expect("connect to the event port");
        let register = Frame::Register {
            worker,
            incarnation: 1,
            dp_size: 1,
            model: model.into(),
            http_addr: "127.0.0.1:9".into(),
        };
        conn.write_all(&encoded(&register)).expect("register");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let full = RankLoad { active_decode_blocks: 90, kv_total_blocks: 100, ..Default::default() };
            let deadline = Instant::now() + Duration::from_secs(120);
            // Relaxed: a stop flag; nothing else hangs on it.
            for seq in 1.. {
                if stopped.load(Ordering::Relaxed) || Instant::now() > deadline {
                    break;
                }
                let load = Frame::Load { worker, incarnation: 1, rank: 0, seq, load: full };
                if conn.write_all(&encoded(&load)).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        BusyWorker { stop, thread: Some(thread) }
    }
}

impl Drop for BusyWorker {
    fn drop(&mut self) {
        // Relaxed: as above.
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
