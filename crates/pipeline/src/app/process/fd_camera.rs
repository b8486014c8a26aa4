//! The camera process of the fd two-process mode: allocates the slots'
//! memory and timeline semaphores with an [`Exporter`], sends them as fds,
//! then carries out the CUDA process's tickets (wait *free*, check the
//! slot's previous frame, write, publish), checking each ticket against a
//! ring of its own that follows the same protocol.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use super::error::{Peer, ProcessError};
use super::fd::{fault_code, fd_err};
use super::Settings;
use crate::app::cli::BackendChoice;
use crate::camera::TestPattern;
use crate::slots::Slots;
use crate::transport::export::{ExportedFrame, ExportedTimeline, Exporter};
use crate::transport::fdpass::{Channel, FdHello, FdMsg, SemRole};
use crate::transport::host::Fault;
use crate::transport::{Completion, TransportError};

/// How long one slice of a wait for *free* is (the socket is looked at
/// between slices, so a peer that ended is seen at once).
const SLICE: Duration = Duration::from_millis(20);

fn exporter_err(e: TransportError) -> ProcessError {
    ProcessError::Export(e.to_string())
}

fn ring_error(e: crate::slots::RingError) -> ProcessError {
    ProcessError::Ring(e.to_string())
}

/// Runs the camera side over `ch` with the exporter `settings.backend`
/// names.
pub(super) fn run(settings: &Settings, ch: Channel) -> Result<(), ProcessError> {
    match settings.backend {
        BackendChoice::SimFd => {
            Camera::new(crate::transport::export::SimExporter, ch, settings)?.run(settings)
        }
        #[cfg(feature = "vulkan")]
        BackendChoice::Gpu => {
            let backend =
                tegra_interop::driver::Backend::real().map_err(|source| ProcessError::Driver {
                    what: "the CUDA driver (for the device's UUID)",
                    source,
                })?;
            let uuid = backend.device(0).and_then(|d| d.uuid()).map_err(|source| {
                ProcessError::Driver {
                    what: "the CUDA device's UUID",
                    source,
                }
            })?;
            let ex = crate::transport::export::VulkanFdExporter::open(uuid, None)
                .map_err(exporter_err)?;
            Camera::new(ex, ch, settings)?.run(settings)
        }
        other => Err(ProcessError::Options(format!(
            "the fd camera runs with --backend sim-fd or gpu (with --features vulkan), not {}",
            other.name()
        ))),
    }
}

/// One slot as the camera holds it.
struct Slot<E: Exporter> {
    frame: E::Frame,
    ready: E::Timeline,
    free: E::Timeline,
    /// The frame the slot holds and the *free* value that releases it.
    held: Option<(u64, u64)>,
}

struct Camera<E: Exporter> {
    // The slots before the exporter (its objects before their device).
    slots: Vec<Slot<E>>,
    ex: E,
    ch: Channel,
    mirror: Slots,
    frames: u64,
    stride: usize,
    len: usize,
    limit: Duration,
    fault: Fault,
    staging: Vec<u8>,
    verified: u64,
    failed: u64,
    write_time: Duration,
}

impl<E: Exporter> Camera<E> {
    fn new(ex: E, ch: Channel, settings: &Settings) -> Result<Camera<E>, ProcessError> {
        let len = settings.geometry.frame_len();
        Ok(Camera {
            slots: Vec::with_capacity(settings.ring),
            ex,
            ch,
            mirror: Slots::new(settings.ring).map_err(ring_error)?,
            frames: settings.frames,
            stride: settings.geometry.stride,
            len,
            limit: settings.limit,
            fault: settings.fault,
            staging: vec![0; len],
            verified: 0,
            failed: 0,
            write_time: Duration::ZERO,
        })
    }

    fn protocol(&self, detail: String) -> ProcessError {
        ProcessError::Protocol {
            peer: Peer::Cuda,
            detail,
        }
    }

