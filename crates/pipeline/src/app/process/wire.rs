//! The messages of the two-process mode and the endpoint that carries them.
//!
//! Messages are one line of text each (a word, then numbers), sent as one
//! NvSciIpc message; the NvSci objects and fences travel between them as
//! the driver's own messages. What arrives is checked before use: a
//! message of the wrong kind, with missing, extra or malformed fields, is a
//! [`ProcessError::Protocol`].

use std::time::Duration;

use tegra_interop::driver::nvsci::{IpcEndpoint, IpcError, NvSciIpc};

use super::error::{Peer, ProcessError};
use super::Setup;
use crate::slots::Ticket;
use crate::transport::host::Fault;

/// What both sides must agree on before any object crosses, and the
/// defect one of them was asked to inject (`--fault`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub frames: u64,
    pub ring: u64,
    pub width: u64,
    pub height: u64,
    pub bytes_per_pixel: u64,
    pub fault: Fault,
}

impl Hello {
    /// The fault of a run whose sides were given `self.fault` and
    /// `theirs.fault`: the one given (to either side), `None` when they
    /// name two different ones.
    fn agreed_fault(&self, theirs: &Hello) -> Option<Fault> {
        match (self.fault, theirs.fault) {
            (Fault::None, f) | (f, Fault::None) => Some(f),
            (a, b) if a == b => Some(a),
            _ => None,
        }
    }

    /// The options of `self` (this side) and `theirs` that differ, in
    /// words (`--frames 21 here, 20 there`); empty when none.
    fn differences(&self, theirs: &Hello) -> String {
        let mut out = Vec::new();
        let mut num = |name: &str, here: u64, there: u64| {
            if here != there {
                out.push(format!("{name} {here} here, {name} {there} there"));
            }
        };
        num("--frames", self.frames, theirs.frames);
        num("--ring", self.ring, theirs.ring);
        num("--width", self.width, theirs.width);
        num("--height", self.height, theirs.height);
        if self.bytes_per_pixel != theirs.bytes_per_pixel {
            out.push(format!(
                "--format of {} bytes per pixel here, of {} there",
                self.bytes_per_pixel, theirs.bytes_per_pixel
            ));
        }
        if self.agreed_fault(theirs).is_none() {
            out.push(format!(
                "--fault {} here, --fault {} there",
                fault_word(self.fault),
                fault_word(theirs.fault)
            ));
        }
        out.join("; ")
    }
}

/// `--fault`'s word for `f`, as it crosses in the hello.
fn fault_word(f: Fault) -> &'static str {
    match f {
        Fault::None => "none",
        Fault::SkipProcess => "skip-process",
        Fault::Corrupt => "corrupt",
    }
}

fn parse_fault(word: &str) -> Option<Fault> {
    [Fault::None, Fault::SkipProcess, Fault::Corrupt]
        .into_iter()
        .find(|&f| fault_word(f) == word)
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
    /// CUDA -> camera, first: its options.
    Hello(Hello),
    /// Camera -> CUDA, the answer to a hello that matches its own options:
    /// the fault the run injects (the one either side was given).
    Agreed(Fault),
    /// Camera -> CUDA, the answer to a hello that does not match: its own
    /// options (the CUDA side names the differences; no text of the peer
    /// is shown).
    Refused(Hello),
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
            Msg::Hello(h) => format!("hello {}", hello_fields(h)),
            Msg::Agreed(f) => format!("agreed {}", fault_word(*f)),
            Msg::Refused(h) => format!("refused {}", hello_fields(h)),
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
        let f = Fields {
            kind,
            text,
            words: words.collect(),
        };
        Ok(match kind {
            "hello" => Msg::Hello(f.hello()?),
            "agreed" => {
                f.want(1)?;
                Msg::Agreed(f.fault(0)?)
            }
            "refused" => Msg::Refused(f.hello()?),
            "ticket" => {
                f.want(6)?;
                let previous = match f.words[5] {
                    "-" => None,
                    _ => Some(f.n(5)?),
                };
                Msg::Ticket(TicketMsg {
                    frame: f.n(0)?,
                    slot: f.n(1)?,
                    free_wait: f.n(2)?,
                    ready: f.n(3)?,
                    free_signal: f.n(4)?,
                    previous,
                })
            }
            "written" => {
                f.want(2)?;
                Msg::Written {
                    frame: f.n(0)?,
                    write_ns: f.n(1)?,
                }
            }
            "freed" => {
                f.want(1)?;
                Msg::Freed { frame: f.n(0)? }
            }
            "end" => {
                f.want(0)?;
                Msg::End
            }
            "figures" => {
                f.want(5)?;
                Msg::Figures(Figures {
                    pid: f.n(0)?,
                    verified: f.n(1)?,
                    failed: f.n(2)?,
                    write_us_per_frame: f.n(3)?,
                    elapsed_us: f.n(4)?,
                })
            }
            _ => return Err(BadMessage(format!("an unknown message {text:?}"))),
        })
    }
}

