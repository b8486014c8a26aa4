//! The camera process: allocates what the CUDA process asks for, then
//! carries out the tickets of the CUDA process's ring (wait *free*,
//! check the slot's previous frame, write, signal *ready*), checking each
//! against a ring of its own that follows the same protocol.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tegra_interop::core::DeterministicCounter;
use tegra_interop::driver::nvsci::{
    BufAttrs, BufModule, BufPerm, BufType, CpuWaitContext, Fence, FenceSource, SyncAttrs,
    SyncModule, SyncObj, SyncPerm, Timeout,
};

use super::error::{Context, Peer, ProcessError};
use super::wire::{Figures, Hello, Link, Msg, TicketMsg};
use super::{Settings, Setup};
use crate::camera::TestPattern;
use crate::consumer::shared::CpuFrame;
use crate::slots::{Slots, Ticket};
use crate::transport::host::Fault;
use crate::transport::Completion;

/// The ring's refusal as the process error.
fn ring_error(e: crate::slots::RingError) -> ProcessError {
    ProcessError::Ring(e.to_string())
}

/// One slot's objects, as the camera holds them.
struct Slot {
    /// The buffer and its CPU mapping.
    frame: CpuFrame,
    ready: SyncObj,
    free: SyncObj,
    ready_counter: Option<DeterministicCounter>,
    free_counter: Option<DeterministicCounter>,
    /// The fence of the slot's last *free* signal, where it crossed.
    free_fence: Option<(u64, Fence)>,
    /// The frame the slot holds and the *free* value that releases it.
    held: Option<(u64, u64)>,
}

/// A frame of `len` bytes in `frame`'s mapping, refused when the buffer
/// the library allocated is smaller.
fn frame_bytes_mut(frame: &mut CpuFrame, len: usize) -> Result<&mut [u8], ProcessError> {
    frame
        .bytes_mut()
        .get_mut(..len)
        .ok_or_else(|| too_small(len))
}

/// The error for a buffer smaller than a frame of `len` bytes.
fn too_small(len: usize) -> ProcessError {
    ProcessError::Protocol {
        peer: Peer::Cuda,
        detail: format!("the reconciled buffer is smaller than a frame ({len} bytes)"),
    }
}

/// The camera side: the slots, the link, the modules (dropped in this
/// order: the objects before the modules they came from).
struct Camera {
    slots: Vec<Slot>,
    cx: CpuWaitContext,
    link: Link,
    _syncs: SyncModule,
    source: FenceSource,
    stride: usize,
    len: usize,
    limit: Duration,
    mirror: Slots,
    frames: u64,
    fault: Fault,
    verified: u64,
    failed: u64,
    write_time: Duration,
    _bufs: BufModule,
}

/// The variable in which the CUDA process passes its pid to the camera
/// process it starts (`--processes 2`); a camera started by hand has none.
pub(super) const PARENT_VAR: &str = "TEGRA_INTEROP_CAMERA_PARENT";

/// Watches, while it lives, that the CUDA process that started this
/// camera process is still its parent.
pub(super) struct ParentWatch {
    stop: Arc<AtomicBool>,
}

impl Drop for ParentWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Starts watching the CUDA process that started this camera process
/// ([`PARENT_VAR`]; `None` for a camera started otherwise), until it is
/// connected: an early death of the CUDA process leaves no peer to reset
/// the connection, and the driver's wait for it cannot be broken, so the
/// watch ends this process (error line, exit status 1) within 20 ms of
/// the death instead of letting it wait out `--peer-timeout`. A parent
/// already gone is [`ProcessError::ParentGone`]. Once connected, the
/// CUDA process's death resets the connection and the watch is dropped.
pub(super) fn watch_parent() -> Result<Option<ParentWatch>, ProcessError> {
    let Some(value) = std::env::var_os(PARENT_VAR) else {
        return Ok(None);
    };
    let pid: u32 = value
        .to_str()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| ProcessError::Options(format!("{PARENT_VAR} is not a pid: {value:?}")))?;
    let gone = move || std::os::unix::process::parent_id() != pid;
    if gone() {
        return Err(ProcessError::ParentGone { pid });
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    let spawned = std::thread::Builder::new()
        .name("parent-watch".into())
        .spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                if gone() && !stopped.load(Ordering::Relaxed) {
                    let e = ProcessError::ParentGone { pid };
                    crate::app::output::stderr_line(&format!("error (camera process): {e}"));
                    std::process::exit(1);
                }
            }
        });
    spawned.map_err(|source| ProcessError::Io {
        what: "starting the thread that watches the CUDA process",
        source,
    })?;
    Ok(Some(ParentWatch { stop }))
}