    fn run(mut self, settings: &Settings) -> Result<(), ProcessError> {
        let start = Instant::now();
        self.hello(settings)?;
        for i in 0..settings.ring {
            self.slot(i)?;
        }
        self.ch
            .send_msg(&FdMsg::SetUp, &[])
            .map_err(fd_err(Peer::Cuda))?;
        loop {
            let next = self.mirror.next_frame();
            let waiting = || format!("the ticket of frame {next} or the end");
            match self.ch.recv_msg(&waiting).map_err(fd_err(Peer::Cuda))?.0 {
                FdMsg::Ticket {
                    frame,
                    slot,
                    free_wait,
                    ready,
                    previous,
                } => self.write(frame, slot, free_wait, ready, previous)?,
                FdMsg::End => return self.finish(start),
                other => {
                    return Err(self.protocol(format!("{other:?} instead of a ticket or the end")))
                }
            }
        }
    }

    /// The CUDA process's settings must be this process's own.
    fn hello(&mut self, settings: &Settings) -> Result<(), ProcessError> {
        let want = hello_of(settings);
        let got = match self.ch.recv_msg(&|| "its hello".into()) {
            Ok((FdMsg::Hello(h), _)) => h,
            Ok((other, _)) => return Err(self.protocol(format!("{other:?} instead of its hello"))),
            Err(e) => return Err(fd_err(Peer::Cuda)(e)),
        };
        if got != want {
            return Err(ProcessError::Options(format!(
                "the CUDA process runs with other options than this camera process: {got:?} there, {want:?} here (start both sides with the same --frames, --ring, --width, --height, --format and --fault)"
            )));
        }
        Ok(())
    }

    /// Allocates slot `i` and sends its three fds.
    fn slot(&mut self, i: usize) -> Result<(), ProcessError> {
        let frame = self
            .ex
            .export_frame(self.len as u64)
            .map_err(exporter_err)?;
        let ready = self.ex.export_timeline(0).map_err(exporter_err)?;
        let free = self.ex.export_timeline(0).map_err(exporter_err)?;
        let slot = i as u64;
        let mem = frame.export_fd().map_err(exporter_err)?;
        let m = FdMsg::Memory {
            slot,
            size: frame.size(),
            dedicated: frame.dedicated(),
        };
        let send = |ch: &mut Channel, m: &FdMsg, fd: std::os::fd::OwnedFd| {
            ch.send_msg(m, &[fd.as_fd()]).map_err(fd_err(Peer::Cuda))
        };
        send(&mut self.ch, &m, mem)?;
        for (role, sem) in [(SemRole::Ready, &ready), (SemRole::Free, &free)] {
            let fd = sem.export_fd().map_err(exporter_err)?;
            send(&mut self.ch, &FdMsg::Semaphore { slot, role }, fd)?;
        }
        self.slots.push(Slot {
            frame,
            ready,
            free,
            held: None,
        });
        Ok(())
    }

