//! The consumer process's side of a [`super::ProcessFanout`]: [`serve`].

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tegra_interop::core::{SignalParams, WaitParams};
use tegra_interop::driver::{Context, ExternalSemaphore, MappedBuffer, Stream};

use super::{pending, McMsg, Pending};
use crate::consumer::{
    Consumer, ConsumerConfig, CopyWith, DeviceFrame, FrameMemory, FrameWork, Placement, WorkError,
};
use crate::frame::{FrameLayout, PixelFormat};
use crate::transport::export::{import_frame_fd, import_timeline};
use crate::transport::fdpass::{check_memory_fd, open_fds, Channel, FdError};
use crate::transport::{DriverResultExt, FrameGeometry, TransportError};

/// The most a memory fd whose size `fstat` cannot tell (a driver's opaque
/// handle) may declare: the frame rounded up to this (as the fd
/// two-process mode bounds it: Vulkan's granularity for these buffers is
/// at most 2 MiB).
pub const OPAQUE_GRANULE: u64 = 2 << 20;

/// What the consumer process expects of the producer (from its own
/// options, never from the peer): the ring's shape. A hello that differs
/// is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expect {
    /// Slots of the ring.
    pub slots: usize,
    /// Layout of every frame.
    pub geometry: FrameGeometry,
}

/// A consumer process's figures, sent to the producer last
/// ([`McMsg::Figures`]) and returned by [`serve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Served {
    /// Its process id.
    pub pid: u64,
    /// Its index on the ring.
    pub index: u64,
    /// Frames it was queued (tickets).
    pub taken: u64,
    /// Frames it finished with no mismatch.
    pub verified: u64,
    /// Frames it finished with mismatches.
    pub failed: u64,
    /// File descriptors open at its end beyond those open before its
    /// set-up (0: every fd it received was closed).
    pub fds_left: u64,
}

/// Work that holds its stream a given time after the inner work (a slow
/// consumer: the ticket's `delay_ns`).
struct Paced {
    inner: Box<dyn FrameWork>,
    delay: Arc<AtomicU64>,
}

impl FrameWork for Paced {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn pixel_format(&self) -> PixelFormat {
        self.inner.pixel_format()
    }
    fn prepare(
        &mut self,
        ctx: &Context,
        layout: FrameLayout,
        slots: usize,
        placement: Placement,
    ) -> Result<(), WorkError> {
        self.inner.prepare(ctx, layout, slots, placement)
    }
    fn queue(&mut self, frame: &DeviceFrame<'_>, stream: &Stream) -> Result<(), WorkError> {
        self.inner.queue(frame, stream)?;
        let delay = Duration::from_nanos(self.delay.load(Ordering::Relaxed));
        if !delay.is_zero() {
            stream
                .launch_host_fn(move || std::thread::sleep(delay))
                .map_err(|e| WorkError::driver("queueing a slow consumer's delay", e))?;
        }
        Ok(())
    }
    fn finished(&mut self, slot: usize, frame: u64) -> Result<u64, WorkError> {
        self.inner.finished(slot, frame)
    }
}

fn peer(what: &'static str) -> impl Fn(FdError) -> TransportError {
    move |e| TransportError::peer_error(what, e)
}

fn protocol(detail: String) -> TransportError {
    TransportError::peer(format!("the producer broke the protocol: {detail}"))
}

/// The imports of one consumer process; field order is drop order: the
/// consumer (its streams drained) before the semaphores they used.
struct Side {
    consumer: Consumer,
    ready: Vec<ExternalSemaphore>,
    release: Vec<ExternalSemaphore>,
}

/// What the set-up received: the hello's index and mode, the frames and
/// semaphores.
struct Received {
    index: u64,
    frames: Vec<MappedBuffer>,
    ready: Vec<ExternalSemaphore>,
    release: Vec<ExternalSemaphore>,
}

/// The next message of the set-up, which must be `kind` with its fd.
fn next_fd(ch: &mut Channel, what: &str) -> Result<(McMsg, Option<OwnedFd>), TransportError> {
    let r = ch
        .recv(&|| what.to_string())
        .map_err(peer("the producer's set-up"))?;
    let m = McMsg::decode(&r.body).map_err(peer("the producer's set-up"))?;
    if r.fds.len() != m.fds() {
        return Err(protocol(format!(
            "{} with {} fds, waiting for {what}",
            m.kind(),
            r.fds.len()
        )));
    }
    Ok((m, r.fds.into_iter().next()))
}

