//! Shared helpers of the real-process tests: spawn `loadgate` (killed on
//! drop, its stderr kept and printed when a test fails), parse its listening
//! line, read a process's memory from `/proc` ([`procs`]), start frontends
//! and workers ([`cluster`]), a raw event-plane client that speaks the
//! handshake of spec section 2 or not ([`event_conn`]), the request proof
//! ([`proof`]), a fake worker that counts what it receives
//! ([`fake_worker`]), one that reports a full KV cache ([`busy_worker`]),
//! signals, metrics and load ([`faults`]), a `nats-server` ([`nats`]) and a retry storm ([`storm`]). Every item
//! is re-exported here, so tests name it `common::X`.
//!
//! Every wait here is bounded in time; every socket has a timeout.

// Each test binary uses a different part of this (the allowance applies to
// the submodules too).
#![allow(dead_code)]

mod busy_worker;
mod cluster;
mod event_conn;
mod fake_worker;
mod faults;
mod nats;
mod procs;
mod proof;
mod storm;

// A test binary that uses nothing of a submodule would warn of its re-export.
#[allow(unused_imports)]
pub use busy_worker::*;
#[allow(unused_imports)]
pub use cluster::*;
#[allow(unused_imports)]
pub use event_conn::*;
#[allow(unused_imports)]
pub use fake_worker::*;
#[allow(unused_imports)]
pub use faults::*;
#[allow(unused_imports)]
pub use nats::*;
#[allow(unused_imports)]
pub use procs::*;
#[allow(unused_imports)]
pub use proof::*;
#[allow(unused_imports)]
pub use storm::*;

use std::time::Duration;

use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The shared secret the suite's frontends and workers are given.
pub const SECRET: &str = "attack-suite-secret-0123456789abcdef";
/// A secret of the right shape that is not theirs.
pub const WRONG_SECRET: &str = "not-the-secret-at-all-0123456789ab";
/// How long a process may take to print its listening line.
pub const STARTUP: Duration = Duration::from_secs(20);
/// The frontend's handshake timeout (spec section 2).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// The frontend's deregistration grace (`frontend::DEREGISTER_GRACE`).
pub const GRACE: Duration = Duration::from_millis(500);

/// The request proof header (spec section 1).
pub const PROOF_HEADER: &str = "x-loadgate-proof";

/// The binary under test. `ATTACKS_LEGACY_BIN=/path/to/old/loadgate` runs the
/// suite against a build from before issue 9 (its CLI has none of the new
/// flags, which are then left out), to show that each attack succeeds there.
pub fn bin() -> String {
    std::env::var("ATTACKS_LEGACY_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_loadgate").to_owned())
}

/// True when running against a build from before issue 9.
pub fn legacy() -> bool {
    std::env::var_os("ATTACKS_LEGACY_BIN").is_some()
}

/// Flags (each with one value) that builds before issue 9 do not know.
const NEW_FRONTEND_FLAGS: &[&str] = &[
    "--http-host",
    "--event-host",
    "--admin-host",
    "--admin-port",
    "--model",
    "--max-dp-size",
    "--max-event-connections",
    "--max-workers",
    "--max-models",
    "--max-name-len",
    "--event-read-budget",
    "--http-body-limit-mb",
    "--http-body-budget-mb",
    "--event-idle-timeout-ms",
    "--event-silence-ms",
    "--max-pending-handshakes",
];
const NEW_WORKER_FLAGS: &[&str] = &["--http-host", "--advertise-addr", "--http-body-limit-mb"];

fn legacy_args(args: &[&str]) -> Vec<String> {
    let new = match args.first() {
        Some(&"frontend") => NEW_FRONTEND_FLAGS,
        Some(&"worker") => NEW_WORKER_FLAGS,
        _ => &[],
    };
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if new.contains(arg) {
            it.next();
        } else {
            out.push((*arg).to_owned());
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Test isolation: timing- and memory-sensitive tests run alone.

// An async lock: each test runs on its own runtime and holds it across awaits.
static BOX: RwLock<()> = RwLock::const_new(());

/// Taken by ordinary tests: they may run side by side.
pub async fn shared() -> RwLockReadGuard<'static, ()> {
    BOX.read().await
}

/// Taken by tests that measure time or memory: no other test runs meanwhile.
pub async fn exclusive() -> RwLockWriteGuard<'static, ()> {
    BOX.write().await
}
