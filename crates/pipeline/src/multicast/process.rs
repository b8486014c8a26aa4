//! [`ProcessFanout`]: a [`FanoutTransport`] whose producer is this
//! process's [`Exporter`] (the simulator's memfds, or Vulkan on a discrete
//! GPU) and whose consumers each run in **another process**, connected by
//! an fd channel ([`crate::transport::fdpass::Channel`]: the peer's uid
//! checked, messages and fds bounded, every wait bounded).
//!
//! - **Attach** sends the consumer process, over its channel, every
//!   slot's memory and *ready* timeline semaphore and that consumer's own
//!   *release* timeline semaphore of each slot, as fds (`SCM_RIGHTS`; the
//!   producer keeps the exporter's handle of each release semaphore to
//!   read and wait on), then waits (bounded) for the consumer to say it
//!   imported them.
//! - **Queue** sends a ticket (frame, slot, use). The consumer process
//!   ([`serve`]) queues, on its own CUDA stream, a wait for the slot's
//!   *ready* >= use, its work on a device copy of the slot (the shared slot
//!   is never written: [`crate::consumer::CheckInvert`] runs on the copy),
//!   then the signal of its *release* fence of the slot to the use; once
//!   the work finished it answers with the frame's verification result,
//!   which [`FanoutTransport::try_complete`] hands to the ring.
//! - **A consumer process that dies**: its channel closes. The next call
//!   that looks at it (the ring's poll, or its wait for that consumer)
//!   fails with a [`TransportError::Peer`] whose source is a
//!   [`ConsumerEnded`], and the ring disconnects the consumer with the
//!   typed [`DisconnectReason::ProcessEnded`]. Its held slots are retired
//!   by the ring until their release fences come; a process that died in
//!   the middle of its work never signals, so those slots stay retired
//!   (reported as [`super::ConsumerEvent::SlotRetired`]), and the other
//!   consumers go on with the rest. Once the process is gone (reaped,
//!   where this process started it and handed its [`Child`] over; else no
//!   longer there), no signal of it can come any more: the release values
//!   are read one last time and kept, and the consumer's fds (its channel,
//!   its release semaphores) are closed, so this process's fd ledger
//!   ([`crate::transport::fdpass::open_fds`]) is back where it was before
//!   the attach. On a GPU that rests on the driver ending a process's
//!   device work when the process ends (its contexts go with it).
//! - **Detach** and [`FanoutTransport::close`] send `end`; the consumer
//!   finishes what it was queued, answers every frame and its own figures
//!   ([`Farewell`]: frames it took and verified, and the fds it still had
//!   open beyond what it started with), and exits; the process is reaped
//!   here (bounded; killed past the limit).
//!
//! A consumer process that sends what the protocol does not allow (an
//! answer for a slot it was not given, a message with fds, another kind)
//! has its connection closed here and is disconnected with
//! [`DisconnectReason::Failed`] naming what it sent; its slots are retired
//! as above, and its release semaphores are closed once it is gone.
//!
//! Every wait is bounded: the channel's own limit for each message, the
//! ring's limit for each release. Every fd is owned ([`std::os::fd::OwnedFd`]) from
//! the moment it exists.
//!
//! Verified where: on the simulator (`tests/multicast_processes.rs`, CI),
//! two consumer processes, one of them killed with `SIGKILL` in the
//! middle of a run. The Vulkan form builds with `--features vulkan`; its
//! test is for the GPU machine and has not run there yet.
//!
//! Here the consumer's side runs in a thread with a simulator of its own
//! (in the program it is a process started as `pipeline --role consumer`):
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use std::time::Duration;
//! use tegra_interop::driver::Context;
//! use tegra_interop_pipeline::camera::TestPattern;
//! use tegra_interop_pipeline::consumer::{twin, CheckInvert};
//! use tegra_interop_pipeline::multicast::process::{
//!     serve, Expect, ProcessFanout, RemoteConsumer,
//! };
//! use tegra_interop_pipeline::multicast::ring::MulticastRing;
//! use tegra_interop_pipeline::multicast::ConsumerSpec;
//! use tegra_interop_pipeline::transport::export::SimExporter;
//! use tegra_interop_pipeline::transport::fdpass::{Channel, Limits};
//! use tegra_interop_pipeline::transport::FrameGeometry;
//!
//! type BoxError = Box<dyn std::error::Error + Send + Sync>;
//! let g = FrameGeometry { stride: 64, rows: 4 };
//! let limit = Duration::from_secs(5);
//! let (mine, theirs) = Channel::pair(Limits::new(limit))?;
//! let consumer = std::thread::spawn(move || {
//!     let sim = tegra_interop_pipeline::sim::Sim::new()?;
//!     twin::register(&sim); // the kernels' Rust twins
//!     let ctx = Context::new(sim.backend(), 0)?;
//!     let expect = Expect { slots: 3, geometry: g };
//!     Ok::<_, BoxError>(serve(&ctx, theirs, &expect, CheckInvert::boxed())?)
//! });
//! let mut ring = MulticastRing::new(ProcessFanout::open(SimExporter, g, 3)?)?;
//! let id = ring.attach(ConsumerSpec::fifo(RemoteConsumer::new(mine), limit))?;
//! for _ in 0..5 {
//!     let mut lease = ring.acquire()?;
//!     TestPattern::new(lease.frame(), g.stride).fill(lease.bytes_mut()?);
//!     ring.hand_over(lease)?;
//! }
//! ring.drain(limit)?;
//! let report = ring.report(id).ok_or("the consumer is attached")?;
//! assert_eq!((report.finished, report.mismatches), (5, 0));
//! ring.detach(id)?; // `end`: the consumer answers with its figures
//! ring.close()?;
//! let served = consumer.join().map_err(|_| "the consumer thread")??;
//! assert_eq!((served.taken, served.verified, served.failed), (5, 5, 0));
//! # }
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::process::Child;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::RecvFlags;

