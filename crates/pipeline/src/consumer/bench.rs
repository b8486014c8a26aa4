//! Plain-CUDA work over frames the host fills and checks, safe by its
//! shape: the plain-CUDA baseline and the machine's limit
//! (`crate::app::baseline`) queue the pipeline's copies and its
//! check-and-invert kernel through a [`Bench`], which owns the memory, the
//! streams and the events, and keeps the promise the driver's queued calls
//! ask for (the memory outlives the work, the host keeps off it meanwhile).
//!
//! It tracks, per buffer (and per mismatch-counter word), the stream and
//! the position on it of the last work queued over it; that work is known
//! complete once the stream was synchronised, or an event recorded on it
//! at or after that position was. The host's views of a buffer, and work
//! on another stream over it, are refused until then (a typed
//! [`TransportError::Misuse`]); work on the same stream is ordered by the
//! stream and allowed. The drop synchronises every stream before the
//! memory goes, and leaks the memory when it cannot.

use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tegra_interop::driver::{
    Context, DeviceBuffer, DeviceMemory, DevicePtr, Event, EventFlags, PinnedHostBuffer, Stream,
};

use super::{grid_for, pattern_seed, FrameMemory, Kernels, BLOCK, FRAME_ALIGN};
use crate::error::{DriverResultExt, TransportError};
use crate::frame::FrameGeometry;

/// What a [`Bench`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BenchConfig {
    /// Layout of every frame.
    pub geometry: FrameGeometry,
    /// Frames: each a pinned, device-mapped host buffer with a word of
    /// its own in the mismatch counters.
    pub frames: usize,
    /// Whether each frame has a device buffer too (copy mode).
    pub device: bool,
    /// CUDA streams.
    pub streams: usize,
    /// CUDA events.
    pub events: usize,
    /// Whether the events keep times ([`Bench::elapsed`]); without, they
    /// only order and complete.
    pub timing: bool,
}

/// Which of a frame's buffers the kernel works on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The pinned host buffer, through its device mapping (zero-copy).
    Host,
    /// The device buffer (copy mode).
    Device,
}

/// Where the last queued work over something is: (stream, position).
type LastUse = Option<(usize, u64)>;

struct Memory {
    host: Vec<PinnedHostBuffer>,
    device: Vec<DeviceBuffer>,
    counters: PinnedHostBuffer,
    events: Vec<Event>,
}

/// Frames, streams and events, and the pipeline's kernels, for plain-CUDA
/// work (see the module docs).
pub struct Bench {
    config: BenchConfig,
    mem: ManuallyDrop<Memory>,
    streams: Vec<Stream>,
    kernels: Kernels,
    /// Per stream: work items queued so far, and known complete.
    queued: Vec<u64>,
    done: Vec<u64>,
    host_use: Vec<LastUse>,
    device_use: Vec<LastUse>,
    counter_use: Vec<LastUse>,
    /// Per event: the stream position its last record covers.
    covers: Vec<LastUse>,
}

impl Bench {
    /// Allocates what `config` asks for in `ctx` and compiles the kernels.
    pub fn new(ctx: &Context, config: BenchConfig) -> Result<Bench, TransportError> {
        let len = config.geometry.frame_len();
        if len == 0 || config.frames == 0 || config.streams == 0 {
            return Err(TransportError::refused(
                "a bench needs frames of at least one byte, one frame and one stream",
            ));
        }
        let flags = match config.timing {
            true => EventFlags::DEFAULT,
            false => EventFlags::NO_TIMING,
        };
        let host = (0..config.frames)
            .map(|_| PinnedHostBuffer::new(ctx, len).during("allocating pinned mapped host memory"))
            .collect::<Result<Vec<_>, _>>()?;
        let device = match config.device {
            true => (0..config.frames)
                .map(|_| DeviceBuffer::new(ctx, len).during("allocating a device frame"))
                .collect::<Result<Vec<_>, _>>()?,
            false => Vec::new(),
        };
        let mem = Memory {
            host,
            device,
            counters: PinnedHostBuffer::new(ctx, 8 * config.frames)
                .during("allocating the mismatch counters")?,
            events: (0..config.events)
                .map(|_| Event::new(ctx, flags).during("creating a CUDA event"))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let streams = (0..config.streams)
            .map(|_| Stream::new(ctx).during("creating a CUDA stream"))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Bench {
            mem: ManuallyDrop::new(mem),
            streams,
            kernels: Kernels::compile(ctx)?,
            queued: vec![0; config.streams],
            done: vec![0; config.streams],
            host_use: vec![None; config.frames],
            device_use: vec![None; config.frames],
            counter_use: vec![None; config.frames],
            covers: vec![None; config.events],
            config,
        })
    }

