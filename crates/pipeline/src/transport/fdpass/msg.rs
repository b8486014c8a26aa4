//! The typed messages of the fd two-process mode and their encoding.
//!
//! A body is one kind byte, then the kind's fields as little-endian `u64`s,
//! nothing else: a body of the wrong length for its kind, an unknown kind
//! or a field out of its range is [`FdError::BadMessage`]. Each kind
//! carries a fixed number of fds ([`FdMsg::fds`]), which
//! [`super::Channel::recv_msg`] enforces.

use super::FdError;

/// A body of kind `kind` and `fields`, each 8 bytes little-endian (the
/// layout of every message on the fd channel, this module's and the
/// multicast consumers').
pub(crate) fn encode_words(kind: u8, fields: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 8 * fields.len());
    out.push(kind);
    for f in fields {
        out.extend_from_slice(&f.to_le_bytes());
    }
    out
}

/// The `want` 8-byte fields of a body of kind `kind` (`rest`: the body
/// after its kind byte); a body of another length is refused.
pub(crate) fn decode_words(kind: u8, rest: &[u8], want: usize) -> Result<Vec<u64>, FdError> {
    if rest.len() != 8 * want {
        return Err(FdError::BadMessage(format!(
            "kind {kind} with {} bytes of fields, not {}",
            rest.len(),
            8 * want
        )));
    }
    Ok(rest
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect())
}

/// What both sides must agree on before any fd crosses (CUDA process ->
/// camera process, first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdHello {
    /// Frames in the run.
    pub frames: u64,
    /// Slots in the ring.
    pub ring: u64,
    /// Frame width in pixels.
    pub width: u64,
    /// Frame height in rows.
    pub height: u64,
    /// Bytes per pixel.
    pub bytes_per_pixel: u64,
    /// The fault to inject (`--fault`), as a code: 0 none, 1 corrupt, 2
    /// skip-process; the camera process refuses a code it does not know.
    pub fault: u64,
}

/// Which of a slot's two timeline semaphores an fd is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SemRole {
    /// Signalled by the camera when the frame is written; waited for by
    /// the CUDA stream.
    Ready,
    /// Signalled by the CUDA stream when the frame is processed; waited for
    /// by the camera before it writes the slot again.
    Free,
}

/// One message of the fd two-process mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdMsg {
    /// CUDA -> camera, first: the run's settings.
    Hello(FdHello),
    /// Camera -> CUDA, with 1 fd: slot `slot`'s memory of `size` bytes.
    Memory {
        /// The slot.
        slot: u64,
        /// Its size as exported (checked against the fd before import).
        size: u64,
        /// Whether the import must say it is a dedicated allocation.
        dedicated: bool,
    },
    /// Camera -> CUDA, with 1 fd: a timeline semaphore of slot `slot`.
    Semaphore {
        /// The slot.
        slot: u64,
        /// Which one.
        role: SemRole,
    },
    /// Camera -> CUDA: every slot's fds were sent.
    SetUp,
    /// CUDA -> camera: write frame `frame` into `slot` once its *free*
    /// semaphore reached `free_wait`, then signal *ready* = `ready`.
    Ticket {
        /// The frame.
        frame: u64,
        /// The slot.
        slot: u64,
        /// The *free* value to wait for before writing.
        free_wait: u64,
        /// The *ready* value to signal after writing.
        ready: u64,
        /// The slot's previous frame (to check its processed bytes).
        previous: Option<u64>,
    },
    /// Camera -> CUDA: the frame is written and *ready* signalled.
    Written {
        /// The frame.
        frame: u64,
        /// Nanoseconds the write took.
        write_ns: u64,
    },
    /// CUDA -> camera: every frame is processed; check the last ones and
    /// send the figures.
    End,
    /// Camera -> CUDA, last: the camera's figures.
    Figures {
        /// The camera process's id.
        pid: u64,
        /// Processed frames it verified.
        verified: u64,
        /// Processed frames that failed its check.
        failed: u64,
        /// Mean write time per frame, microseconds.
        write_us_per_frame: u64,
        /// Its run time, microseconds.
        elapsed_us: u64,
    },
}

const NONE: u64 = u64::MAX;

