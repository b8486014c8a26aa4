//! The messages between a [`super::ProcessFanout`] and a consumer process,
//! and their encoding: one kind byte, then the kind's fields as
//! little-endian `u64`s, nothing else. A body of the wrong length for its
//! kind, an unknown kind or a field out of its range is
//! [`FdError::BadMessage`]. Each kind carries a fixed number of fds
//! ([`McMsg::fds`]); the receiver checks it.

use super::Served;
use crate::transport::fdpass::msg::{decode_words, encode_words};
use crate::transport::fdpass::FdError;

/// One message of the multicast-over-processes protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McMsg {
    /// Producer -> consumer, first: who it is and the ring's shape.
    Hello {
        /// Its index on the ring.
        index: u64,
        /// Slots of the ring.
        slots: u64,
        /// Bytes per frame line.
        stride: u64,
        /// Lines per frame.
        rows: u64,
        /// Whether it is a mailbox consumer (else FIFO).
        mailbox: bool,
    },
    /// Producer -> consumer, 1 fd: slot `slot`'s memory of `size` bytes.
    Memory {
        /// The slot.
        slot: u64,
        /// Its size as exported (checked against the fd before import).
        size: u64,
        /// Whether the import must say it is a dedicated allocation.
        dedicated: bool,
    },
    /// Producer -> consumer, 1 fd: slot `slot`'s *ready* timeline.
    Ready {
        /// The slot.
        slot: u64,
    },
    /// Producer -> consumer, 1 fd: the consumer's own *release* timeline
    /// of slot `slot`.
    Release {
        /// The slot.
        slot: u64,
    },
    /// Producer -> consumer: every slot's fds were sent.
    SetUp,
    /// Consumer -> producer: everything is imported; frames may come.
    Attached {
        /// The consumer process's id.
        pid: u64,
    },
    /// Producer -> consumer: frame `frame` is use `use_` of `slot`: wait
    /// for *ready* >= `use_`, work on a copy, signal *release* = `use_`
    /// (holding the slot `delay_ns` longer after the work).
    Ticket {
        /// The frame.
        frame: u64,
        /// The slot.
        slot: u64,
        /// The slot's use.
        use_: u64,
        /// Extra time the consumer holds the slot (a slow consumer).
        delay_ns: u64,
    },
    /// Consumer -> producer: a frame's work finished.
    Done {
        /// The frame.
        frame: u64,
        /// Its slot.
        slot: u64,
        /// Its use.
        use_: u64,
        /// Bytes that differed from the test pattern.
        mismatches: u64,
        /// Nanoseconds the work took.
        process_ns: u64,
    },
    /// Producer -> consumer: no more frames; finish, answer, send figures.
    End,
    /// Consumer -> producer, last: its figures.
    Figures(Served),
}

