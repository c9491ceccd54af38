//! What the kernel says: the `TcpExt` counters of `/proc/net/netstat`
//! (the ones `nstat -az` prints) and the TCP sockets of `/proc/net/tcp`
//! on the event port, by side and state.

use std::collections::BTreeMap;

/// The counters the report always shows (before, after), in this order.
pub const WATCHED: &[&str] = &[
    "ListenOverflows",
    "ListenDrops",
    "TCPReqQFullDoCookies",
    "TCPReqQFullDrop",
    "SyncookiesSent",
    "SyncookiesRecv",
    "SyncookiesFailed",
    "TCPKeepAlive",
    "TCPAbortOnTimeout",
];

/// One reading of the `TcpExt` counters (network-namespace wide: other
/// traffic on the machine counts too).
#[derive(Clone, Debug, Default)]
pub struct Netstat(BTreeMap<String, u64>);

impl Netstat {
    /// Reads `/proc/net/netstat` (empty if unreadable).
    pub fn read() -> Netstat {
        let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let mut counters = BTreeMap::new();
        for pair in lines.chunks(2) {
            let [names, values] = pair else { continue };
            let (Some(names), Some(values)) = (names.strip_prefix("TcpExt:"), values.strip_prefix("TcpExt:")) else {
                continue;
            };
            for (name, value) in names.split_whitespace().zip(values.split_whitespace()) {
                counters.insert(name.to_owned(), value.parse().unwrap_or(0));
            }
        }
        Netstat(counters)
    }

    /// One counter (0 if absent).
    pub fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }

    /// The watched counters as `name before -> after`, then every other
    /// counter that moved, as `name +delta`.
    pub fn report(&self, after: &Netstat) -> String {
        let mut out: Vec<String> =
            WATCHED.iter().map(|name| format!("{name} {} -> {}", self.get(name), after.get(name))).collect();
        let moved: Vec<String> = after
            .0
            .iter()
            .filter(|(name, _)| !WATCHED.contains(&name.as_str()))
            .filter_map(|(name, &value)| {
                let delta = value.wrapping_sub(self.get(name));
                (delta != 0).then(|| format!("{name} +{delta}"))
            })
            .collect();
        out.push(format!("others moved: {}", if moved.is_empty() { "none".into() } else { moved.join(", ") }));
        out.join("\n    ")
    }
}

/// The TCP sockets on one port, from `/proc/net/tcp` (IPv4).
#[derive(Clone, Debug, Default)]
pub struct PortSockets {
    /// The frontend's side (local port = the port), by state.
    pub server: BTreeMap<&'static str, usize>,
    /// The connecting side (remote port = the port), by state.
    pub client: BTreeMap<&'static str, usize>,
    /// The listening socket's accept queue: (length now, backlog).
    pub accept_queue: Option<(u64, u64)>,
}

impl PortSockets {
    /// Reads `/proc/net/tcp` for `port`.
    pub fn read(port: u16) -> PortSockets {
        let text = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let mut sockets = PortSockets::default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let [_, local, remote, state, queues, ..] = cols.as_slice() else { continue };
            let (local_port, remote_port) = (port_of(local), port_of(remote));
            let state = state_name(state);
            if local_port == Some(port) {
                *sockets.server.entry(state).or_default() += 1;
                if state == "LISTEN" {
                    // For a listener, tx_queue:rx_queue is backlog:accept queue.
                    let mut q = queues.split(':').map(|h| u64::from_str_radix(h, 16).unwrap_or(0));
                    let (backlog, queued) = (q.next().unwrap_or(0), q.next().unwrap_or(0));
                    sockets.accept_queue = Some((queued, backlog));
                }
            } else if remote_port == Some(port) {
                *sockets.client.entry(state).or_default() += 1;
            }
        }
        sockets
    }
}

impl std::fmt::Display for PortSockets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "frontend side {:?}, worker side {:?}", self.server, self.client)?;
        if let Some((queued, backlog)) = self.accept_queue {
            write!(f, ", accept queue {queued}/{backlog}")?;
        }
        Ok(())
    }
}

/// The port of `ADDR:PORT` in `/proc/net/tcp`'s hex notation.
fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok())
}

/// The name of a `/proc/net/tcp` state (`include/net/tcp_states.h`).
fn state_name(hex: &str) -> &'static str {
    match u8::from_str_radix(hex, 16).unwrap_or(0) {
        1 => "ESTABLISHED",
        2 => "SYN_SENT",
        3 => "SYN_RECV",
        4 => "FIN_WAIT1",
        5 => "FIN_WAIT2",
        6 => "TIME_WAIT",
        7 => "CLOSE",
        8 => "CLOSE_WAIT",
        9 => "LAST_ACK",
        10 => "LISTEN",
        11 => "CLOSING",
        12 => "NEW_SYN_RECV",
        _ => "?",
    }
}