/// Runs the camera side to the end of the CUDA process's frames; `watch`
/// (see [`watch_parent`]) ends once connected.
pub(super) fn run(
    settings: &Settings,
    s: &Setup,
    watch: Option<ParentWatch>,
) -> Result<(), ProcessError> {
    let link = Link::open(s, &s.camera_ep, Peer::Cuda, settings.limit)?;
    drop(watch);
    let hello = settings.hello();
    let (link, fault) = link.answer(&hello)?;
    let settings = Settings {
        fault,
        ..settings.clone()
    };
    let mut cam = Camera::set_up(link, s, &hello, &settings)?;
    let start = Instant::now();
    loop {
        let next = cam.mirror.next_frame();
        let what = || format!("its ticket for frame {next}");
        match cam.link.recv(&what)? {
            Msg::Ticket(t) => cam.write(&t)?,
            Msg::Freed { frame } => cam.take_free_fence(frame)?,
            Msg::End => break,
            other => return Err(cam.link.protocol(format!("{other:?} instead of a ticket"))),
        }
    }
    cam.finish(start)
}

fn buffer_attrs(len: usize) -> Result<BufAttrs, ProcessError> {
    let mut mine = BufAttrs::new();
    mine.types(&[BufType::RawBuffer])
        .and_then(|a| a.raw_size(len as u64))
        .and_then(|a| a.need_cpu_access(true))
        .and_then(|a| a.required_perm(BufPerm::ReadWrite))
        .ctx("buffer attributes")?;
    Ok(mine)
}

fn sync_attrs(perm: SyncPerm, deterministic: bool) -> Result<SyncAttrs, ProcessError> {
    let mut a = SyncAttrs::new();
    a.need_cpu_access(true)
        .and_then(|a| a.required_perm(perm))
        .ctx("sync attributes")?;
    if deterministic {
        a.require_deterministic_fences(true)
            .ctx("sync attributes")?;
    }
    Ok(a)
}

impl Camera {
    fn set_up(
        mut link: Link,
        s: &Setup,
        hello: &Hello,
        settings: &Settings,
    ) -> Result<Camera, ProcessError> {
        let limit = settings.limit;
        let stride = (hello.width * hello.bytes_per_pixel) as usize;
        let len = stride * hello.height as usize;
        let bufs = BufModule::open(&s.backend).ctx("NvSciBufModuleOpen")?;
        let syncs = SyncModule::open(&s.backend).ctx("NvSciSyncModuleOpen")?;
        let source = syncs.fence_source();
        let mine = buffer_attrs(len)?;
        let signal = sync_attrs(SyncPerm::SignalOnly, source == FenceSource::Built)?;
        let wait = sync_attrs(SyncPerm::WaitOnly, false)?;
        let mut slots = Vec::with_capacity(hello.ring as usize);
        for _ in 0..hello.ring {
            slots.push(Self::slot(
                &mut link, &bufs, &syncs, &mine, &signal, &wait, limit,
            )?);
        }
        let mirror = Slots::new(hello.ring as usize).map_err(ring_error)?;
        let cx = CpuWaitContext::new(&syncs).ctx("CPU wait context")?;
        Ok(Camera {
            cx,
            link,
            _syncs: syncs,
            source,
            slots,
            stride,
            len,
            limit,
            mirror,
            frames: hello.frames,
            fault: settings.fault,
            verified: 0,
            failed: 0,
            write_time: Duration::ZERO,
            _bufs: bufs,
        })
    }