    /// Carries out one ticket: collect the slot's previous frame, then
    /// write this one and publish it.
    fn write(
        &mut self,
        frame: u64,
        slot: u64,
        free_wait: u64,
        ready: u64,
        previous: Option<u64>,
    ) -> Result<(), ProcessError> {
        if frame >= self.frames {
            return Err(self.protocol(format!(
                "a ticket for frame {frame}, past the run's {} frames",
                self.frames
            )));
        }
        // The slot's previous frame first: the mirror hands the slot out
        // only once that frame is collected.
        let held = (frame % self.slots.len().max(1) as u64) as usize;
        if let Some((prev, value)) = self.slots.get(held).and_then(|s| s.held) {
            self.take_back(held, prev, value)?;
        }
        let t = self.mirror.acquire().map_err(ring_error)?;
        let ours = (
            t.frame(),
            t.slot() as u64,
            t.free_wait(),
            t.ready(),
            t.previous_frame(),
        );
        if ours != (frame, slot, free_wait, ready, previous) {
            return Err(self.protocol(format!(
                "ticket (frame, slot, free wait, ready, previous) {:?}; the ring's next is {ours:?}",
                (frame, slot, free_wait, ready, previous)
            )));
        }
        let i = t.slot();
        let started = Instant::now();
        TestPattern::new(frame, self.stride).fill(&mut self.staging);
        if self.fault == Fault::Corrupt {
            if let Some(b) = self.staging.last_mut() {
                *b ^= 0x5a;
            }
        }
        let sl = &mut self.slots[i];
        sl.frame.write(0, &self.staging).map_err(exporter_err)?;
        self.ex
            .publish(&mut sl.frame, &sl.ready, ready)
            .map_err(exporter_err)?;
        let write_ns = started.elapsed().as_nanos() as u64;
        self.write_time += started.elapsed();
        self.ch
            .send_msg(&FdMsg::Written { frame, write_ns }, &[])
            .map_err(fd_err(Peer::Cuda))?;
        self.mirror
            .release(&t, started, write_ns)
            .and_then(|()| self.mirror.submit(&t))
            .map_err(ring_error)?;
        self.slots[i].held = Some((frame, t.free_signal()));
        Ok(())
    }

    /// Waits (in slices, watching the socket, at most the limit) for frame
    /// `frame`'s *free* signal, takes the memory back and checks its
    /// processed bytes.
    fn take_back(&mut self, i: usize, frame: u64, value: u64) -> Result<(), ProcessError> {
        let what = || format!("the CUDA stream's free signal of frame {frame} (slot {i})");
        let deadline = Instant::now() + self.limit;
        while !self.slots[i]
            .free
            .wait(value, SLICE)
            .map_err(exporter_err)?
        {
            if self.ch.peer_closed().map_err(fd_err(Peer::Cuda))? {
                return Err(ProcessError::Fd {
                    peer: Peer::Cuda,
                    source: crate::transport::fdpass::FdError::Closed {
                        waiting_for: what(),
                    },
                });
            }
            if Instant::now() >= deadline {
                return Err(ProcessError::Timeout {
                    peer: Peer::Cuda,
                    waiting_for: what(),
                    limit: self.limit,
                });
            }
        }
        let sl = &mut self.slots[i];
        if !self
            .ex
            .reclaim(&mut sl.frame, self.limit)
            .map_err(exporter_err)?
        {
            return Err(ProcessError::Timeout {
                peer: Peer::Cuda,
                waiting_for: format!("slot {i} to come back to the host after frame {frame}"),
                limit: self.limit,
            });
        }
        sl.frame.read(0, &mut self.staging).map_err(exporter_err)?;
        let ok = TestPattern::new(frame, self.stride)
            .first_mismatch(&self.staging, 0xff)
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
    /// figures.
    fn finish(mut self, start: Instant) -> Result<(), ProcessError> {
        let mut held: Vec<(usize, u64, u64)> = (0..self.slots.len())
            .filter_map(|i| self.slots[i].held.map(|(f, v)| (i, f, v)))
            .collect();
        held.sort_by_key(|h| h.1);
        for (i, frame, value) in held {
            self.take_back(i, frame, value)?;
        }
        let frames = self.mirror.next_frame().max(1);
        let figures = FdMsg::Figures {
            pid: u64::from(std::process::id()),
            verified: self.verified,
            failed: self.failed,
            write_us_per_frame: (self.write_time.as_micros() / u128::from(frames)) as u64,
            elapsed_us: start.elapsed().as_micros() as u64,
        };
        self.ch.send_msg(&figures, &[]).map_err(fd_err(Peer::Cuda))
    }
}

/// The hello `settings` give (both sides build it the same way).
pub(super) fn hello_of(settings: &Settings) -> FdHello {
    FdHello {
        frames: settings.frames,
        ring: settings.ring as u64,
        width: u64::from(settings.width),
        height: u64::from(settings.height),
        bytes_per_pixel: settings.bytes_per_pixel as u64,
        fault: fault_code(settings.fault),
    }
}
