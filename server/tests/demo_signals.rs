//! `loadgate demo` stopped from outside: SIGTERM, SIGINT or SIGHUP to the
//! demo alone (not its process group, as `kill` or `timeout` send it) kills
//! its frontend and workers too, and it exits with 128 + the signal. Real
//! processes; every wait is bounded, and a failing test kills what it
//! started.

use std::fs;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};

/// Generous: the demo starts a frontend and 4 workers on a small, busy machine.
const CHILDREN_WAIT: Duration = Duration::from_secs(60);
/// From the signal to the demo's exit and its children's.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// The pids whose parent is `parent`, from `/proc/*/stat`.
fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| parent_of(*pid) == Some(parent))
        .collect()
}

/// `(state, parent)` of `pid` (`None`: gone).
fn stat(pid: u32) -> Option<(char, u32)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: state, then the parent's pid.
    let mut rest = text.rsplit_once(')')?.1.split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.next()?.parse().ok()?))
}

fn parent_of(pid: u32) -> Option<u32> {
    stat(pid).map(|(_, parent)| parent)
}

/// Gone, or a zombie waiting for whoever inherited it.
fn stopped(pid: u32) -> bool {
    stat(pid).is_none_or(|(state, _)| state == 'Z' || state == 'X')
}

fn signal(pid: u32, signal: Signal) {
    let pid = Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    let _ = kill_process(pid, signal);
}

/// Kills the demo and the children it had, if the test did not see them stop.
struct Cleanup {
    demo: Child,
    children: Vec<u32>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = self.demo.kill();
        let _ = self.demo.wait();
        for pid in &self.children {
            if !stopped(*pid) {
                signal(*pid, Signal::KILL);
            }
        }
    }
}

fn stops_children_on(sent: Signal) {
    let plot = std::env::temp_dir().join(format!("loadgate-demo-signals-{}.svg", std::process::id()));
    let demo = Command::new(env!("CARGO_BIN_EXE_loadgate"))
        .args(["demo", "--plot"])
        .arg(&plot)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the demo");
    let pid = demo.id();
    let mut cleanup = Cleanup { demo, children: Vec::new() };

    // The capacity run's pool: a frontend and 4 workers.
    let deadline = Instant::now() + CHILDREN_WAIT;
    while cleanup.children.len() < 5 {
        assert!(Instant::now() < deadline, "the demo started {:?} within {CHILDREN_WAIT:?}", cleanup.children);
        std::thread::sleep(Duration::from_millis(50));
        cleanup.children = children(pid);
    }

    signal(pid, sent);
    let deadline = Instant::now() + STOP_WAIT;
    let status = loop {
        if let Some(status) = cleanup.demo.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the demo still ran {STOP_WAIT:?} after {sent:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(128 + sent.as_raw()), "{status}");
    while let Some(pid) = cleanup.children.iter().find(|pid| !stopped(**pid)) {
        assert!(Instant::now() < deadline, "child {pid} still ran {STOP_WAIT:?} after {sent:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = fs::remove_file(plot);
}

#[test]
fn sigterm_stops_the_demo_and_its_children() {
    stops_children_on(Signal::TERM);
}

#[test]
fn sighup_stops_the_demo_and_its_children() {
    stops_children_on(Signal::HUP);
}