    /// One slot's objects: the buffer and *ready* are reconciled and
    /// allocated here from the CUDA process's lists (we signal); *free*
    /// comes from the CUDA process, reconciled there from our waiter list.
    fn slot(
        link: &mut Link,
        bufs: &BufModule,
        syncs: &SyncModule,
        mine: &BufAttrs,
        signal: &SyncAttrs,
        wait: &SyncAttrs,
        limit: Duration,
    ) -> Result<Slot, ProcessError> {
        let theirs = bufs
            .receive_unreconciled(link.endpoint())
            .map_err(link.ipc_err("its buffer list"))?;
        let ours = bufs.attr_list(mine).ctx("buffer list")?;
        let buf = bufs
            .reconcile_and_alloc(&[&ours, &theirs])
            .ctx("buffer reconciliation")?;
        buf.send(Some(BufPerm::ReadWrite), link.endpoint())
            .map_err(link.ipc_err("to take the buffer"))?;
        let waiter = syncs
            .receive_unreconciled(link.endpoint())
            .map_err(link.ipc_err("its ready list"))?;
        let ours = syncs.attr_list(signal).ctx("ready list")?;
        let ready = syncs
            .reconcile_and_alloc(&[&ours, &waiter])
            .ctx("ready reconciliation")?;
        ready
            .send(Some(SyncPerm::WaitOnly), link.endpoint())
            .map_err(link.ipc_err("to take the ready object"))?;
        let own = syncs.attr_list(wait).ctx("free list")?;
        syncs
            .send_unreconciled(&[&own], link.endpoint())
            .map_err(link.ipc_err("to take our free list"))?;
        let free = syncs
            .receive_obj(
                link.endpoint(),
                &[&own],
                SyncPerm::WaitOnly,
                Timeout::After(limit),
            )
            .map_err(link.ipc_err("the free object"))?;
        let frame = CpuFrame::whole(buf).ctx("NvSciBufObjGetCpuPtr")?;
        Ok(Slot {
            frame,
            ready,
            free,
            ready_counter: None,
            free_counter: None,
            free_fence: None,
            held: None,
        })
    }

    /// The slot of a frame the peer names.
    fn slot_of(&self, frame: u64) -> usize {
        (frame % self.slots.len() as u64) as usize
    }

    /// "freed k": the fence of frame k's *free* signal follows.
    fn take_free_fence(&mut self, frame: u64) -> Result<(), ProcessError> {
        let i = self.slot_of(frame);
        if self.slots[i].held.map(|h| h.0) != Some(frame) {
            return Err(self.link.protocol(format!(
                "a free fence for frame {frame}, which slot {i} does not hold"
            )));
        }
        let fence = self.slots[i]
            .free
            .receive_fence(self.link.endpoint())
            .map_err(self.link.ipc_err("the free fence"))?;
        self.slots[i].free_fence = Some((frame, fence));
        Ok(())
    }

    /// Carries out one ticket: collect the slot's previous frame, then
    /// write this one and signal it ready.
    fn write(&mut self, msg: &TicketMsg) -> Result<(), ProcessError> {
        if msg.frame >= self.frames {
            return Err(self.link.protocol(format!(
                "a ticket for frame {}, past the run's {} frames",
                msg.frame, self.frames
            )));
        }
        let i = self.slot_of(msg.frame);
        if let Some((prev, value)) = self.slots[i].held {
            self.take_back(i, prev, value)?;
        }
        let t = self.mirror.acquire().map_err(ring_error)?;
        if TicketMsg::of(&t) != *msg {
            return Err(self.link.protocol(format!(
                "ticket {msg:?}; the ring's next is {:?}",
                TicketMsg::of(&t)
            )));
        }
        let started = Instant::now();
        // The consumer is done with the slot's bytes: its previous frame
        // was collected above (its free fence waited for), or the slot was
        // never used.
        let bytes = frame_bytes_mut(&mut self.slots[i].frame, self.len)?;
        TestPattern::new(t.frame(), self.stride).fill(bytes);
        if self.fault == Fault::Corrupt {
            if let Some(b) = bytes.last_mut() {
                *b ^= 0x5a;
            }
        }
        let write_ns = started.elapsed().as_nanos() as u64;
        self.write_time += started.elapsed();
        self.signal_ready(i, &t, write_ns)?;
        self.mirror
            .release(&t, started, write_ns)
            .and_then(|()| self.mirror.submit(&t))
            .map_err(ring_error)?;
        self.slots[i].held = Some((t.frame(), t.free_signal()));
        Ok(())
    }