/// The fields of one message being parsed, after its first word.
struct Fields<'a> {
    kind: &'a str,
    text: &'a str,
    words: Vec<&'a str>,
}

impl Fields<'_> {
    /// Exactly `count` fields, or the error.
    fn want(&self, count: usize) -> Result<(), BadMessage> {
        if self.words.len() == count {
            return Ok(());
        }
        Err(BadMessage(format!(
            "`{}` with {} fields: {:?}",
            self.kind,
            self.words.len(),
            self.text
        )))
    }

    /// Field `i` as a number.
    fn n(&self, i: usize) -> Result<u64, BadMessage> {
        self.words
            .get(i)
            .and_then(|w| w.parse().ok())
            .ok_or_else(|| self.bad("field", i))
    }

    /// Field `i` as a `--fault` word.
    fn fault(&self, i: usize) -> Result<Fault, BadMessage> {
        self.words
            .get(i)
            .and_then(|w| parse_fault(w))
            .ok_or_else(|| self.bad("fault", i))
    }

    /// The six fields of a hello (or a refusal).
    fn hello(&self) -> Result<Hello, BadMessage> {
        self.want(6)?;
        Ok(Hello {
            frames: self.n(0)?,
            ring: self.n(1)?,
            width: self.n(2)?,
            height: self.n(3)?,
            bytes_per_pixel: self.n(4)?,
            fault: self.fault(5)?,
        })
    }

    fn bad(&self, what: &str, i: usize) -> BadMessage {
        BadMessage(format!(
            "`{}` with a bad {what} {i}: {:?}",
            self.kind, self.text
        ))
    }
}

fn hello_fields(h: &Hello) -> String {
    format!(
        "{} {} {} {} {} {}",
        h.frames,
        h.ring,
        h.width,
        h.height,
        h.bytes_per_pixel,
        fault_word(h.fault)
    )
}

/// This side's end of the pair: every wait on it is bounded by the peer
/// timeout, and its errors name the peer and what was waited for.
pub(crate) struct Link {
    ep: NvSciIpc,
    peer: Peer,
}

impl Link {
    /// Opens endpoint `name` of `s` and waits (at most `limit`) for `peer`
    /// to connect; every later send and receive waits at most `limit` too.
    /// A configuration file the simulator refused is
    /// [`ProcessError::Config`], with the simulator's reason.
    pub fn open(s: &Setup, name: &str, peer: Peer, limit: Duration) -> Result<Link, ProcessError> {
        match NvSciIpc::open(&s.backend, name, limit) {
            Ok(ep) => Ok(Link { ep, peer }),
            Err(e) => Err(match config_refusal(s, &e) {
                Some(reason) => ProcessError::Config { reason, source: e },
                None => ProcessError::ipc(peer, format!("to connect to {name:?}"), e),
            }),
        }
    }

    /// The CUDA side's half of the handshake: sends our options, waits for
    /// the camera's answer; the fault the run injects.
    pub fn offer(&mut self, ours: &Hello) -> Result<Fault, ProcessError> {
        self.send(&Msg::Hello(*ours))?;
        match self.recv(&|| "its answer to our hello".into())? {
            Msg::Agreed(f) if ours.agreed_fault(&Hello { fault: f, ..*ours }) == Some(f) => Ok(f),
            Msg::Refused(theirs) => {
                let detail = ours.differences(&theirs);
                Err(if detail.is_empty() {
                    self.protocol(format!("it refused our hello {ours:?} as its own"))
                } else {
                    ProcessError::Mismatch {
                        peer: self.peer,
                        detail,
                    }
                })
            }
            other => Err(self.protocol(format!("{other:?} instead of its answer to our hello"))),
        }
    }