impl FdMsg {
    /// The kind's name (in errors).
    pub fn kind(&self) -> &'static str {
        match self {
            FdMsg::Hello(_) => "hello",
            FdMsg::Memory { .. } => "memory",
            FdMsg::Semaphore { .. } => "semaphore",
            FdMsg::SetUp => "set-up",
            FdMsg::Ticket { .. } => "ticket",
            FdMsg::Written { .. } => "written",
            FdMsg::End => "end",
            FdMsg::Figures { .. } => "figures",
        }
    }

    /// The fds a message of this kind carries.
    pub fn fds(&self) -> usize {
        match self {
            FdMsg::Memory { .. } | FdMsg::Semaphore { .. } => 1,
            _ => 0,
        }
    }

    fn fields(&self) -> (u8, Vec<u64>) {
        match *self {
            FdMsg::Hello(h) => (
                1,
                vec![
                    h.frames,
                    h.ring,
                    h.width,
                    h.height,
                    h.bytes_per_pixel,
                    h.fault,
                ],
            ),
            FdMsg::Memory {
                slot,
                size,
                dedicated,
            } => (2, vec![slot, size, u64::from(dedicated)]),
            FdMsg::Semaphore { slot, role } => (3, vec![slot, u64::from(role == SemRole::Free)]),
            FdMsg::SetUp => (4, vec![]),
            FdMsg::Ticket {
                frame,
                slot,
                free_wait,
                ready,
                previous,
            } => (
                5,
                vec![frame, slot, free_wait, ready, previous.unwrap_or(NONE)],
            ),
            FdMsg::Written { frame, write_ns } => (6, vec![frame, write_ns]),
            FdMsg::End => (7, vec![]),
            FdMsg::Figures {
                pid,
                verified,
                failed,
                write_us_per_frame,
                elapsed_us,
            } => (
                8,
                vec![pid, verified, failed, write_us_per_frame, elapsed_us],
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
    pub fn decode(body: &[u8]) -> Result<FdMsg, FdError> {
        let (&kind, rest) = body
            .split_first()
            .ok_or_else(|| FdError::BadMessage("an empty message".into()))?;
        let want = match kind {
            1 => 6,
            2 => 3,
            3 => 2,
            4 | 7 => 0,
            5 => 5,
            6 => 2,
            8 => 5,
            k => return Err(FdError::BadMessage(format!("an unknown kind {k}"))),
        };
        let f = decode_words(kind, rest, want)?;
        Ok(match kind {
            1 => FdMsg::Hello(FdHello {
                frames: f[0],
                ring: f[1],
                width: f[2],
                height: f[3],
                bytes_per_pixel: f[4],
                fault: f[5],
            }),
            2 => FdMsg::Memory {
                slot: f[0],
                size: f[1],
                dedicated: match f[2] {
                    0 => false,
                    1 => true,
                    d => return Err(FdError::BadMessage(format!("a dedicated flag {d}"))),
                },
            },
            3 => FdMsg::Semaphore {
                slot: f[0],
                role: match f[1] {
                    0 => SemRole::Ready,
                    1 => SemRole::Free,
                    r => return Err(FdError::BadMessage(format!("a semaphore role {r}"))),
                },
            },
            4 => FdMsg::SetUp,
            5 => FdMsg::Ticket {
                frame: f[0],
                slot: f[1],
                free_wait: f[2],
                ready: f[3],
                previous: (f[4] != NONE).then_some(f[4]),
            },
            6 => FdMsg::Written {
                frame: f[0],
                write_ns: f[1],
            },
            7 => FdMsg::End,
            _ => FdMsg::Figures {
                pid: f[0],
                verified: f[1],
                failed: f[2],
                write_us_per_frame: f[3],
                elapsed_us: f[4],
            },
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// One message of every kind (both semaphore roles, a first ticket).
    fn every_kind() -> [FdMsg; 10] {
        [
            FdMsg::Hello(FdHello {
                frames: 9,
                ring: 3,
                width: 64,
                height: 8,
                bytes_per_pixel: 4,
                fault: 0,
            }),
            FdMsg::Memory {
                slot: 1,
                size: 4096,
                dedicated: true,
            },
            FdMsg::Semaphore {
                slot: 2,
                role: SemRole::Free,
            },
            FdMsg::Semaphore {
                slot: 0,
                role: SemRole::Ready,
            },
            FdMsg::SetUp,
            FdMsg::Ticket {
                frame: 5,
                slot: 2,
                free_wait: 1,
                ready: 2,
                previous: Some(2),
            },
            FdMsg::Ticket {
                frame: 0,
                slot: 0,
                free_wait: 0,
                ready: 1,
                previous: None,
            },
            FdMsg::Written {
                frame: 5,
                write_ns: 77,
            },
            FdMsg::End,
            FdMsg::Figures {
                pid: 1,
                verified: 2,
                failed: 0,
                write_us_per_frame: 3,
                elapsed_us: 4,
            },
        ]
    }

    #[test]
    fn messages_round_trip_and_malformed_ones_are_refused() {
        for m in every_kind() {
            assert_eq!(FdMsg::decode(&m.encode()).unwrap(), m);
        }
        let mut long = FdMsg::End.encode();
        long.push(0);
        let mut role = FdMsg::Semaphore {
            slot: 0,
            role: SemRole::Ready,
        }
        .encode();
        role[9] = 2;
        let mut dedicated = FdMsg::Memory {
            slot: 0,
            size: 1,
            dedicated: false,
        }
        .encode();
        dedicated[17] = 7;
        for bad in [
            vec![],
            vec![0],
            vec![9],
            vec![2, 1, 2],
            long,
            role,
            dedicated,
        ] {
            assert!(
                matches!(FdMsg::decode(&bad), Err(FdError::BadMessage(_))),
                "{bad:?}"
            );
        }
    }
}