    fn signal_ready(&mut self, i: usize, t: &Ticket, write_ns: u64) -> Result<(), ProcessError> {
        let sl = &mut self.slots[i];
        sl.frame
            .buf()
            .flush_cpu_cache_range(0, self.len as u64)
            .ctx("NvSciBufObjFlushCpuCacheRange")?;
        let fence = sl.ready.generate_fence().ctx("ready fence")?;
        let built = self.source == FenceSource::Built;
        if built && sl.ready_counter.is_none() {
            let c = sl.ready.counter_from_fence(t.ready(), &fence);
            sl.ready_counter = Some(c.ctx("ready counter")?);
        }
        sl.ready.cpu_signal().ctx("NvSciSyncObjSignal")?;
        self.link.send(&Msg::Written {
            frame: t.frame(),
            write_ns,
        })?;
        if !built || t.ready() == 1 {
            fence
                .send(self.link.endpoint())
                .map_err(self.link.ipc_err("to take the ready fence"))?;
        }
        Ok(())
    }

    /// The fence of the `value`-th *free* signal of slot `i` (frame `frame`).
    fn free_fence(&mut self, i: usize, frame: u64, value: u64) -> Result<Fence, ProcessError> {
        let sl = &mut self.slots[i];
        let crossed = sl.free_fence.take();
        match (self.source, sl.free_counter.as_ref(), crossed) {
            (_, _, Some((f, fence))) if f == frame => {
                if self.source == FenceSource::Built && sl.free_counter.is_none() {
                    let c = sl.free.counter_from_fence(value, &fence);
                    sl.free_counter = Some(c.ctx("free counter")?);
                }
                Ok(fence)
            }
            (FenceSource::Built, Some(c), None) => sl
                .free
                .fence_for_value(c.value_of_signal(value))
                .ctx("NvSciSyncFenceUpdateFence"),
            _ => Err(self
                .link
                .protocol(format!("no free fence came for frame {frame}"))),
        }
    }

    /// Waits (in slices, watching the connection, at most the limit) for
    /// frame `frame`'s *free* signal, then checks its processed bytes.
    fn take_back(&mut self, i: usize, frame: u64, value: u64) -> Result<(), ProcessError> {
        let fence = self.free_fence(i, frame, value)?;
        let what = || format!("its free signal of frame {frame}");
        let deadline = Instant::now() + self.limit;
        while !fence
            .wait(&mut self.cx, Timeout::After(Duration::from_millis(50)))
            .ctx("waiting for the free fence")?
        {
            self.link.check(&what)?;
            if Instant::now() >= deadline {
                return Err(ProcessError::Timeout {
                    peer: Peer::Cuda,
                    waiting_for: what(),
                    limit: self.limit,
                });
            }
        }
        let sl = &mut self.slots[i];
        sl.frame
            .buf()
            .flush_cpu_cache_range(0, self.len as u64)
            .ctx("NvSciBufObjFlushCpuCacheRange")?;
        // As in `write`: the consumer signalled free after its last access,
        // and the fence was waited for.
        let bytes = sl
            .frame
            .bytes()
            .get(..self.len)
            .ok_or_else(|| too_small(self.len))?;
        let ok = TestPattern::new(frame, self.stride)
            .first_mismatch(bytes, 0xff)
            .is_none();
        sl.held = None;
        self.verified += 1;
        self.failed += u64::from(!ok);
        let done = Completion {
            slot: i,
            frame,
            mismatches: u64::from(!ok),
            process: Duration::ZERO,
            busy: Duration::ZERO,
            finished: Instant::now(),
        };
        self.mirror.complete(&done).map_err(ring_error)?;
        Ok(())
    }

    /// "end": collect every slot's last frame (in frame order), send the
    /// figures, close.
    fn finish(mut self, start: Instant) -> Result<(), ProcessError> {
        let mut held: Vec<(usize, u64, u64)> = (0..self.slots.len())
            .filter_map(|i| self.slots[i].held.map(|(f, v)| (i, f, v)))
            .collect();
        held.sort_by_key(|h| h.1);
        for (i, frame, value) in held {
            self.take_back(i, frame, value)?;
        }
        let frames = self.mirror.next_frame().max(1);
        let figures = Figures {
            pid: u64::from(std::process::id()),
            verified: self.verified,
            failed: self.failed,
            write_us_per_frame: (self.write_time.as_micros() / u128::from(frames)) as u64,
            elapsed_us: start.elapsed().as_micros() as u64,
        };
        self.link.send(&Msg::Figures(figures))?;
        self.link.close()
    }
}
