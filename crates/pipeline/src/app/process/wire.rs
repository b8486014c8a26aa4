//! The messages of the two-process mode and the endpoint that carries them.
//!
//! Messages are one line of text each (a word, then numbers), sent as one
//! NvSciIpc message; the NvSci objects and fences travel between them as
//! the driver's own messages. What arrives is checked before use: a
//! message of the wrong kind, with missing, extra or malformed fields, is a
//! [`ProcessError::Protocol`].

use std::sync::Arc;
use std::time::Duration;

use tegra_interop::driver::nvsci::{IpcEndpoint, NvSciIpc};
use tegra_interop::driver::Backend;

use super::error::{Peer, ProcessError};
use crate::slots::Ticket;

/// What both sides must agree on before any object crosses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub frames: u64,
    pub ring: u64,
    pub width: u64,
    pub height: u64,
    pub bytes_per_pixel: u64,
}

/// The fields of a [`Ticket`], as they cross to the camera process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TicketMsg {
    pub frame: u64,
    pub slot: u64,
    pub free_wait: u64,
    pub ready: u64,
    pub free_signal: u64,
    pub previous: Option<u64>,
}

impl TicketMsg {
    pub fn of(t: &Ticket) -> TicketMsg {
        TicketMsg {
            frame: t.frame(),
            slot: t.slot() as u64,
            free_wait: t.free_wait(),
            ready: t.ready(),
            free_signal: t.free_signal(),
            previous: t.previous_frame(),
        }
    }
}

/// The camera's figures, sent at the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Figures {
    pub pid: u64,
    pub verified: u64,
    pub failed: u64,
    pub write_us_per_frame: u64,
    pub elapsed_us: u64,
}

/// What is wrong with a message that does not parse.
#[derive(Debug, PartialEq, Eq)]
struct BadMessage(String);

/// One message of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Msg {
    /// CUDA -> camera, first.
    Hello(Hello),
    /// CUDA -> camera: write this frame as the ticket says.
    Ticket(TicketMsg),
    /// Camera -> CUDA: the frame is written and *ready* signalled (its
    /// fence follows where it crosses); nanoseconds the write took.
    Written { frame: u64, write_ns: u64 },
    /// CUDA -> camera: the fence of this frame's *free* signal follows.
    Freed { frame: u64 },
    /// CUDA -> camera: every frame is processed; check the last ones, send
    /// the figures.
    End,
    /// Camera -> CUDA, last.
    Figures(Figures),
}

impl Msg {
    fn encode(&self) -> String {
        match self {
            Msg::Hello(h) => format!(
                "hello {} {} {} {} {}",
                h.frames, h.ring, h.width, h.height, h.bytes_per_pixel
            ),
            Msg::Ticket(t) => format!(
                "ticket {} {} {} {} {} {}",
                t.frame,
                t.slot,
                t.free_wait,
                t.ready,
                t.free_signal,
                t.previous.map_or("-".into(), |p| p.to_string())
            ),
            Msg::Written { frame, write_ns } => format!("written {frame} {write_ns}"),
            Msg::Freed { frame } => format!("freed {frame}"),
            Msg::End => "end".into(),
            Msg::Figures(f) => format!(
                "figures {} {} {} {} {}",
                f.pid, f.verified, f.failed, f.write_us_per_frame, f.elapsed_us
            ),
        }
    }

    /// Parses one message; `Err` names what is wrong.
    fn decode(bytes: &[u8]) -> Result<Msg, BadMessage> {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| BadMessage("a message that is not text".into()))?;
        let mut words = text.split(' ');
        let kind = words.next().unwrap_or_default();
        let fields: Vec<&str> = words.collect();
        let n = |i: usize| -> Result<u64, BadMessage> {
            fields
                .get(i)
                .and_then(|w| w.parse().ok())
                .ok_or_else(|| BadMessage(format!("`{kind}` with a bad field {i}: {text:?}")))
        };
        let want = |count: usize| {
            if fields.len() == count {
                Ok(())
            } else {
                Err(BadMessage(format!(
                    "`{kind}` with {} fields: {text:?}",
                    fields.len()
                )))
            }
        };
        Ok(match kind {
            "hello" => {
                want(5)?;
                Msg::Hello(Hello {
                    frames: n(0)?,
                    ring: n(1)?,
                    width: n(2)?,
                    height: n(3)?,
                    bytes_per_pixel: n(4)?,
                })
            }
            "ticket" => {
                want(6)?;
                let previous = match fields[5] {
                    "-" => None,
                    _ => Some(n(5)?),
                };
                Msg::Ticket(TicketMsg {
                    frame: n(0)?,
                    slot: n(1)?,
                    free_wait: n(2)?,
                    ready: n(3)?,
                    free_signal: n(4)?,
                    previous,
                })
            }
            "written" => {
                want(2)?;
                Msg::Written {
                    frame: n(0)?,
                    write_ns: n(1)?,
                }
            }
            "freed" => {
                want(1)?;
                Msg::Freed { frame: n(0)? }
            }
            "end" => {
                want(0)?;
                Msg::End
            }
            "figures" => {
                want(5)?;
                Msg::Figures(Figures {
                    pid: n(0)?,
                    verified: n(1)?,
                    failed: n(2)?,
                    write_us_per_frame: n(3)?,
                    elapsed_us: n(4)?,
                })
            }
            _ => return Err(BadMessage(format!("an unknown message {text:?}"))),
        })
    }
}