impl McMsg {
    /// The kind's name (in errors).
    pub fn kind(&self) -> &'static str {
        match self {
            McMsg::Hello { .. } => "hello",
            McMsg::Memory { .. } => "memory",
            McMsg::Ready { .. } => "ready",
            McMsg::Release { .. } => "release",
            McMsg::SetUp => "set-up",
            McMsg::Attached { .. } => "attached",
            McMsg::Ticket { .. } => "ticket",
            McMsg::Done { .. } => "done",
            McMsg::End => "end",
            McMsg::Figures(_) => "figures",
        }
    }

    /// The fds a message of this kind carries.
    pub fn fds(&self) -> usize {
        match self {
            McMsg::Memory { .. } | McMsg::Ready { .. } | McMsg::Release { .. } => 1,
            _ => 0,
        }
    }

    fn fields(&self) -> (u8, Vec<u64>) {
        match *self {
            McMsg::Hello {
                index,
                slots,
                stride,
                rows,
                mailbox,
            } => (1, vec![index, slots, stride, rows, u64::from(mailbox)]),
            McMsg::Memory {
                slot,
                size,
                dedicated,
            } => (2, vec![slot, size, u64::from(dedicated)]),
            McMsg::Ready { slot } => (3, vec![slot]),
            McMsg::Release { slot } => (4, vec![slot]),
            McMsg::SetUp => (5, vec![]),
            McMsg::Attached { pid } => (6, vec![pid]),
            McMsg::Ticket {
                frame,
                slot,
                use_,
                delay_ns,
            } => (7, vec![frame, slot, use_, delay_ns]),
            McMsg::Done {
                frame,
                slot,
                use_,
                mismatches,
                process_ns,
            } => (8, vec![frame, slot, use_, mismatches, process_ns]),
            McMsg::End => (9, vec![]),
            McMsg::Figures(f) => (
                10,
                vec![f.pid, f.index, f.taken, f.verified, f.failed, f.fds_left],
            ),
        }
    }

    /// The message's body.
    pub fn encode(&self) -> Vec<u8> {
        let (kind, fields) = self.fields();
        encode_words(kind, &fields)
    }

    /// Parses a body.
    ///
    /// # Errors
    /// [`FdError::BadMessage`] naming what is wrong.
    pub fn decode(body: &[u8]) -> Result<McMsg, FdError> {
        let (&kind, rest) = body
            .split_first()
            .ok_or_else(|| FdError::BadMessage("an empty message".into()))?;
        let want = match kind {
            5 | 9 => 0,
            3 | 4 | 6 => 1,
            2 => 3,
            7 => 4,
            1 | 8 => 5,
            10 => 6,
            k => return Err(FdError::BadMessage(format!("an unknown kind {k}"))),
        };
        let f = decode_words(kind, rest, want)?;
        let flag = |v: u64, what: &str| match v {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(FdError::BadMessage(format!("{what} {v}"))),
        };
        Ok(match kind {
            1 => McMsg::Hello {
                index: f[0],
                slots: f[1],
                stride: f[2],
                rows: f[3],
                mailbox: flag(f[4], "a mailbox flag")?,
            },
            2 => McMsg::Memory {
                slot: f[0],
                size: f[1],
                dedicated: flag(f[2], "a dedicated flag")?,
            },
            3 => McMsg::Ready { slot: f[0] },
            4 => McMsg::Release { slot: f[0] },
            5 => McMsg::SetUp,
            6 => McMsg::Attached { pid: f[0] },
            7 => McMsg::Ticket {
                frame: f[0],
                slot: f[1],
                use_: f[2],
                delay_ns: f[3],
            },
            8 => McMsg::Done {
                frame: f[0],
                slot: f[1],
                use_: f[2],
                mismatches: f[3],
                process_ns: f[4],
            },
            9 => McMsg::End,
            _ => McMsg::Figures(Served {
                pid: f[0],
                index: f[1],
                taken: f[2],
                verified: f[3],
                failed: f[4],
                fds_left: f[5],
            }),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_malformed_ones_are_refused() {
        let all = [
            McMsg::Hello {
                index: 2,
                slots: 6,
                stride: 64,
                rows: 8,
                mailbox: true,
            },
            McMsg::Memory {
                slot: 1,
                size: 4096,
                dedicated: false,
            },
            McMsg::Ready { slot: 3 },
            McMsg::Release { slot: 4 },
            McMsg::SetUp,
            McMsg::Attached { pid: 77 },
            McMsg::Ticket {
                frame: 9,
                slot: 2,
                use_: 3,
                delay_ns: 1000,
            },
            McMsg::Done {
                frame: 9,
                slot: 2,
                use_: 3,
                mismatches: 0,
                process_ns: 5,
            },
            McMsg::End,
            McMsg::Figures(Served {
                pid: 1,
                index: 0,
                taken: 5,
                verified: 5,
                failed: 0,
                fds_left: 0,
            }),
        ];
        for m in all {
            assert_eq!(McMsg::decode(&m.encode()).unwrap(), m, "{m:?}");
            let fds = usize::from(matches!(
                m,
                McMsg::Memory { .. } | McMsg::Ready { .. } | McMsg::Release { .. }
            ));
            assert_eq!(m.fds(), fds);
        }
        let mut hello = all[0].encode();
        hello[33] = 2; // the mailbox flag
        let mut long = McMsg::End.encode();
        long.push(0);
        for bad in [vec![], vec![0], vec![11], vec![3, 1], long, hello] {
            assert!(
                matches!(McMsg::decode(&bad), Err(FdError::BadMessage(_))),
                "{bad:?}"
            );
        }
    }
}