    /// What it holds.
    pub fn config(&self) -> BenchConfig {
        self.config
    }

    fn frame_len(&self) -> usize {
        self.config.geometry.frame_len()
    }

    fn complete(&self, u: LastUse) -> bool {
        u.is_none_or(|(s, at)| at <= self.done[s])
    }

    fn check_frame(&self, frame: usize) -> Result<(), TransportError> {
        match frame < self.config.frames {
            true => Ok(()),
            false => Err(TransportError::refused(format!(
                "frame {frame} of a bench of {}",
                self.config.frames
            ))),
        }
    }

    fn check_stream(&self, stream: usize) -> Result<(), TransportError> {
        match stream < self.streams.len() {
            true => Ok(()),
            false => Err(TransportError::refused(format!(
                "stream {stream} of a bench of {}",
                self.streams.len()
            ))),
        }
    }

    fn check_event(&self, event: usize) -> Result<(), TransportError> {
        match event < self.mem.events.len() {
            true => Ok(()),
            false => Err(TransportError::refused(format!(
                "event {event} of a bench of {}",
                self.mem.events.len()
            ))),
        }
    }

    /// Refuses host access to what `u` says is in use.
    fn idle(&self, u: LastUse, what: &str, frame: usize) -> Result<(), TransportError> {
        match self.complete(u) {
            true => Ok(()),
            false => Err(TransportError::misuse(format!(
                "frame {frame}'s {what} has queued work not known complete: synchronise its stream or an event recorded after it first"
            ))),
        }
    }

    /// Refuses work on `stream` over what is in use on another stream.
    fn usable_on(
        &self,
        u: LastUse,
        stream: usize,
        what: &str,
        frame: usize,
    ) -> Result<(), TransportError> {
        match u {
            Some((s, _)) if s != stream && !self.complete(u) => Err(TransportError::misuse(
                format!("frame {frame}'s {what} is in use on stream {s}, not {stream}"),
            )),
            _ => Ok(()),
        }
    }

    /// The next position on `stream`, for work being queued.
    fn next(&mut self, stream: usize) -> (usize, u64) {
        self.queued[stream] += 1;
        (stream, self.queued[stream])
    }

    /// Frame `frame`'s host buffer, to write (refused while work over it
    /// is not known complete).
    pub fn host_mut(&mut self, frame: usize) -> Result<&mut [u8], TransportError> {
        self.check_frame(frame)?;
        self.idle(self.host_use[frame], "host buffer", frame)?;
        Ok(self.mem.host[frame].as_mut_slice())
    }

    /// Frame `frame`'s host buffer, to read (as [`Bench::host_mut`]).
    pub fn host(&mut self, frame: usize) -> Result<&[u8], TransportError> {
        self.host_mut(frame).map(|b| &*b)
    }

    /// Takes frame `frame`'s mismatch count (setting it to 0), refused
    /// while a kernel counting into it is not known complete.
    pub fn take_mismatches(&mut self, frame: usize) -> Result<u64, TransportError> {
        self.check_frame(frame)?;
        self.idle(self.counter_use[frame], "mismatch counter", frame)?;
        Ok(self
            .mem
            .counters
            .atomic_u64(frame)
            .during("the mismatch counter")?
            .swap(0, Ordering::AcqRel))
    }

    fn device_of(&self, frame: usize) -> Result<&DeviceBuffer, TransportError> {
        self.mem
            .device
            .get(frame)
            .ok_or_else(|| TransportError::misuse("this bench has no device buffers"))
    }

    /// Queues on `stream` a copy of frame `frame` from its host buffer to
    /// its device buffer (`cuMemcpyHtoDAsync`).
    pub fn copy_in(&mut self, frame: usize, stream: usize) -> Result<(), TransportError> {
        self.copy(frame, stream, true)
    }

    /// Queues on `stream` a copy of frame `frame` from its device buffer to
    /// its host buffer (`cuMemcpyDtoHAsync`).
    pub fn copy_out(&mut self, frame: usize, stream: usize) -> Result<(), TransportError> {
        self.copy(frame, stream, false)
    }

