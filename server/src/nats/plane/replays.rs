//! [`Replays`]: the newest frame of each stream whose frames keep state
//! alive (a worker's Registers, a frontend's beats and acks), so that a
//! sealed frame recorded off NATS and published again is dropped.
//!
//! The clock window alone lets a replay through for 30 s, and these frames
//! carry no seq: a replayed beat kept a dead frontend's load counting, a
//! replayed Register kept a crashed worker in routing (and registered it
//! again once forgotten), and a replayed old ack emptied a frontend's lease
//! reference. A stream's frames are sealed by one task of one process, in
//! order, so a frame sealed before the newest one heard is a replay; one
//! sealed in the same millisecond is new only if its envelope's tag differs
//! from every one heard in that millisecond. A newer incarnation starts the
//! stream over; an older one is dropped.
//!
//! Streams are kept for the clock window, however many ids their senders
//! name: a holder of the secret could make one per frame. So their count
//! has a limit (twice `--max-workers`, plus [`FRONTEND_STREAMS`]); past it,
//! a frame of a stream not yet heard is dropped until old streams are
//! forgotten.

use std::collections::HashMap;
use std::sync::Mutex;

use loadgate::WorkerId;

/// A sender's stream of frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Stream {
    /// A worker's Registers (its first, and its heartbeats).
    Register(WorkerId),
    /// A frontend's beats.
    Beat(u64),
    /// A frontend's acks.
    Ack(u64),
}

/// The newest frame heard of a stream.
#[derive(Debug)]
struct Newest {
    incarnation: u64,
    sent_ms: u64,
    /// The tags of the frames heard sealed at `sent_ms`.
    tags: Vec<u64>,
}

/// The most frames of one stream sealed in one millisecond: past it, more
/// are dropped (one task sends a beat, an ack or a Register a few times a
/// second).
const MAX_SAME_MS: usize = 64;

/// Streams kept beside twice `--max-workers`: the beats and acks of up to
/// 256 frontends (`--max-frontends`), twice over.
pub(super) const FRONTEND_STREAMS: usize = 1024;

/// The newest frame of every stream heard within the clock window.
#[derive(Debug)]
pub(super) struct Replays {
    streams: Mutex<HashMap<Stream, Newest>>,
    /// The most streams kept.
    limit: usize,
}

impl Default for Replays {
    /// No limit (tests).
    fn default() -> Self {
        Replays::new(usize::MAX)
    }
}

impl Replays {
    /// At most `limit` streams (see the module docs).
    pub(super) fn new(limit: usize) -> Self {
        Replays { streams: Mutex::default(), limit }
    }

    /// Whether the frame of `stream`'s `incarnation` sealed at `sent_ms`
    /// with envelope tag `tag` is new (then it is the newest), not a replay
    /// or an older life's.
    pub(super) fn is_new(&self, stream: Stream, incarnation: u64, sent_ms: u64, tag: u64) -> bool {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let newest = Newest { incarnation, sent_ms, tags: vec![tag] };
        let Some(heard) = streams.get_mut(&stream) else {
            if streams.len() >= self.limit {
                return false;
            }
            streams.insert(stream, newest);
            return true;
        };
        if incarnation != heard.incarnation {
            if incarnation < heard.incarnation {
                return false;
            }
            *heard = newest;
            return true;
        }
        if sent_ms != heard.sent_ms {
            if sent_ms < heard.sent_ms {
                return false;
            }
            *heard = newest;
            return true;
        }
        if heard.tags.contains(&tag) || heard.tags.len() >= MAX_SAME_MS {
            return false;
        }
        heard.tags.push(tag);
        true
    }

    /// Forgets the streams whose newest frame was sealed before
    /// `horizon_ms`: a replay of any of their frames is outside the clock
    /// window by now.
    pub(super) fn forget_before(&self, horizon_ms: u64) {
        self.streams.lock().unwrap_or_else(|e| e.into_inner()).retain(|_, heard| heard.sent_ms >= horizon_ms);
    }
}