use super::produce::ProducerSlot;
use super::{
    ConsumerSpec, DisconnectReason, FanoutInfo, FanoutTransport, Mode, Queued, MAX_CONSUMERS,
};
use crate::transport::export::{ExportedFrame, ExportedTimeline, Exporter};
use crate::transport::fdpass::{Channel, FdError};
use crate::transport::{Completion, FrameGeometry, SlotMemory, TransportError};

mod serve;
mod wire;

pub use serve::{serve, Expect, Served, OPAQUE_GRANULE};
pub use wire::McMsg;

/// How long [`FanoutTransport::take_slot`] waits for the exporter to hand
/// a slot back to the host (as [`super::cuda::TAKE_LIMIT`]).
pub const TAKE_LIMIT: Duration = Duration::from_secs(10);

/// The name [`FanoutInfo::backend`] gives.
pub const BACKEND_NAME: &str = "process-fanout";

/// The most messages a detach reads while waiting for the consumer's
/// figures (its answers of the frames still queued, then the figures).
const FAREWELL_MESSAGES: usize = 4 * crate::slots::MAX_SLOTS + 4;

/// A consumer process to attach: the connected channel to it and,
/// where this process started it, its [`Child`] (reaped here when it
/// ends). The work itself is the consumer process's own.
pub struct RemoteConsumer {
    channel: Channel,
    child: Option<Child>,
    delay: Option<Arc<AtomicU64>>,
}

impl fmt::Debug for RemoteConsumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteConsumer")
            .field("peer", &self.channel.peer())
            .field("child", &self.child.as_ref().map(Child::id))
            .finish_non_exhaustive()
    }
}

impl RemoteConsumer {
    /// The consumer process at the other end of `channel` (its uid was
    /// checked when the channel was made).
    pub fn new(channel: Channel) -> RemoteConsumer {
        RemoteConsumer {
            channel,
            child: None,
            delay: None,
        }
    }

    /// The consumer process is `child`, started by this process: the
    /// transport reaps it (and kills it past the limit at detach, close
    /// or drop).
    pub fn with_child(mut self, child: Child) -> RemoteConsumer {
        self.child = Some(child);
        self
    }

    /// Each ticket asks the consumer to hold its slot `delay` nanoseconds
    /// longer after its work (a slow consumer; read at each ticket, so the
    /// caller may change it).
    pub fn with_delay(mut self, delay: Arc<AtomicU64>) -> RemoteConsumer {
        self.delay = Some(delay);
        self
    }

