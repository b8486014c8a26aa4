//! Messages over fixed-size frames (NvSciIpc channels move frames of
//! `frame_size` bytes): how a message is cut into frames and how the frames
//! of an untrusted peer are checked before a byte of them is used.
//!
//! Each frame starts with a [`FrameHeader`] of [`FRAME_HEADER_LEN`] bytes
//! (`"TIMF"`, the message's sequence number, its total length, the chunk's
//! offset) followed by the chunk. [`Assembly`] follows one message in
//! progress without holding its bytes (no allocation here): it refuses a
//! frame that is not ours, belongs to another message, arrives out of order
//! or announces more than the receiver's limit, and tells the caller which
//! bytes of the frame to append.
//!
//! ```
//! use tegra_interop_core::ipc::{Assembly, Frames};
//!
//! let message = [7u8; 100];
//! let mut got = [0u8; 100];
//! let mut assembly = Assembly::new(0, 1024);
//! let mut frame = [0u8; 32];
//! for piece in Frames::new(&message, 0, 32) {
//!     let n = piece.write_to(&mut frame).unwrap();
//!     let chunk = assembly.accept(&frame[..n]).unwrap();
//!     got[chunk.offset..chunk.offset + chunk.bytes.len()].copy_from_slice(chunk.bytes);
//! }
//! assert!(assembly.is_complete());
//! assert_eq!(got, message);
//! ```

use core::fmt;

/// Bytes of the header each frame carries.
pub const FRAME_HEADER_LEN: usize = 16;
const MAGIC: u32 = u32::from_le_bytes(*b"TIMF");

/// The header of one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The message's sequence number (each direction counts from 0).
    pub seq: u32,
    /// The message's total length in bytes.
    pub total: u32,
    /// Where this frame's chunk starts in the message.
    pub offset: u32,
}

impl FrameHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        for (i, w) in [MAGIC, self.seq, self.total, self.offset]
            .iter()
            .enumerate()
        {
            b[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// Reads the header of `frame`; the rest of the frame is its payload
    /// area (the chunk plus, in the last frame, padding).
    pub fn decode(frame: &[u8]) -> Result<(FrameHeader, &[u8]), FrameError> {
        if frame.len() <= FRAME_HEADER_LEN {
            return Err(FrameError::Short { len: frame.len() });
        }
        let (head, rest) = frame.split_at(FRAME_HEADER_LEN);
        let w = |i: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&head[i * 4..i * 4 + 4]);
            u32::from_le_bytes(b)
        };
        if w(0) != MAGIC {
            return Err(FrameError::NotAFrame);
        }
        Ok((
            FrameHeader {
                seq: w(1),
                total: w(2),
                offset: w(3),
            },
            rest,
        ))
    }
}

/// Why a received frame was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum FrameError {
    /// Not longer than a header.
    Short {
        /// The frame's length.
        len: usize,
    },
    /// The header's magic is not ours: garbage, or another protocol.
    NotAFrame,
    /// The message announces more bytes than the receiver accepts.
    TooLarge {
        /// The announced length.
        len: u32,
        /// The receiver's limit.
        max: u32,
    },
    /// A frame of another message than the one expected.
    WrongMessage {
        /// The sequence number expected.
        expected: u32,
        /// The one received.
        got: u32,
    },
    /// A frame whose offset or length does not continue the message.
    OutOfOrder {
        /// The offset expected.
        expected: u32,
        /// The one received.
        got: u32,
    },
    /// A frame after the message was complete.
    AlreadyComplete,
    /// An output buffer too small for a frame.
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Short { len } => {
                write!(f, "a frame of {len} bytes, not longer than its header")
            }
            FrameError::NotAFrame => f.write_str("a frame that is not a message frame (garbage?)"),
            FrameError::TooLarge { len, max } => {
                write!(
                    f,
                    "a message of {len} bytes announced; at most {max} accepted"
                )
            }
            FrameError::WrongMessage { expected, got } => {
                write!(
                    f,
                    "a frame of message {got} while message {expected} was expected"
                )
            }
            FrameError::OutOfOrder { expected, got } => {
                write!(
                    f,
                    "a frame at offset {got} while offset {expected} was expected"
                )
            }
            FrameError::AlreadyComplete => f.write_str("a frame after the message was complete"),
            FrameError::BufferTooSmall { needed } => {
                write!(
                    f,
                    "the frame buffer holds fewer than the {needed} bytes needed"
                )
            }
        }
    }
}

/// One frame to send: its header and chunk.
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    /// The header.
    pub header: FrameHeader,
    /// The chunk of the message.
    pub chunk: &'a [u8],
}

impl Frame<'_> {
    /// Writes the frame into `out`; the number of bytes written.
    pub fn write_to(&self, out: &mut [u8]) -> Result<usize, FrameError> {
        let n = FRAME_HEADER_LEN + self.chunk.len();
        let Some(dst) = out.get_mut(..n) else {
            return Err(FrameError::BufferTooSmall { needed: n });
        };
        dst[..FRAME_HEADER_LEN].copy_from_slice(&self.header.encode());
        dst[FRAME_HEADER_LEN..].copy_from_slice(self.chunk);
        Ok(n)
    }
}

/// The frames of one message (an empty message is one frame).
#[derive(Clone, Debug)]
pub struct Frames<'a> {
    message: &'a [u8],
    seq: u32,
    cap: usize,
    offset: usize,
    done: bool,
}

