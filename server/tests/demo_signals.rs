//! `loadgate demo` stopped from outside: SIGTERM, SIGINT or SIGHUP to the
//! demo alone (not its process group, as `kill` or `timeout` send it) kills
//! its frontend and workers too, and then the demo dies of that signal. A
//! signal the demo was started ignoring (`nohup`) stays ignored. Real
//! processes, started through `env --default-signal` or `--ignore-signal`
//! (GNU coreutils) so that what the test runner ignores does not count;
//! every wait is bounded, and a failing test kills what it started.

use std::fs;
use std::os::unix::process::ExitStatusExt as _;
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

/// A demo that its test stops; on drop, what is still running of it is
/// killed: the demo stopped first, so the children read then are all.
struct Demo {
    child: Child,
    plot: std::path::PathBuf,
    /// Its children once all had started.
    children: Vec<u32>,
}

impl Demo {
    /// `loadgate demo`, with the signals' actions `env_flag` sets, once the
    /// capacity run's pool (a frontend and 4 workers) runs.
    fn start(env_flag: &str) -> Demo {
        let plot = std::env::temp_dir().join(format!("loadgate-demo-signals-{}-{env_flag}.svg", std::process::id()));
        let child = Command::new("env")
            .args([env_flag, env!("CARGO_BIN_EXE_loadgate"), "demo", "--plot"])
            .arg(&plot)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the demo through env (GNU coreutils)");
        let mut demo = Demo { child, plot, children: Vec::new() };
        let deadline = Instant::now() + CHILDREN_WAIT;
        while demo.children.len() < 5 {
            assert!(Instant::now() < deadline, "the demo started {:?} within {CHILDREN_WAIT:?}", demo.children);
            std::thread::sleep(Duration::from_millis(50));
            demo.children = children(demo.child.id());
        }
        demo
    }

    /// Sends `sent`; the demo dies of it, and its children stop, within [`STOP_WAIT`].
    fn stops_on(&mut self, sent: Signal) {
        signal(self.child.id(), sent);
        let deadline = Instant::now() + STOP_WAIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "the demo still ran {STOP_WAIT:?} after {sent:?}");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.signal(), Some(sent.as_raw()), "{status}");
        while let Some(pid) = self.children.iter().find(|pid| !stopped(**pid)) {
            assert!(Instant::now() < deadline, "child {pid} still ran {STOP_WAIT:?} after {sent:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            // Stopped, it starts no more children; then every child is listed.
            signal(self.child.id(), Signal::STOP);
            self.children = children(self.child.id());
            for pid in &self.children {
                signal(*pid, Signal::KILL);
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = fs::remove_file(&self.plot);
    }
}

#[test]
fn sigterm_stops_the_demo_and_its_children() {
    Demo::start("--default-signal=TERM").stops_on(Signal::TERM);
}

#[test]
fn sighup_stops_the_demo_and_its_children() {
    Demo::start("--default-signal=HUP").stops_on(Signal::HUP);
}

#[test]
fn sigint_stops_the_demo_and_its_children() {
    Demo::start("--default-signal=INT").stops_on(Signal::INT);
}

/// Under `nohup`: SIGHUP changes nothing (a second is ample for a handler
/// to have killed everything); SIGTERM still stops it all.
#[test]
fn a_signal_ignored_at_start_stays_ignored() {
    let mut demo = Demo::start("--ignore-signal=HUP");
    signal(demo.child.id(), Signal::HUP);
    std::thread::sleep(Duration::from_secs(1));
    assert!(demo.child.try_wait().unwrap().is_none(), "the demo died of an ignored SIGHUP");
    assert!(!demo.children.iter().any(|pid| stopped(*pid)), "a child stopped on an ignored SIGHUP");
    demo.stops_on(Signal::TERM);
}