    /// The consumer process's id, where known before its set-up: its
    /// [`Child`]'s, else the peer's as the kernel names it (for a socket
    /// pair, the process that made the pair).
    pub fn pid(&self) -> i32 {
        match &self.child {
            Some(c) => i32::try_from(c.id()).unwrap_or(0),
            None => self.channel.peer().pid,
        }
    }
}

/// A consumer process ended (its connection closed): the typed source of
/// the [`TransportError::Peer`] that [`ProcessFanout`] reports, from which
/// the ring makes [`DisconnectReason::ProcessEnded`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerEnded {
    /// The consumer's index on the ring.
    pub index: usize,
    /// Its process id.
    pub pid: i32,
    /// What was seen: the connection closed, and how the process ended
    /// where that is known yet.
    pub detail: String,
}

impl fmt::Display for ConsumerEnded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "consumer process {} (consumer {}) ended: {}",
            self.pid, self.index, self.detail
        )
    }
}

impl std::error::Error for ConsumerEnded {}

/// The reason the ring gives a consumer whose call failed with `e`:
/// [`DisconnectReason::ProcessEnded`] where `e` (or an error it came from)
/// is a [`ConsumerEnded`], else [`DisconnectReason::Failed`].
pub fn disconnect_reason(e: &(dyn std::error::Error + 'static)) -> DisconnectReason {
    let mut at = Some(e);
    while let Some(err) = at {
        if let Some(end) = err.downcast_ref::<ConsumerEnded>() {
            return DisconnectReason::ProcessEnded {
                pid: end.pid,
                detail: end.detail.clone(),
            };
        }
        at = err.source();
    }
    DisconnectReason::Failed {
        reason: e.to_string(),
    }
}

/// What a consumer process said and how it ended, kept once it left (its
/// detach, the transport's close, or its death).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Farewell {
    /// Its index on the ring.
    pub index: usize,
    /// Its process id.
    pub pid: i32,
    /// Its own figures (`None`: it died or broke off before sending them).
    pub figures: Option<Served>,
    /// How it ended, in words (`exited with status 0`, `was killed by
    /// signal 9 (SIGKILL)`), where this process reaped it.
    pub exit: Option<String>,
    /// Whether it exited with status 0.
    pub exit_ok: bool,
    /// Why it left early, if it did (its connection closed).
    pub ended: Option<String>,
}

/// The farewells of a [`ProcessFanout`]'s consumers, shared (see
/// [`ProcessFanout::farewells`]).
pub type Farewells = Arc<Mutex<Vec<Farewell>>>;

/// What a channel holds now, looked at without waiting.
enum Pending {
    Message,
    Nothing,
    Closed,
}

/// Looks at `ch` without waiting and without taking anything.
fn pending(ch: &Channel) -> Result<Pending, TransportError> {
    let mut b = [MaybeUninit::<u8>::uninit(); 1];
    let flags = RecvFlags::PEEK | RecvFlags::DONTWAIT;
    match rustix::net::recv(ch.socket(), &mut b[..], flags) {
        Ok((_, 0)) => Ok(Pending::Closed),
        Ok(_) => Ok(Pending::Message),
        Err(Errno::AGAIN) | Err(Errno::INTR) => Ok(Pending::Nothing),
        Err(Errno::CONNRESET) => Ok(Pending::Closed),
        Err(e) => Err(TransportError::peer_error(
            "looking at a consumer process's socket",
            std::io::Error::from(e),
        )),
    }
}

/// How `status` ended, in words.
fn ended_words(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(9)) => "was killed by signal 9 (SIGKILL)".into(),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        (None, None) => format!("ended ({status})"),
    }
}

/// One attached consumer process, as the producer sees it.
struct Remote<T> {
    index: usize,
    pid: i32,
    /// `None` once its connection closed (or was closed here).
    ch: Option<Channel>,
    child: Option<Child>,
    delay: Option<Arc<AtomicU64>>,
    /// The host side of its release semaphores; empty once final.
    release: Vec<T>,
    /// Its release values as last read (final once `release` is empty).
    last: Vec<u64>,
    done: VecDeque<Completion>,
    /// Frames sent to it and not answered yet: (frame, slot, use), oldest
    /// first (it answers in that order).
    queued: VecDeque<(u64, usize, u64)>,
    /// How its connection ended, once it did.
    ended: Option<String>,
    /// Whether its end was reported to the ring (once).
    reported: bool,
    /// How the process ended, once reaped here.
    exit: Option<std::process::ExitStatus>,
}