/// This side's end of the pair: every wait on it is bounded by the peer
/// timeout, and its errors name the peer and what was waited for.
pub(crate) struct Link {
    ep: NvSciIpc,
    peer: Peer,
}

impl Link {
    /// Opens endpoint `name` and waits (at most `limit`) for `peer` to
    /// connect; every later send and receive waits at most `limit` too.
    pub fn open(
        backend: &Arc<Backend>,
        name: &str,
        peer: Peer,
        limit: Duration,
    ) -> Result<Link, ProcessError> {
        let ep = NvSciIpc::open(backend, name, limit)
            .map_err(|e| ProcessError::ipc(peer, format!("to connect to {name:?}"), e))?;
        Ok(Link { ep, peer })
    }

    /// The endpoint, for the driver's object and fence transfers.
    pub fn endpoint(&mut self) -> &mut impl IpcEndpoint {
        &mut self.ep
    }

    /// Sends `m`.
    pub fn send(&mut self, m: &Msg) -> Result<(), ProcessError> {
        let text = m.encode();
        self.ep
            .send(text.as_bytes())
            .map_err(|e| ProcessError::ipc(self.peer, format!("to take `{text}`"), e))
    }

    /// Receives the next message; `waiting_for` names it in errors.
    pub fn recv(&mut self, waiting_for: &dyn Fn() -> String) -> Result<Msg, ProcessError> {
        let bytes = self
            .ep
            .recv()
            .map_err(|e| ProcessError::ipc(self.peer, waiting_for(), e))?;
        Msg::decode(&bytes).map_err(|BadMessage(detail)| self.protocol(detail))
    }

    /// Whether the connection still stands (between slices of a wait).
    pub fn check(&self, what: &dyn Fn() -> String) -> Result<(), ProcessError> {
        self.ep
            .check_connection()
            .map_err(|e| ProcessError::ipc(self.peer, what(), e))
    }

    /// A protocol error of the peer.
    pub fn protocol(&self, detail: impl Into<String>) -> ProcessError {
        ProcessError::Protocol {
            peer: self.peer,
            detail: detail.into(),
        }
    }

    /// Maps an IPC error of a driver transfer (objects, fences).
    pub fn ipc_err(
        &self,
        what: &'static str,
    ) -> impl FnOnce(tegra_interop::driver::nvsci::IpcError) -> ProcessError {
        let peer = self.peer;
        move |e| ProcessError::ipc(peer, what, e)
    }

    /// Closes the endpoint (the peer sees the reset only after it read
    /// everything sent).
    pub fn close(self) -> Result<(), ProcessError> {
        let peer = self.peer;
        self.ep
            .close()
            .map_err(|e| ProcessError::ipc(peer, "to close the endpoint", e))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_malformed_ones_are_refused() {
        let all = [
            Msg::Hello(Hello {
                frames: 30,
                ring: 3,
                width: 64,
                height: 16,
                bytes_per_pixel: 4,
            }),
            Msg::Ticket(TicketMsg {
                frame: 4,
                slot: 1,
                free_wait: 1,
                ready: 2,
                free_signal: 2,
                previous: Some(1),
            }),
            Msg::Ticket(TicketMsg {
                frame: 0,
                slot: 0,
                free_wait: 0,
                ready: 1,
                free_signal: 1,
                previous: None,
            }),
            Msg::Written {
                frame: 9,
                write_ns: 1234,
            },
            Msg::Freed { frame: 2 },
            Msg::End,
            Msg::Figures(Figures {
                pid: 7,
                verified: 30,
                failed: 0,
                write_us_per_frame: 3,
                elapsed_us: 99,
            }),
        ];
        for m in all {
            assert_eq!(Msg::decode(m.encode().as_bytes()), Ok(m));
        }
        for bad in [
            &b"ticket 1 2 3"[..],
            b"ticket 1 2 3 4 5 6 7",
            b"ticket 1 2 x 4 5 -",
            b"written -1 2",
            b"end now",
            b"hello",
            b"reboot",
            b"\xff\xfe",
            b"",
        ] {
            assert!(Msg::decode(bad).is_err(), "{bad:?}");
        }
    }
}
