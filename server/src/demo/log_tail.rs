//! [`keep_tail`]: what the demo keeps of a child's log for an error
//! message — its last lines, each cut — while it reads the log to its end
//! whatever its bytes, so the child's writes never block on a full pipe.

use std::collections::VecDeque;
use std::io::{BufRead, Read as _};
use std::sync::Mutex;

/// How much of a log [`keep_tail`] keeps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TailLimits {
    /// The last this many lines.
    pub(crate) lines: usize,
    /// Each cut at this many bytes.
    pub(crate) bytes: usize,
}

/// Reads `log` to its end (or its first read error), keeping its last
/// lines in `tail` within `limits`. Bytes that are not UTF-8 are kept
/// replaced (`U+FFFD`), and reading goes on past them; a line longer than
/// the cut is read in pieces, and only its first piece is kept.
pub(crate) fn keep_tail(mut log: impl BufRead, tail: &Mutex<VecDeque<String>>, limits: TailLimits) {
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut log).take(limits.bytes as u64).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let complete = line.ends_with(b"\n");
        let text = String::from_utf8_lossy(&line).trim_end().to_owned();
        if let Ok(mut tail) = tail.lock() {
            if tail.len() == limits.lines {
                tail.pop_front();
            }
            tail.push_back(text);
        }
        if !complete {
            // Skip the rest of an over-long line.
            let mut rest = Vec::new();
            loop {
                rest.clear();
                match (&mut log).take(limits.bytes as u64).read_until(b'\n', &mut rest) {
                    Ok(0) | Err(_) => return,
                    Ok(_) if rest.ends_with(b"\n") => break,
                    Ok(_) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: TailLimits = TailLimits { lines: 12, bytes: 300 };

    #[test]
    fn the_log_tail_is_bounded() {
        let long = "x".repeat(10 * LIMITS.bytes);
        let text = format!("{long}\n{}", (0..30).map(|i| format!("line {i}\n")).collect::<String>());
        let tail = Mutex::new(VecDeque::new());
        keep_tail(text.as_bytes(), &tail, LIMITS);
        let tail = tail.into_inner().unwrap();
        assert_eq!(tail.len(), LIMITS.lines);
        assert_eq!(tail.back().map(String::as_str), Some("line 29"));

        let one = Mutex::new(VecDeque::new());
        keep_tail(format!("{long}\nend\n").as_bytes(), &one, LIMITS);
        let one = one.into_inner().unwrap();
        assert_eq!(one.len(), 2, "the over-long line is one entry: {one:?}");
        assert_eq!((one[0].len(), one[1].as_str()), (LIMITS.bytes, "end"));
    }

    /// Found by a review: the demo's reader of its own children's stderr
    /// stopped at the first line that was not UTF-8, so the child's next
    /// writes would fill the pipe and block it. Reading goes on to the end.
    #[test]
    fn a_line_that_is_not_utf8_does_not_stop_the_reading() {
        let mut log = b"first\n\xff\xfe broken\n".to_vec();
        log.extend((0..3).flat_map(|i| format!("after {i}\n").into_bytes()));
        let tail = Mutex::new(VecDeque::new());
        keep_tail(&log[..], &tail, LIMITS);
        let tail = tail.into_inner().unwrap();
        assert_eq!(tail.len(), 5, "{tail:?}");
        assert_eq!((tail[1].as_str(), tail[4].as_str()), ("\u{fffd}\u{fffd} broken", "after 2"));
    }
}