impl<T: ExportedTimeline> Remote<T> {
    fn gone_error(&self) -> TransportError {
        let mut detail = self
            .ended
            .clone()
            .unwrap_or_else(|| "its connection closed".into());
        if let Some(s) = &self.exit {
            detail = format!("{detail}; it {}", ended_words(s));
        }
        let end = ConsumerEnded {
            index: self.index,
            pid: self.pid,
            detail,
        };
        TransportError::peer_error("a consumer process ended", end)
    }

    /// The connection closed (`why`): the channel is dropped here.
    fn closed(&mut self, why: String) {
        self.ch = None;
        self.ended.get_or_insert(why);
    }

    /// Whether the process is gone: reaped here (its exit status kept), or,
    /// for a process this one did not start, no longer there.
    fn gone(&mut self) -> bool {
        if self.exit.is_some() {
            return true;
        }
        match self.child.as_mut() {
            Some(child) => match child.try_wait() {
                Ok(Some(status)) => {
                    self.exit = Some(status);
                    true
                }
                _ => false,
            },
            None => match rustix::process::Pid::from_raw(self.pid) {
                Some(pid) => rustix::process::test_kill_process(pid) == Err(Errno::SRCH),
                None => true,
            },
        }
    }

    /// Once the connection closed and the process is gone, its release
    /// values are final: read them one last time and close its semaphores.
    fn settle(&mut self) {
        if self.ended.is_none() || self.release.is_empty() || !self.gone() {
            return;
        }
        for (last, sem) in self.last.iter_mut().zip(&self.release) {
            if let Ok(v) = sem.value() {
                *last = (*last).max(v);
            }
        }
        self.release.clear();
    }

    /// Reads every message waiting (answers of finished frames), without
    /// waiting; notes a closed connection.
    fn pump(&mut self) -> Result<(), TransportError> {
        loop {
            let Some(ch) = self.ch.as_mut() else {
                return Ok(());
            };
            match pending(ch)? {
                Pending::Nothing => return Ok(()),
                Pending::Closed => {
                    self.closed("its connection closed".into());
                    return Ok(());
                }
                Pending::Message => {}
            }
            let index = self.index;
            let r = match ch.recv(&|| format!("consumer {index}'s answer")) {
                Ok(r) => r,
                Err(FdError::Closed { .. }) => {
                    self.closed("its connection closed".into());
                    return Ok(());
                }
                Err(e) => return Err(self.broke(e.to_string())),
            };
            match McMsg::decode(&r.body) {
                Ok(m @ McMsg::Done { .. }) if r.fds.is_empty() => {
                    let c = self.completion(m)?;
                    self.done.push_back(c);
                }
                Ok(other) => {
                    let what = format!(
                        "{} with {} fds instead of an answer",
                        other.kind(),
                        r.fds.len()
                    );
                    return Err(self.broke(what));
                }
                Err(e) => return Err(self.broke(e.to_string())),
            }
        }
    }

    /// The consumer broke the protocol (`what`): its connection is closed
    /// here and it takes no more frames; the error (reported once, a
    /// [`DisconnectReason::Failed`] for the ring: the process may still
    /// run) names what it sent.
    fn broke(&mut self, what: String) -> TransportError {
        let why = format!("it broke the protocol ({what}); its connection was closed");
        self.closed(why.clone());
        self.reported = true;
        TransportError::peer(format!(
            "consumer process {} (consumer {}): {why}",
            self.pid, self.index
        ))
    }

    /// A `done` answer as a completion (checked against what it was
    /// queued: it must be its oldest frame not yet answered).
    fn completion(&mut self, m: McMsg) -> Result<Completion, TransportError> {
        match answer(m, &mut self.queued) {
            Ok(c) => Ok(c),
            Err(what) => Err(self.broke(what)),
        }
    }