    /// The camera side's half of the handshake: takes the CUDA side's
    /// options and answers; the fault the run injects. On a mismatch the
    /// refusal is sent, the endpoint closed (the peer reads the refusal
    /// first) and the mismatch returned.
    pub fn answer(mut self, ours: &Hello) -> Result<(Link, Fault), ProcessError> {
        let theirs = match self.recv(&|| "its hello".into())? {
            Msg::Hello(h) => h,
            other => return Err(self.protocol(format!("{other:?} instead of its hello"))),
        };
        let detail = ours.differences(&theirs);
        match ours.agreed_fault(&theirs) {
            Some(f) if detail.is_empty() => {
                self.send(&Msg::Agreed(f))?;
                Ok((self, f))
            }
            _ => {
                let peer = self.peer;
                let told = self.send(&Msg::Refused(*ours)).and_then(|()| self.close());
                // The mismatch is this side's error whether or not the
                // refusal reached the peer (which then sees a reset).
                drop(told);
                Err(ProcessError::Mismatch { peer, detail })
            }
        }
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

/// The simulator's reason for refusing the NvSciIpc configuration file,
/// where `e` is that refusal (`NvSciIpcInit`'s `NotPermitted`; the reason
/// is the simulator's diagnostic of that call).
fn config_refusal(s: &Setup, e: &IpcError) -> Option<String> {
    let refused = matches!(
        e,
        IpcError::Driver(tegra_interop::driver::Error::NvSci {
            call: "NvSciIpcInit",
            code: tegra_interop::core::NvSciError::NOT_PERMITTED,
        })
    );
    let sim = s.sim.as_ref().filter(|_| refused)?;
    sim.diagnostics()
        .into_iter()
        .find(|d| d.symbol == "NvSciIpcInit" && d.kind == tegra_interop_sim::DiagnosticKind::Misuse)
        .map(|d| d.message)
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
                fault: Fault::None,
            }),
            Msg::Refused(Hello {
                frames: 1,
                ring: 8,
                width: 2,
                height: 3,
                bytes_per_pixel: 2,
                fault: Fault::SkipProcess,
            }),
            Msg::Agreed(Fault::Corrupt),
            Msg::Agreed(Fault::None),
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
            b"hello 1 2 3 4 5",
            b"hello 1 2 3 4 5 broken",
            b"agreed",
            b"agreed corrupt none",
            b"refused 1 2 3 4 5 \x1b[2J",
            b"reboot",
            b"\xff\xfe",
            b"",
        ] {
            assert!(Msg::decode(bad).is_err(), "{bad:?}");
        }
    }

    fn hello(frames: u64, ring: u64, fault: Fault) -> Hello {
        Hello {
            frames,
            ring,
            width: 64,
            height: 16,
            bytes_per_pixel: 4,
            fault,
        }
    }

    #[test]
    fn the_fault_given_to_either_side_is_the_runs_and_two_differ() {
        use Fault::{Corrupt, None as No, SkipProcess};
        for (a, b, want) in [
            (No, No, Some(No)),
            (Corrupt, No, Some(Corrupt)),
            (No, SkipProcess, Some(SkipProcess)),
            (Corrupt, Corrupt, Some(Corrupt)),
            (Corrupt, SkipProcess, None),
        ] {
            assert_eq!(hello(5, 3, a).agreed_fault(&hello(5, 3, b)), want);
            assert_eq!(hello(5, 3, b).agreed_fault(&hello(5, 3, a)), want);
        }
        assert_eq!(hello(5, 3, Corrupt).differences(&hello(5, 3, No)), "");
        assert_eq!(
            hello(21, 3, Corrupt).differences(&hello(20, 4, SkipProcess)),
            "--frames 21 here, --frames 20 there; --ring 3 here, --ring 4 there; \
             --fault corrupt here, --fault skip-process there"
        );
    }
}