/// Receives the hello (checked against `expect`) and every slot's fds
/// (memory sizes checked before import), then `set-up`.
fn receive(
    ch: &mut Channel,
    ctx: &Context,
    expect: &Expect,
) -> Result<(Received, bool), TransportError> {
    let (hello, _) = next_fd(ch, "the hello")?;
    let g = expect.geometry;
    let McMsg::Hello {
        index,
        slots,
        stride,
        rows,
        mailbox,
    } = hello
    else {
        return Err(protocol(format!("{} instead of the hello", hello.kind())));
    };
    if (slots, stride, rows) != (expect.slots as u64, g.stride as u64, g.rows as u64) {
        return Err(TransportError::refused(format!(
            "the producer's ring is {slots} slots of {rows} lines of {stride} bytes, this consumer was started for {} slots of {} lines of {} bytes (start it with the same --ring, --width, --height and --format)",
            expect.slots, g.rows, g.stride
        )));
    }
    let len = g.frame_len() as u64;
    let most = len.div_ceil(OPAQUE_GRANULE).max(1) * OPAQUE_GRANULE;
    let mut out = Received {
        index,
        frames: Vec::new(),
        ready: Vec::new(),
        release: Vec::new(),
    };
    for slot in 0..slots {
        receive_slot(ch, ctx, slot, (len, most), &mut out)?;
    }
    match next_fd(ch, "the end of the set-up")? {
        (McMsg::SetUp, _) => Ok((out, mailbox)),
        (m, _) => Err(protocol(format!(
            "{} instead of the end of the set-up",
            m.kind()
        ))),
    }
}

/// Receives and imports slot `slot`'s memory (its declared size checked
/// within `len..=most` and against `fstat` first), *ready* and *release*
/// semaphores.
fn receive_slot(
    ch: &mut Channel,
    ctx: &Context,
    slot: u64,
    (len, most): (u64, u64),
    out: &mut Received,
) -> Result<(), TransportError> {
    let (m, fd) = next_fd(ch, &format!("slot {slot}'s memory"))?;
    let (
        McMsg::Memory {
            slot: s,
            size,
            dedicated,
        },
        Some(fd),
    ) = (m, fd)
    else {
        return Err(protocol(format!(
            "{} instead of slot {slot}'s memory",
            m.kind()
        )));
    };
    if s != slot {
        return Err(protocol(format!(
            "slot {s}'s memory instead of slot {slot}'s"
        )));
    }
    check_memory_fd(fd.as_fd(), size, len, most).map_err(peer("a slot's memory fd"))?;
    out.frames.push(import_frame_fd(ctx, fd, size, dedicated)?);
    let (m, fd) = next_fd(ch, &format!("slot {slot}'s ready semaphore"))?;
    match (m, fd) {
        (McMsg::Ready { slot: s }, Some(fd)) if s == slot => {
            out.ready.push(import_timeline(ctx, fd)?)
        }
        _ => {
            return Err(protocol(format!(
                "{m:?} instead of slot {slot}'s ready semaphore"
            )))
        }
    }
    let (m, fd) = next_fd(ch, &format!("slot {slot}'s release semaphore"))?;
    match (m, fd) {
        (McMsg::Release { slot: s }, Some(fd)) if s == slot => {
            out.release.push(import_timeline(ctx, fd)?)
        }
        _ => {
            return Err(protocol(format!(
                "{m:?} instead of slot {slot}'s release semaphore"
            )))
        }
    }
    Ok(())
}

/// What the consumer process does per frame, and its counts.
struct Run {
    side: Side,
    slots: usize,
    delay: Arc<AtomicU64>,
    /// Frames queued and not yet answered.
    in_flight: VecDeque<(u64, usize, u64)>,
    /// The last use queued per slot, and the last frame.
    last_use: Vec<u64>,
    last_frame: Option<u64>,
    served: Served,
}

impl Run {
    /// Answers every finished frame (no wait).
    fn answer(
        &mut self,
        ch: &mut Channel,
        block: Option<Duration>,
    ) -> Result<bool, TransportError> {
        if self.in_flight.is_empty() {
            return Ok(false);
        }
        let c = match block {
            Some(limit) => Some(self.side.consumer.wait_complete(limit)?),
            None => self.side.consumer.try_complete()?,
        };
        let Some((c, _)) = c else { return Ok(false) };
        let Some((frame, slot, use_)) = self.in_flight.pop_front() else {
            return Ok(false);
        };
        if (c.frame, c.slot) != (frame, slot) {
            return Err(TransportError::misuse(format!(
                "the consumer finished frame {} (slot {}) before frame {frame} (slot {slot})",
                c.frame, c.slot
            )));
        }
        match c.mismatches {
            0 => self.served.verified += 1,
            _ => self.served.failed += 1,
        }
        let done = McMsg::Done {
            frame,
            slot: slot as u64,
            use_,
            mismatches: c.mismatches,
            process_ns: c.process.as_nanos() as u64,
        };
        ch.send(&done.encode(), &[])
            .map_err(peer("answering the producer"))?;
        Ok(true)
    }