    /// The release value of `slot` now.
    fn value(&mut self, slot: usize) -> Result<u64, TransportError> {
        self.settle();
        let last = self
            .last
            .get_mut(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?;
        if let Some(sem) = self.release.get(slot) {
            *last = (*last).max(sem.value()?);
        }
        Ok(*last)
    }

    /// The end, reported once (`Err`), then `Ok`.
    fn report_end(&mut self) -> Result<(), TransportError> {
        if self.ended.is_some() && !self.reported {
            self.reported = true;
            self.settle();
            return Err(self.gone_error());
        }
        Ok(())
    }
}

/// A multicast transport whose consumers are other processes (see the
/// module docs). Its drop kills and reaps (bounded) the consumer
/// processes it was handed that are still running.
pub struct ProcessFanout<E: Exporter> {
    consumers: Vec<Option<Remote<E::Timeline>>>,
    /// Completions a consumer that left did not have taken yet.
    leftover: Vec<VecDeque<Completion>>,
    slots: Vec<ProducerSlot<E>>,
    geometry: FrameGeometry,
    exporter: E,
    farewells: Farewells,
}

impl<E: Exporter> fmt::Debug for ProcessFanout<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessFanout")
            .field("exporter", &self.exporter.name())
            .field("geometry", &self.geometry)
            .field("slots", &self.slots.len())
            .field("consumers", &self.attached())
            .finish()
    }
}