    fn copy(&mut self, frame: usize, stream: usize, inward: bool) -> Result<(), TransportError> {
        self.check_frame(frame)?;
        self.check_stream(stream)?;
        self.device_of(frame)?;
        self.usable_on(self.host_use[frame], stream, "host buffer", frame)?;
        self.usable_on(self.device_use[frame], stream, "device buffer", frame)?;
        let len = self.frame_len();
        let (d, h, s) = (
            &self.mem.device[frame],
            &self.mem.host[frame],
            &self.streams[stream],
        );
        // Both buffers are owned by the bench, which keeps them until its
        // streams are synchronised (its drop, or leaks them); the host does
        // not touch them, nor does work on another stream, until this copy
        // is known complete (the uses recorded below, checked by every host
        // view and every queueing).
        let r = if inward {
            // SAFETY: as said above.
            unsafe { d.copy_from_pinned_async(0, h, 0, len, s) }.during("cuMemcpyHtoDAsync")
        } else {
            // SAFETY: as said above.
            unsafe { d.copy_to_pinned_async(0, h, 0, len, s) }.during("cuMemcpyDtoHAsync")
        };
        // Recorded on failure too: a call that failed part-way may have
        // queued something.
        let at = self.next(stream);
        self.host_use[frame] = Some(at);
        self.device_use[frame] = Some(at);
        r
    }

    /// Queues on `stream` the pipeline's check-and-invert kernel over frame
    /// `frame`'s `target` buffer, checking the pattern of frame number
    /// `index` and counting mismatches into the frame's counter word.
    pub fn check_and_invert(
        &mut self,
        frame: usize,
        target: Target,
        stream: usize,
        index: u64,
    ) -> Result<(), TransportError> {
        self.check_frame(frame)?;
        self.check_stream(stream)?;
        let uses = match target {
            Target::Host => self.host_use[frame],
            Target::Device => {
                self.device_of(frame)?;
                self.device_use[frame]
            }
        };
        self.usable_on(uses, stream, "frame buffer", frame)?;
        self.usable_on(self.counter_use[frame], stream, "mismatch counter", frame)?;
        let g = self.config.geometry;
        let len = g.frame_len() as u64;
        let memory: &dyn DeviceMemory = match target {
            Target::Host => &self.mem.host[frame],
            Target::Device => &self.mem.device[frame],
        };
        let at = memory
            .device_range(0, len)
            .during("the frame for the kernel")?;
        if !at.is_multiple_of(FRAME_ALIGN) {
            return Err(TransportError::refused(format!(
                "the frame at {at:#x} is not {FRAME_ALIGN}-byte aligned, which the kernel's vector accesses need"
            )));
        }
        let counter = DevicePtr::at(&self.mem.counters, 8 * frame as u64, 8)
            .during("the mismatch counter")?;
        let f = self.kernels.check_and_invert(match target {
            Target::Host => FrameMemory::System,
            Target::Device => FrameMemory::Device,
        });
        let launch = f
            .launch(grid_for(len as usize), BLOCK)
            // SAFETY: `at` lies in `memory` (checked by `device_range`).
            .arg(unsafe { DevicePtr::from_raw(at) })
            .arg(len)
            .arg(g.stride as u64)
            .arg(pattern_seed(index))
            .arg(counter);
        // SAFETY: the arguments match the kernel's parameter list
        // `(unsigned char*, u64, u64, u32, u64*)`; the frame and the counter
        // are owned by the bench, kept until its streams are synchronised,
        // and untouched by the host and by other streams until the kernel
        // is known complete (the uses recorded below).
        let r =
            unsafe { launch.launch(&self.streams[stream]) }.during("launching the consumer kernel");
        let pos = self.next(stream);
        match target {
            Target::Host => self.host_use[frame] = Some(pos),
            Target::Device => self.device_use[frame] = Some(pos),
        }
        self.counter_use[frame] = Some(pos);
        r
    }

    /// Records `event` on `stream`.
    pub fn record(&mut self, event: usize, stream: usize) -> Result<(), TransportError> {
        self.check_event(event)?;
        self.check_stream(stream)?;
        self.mem.events[event]
            .record(&self.streams[stream])
            .during("recording a CUDA event")?;
        self.covers[event] = Some((stream, self.queued[stream]));
        Ok(())
    }

    /// Makes `stream`'s later work wait for `event` (`cuStreamWaitEvent`).
    pub fn wait_event(&mut self, stream: usize, event: usize) -> Result<(), TransportError> {
        self.check_event(event)?;
        self.check_stream(stream)?;
        self.streams[stream]
            .wait_event(&self.mem.events[event])
            .during("cuStreamWaitEvent")
    }