    /// Queues a ticket's frame: wait for *ready*, the work on a copy, then
    /// *release*; the ticket is checked first (a slot of the ring, a use
    /// past the slot's last, a frame past the last).
    fn ticket(
        &mut self,
        ch: &mut Channel,
        limit: Duration,
        (frame, slot, use_, delay_ns): (u64, u64, u64, u64),
    ) -> Result<(), TransportError> {
        let s = usize::try_from(slot).unwrap_or(usize::MAX);
        let fresh = self.last_frame.is_none_or(|f| frame > f);
        if s >= self.slots || use_ <= self.last_use[s] || !fresh {
            return Err(protocol(format!(
                "a ticket for frame {frame} in slot {slot}, use {use_} (slots: {}, the slot's last use {}, the last frame {:?})",
                self.slots, self.last_use.get(s).copied().unwrap_or(0), self.last_frame
            )));
        }
        // A slot is queued again only once its earlier frame was answered.
        let start = Instant::now();
        while self.in_flight.iter().any(|&(_, x, _)| x == s) {
            let left = limit.saturating_sub(start.elapsed());
            self.answer(ch, Some(left))?;
        }
        self.delay.store(delay_ns, Ordering::Relaxed);
        let c = &self.side.consumer;
        c.entry_stream()
            .wait(&self.side.ready[s], WaitParams::timeline(use_))
            .during("queueing the wait for a slot's ready fence")?;
        c.queue(s, frame)?;
        c.exit_stream()
            .signal(&mut self.side.release[s], SignalParams::timeline(use_))
            .during("queueing the signal of the consumer's release fence")?;
        self.last_use[s] = use_;
        self.last_frame = Some(frame);
        self.served.taken += 1;
        self.in_flight.push_back((frame, s, use_));
        Ok(())
    }

    /// Frames until `end`, answering each once finished.
    fn frames(&mut self, ch: &mut Channel, limit: Duration) -> Result<(), TransportError> {
        // Since when the oldest frame in flight waits (bounded by `limit`).
        let mut since = Instant::now();
        loop {
            while self.answer(ch, None)? {
                since = Instant::now();
            }
            if !self.in_flight.is_empty() {
                match pending(ch)? {
                    Pending::Nothing if since.elapsed() >= limit => {
                        let frame = self.in_flight.front().map_or(0, |f| f.0);
                        return Err(TransportError::timeout(
                            format!("frame {frame} to finish on this consumer's stream"),
                            limit,
                        ));
                    }
                    Pending::Nothing => {
                        std::thread::sleep(Duration::from_micros(100));
                        continue;
                    }
                    Pending::Message | Pending::Closed => {}
                }
            } else {
                since = Instant::now();
            }
            let r = ch
                .recv(&|| "the producer's next ticket".into())
                .map_err(peer("the producer's tickets"))?;
            match (
                McMsg::decode(&r.body).map_err(peer("a ticket"))?,
                r.fds.len(),
            ) {
                (
                    McMsg::Ticket {
                        frame,
                        slot,
                        use_,
                        delay_ns,
                    },
                    0,
                ) => self.ticket(ch, limit, (frame, slot, use_, delay_ns))?,
                (McMsg::End, 0) => {
                    while !self.in_flight.is_empty() {
                        self.answer(ch, Some(limit))?;
                    }
                    return Ok(());
                }
                (m, n) => {
                    return Err(protocol(format!(
                        "{} with {n} fds instead of a ticket",
                        m.kind()
                    )))
                }
            }
        }
    }
}

/// Serves one consumer of a [`super::ProcessFanout`] over `ch` (this
/// process's end): receives and imports the slots' memory and fences
/// (checked against `expect` and `fstat` first), runs `work` on a device
/// copy of each frame it is given (the shared slot is only read), answers
/// each frame, and at `end` sends its figures. Every wait for the producer
/// is bounded by the channel's limit.
///
/// # Errors
/// The producer's typed channel errors (it ended, or broke the protocol),
/// a hello that differs from `expect`, a memory fd whose declared size is
/// wrong, CUDA's errors.
pub fn serve(
    ctx: &Context,
    mut ch: Channel,
    expect: &Expect,
    work: Box<dyn FrameWork>,
) -> Result<Served, TransportError> {
    let before = open_fds().map_err(|e| TransportError::new(format!("the fd ledger: {e}")))?;
    let limit = ch.limits().timeout;
    let (got, _mailbox) = receive(&mut ch, ctx, expect)?;
    let delay = Arc::new(AtomicU64::new(0));
    let config = ConsumerConfig {
        geometry: expect.geometry,
        slots: expect.slots,
        memory: FrameMemory::System,
        placement: Placement::DeviceCopy(CopyWith::Engines),
        skip_kernel: false,
    };
    let paced = Paced {
        inner: work,
        delay: Arc::clone(&delay),
    };
    let mut consumer = Consumer::new(ctx, config, got.frames, Box::new(paced))?;
    consumer.set_read_only();
    let pid = u64::from(std::process::id());
    ch.send(&McMsg::Attached { pid }.encode(), &[])
        .map_err(peer("answering the set-up"))?;
    let mut run = Run {
        side: Side {
            consumer,
            ready: got.ready,
            release: got.release,
        },
        slots: expect.slots,
        delay,
        in_flight: VecDeque::new(),
        last_use: vec![0; expect.slots],
        last_frame: None,
        served: Served {
            pid,
            index: got.index,
            ..Served::default()
        },
    };
    run.frames(&mut ch, limit)?;
    let Run {
        side, mut served, ..
    } = run;
    drop(side);
    let after = open_fds().map_err(|e| TransportError::new(format!("the fd ledger: {e}")))?;
    served.fds_left = after.saturating_sub(before) as u64;
    ch.send(&McMsg::Figures(served).encode(), &[])
        .map_err(peer("sending the figures"))?;
    Ok(served)
}