impl<E: Exporter> ProcessFanout<E> {
    /// `slots` slots of frames of `geometry`, exported by `exporter`.
    ///
    /// # Errors
    /// Refused for a ring size outside `1..=MAX_SLOTS` or empty frames; the
    /// exporter's errors.
    pub fn open(
        mut exporter: E,
        geometry: FrameGeometry,
        slots: usize,
    ) -> Result<ProcessFanout<E>, TransportError> {
        let len = geometry.frame_len();
        if !(1..=crate::slots::MAX_SLOTS).contains(&slots) || len == 0 {
            return Err(TransportError::refused(format!(
                "a multicast ring needs 1..={} slots and non-empty frames (asked: {slots} slots of {len} bytes)",
                crate::slots::MAX_SLOTS
            )));
        }
        let made = ProducerSlot::make(&mut exporter, slots, len)?;
        Ok(ProcessFanout {
            consumers: (0..MAX_CONSUMERS).map(|_| None).collect(),
            leftover: (0..MAX_CONSUMERS).map(|_| VecDeque::new()).collect(),
            slots: made,
            geometry,
            exporter,
            farewells: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// The exporter's name.
    pub fn exporter_name(&self) -> &'static str {
        self.exporter.name()
    }

    /// Consumers attached now (their processes alive or not yet seen dead).
    pub fn attached(&self) -> usize {
        self.consumers.iter().flatten().count()
    }

    /// The farewells of the consumers that left (shared: take the handle
    /// before the transport goes into a ring or a wrapper).
    pub fn farewells(&self) -> Farewells {
        Arc::clone(&self.farewells)
    }

    /// Reads `slot`'s exported frame through the producer's mapping into
    /// `out` (a check that no consumer wrote the shared slot).
    ///
    /// # Errors
    /// A slot the transport does not have, or `out` longer than the frame.
    pub fn read_frame(&self, slot: usize, out: &mut [u8]) -> Result<(), TransportError> {
        self.slots
            .get(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?
            .frame
            .read(0, out)
    }

    fn remote(&mut self, id: usize) -> Result<&mut Remote<E::Timeline>, TransportError> {
        self.consumers
            .get_mut(id)
            .and_then(Option::as_mut)
            .ok_or_else(|| TransportError::misuse(format!("consumer {id} is not attached")))
    }

    /// Sends consumer `index` over `ch` everything it imports: the hello,
    /// every slot's memory, *ready* and (made here) *release* semaphore,
    /// then waits for its answer. The release semaphores' host side.
    fn set_up(
        &mut self,
        index: usize,
        ch: &mut Channel,
        mode: Mode,
    ) -> Result<(Vec<E::Timeline>, u64), TransportError> {
        let hello = McMsg::Hello {
            index: index as u64,
            slots: self.slots.len() as u64,
            stride: self.geometry.stride as u64,
            rows: self.geometry.rows as u64,
            mailbox: mode == Mode::Mailbox,
        };
        let send = |ch: &mut Channel, m: &McMsg, fd: Option<OwnedFd>| {
            let fds: Vec<_> = fd.iter().map(AsFd::as_fd).collect();
            ch.send(&m.encode(), &fds)
                .map_err(|e| TransportError::peer_error("sending a consumer process its set-up", e))
        };
        send(ch, &hello, None)?;
        let mut release = Vec::with_capacity(self.slots.len());
        for (s, slot) in self.slots.iter().enumerate() {
            let s = s as u64;
            let f = &slot.frame;
            let memory = McMsg::Memory {
                slot: s,
                size: f.size(),
                dedicated: f.dedicated(),
            };
            send(ch, &memory, Some(f.export_fd()?))?;
            send(ch, &McMsg::Ready { slot: s }, Some(slot.ready.export_fd()?))?;
            let host = self.exporter.export_timeline(0)?;
            send(ch, &McMsg::Release { slot: s }, Some(host.export_fd()?))?;
            release.push(host);
        }
        send(ch, &McMsg::SetUp, None)?;
        let r = ch
            .recv(&|| format!("consumer {index} to import its slots"))
            .map_err(|e| TransportError::peer_error("a consumer process's set-up", e))?;
        match (McMsg::decode(&r.body), r.fds.len()) {
            (Ok(McMsg::Attached { pid }), 0) => Ok((release, pid)),
            (m, n) => Err(TransportError::peer(format!(
                "consumer process {} answered its set-up with {m:?} and {n} fds",
                ch.peer().pid
            ))),
        }
    }

    /// Ends consumer `r`: `end`, its last answers and figures (bounded),
    /// then its process reaped (killed past the limit). Its farewell is
    /// kept; its last completions go to `leftover`.
    fn end_consumer(&mut self, mut r: Remote<E::Timeline>) -> Result<(), TransportError> {
        let said = match r.ch.as_mut() {
            Some(ch) if r.ended.is_none() => farewell(ch, r.index, &mut r.queued, &mut r.done),
            _ => Ok(None),
        };
        r.ch = None;
        r.release.clear();
        let limit = Duration::from_secs(5);
        let reaped = reap(&mut r.child, limit);
        if let Ok(Some(status)) = &reaped {
            r.exit = Some(*status);
        }
        let figures = said.as_ref().ok().cloned().flatten();
        if let Some(l) = self.leftover.get_mut(r.index) {
            *l = std::mem::take(&mut r.done);
        }
        let fw = Farewell {
            index: r.index,
            pid: r.pid,
            figures,
            exit: r.exit.as_ref().map(ended_words),
            exit_ok: r.exit.is_some_and(|s| s.success()),
            ended: r.ended.clone(),
        };
        if let Ok(mut all) = self.farewells.lock() {
            all.push(fw);
        }
        said?;
        reaped.map(|_| ())
    }
}

/// The consumer process's id: its [`Child`]'s where this process started
/// it; else the peer's as the kernel names it (`SO_PEERCRED`), unless that
/// is this process (it made the socket pair and handed one end over); else
/// the id the consumer announced.
fn consumer_pid(ch: &Channel, child: Option<&Child>, announced: u64) -> i32 {
    if let Some(c) = child {
        return i32::try_from(c.id()).unwrap_or(0);
    }
    let peer = ch.peer().pid;
    if u32::try_from(peer).ok() != Some(std::process::id()) {
        return peer;
    }
    i32::try_from(announced).unwrap_or(0)
}

/// `m`, a consumer's `done` answer, as a completion, once checked to be
/// the oldest frame of `queued` (which it takes off); else what is wrong.
fn answer(m: McMsg, queued: &mut VecDeque<(u64, usize, u64)>) -> Result<Completion, String> {
    let McMsg::Done {
        frame,
        slot,
        use_,
        mismatches,
        process_ns,
    } = m
    else {
        return Err(format!("{} instead of an answer", m.kind()));
    };
    let slot = usize::try_from(slot).unwrap_or(usize::MAX);
    match queued.front() {
        Some(&q) if q == (frame, slot, use_) => {}
        oldest => {
            return Err(format!(
                "an answer for frame {frame} (slot {slot}, use {use_}); the oldest frame sent to it is {oldest:?}"
            ))
        }
    }
    queued.pop_front();
    let process = Duration::from_nanos(process_ns);
    Ok(Completion {
        slot,
        frame,
        mismatches,
        process,
        busy: process,
        finished: Instant::now(),
    })
}

/// Sends `end` over `ch` and reads consumer `index`'s last answers (into
/// `done`) and its figures.
fn farewell(
    ch: &mut Channel,
    index: usize,
    queued: &mut VecDeque<(u64, usize, u64)>,
    done: &mut VecDeque<Completion>,
) -> Result<Option<Served>, TransportError> {
    let err = |e: FdError| TransportError::peer_error("a consumer process's farewell", e);
    ch.send(&McMsg::End.encode(), &[]).map_err(err)?;
    for _ in 0..FAREWELL_MESSAGES {
        let r = ch
            .recv(&|| format!("consumer {index}'s figures"))
            .map_err(err)?;
        match McMsg::decode(&r.body).map_err(err)? {
            McMsg::Figures(f) if r.fds.is_empty() => return Ok(Some(f)),
            m => match answer(m, queued) {
                Ok(c) if r.fds.is_empty() => done.push_back(c),
                Ok(_) => {
                    return Err(TransportError::peer(format!(
                        "consumer {index} sent fds with an answer after `end`"
                    )))
                }
                Err(what) => {
                    return Err(TransportError::peer(format!(
                        "consumer {index} sent, after `end`, {what}"
                    )))
                }
            },
        }
    }
    Err(TransportError::peer(format!(
        "consumer {index} sent more than {FAREWELL_MESSAGES} messages after `end`"
    )))
}

/// Waits up to `limit` for `child` to exit, then kills it and reaps it.
/// Its exit status (`None` where there is no child).
fn reap(
    child: &mut Option<Child>,
    limit: Duration,
) -> Result<Option<std::process::ExitStatus>, TransportError> {
    let Some(c) = child.as_mut() else {
        return Ok(None);
    };
    let io = |what: &'static str| move |e: std::io::Error| TransportError::peer_error(what, e);
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = c.try_wait().map_err(io("waiting for a consumer process"))? {
            return Ok(Some(s));
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // Killed: it can no longer run; a process in the kernel's
    // uninterruptible sleep may take a moment to go.
    let _ = c.kill();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if let Some(s) = c.try_wait().map_err(io("reaping a consumer process"))? {
            return Ok(Some(s));
        }
        if Instant::now() >= deadline {
            return Err(TransportError::timeout(
                "a killed consumer process to end",
                limit + Duration::from_secs(2),
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

impl<E: Exporter> Drop for ProcessFanout<E> {
    fn drop(&mut self) {
        for r in self.consumers.iter_mut().flatten() {
            r.ch = None;
            let _ = reap(&mut r.child, Duration::ZERO);
        }
    }
}

impl<E: Exporter> FanoutTransport for ProcessFanout<E> {
    type Work = RemoteConsumer;

    fn info(&self) -> FanoutInfo {
        FanoutInfo {
            backend: BACKEND_NAME,
            geometry: self.geometry,
            slots: self.slots.len(),
        }
    }

    fn attach(
        &mut self,
        id: usize,
        spec: ConsumerSpec<RemoteConsumer>,
    ) -> Result<(), TransportError> {
        match self.consumers.get(id) {
            None => {
                return Err(TransportError::misuse(format!(
                    "consumer {id} is past the {MAX_CONSUMERS} consumer places"
                )))
            }
            Some(Some(_)) => {
                return Err(TransportError::misuse(format!(
                    "consumer {id} is attached already"
                )))
            }
            Some(None) => {}
        }
        let RemoteConsumer {
            mut channel,
            mut child,
            delay,
        } = spec.work;
        let (release, announced) = match self.set_up(id, &mut channel, spec.mode) {
            Ok(r) => r,
            Err(e) => {
                drop(channel);
                let _ = reap(&mut child, Duration::from_secs(1));
                return Err(e);
            }
        };
        if let Some(l) = self.leftover.get_mut(id) {
            l.clear();
        }
        let pid = consumer_pid(&channel, child.as_ref(), announced);
        self.consumers[id] = Some(Remote {
            index: id,
            pid,
            ch: Some(channel),
            child,
            delay,
            last: vec![0; release.len()],
            release,
            done: VecDeque::new(),
            queued: VecDeque::new(),
            ended: None,
            reported: false,
            exit: None,
        });
        Ok(())
    }

    fn detach(&mut self, id: usize) -> Result<(), TransportError> {
        let Some(r) = self.consumers.get_mut(id).and_then(Option::take) else {
            return Err(TransportError::misuse(format!(
                "consumer {id} is not attached"
            )));
        };
        self.end_consumer(r)
    }

    fn take_slot(
        &mut self,
        slot: usize,
        frame: u64,
        _use: u64,
    ) -> Result<SlotMemory, TransportError> {
        let len = self.geometry.frame_len();
        self.slots
            .get_mut(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?
            .take(&mut self.exporter, slot, frame, len, TAKE_LIMIT)
    }

    fn put_back(&mut self, slot: usize, memory: SlotMemory) -> Result<(), TransportError> {
        self.slots
            .get_mut(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?
            .put_back(slot, memory)
    }

    fn signal_ready(
        &mut self,
        slot: usize,
        use_: u64,
        memory: SlotMemory,
    ) -> Result<(), TransportError> {
        self.slots
            .get_mut(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?
            .publish(&mut self.exporter, slot, use_, memory)
    }

    fn queue(&mut self, id: usize, q: Queued) -> Result<(), TransportError> {
        let r = self.remote(id)?;
        r.pump()?;
        r.report_end()?;
        let delay_ns = r.delay.as_ref().map_or(0, |d| d.load(Ordering::Relaxed));
        let ticket = McMsg::Ticket {
            frame: q.frame,
            slot: q.slot as u64,
            use_: q.use_,
            delay_ns,
        };
        let Some(ch) = r.ch.as_mut() else {
            return Err(TransportError::misuse(format!(
                "consumer {id}'s connection is closed: it takes no more frames"
            )));
        };
        match ch.send(&ticket.encode(), &[]) {
            Ok(()) => {
                r.queued.push_back((q.frame, q.slot, q.use_));
                Ok(())
            }
            Err(FdError::Closed { .. }) => {
                r.closed("its connection closed (a ticket could not be sent)".into());
                r.report_end()
            }
            Err(e) => Err(TransportError::peer_error(
                format!("sending consumer {id} frame {}", q.frame),
                e,
            )),
        }
    }

    fn released(&mut self, id: usize, slot: usize) -> Result<u64, TransportError> {
        self.remote(id)?.value(slot)
    }

    fn wait_released(
        &mut self,
        id: usize,
        slot: usize,
        value: u64,
        limit: Duration,
    ) -> Result<bool, TransportError> {
        let deadline = Instant::now() + limit;
        let r = self.remote(id)?;
        loop {
            if r.value(slot)? >= value {
                return Ok(true);
            }
            r.pump()?;
            r.report_end()?;
            if r.ended.is_some() && r.release.is_empty() {
                // Gone: its values are final.
                return Ok(false);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let slice = left.min(Duration::from_millis(5));
            match r.release.get(slot) {
                Some(sem) => {
                    if sem.wait(value, slice)? {
                        return Ok(true);
                    }
                }
                None => std::thread::sleep(slice),
            }
        }
    }

    fn try_complete(&mut self, id: usize) -> Result<Option<Completion>, TransportError> {
        if let (Some(None), Some(left)) = (self.consumers.get(id), self.leftover.get_mut(id)) {
            return Ok(left.pop_front());
        }
        let r = self.remote(id)?;
        if let Some(c) = r.done.pop_front() {
            return Ok(Some(c));
        }
        r.pump()?;
        if let Some(c) = r.done.pop_front() {
            return Ok(Some(c));
        }
        r.report_end()?;
        r.settle();
        Ok(None)
    }

    fn close(mut self: Box<Self>) -> Result<(), TransportError> {
        let mut first = Ok(());
        for id in 0..MAX_CONSUMERS {
            if let Some(r) = self.consumers.get_mut(id).and_then(Option::take) {
                let ended = self.end_consumer(r);
                if first.is_ok() {
                    first = ended;
                }
            }
        }
        first
    }
}