impl<'a> Frames<'a> {
    /// Cuts `message` (sequence number `seq`) into frames of at most
    /// `frame_size` bytes. A `frame_size` not larger than the header is
    /// treated as one payload byte per frame; callers check
    /// `frame_size > FRAME_HEADER_LEN` up front.
    pub fn new(message: &'a [u8], seq: u32, frame_size: usize) -> Frames<'a> {
        Frames {
            message,
            seq,
            cap: frame_size.saturating_sub(FRAME_HEADER_LEN).max(1),
            offset: 0,
            done: false,
        }
    }
}

impl<'a> Iterator for Frames<'a> {
    type Item = Frame<'a>;

    fn next(&mut self) -> Option<Frame<'a>> {
        if self.done {
            return None;
        }
        let end = self.offset.saturating_add(self.cap).min(self.message.len());
        let chunk = self.message.get(self.offset..end)?;
        let frame = Frame {
            header: FrameHeader {
                seq: self.seq,
                total: u32::try_from(self.message.len()).unwrap_or(u32::MAX),
                offset: u32::try_from(self.offset).unwrap_or(u32::MAX),
            },
            chunk,
        };
        self.offset = end;
        self.done = end >= self.message.len();
        Some(frame)
    }
}

/// A checked chunk: append `bytes` at `offset` of the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk<'a> {
    /// Where the bytes go in the message.
    pub offset: usize,
    /// The bytes (a sub-slice of the frame).
    pub bytes: &'a [u8],
    /// The message's total length.
    pub total: usize,
}

/// One message in progress at the receiver: which message, how much of it
/// arrived. Holds no bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Assembly {
    seq: u32,
    max: u32,
    total: Option<u32>,
    received: u32,
}

impl Assembly {
    /// Expects message `seq` of at most `max` bytes.
    pub fn new(seq: u32, max: u32) -> Assembly {
        Assembly {
            seq,
            max,
            total: None,
            received: 0,
        }
    }

    /// Whether every byte of the message arrived.
    pub fn is_complete(&self) -> bool {
        self.total == Some(self.received)
    }

    /// The message's length, once its first frame arrived.
    pub fn total(&self) -> Option<u32> {
        self.total
    }

    /// Checks `frame` and returns where its chunk goes.
    pub fn accept<'f>(&mut self, frame: &'f [u8]) -> Result<Chunk<'f>, FrameError> {
        let (h, payload) = FrameHeader::decode(frame)?;
        if self.is_complete() {
            return Err(FrameError::AlreadyComplete);
        }
        if h.seq != self.seq {
            return Err(FrameError::WrongMessage {
                expected: self.seq,
                got: h.seq,
            });
        }
        if h.total > self.max {
            return Err(FrameError::TooLarge {
                len: h.total,
                max: self.max,
            });
        }
        match self.total {
            None if h.offset == 0 => self.total = Some(h.total),
            Some(t) if t == h.total && h.offset == self.received => {}
            _ => {
                return Err(FrameError::OutOfOrder {
                    expected: self.received,
                    got: h.offset,
                })
            }
        }
        let left = (h.total - self.received) as usize;
        let n = payload.len().min(left);
        let bytes = &payload[..n];
        let offset = self.received as usize;
        // n <= left <= u32::MAX.
        self.received += n as u32;
        Ok(Chunk {
            offset,
            bytes,
            total: h.total as usize,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_does_not_continue_the_message() {
        let msg = [1u8; 40];
        let f: [Frame<'_>; 3] = {
            let mut it = Frames::new(&msg, 5, 32);
            [it.next().unwrap(), it.next().unwrap(), it.next().unwrap()]
        };
        let enc = |fr: &Frame<'_>| {
            let mut b = [0u8; 32];
            let n = fr.write_to(&mut b).unwrap();
            (b, n)
        };
        let (f0, n0) = enc(&f[0]);
        let (f2, n2) = enc(&f[2]);
        let mut a = Assembly::new(5, 100);
        assert_eq!(
            a.accept(&f2[..n2]),
            Err(FrameError::OutOfOrder {
                expected: 0,
                got: 32
            })
        );
        assert!(a.accept(&f0[..n0]).is_ok());
        assert_eq!(
            a.accept(&f2[..n2]),
            Err(FrameError::OutOfOrder {
                expected: 16,
                got: 32
            })
        );
        let mut other = Assembly::new(6, 100);
        assert_eq!(
            other.accept(&f0[..n0]),
            Err(FrameError::WrongMessage {
                expected: 6,
                got: 5
            })
        );
        let mut small = Assembly::new(5, 39);
        assert_eq!(
            small.accept(&f0[..n0]),
            Err(FrameError::TooLarge { len: 40, max: 39 })
        );
        assert_eq!(
            Assembly::new(0, 9).accept(&[0u8; 32]),
            Err(FrameError::NotAFrame)
        );
        assert_eq!(
            Assembly::new(0, 9).accept(&[0u8; 16]),
            Err(FrameError::Short { len: 16 })
        );
    }

    #[test]
    fn an_empty_message_is_one_frame() {
        let mut it = Frames::new(&[], 0, 17);
        let f = it.next().unwrap();
        assert!(it.next().is_none());
        let mut b = [0u8; 17];
        f.write_to(&mut b).unwrap();
        let mut a = Assembly::new(0, 10);
        assert_eq!(a.accept(&b).unwrap().bytes, &[] as &[u8]);
        assert!(a.is_complete());
        assert_eq!(a.accept(&b), Err(FrameError::AlreadyComplete));
    }
}