    /// Waits (at most `limit`) for `event`'s last record: the work queued
    /// before it on its stream is complete.
    pub fn synchronize_event(
        &mut self,
        event: usize,
        limit: Duration,
    ) -> Result<(), TransportError> {
        self.check_event(event)?;
        self.mem.events[event]
            .synchronize(limit)
            .during("waiting for a frame")?;
        if let Some((s, at)) = self.covers[event] {
            self.done[s] = self.done[s].max(at);
        }
        Ok(())
    }

    /// Waits for everything queued on `stream`.
    pub fn synchronize(&mut self, stream: usize) -> Result<(), TransportError> {
        self.check_stream(stream)?;
        self.streams[stream]
            .synchronize()
            .during("waiting for a CUDA stream")?;
        self.done[stream] = self.queued[stream];
        Ok(())
    }

    /// The time from event `a` to event `b` (both recorded and complete;
    /// timing events only).
    pub fn elapsed(&self, a: usize, b: usize) -> Result<Duration, TransportError> {
        self.check_event(a)?;
        self.check_event(b)?;
        self.mem.events[b]
            .elapsed_since(&self.mem.events[a])
            .during("reading CUDA event times")
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        // Queued work may still use the memory: if a stream cannot be
        // drained, leak the memory rather than free it under the device.
        if self.streams.iter().all(|s| s.synchronize().is_ok()) {
            // SAFETY: dropped once, here, and never used again (this is the
            // bench's drop).
            unsafe { ManuallyDrop::drop(&mut self.mem) };
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::camera::TestPattern;

    fn bench(sim: &tegra_interop_sim::Sim) -> Bench {
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let config = BenchConfig {
            geometry: FrameGeometry {
                stride: 64,
                rows: 4,
            },
            frames: 2,
            device: true,
            streams: 2,
            events: 2,
            timing: false,
        };
        Bench::new(&ctx, config).unwrap()
    }

    #[test]
    #[cfg_attr(miri, ignore = "runs the simulator's stream threads and NVRTC model")]
    fn the_host_keeps_off_a_frame_until_its_work_is_known_complete() {
        let sim = tegra_interop_sim::Sim::new().unwrap();
        crate::consumer::twin::register(&sim);
        let mut b = bench(&sim);
        TestPattern::new(5, 64).fill(b.host_mut(0).unwrap());
        b.copy_in(0, 0).unwrap();
        b.check_and_invert(0, Target::Device, 0, 5).unwrap();
        b.copy_out(0, 0).unwrap();
        let e = b.host_mut(0).unwrap_err();
        assert!(matches!(e, TransportError::Misuse { .. }), "{e:?}");
        assert!(b.host(0).is_err() && b.take_mismatches(0).is_err());
        // Other frames are free; other streams may not touch frame 0.
        b.host_mut(1).unwrap();
        let e = b.copy_in(0, 1).unwrap_err().to_string();
        assert!(e.contains("in use on stream 0"), "{e}");
        // An event recorded after the work completes it.
        b.record(0, 0).unwrap();
        b.synchronize_event(0, Duration::from_secs(10)).unwrap();
        assert_eq!(b.take_mismatches(0).unwrap(), 0);
        let processed = TestPattern::new(5, 64);
        assert_eq!(processed.first_mismatch(b.host(0).unwrap(), 0xff), None);
        // An event recorded before later work does not complete that work.
        b.record(1, 0).unwrap();
        b.copy_in(0, 0).unwrap();
        b.synchronize_event(1, Duration::from_secs(10)).unwrap();
        assert!(b.host_mut(0).is_err(), "the copy came after the event");
        b.synchronize(0).unwrap();
        b.host_mut(0).unwrap();
        // Work left queued at the drop is drained first.
        b.copy_in(1, 1).unwrap();
        drop(b);
    }

    #[test]
    #[cfg_attr(miri, ignore = "runs the simulator's NVRTC model")]
    fn out_of_range_frames_streams_events_and_missing_device_buffers_are_refused() {
        let sim = tegra_interop_sim::Sim::new().unwrap();
        crate::consumer::twin::register(&sim);
        let mut b = bench(&sim);
        assert!(b.host_mut(2).is_err());
        assert!(b.copy_in(0, 2).is_err());
        assert!(b.record(2, 0).is_err());
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let mut config = b.config();
        config.device = false;
        let mut host_only = Bench::new(&ctx, config).unwrap();
        let e = host_only.copy_in(0, 0).unwrap_err().to_string();
        assert!(e.contains("no device buffers"), "{e}");
        assert!(host_only.check_and_invert(0, Target::Device, 0, 0).is_err());
        config.frames = 0;
        assert!(Bench::new(&ctx, config).is_err());
    }
}
