//! Fault tests: real `loadgate` processes on 127.0.0.1, killed, frozen,
//! flooded and stopped while they serve. Every test here measures time, so
//! each takes [`common::exclusive`] and they run one at a time; each stays
//! under 30 s and the whole binary under 6 minutes. `docs/reliability.md`
//! lists every case, the command that runs it and the counts measured.

#[path = "../common/mod.rs"]
mod common;

mod http;
mod liveness;
mod retry_storm;
mod shutdown;
mod upstream;