/// The last 8 bytes of a sealed envelope (of its tag): what tells two
/// envelopes sealed in the same millisecond apart.
pub(super) fn envelope_tag(payload: &[u8]) -> u64 {
    let mut tail = [0u8; 8];
    let n = payload.len().min(8);
    tail[8 - n..].copy_from_slice(&payload[payload.len() - n..]);
    u64::from_le_bytes(tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_not_newer_than_the_newest_is_a_replay() {
        let replays = Replays::default();
        let beat = Stream::Beat(7);
        assert!(replays.is_new(beat, 1, 1_000, 11));
        assert!(!replays.is_new(beat, 1, 1_000, 11), "the same envelope again");
        assert!(replays.is_new(beat, 1, 1_000, 12), "another one sealed in the same ms");
        assert!(!replays.is_new(beat, 1, 999, 13), "sealed before the newest");
        assert!(replays.is_new(beat, 1, 1_200, 14));
        assert!(!replays.is_new(beat, 1, 1_000, 12), "an older one, once newer ones came");
        // Streams are apart: the same frontend's acks, another frontend.
        assert!(replays.is_new(Stream::Ack(7), 1, 1_000, 11));
        assert!(replays.is_new(Stream::Beat(8), 1, 1_000, 11));
        assert!(replays.is_new(Stream::Register(7), 1, 1_000, 11));
    }

    #[test]
    fn a_newer_incarnation_starts_over_and_an_older_one_is_dropped() {
        let replays = Replays::default();
        let register = Stream::Register(42);
        assert!(replays.is_new(register, 5, 2_000, 1));
        assert!(replays.is_new(register, 6, 1_500, 2), "a restart, even on a clock a little behind");
        assert!(!replays.is_new(register, 5, 3_000, 3), "the older life");
        assert!(replays.is_new(register, 6, 1_600, 4));
    }

    #[test]
    fn a_millisecond_holds_a_bounded_number_of_frames() {
        let replays = Replays::default();
        let ack = Stream::Ack(1);
        for tag in 0..MAX_SAME_MS as u64 {
            assert!(replays.is_new(ack, 1, 5, tag));
        }
        assert!(!replays.is_new(ack, 1, 5, u64::MAX), "past the bound: dropped, not remembered");
        assert!(replays.is_new(ack, 1, 6, u64::MAX));
    }

    #[test]
    fn streams_older_than_the_horizon_are_forgotten() {
        let replays = Replays::default();
        assert!(replays.is_new(Stream::Beat(1), 1, 100, 1));
        assert!(replays.is_new(Stream::Beat(2), 1, 300, 1));
        replays.forget_before(200);
        let streams = replays.streams.lock().unwrap();
        assert_eq!(streams.keys().copied().collect::<Vec<_>>(), [Stream::Beat(2)]);
    }

    #[test]
    fn the_tag_is_the_envelopes_last_bytes() {
        assert_eq!(envelope_tag(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]), u64::from_le_bytes([2, 3, 4, 5, 6, 7, 8, 9]));
        assert_eq!(envelope_tag(&[1, 2]), u64::from_le_bytes([0, 0, 0, 0, 0, 0, 1, 2]));
        assert_eq!(envelope_tag(&[]), 0);
    }

    /// A holder of the secret naming a new id in every frame fills the
    /// streams up to the limit, no further; the streams heard keep working,
    /// and a new one is heard again once old ones are forgotten.
    #[test]
    fn streams_are_kept_up_to_the_limit() {
        let replays = Replays::new(3);
        for worker in 0..3 {
            assert!(replays.is_new(Stream::Register(worker), 1, 100, 1));
        }
        assert!(!replays.is_new(Stream::Register(3), 1, 100, 1), "past the limit");
        assert!(!replays.is_new(Stream::Beat(9), 1, 100, 1), "past the limit");
        assert!(replays.is_new(Stream::Register(1), 1, 200, 2), "a stream heard still works");
        assert_eq!(replays.streams.lock().unwrap().len(), 3);
        replays.forget_before(150);
        assert!(replays.is_new(Stream::Register(3), 1, 300, 1));
    }

    /// What the seal clock is for: a beat every 200 ms through a 5 s step
    /// back of the sender's wall clock is new every time (with the wall
    /// clock's own stamps, 24 beats in a row were dropped as replays).
    #[test]
    fn beats_through_a_step_back_of_the_senders_clock_are_not_replays() {
        use std::time::{Duration, Instant};

        use crate::nats::seal_clock::SealClock;

        let clock = SealClock::new();
        let replays = Replays::default();
        let start = Instant::now();
        let dropped = (0..100u64)
            .filter(|beat| {
                let elapsed = beat * 200;
                let wall = 1_000_000 + elapsed - if *beat >= 10 { 5_000 } else { 0 };
                let stamp = clock.at(wall, start + Duration::from_millis(elapsed), Duration::from_secs(30));
                !replays.is_new(Stream::Beat(7), 1, stamp, *beat)
            })
            .count();
        assert_eq!(dropped, 0);
    }
}
