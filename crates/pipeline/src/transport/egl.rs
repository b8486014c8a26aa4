//! The EGLStream transport (`--backend egl`): the camera's frames reach the
//! CUDA consumer through an `EGLStreamKHR`, the JetPack camera path (on a
//! Jetson, Argus is the producer; here a CUDA producer stands in for it).
//!
//! Per frame `f` in slot `s`:
//! 1. the camera writes the slot's host buffer;
//! 2. `signal_ready`: the producer copies it into a device buffer of its
//!    pool (`cuMemcpyHtoD`: synchronous; an asynchronous copy on the
//!    producer's stream gained nothing, because the present waits for the
//!    stream's earlier work: measured on an H100, the present then took
//!    ~0.5 ms instead of ~15 us) and presents that buffer
//!    (`cuEGLStreamProducerPresentFrame`, FIFO mode: no frame is dropped);
//! 3. `queue_consumer`: the consumer acquires the frame
//!    (`cuEGLStreamConsumerAcquireFrame`), processes it in place on its
//!    stream, reads it back into the slot's host buffer, releases it
//!    (`cuEGLStreamConsumerReleaseFrame`, ordered after that work) and
//!    reports the frame finished from a host function queued last;
//! 4. the producer takes its buffers back with
//!    `cuEGLStreamProducerReturnFrame` before it presents into them again.
//!
//! What the stream does that the code relies on, as measured on the H200
//! (driver 580.159, `crates/testkit/tests/gpu_egl_stream.rs`): the
//! consumer gets its own copy of the frame (so this path copies on a
//! discrete GPU: it is not zero-copy here); of the released frames the most
//! recently acquired stays in the stream for reuse, so the producer's pool
//! has one buffer more than the ring has slots; the consumer connects
//! first. The consumer's copy has the producer's pitch (checked per frame:
//! a frame of another pitch is an error, not a silent re-layout).
//!
//! Processing, as for the NvSci transport: on the simulator a
//! stream-ordered host function over the consumer's copy (whose device
//! address is a host address there); on a real GPU the NVRTC kernel of
//! [`crate::consumer`], whose frame time comes from CUDA events.

use std::any::Any;
use std::fmt::Display;
use std::ptr::NonNull;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{sys as cu_sys, CudaEvent, CudaStream, PinnedHostSlice};
use tegra_interop::driver::egl::{EglStreamConsumer, EglStreamProducer, ProducerFrame};
use tegra_interop::driver::{Context, Stream};
use tegra_interop::sys::cuda::{CUdeviceptr, EGLStreamKHR};

use crate::consumer::{self, CheckArgs, Counters, DeviceFrame, FrameMemory, Kernel};
use crate::ring::{Peek, Ticket};
use crate::transport::nvsci::Processing;
use crate::transport::{
    process_frame, try_recv_completion, wait_completion, Completion, FrameGeometry, FrameTransport,
    PeekedFrame, TransportError,
};

/// How long an acquire, a buffer's return or a completion may take before
/// the run is declared stuck.
const STUCK: Duration = Duration::from_secs(10);

/// Environment variable that sets the producer's pool of device buffers
/// (ring + 1 ..= 64), for measuring how waiting for the driver to return
/// presented buffers limits the frame rate.
pub const POOL_ENV: &str = "TEGRA_INTEROP_EGL_POOL";

/// The producer's buffers: [`POOL_ENV`] where set to a number in
/// `slots + 1 ..= 64`, else `slots + 1`, the least that works (the stream
/// keeps the most recently released frame for reuse: measured).
pub fn pool_size(slots: usize) -> usize {
    std::env::var(POOL_ENV)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| (slots + 1..=64).contains(n))
        .unwrap_or(slots + 1)
}

fn err<E: Display>(what: &'static str) -> impl FnOnce(E) -> TransportError {
    move |e| TransportError::new(format!("{what}: {e}"))
}

/// The slots' host buffers: plain heap memory on the simulator, pinned
/// host memory on a real GPU (for the read-back's asynchronous copy).
/// (Held only to keep the memory alive.)
#[allow(dead_code)]
enum HostMemory {
    Heap(Vec<Box<[u8]>>),
    Pinned(Vec<PinnedHostSlice<u8>>),
}

/// The consumer's CUDA state on a real GPU.
struct KernelPath {
    kernel: Kernel,
    counters: Counters,
    /// Per slot: before the kernel, after it, after the read-back.
    events: Vec<[CudaEvent; 3]>,
    cstream: Arc<CudaStream>,
    grid: u32,
}

/// Per-frame figures of the EGLStream handover, for the report.
#[derive(Default)]
struct Figures {
    frames: u32,
    upload: Duration,
    present: Duration,
    acquire: Duration,
    returns_waited: Duration,
}

/// The EGLStream transport (see the module docs).
pub struct EglTransport {
    name: &'static str,
    note: &'static str,
    geometry: FrameGeometry,
    /// Each slot's host buffer (`frame_len` bytes).
    host: Vec<NonNull<u8>>,
    /// Device buffers the producer may present into now.
    free: Vec<CUdeviceptr>,
    /// Every device buffer of the pool (freed after the producer left).
    pool: Vec<CUdeviceptr>,
    /// Frames presented and not yet handed to the consumer, per slot.
    presented: Vec<bool>,
    /// Whether anything was presented (returns are asked for only then).
    presented_any: bool,
    kernel: Option<KernelPath>,
    done_tx: Sender<Completion>,
    done_rx: Receiver<Completion>,
    in_flight: usize,
    figures: Figures,
    // Torn down in this order by `shut_down` (see Drop).
    producer: Option<EglStreamProducer>,
    consumer: Option<EglStreamConsumer>,
    pstream: Stream,
    cstream: Stream,
    host_memory: HostMemory,
    ctx: Context,
    /// The EGL side that owns the `EGLStreamKHR` (a simulated stream, or
    /// a real display and its stream); dropped after both connections.
    egl: Option<Box<dyn Any>>,
}

impl EglTransport {
    /// Opens the transport on `stream`, an `EGLStreamKHR` in FIFO mode of
    /// at least `slots` frames that `egl` owns (the transport keeps `egl`
    /// and drops it after both ends disconnected), with `ctx` as the
    /// producer's and consumer's context.
    ///
    /// # Safety
    /// `stream` must be a live stream that `egl` keeps alive while it is
    /// alive, with no ends connected yet, and the processing must suit the
    /// backend: [`Processing::HostFnOverSimulatedDeviceMemory`] only on the
    /// simulator (whose device addresses are host addresses).
    pub unsafe fn open(
        ctx: &Context,
        stream: EGLStreamKHR,
        egl: Box<dyn Any>,
        name: &'static str,
        processing: Processing,
        geometry: FrameGeometry,
        slots: usize,
    ) -> Result<EglTransport, TransportError> {
        let len = geometry.frame_len();
        if len == 0 || slots == 0 {
            return Err(TransportError::new(
                "an EGLStream ring needs frames and slots",
            ));
        }
        let width = u32::try_from(geometry.stride / 4)
            .ok()
            .filter(|w| *w as usize * 4 == geometry.stride)
            .ok_or_else(|| {
                TransportError::new("RGBA8 lines: the stride must be a multiple of 4")
            })?;
        let height = u32::try_from(geometry.rows).map_err(err("frame height"))?;
        ctx.bind().map_err(err("binding the CUDA context"))?;
        let (kernel, cstream, host_memory, host) = match processing {
            Processing::HostFnOverSimulatedDeviceMemory => {
                let mut bufs: Vec<Box<[u8]>> = (0..slots)
                    .map(|_| vec![0u8; len].into_boxed_slice())
                    .collect();
                let host = bufs
                    .iter_mut()
                    .map(|b| NonNull::new(b.as_mut_ptr()).ok_or("null"))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(err("host buffer"))?;
                let cstream = Stream::new(ctx).map_err(err("CUDA stream"))?;
                (None, cstream, HostMemory::Heap(bufs), host)
            }
            Processing::CudaKernel => {
                let cu = ctx.cudarc().cloned().ok_or_else(|| {
                    TransportError::new(
                        "the kernel path needs a CUDA context of the real driver made through cudarc",
                    )
                })?;
                consumer::self_check_pattern(geometry.stride, geometry.rows)?;
                let kernel = Kernel::compile(&cu)?;
                let cs = cu.new_stream().map_err(err("CUDA stream"))?;
                let counters = Counters::new(&cu, slots)?;
                let event = || {
                    cu.new_event(Some(cu_sys::CUevent_flags::CU_EVENT_DEFAULT))
                        .map_err(err("CUDA event"))
                };
                let events = (0..slots)
                    .map(|_| Ok([event()?, event()?, event()?]))
                    .collect::<Result<Vec<_>, TransportError>>()?;
                let mut pinned = Vec::with_capacity(slots);
                let mut host = Vec::with_capacity(slots);
                for _ in 0..slots {
                    // SAFETY: pinned host memory of `len` bytes; it is read
                    // only after the camera or a completed read-back wrote it
                    // (the ring orders both).
                    let mut p = unsafe { cu.alloc_pinned::<u8>(len) }
                        .map_err(err("allocating pinned host memory"))?;
                    host.push(
                        p.as_mut_ptr()
                            .ok()
                            .and_then(NonNull::new)
                            .ok_or_else(|| TransportError::new("pinned memory has no address"))?,
                    );
                    pinned.push(p);
                }
                cs.synchronize()
                    .map_err(err("synchronising the CUDA stream"))?;
                let cstream =
                    Stream::from_cudarc(ctx, Arc::clone(&cs)).map_err(err("CUDA stream"))?;
                let path = KernelPath {
                    kernel,
                    counters,
                    events,
                    cstream: cs,
                    grid: consumer::grid_for(len),
                };
                (Some(path), cstream, HostMemory::Pinned(pinned), host)
            }
        };
        let pstream = Stream::new(ctx).map_err(err("CUDA stream"))?;
        let (done_tx, done_rx) = mpsc::channel();
        let mut t = EglTransport {
            name,
            note: match processing {
                Processing::HostFnOverSimulatedDeviceMemory => {
                    "EGLStream (FIFO): a CUDA producer presents device copies of the camera's frames; the consumer's acquired copy is processed by a stream-ordered host function (simulator)"
                }
                Processing::CudaKernel => {
                    "EGLStream (FIFO): a CUDA producer presents device copies of the camera's frames; the consumer's acquired copy (the driver copies: measured) is processed by the NVRTC kernel and read back"
                }
            },
            geometry,
            host,
            free: Vec::new(),
            pool: Vec::new(),
            presented: vec![false; slots],
            presented_any: false,
            kernel,
            done_tx,
            done_rx,
            in_flight: 0,
            figures: Figures::default(),
            producer: None,
            consumer: None,
            pstream,
            cstream,
            host_memory,
            ctx: ctx.clone(),
            egl: Some(egl),
        };
        // From here on a failure tears down what exists (Drop).
        let table = &ctx.backend().table().cuda;
        let alloc = table
            .cuMemAlloc
            .ok_or_else(|| TransportError::new("cuMemAlloc is missing from the driver"))?;
        for _ in 0..pool_size(slots) {
            let mut p: CUdeviceptr = 0;
            // SAFETY: a valid out-pointer; the context is current (bound
            // above).
            let r = unsafe { alloc(&mut p, len) };
            if r.0 != 0 {
                return Err(TransportError::new(format!(
                    "cuMemAlloc of a {len}-byte frame buffer: {}",
                    tegra_interop::core::CuResult(r.0)
                )));
            }
            t.pool.push(p);
            t.free.push(p);
        }
        // The consumer connects first (measured: a producer first gets
        // CUDA_ERROR_UNKNOWN).
        // SAFETY: the caller vouches that `stream` is live while `egl` is,
        // and `egl` is dropped only after both connections ended.
        t.consumer = Some(
            unsafe { EglStreamConsumer::connect(ctx, stream, None) }
                .map_err(err("cuEGLStreamConsumerConnect"))?,
        );
        // SAFETY: as above.
        t.producer = Some(
            unsafe { EglStreamProducer::connect(ctx, stream, width, height) }
                .map_err(err("cuEGLStreamProducerConnect"))?,
        );
        Ok(t)
    }

    /// One line for the summary: how frames travel and are processed.
    pub fn note(&self) -> &'static str {
        self.note
    }

    /// Takes a buffer back from the stream when none is free, waiting
    /// for one. Asked only then, one frame per call: a
    /// `cuEGLStreamProducerReturnFrame` with nothing to return blocks for
    /// about 2 ms before it answers LAUNCH_TIMEOUT (measured on an H100,
    /// driver 580.159: draining the returns after every frame cost 2.15 ms
    /// per frame whatever the pool's size), so the producer never asks
    /// while it has a free buffer.
    fn take_returns(&mut self) -> Result<(), TransportError> {
        if !self.free.is_empty() {
            return Ok(());
        }
        if !self.presented_any {
            // Measured: a return before any present answers UNKNOWN.
            return Err(TransportError::new("no frame buffer and nothing presented"));
        }
        let began = Instant::now();
        let Some(producer) = self.producer.as_mut() else {
            return Err(TransportError::new("the producer has disconnected"));
        };
        while self.free.is_empty() {
            if let Some(back) = producer
                .return_frame(Some(&self.pstream))
                .map_err(err("cuEGLStreamProducerReturnFrame"))?
            {
                let p = back
                    .plane_ptr(0)
                    .filter(|p| self.pool.contains(p))
                    .ok_or_else(|| {
                        TransportError::new(
                            "the stream returned a frame the producer never presented",
                        )
                    })?;
                self.free.push(p);
            } else if began.elapsed() > STUCK {
                return Err(TransportError::new(format!(
                    "no frame buffer came back from the EGLStream within {STUCK:?}"
                )));
            }
        }
        self.figures.returns_waited += began.elapsed();
        Ok(())
    }

    fn slot_bytes(&self, slot: usize) -> Result<NonNull<u8>, TransportError> {
        self.host
            .get(slot)
            .copied()
            .ok_or_else(|| TransportError::new(format!("no slot {slot}")))
    }

    /// Queues the processing and read-back of `frame` (acquired, at device
    /// address `ptr`) on the consumer's stream, then the completion.
    fn queue_processing(
        &self,
        slot: usize,
        frame: u64,
        ptr: CUdeviceptr,
    ) -> Result<(), TransportError> {
        let tx = self.done_tx.clone();
        let len = self.geometry.frame_len();
        let stride = self.geometry.stride;
        let host = self.slot_bytes(slot)?.as_ptr() as usize;
        let Some(k) = &self.kernel else {
            let src = ptr as usize;
            return self
                .cstream
                .launch_host_fn(move || {
                    // SAFETY: this path runs on the simulator only (the
                    // caller of `open` vouched for it), where the acquired
                    // frame's device address is a host address of `len`
                    // bytes (checked against the frame's pitch and height
                    // when acquired); the frame is released on this stream
                    // after this function, so it is alive and nothing else
                    // writes it. The slot's host buffer is `len` bytes owned
                    // by the transport, which drains the stream before it
                    // frees it, and nobody touches it until this frame is
                    // collected (the ring).
                    let (bytes, out) = unsafe {
                        (
                            std::slice::from_raw_parts_mut(src as *mut u8, len),
                            std::slice::from_raw_parts_mut(host as *mut u8, len),
                        )
                    };
                    let start = Instant::now();
                    let mismatches = process_frame(frame, stride, bytes);
                    let process = start.elapsed();
                    out.copy_from_slice(bytes);
                    let _ = tx.send(Completion {
                        slot,
                        frame,
                        mismatches,
                        process,
                        busy: start.elapsed(),
                        finished: Instant::now(),
                    });
                })
                .map_err(err("cuLaunchHostFunc"));
        };
        let s = k.cstream.cu_stream();
        let [before, after, copied] = &k.events[slot];
        before
            .record(&k.cstream)
            .map_err(err("recording a CUDA event"))?;
        let counter = k.counters.device_ptr(slot)?;
        let bytes = DeviceFrame { ptr, len, stride };
        // SAFETY: the acquired frame is `len` bytes (its pitch and height
        // were checked) and is released on this stream after the kernel and
        // the read-back, so it stays valid and nothing else writes it.
        unsafe {
            k.kernel.check_and_invert_at(
                FrameMemory::Device,
                k.grid,
                &k.cstream,
                &CheckArgs::new(bytes, frame, counter),
            )
        }?;
        after
            .record(&k.cstream)
            .map_err(err("recording a CUDA event"))?;
        // SAFETY: the destination is the slot's `len` bytes of pinned host
        // memory, which the host reads only after this frame's completion
        // (queued after the copy on this stream); the source is the frame,
        // valid as above.
        let r = unsafe { cu_sys::cuMemcpyDtoHAsync_v2(host as *mut _, ptr, len, s) };
        if r != cu_sys::CUresult::CUDA_SUCCESS {
            return Err(TransportError::new(format!("cuMemcpyDtoHAsync: {r:?}")));
        }
        copied
            .record(&k.cstream)
            .map_err(err("recording a CUDA event"))?;
        // SAFETY: the frame's kernel was queued above on this stream; the
        // counters live until the transport drained it, and the slot's next
        // kernel is queued only after this frame was collected.
        unsafe {
            k.counters
                .send_completion_after(&self.cstream, slot, frame, tx)
        }
    }

    fn collected(&mut self, mut c: Completion) -> Result<Completion, TransportError> {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(k) = &self.kernel {
            let [before, after, copied] = &k.events[c.slot];
            let ms = |a: &CudaEvent, b: &CudaEvent| {
                a.elapsed_ms(b)
                    .map(|ms| Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
                    .map_err(err("reading CUDA event times"))
            };
            c.process = ms(before, after)?;
            c.busy = ms(before, copied)?;
        }
        Ok(c)
    }

    /// Drains the consumer, disconnects both ends, frees the pool, drops
    /// the EGL side; the first error. Safe to call twice.
    fn shut_down(&mut self) -> Result<(), TransportError> {
        let mut first: Option<TransportError> = None;
        let mut note = |r: Result<(), TransportError>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        if let Err(e) = self.cstream.synchronize() {
            // Host functions or copies may still touch the host buffers and
            // counters: leak them rather than free them under the stream.
            std::mem::forget(std::mem::replace(
                &mut self.host_memory,
                HostMemory::Heap(Vec::new()),
            ));
            std::mem::forget(self.kernel.take());
            note(Err(err("draining the consumer")(e)));
        }
        note(
            self.pstream
                .synchronize()
                .map_err(err("draining the producer")),
        );
        let producer_left = match self.producer.take() {
            Some(p) => {
                let r = p.disconnect().map_err(err("cuEGLStreamProducerDisconnect"));
                let ok = r.is_ok();
                note(r);
                ok
            }
            // Never connected (a failed open), or already handled.
            None => true,
        };
        if let Some(c) = self.consumer.take() {
            note(
                c.disconnect().map_err(|e| {
                    TransportError::new(format!("cuEGLStreamConsumerDisconnect: {e}"))
                }),
            );
        }
        if producer_left {
            // The header: presented memory stays allocated until the
            // producer disconnected. If it could not, the pool is leaked.
            let _ = self.ctx.bind();
            if let Some(free) = self.ctx.backend().table().cuda.cuMemFree {
                for p in self.pool.drain(..) {
                    // SAFETY: allocated by `open`, freed once (drained), after
                    // the producer left and both streams drained.
                    let r = unsafe { free(p) };
                    if r.0 != 0 {
                        note(Err(TransportError::new(format!(
                            "cuMemFree of a frame buffer: {}",
                            tegra_interop::core::CuResult(r.0)
                        ))));
                    }
                }
            }
        } else if !self.pool.is_empty() {
            note(Err(TransportError::new(
                "the producer did not disconnect, so its frame buffers are left allocated",
            )));
            self.pool.clear();
        }
        self.free.clear();
        self.egl = None;
        first.map_or(Ok(()), Err)
    }
}

impl Drop for EglTransport {
    fn drop(&mut self) {
        // `close` reports teardown errors; a transport dropped without it
        // tears down the same way (the driver's handles record their own
        // failed releases with the backend).
        let _ = self.shut_down();
    }
}

impl FrameTransport for EglTransport {
    fn backend(&self) -> &'static str {
        self.name
    }

    fn slot_count(&self) -> usize {
        self.host.len()
    }

    fn geometry(&self) -> FrameGeometry {
        self.geometry
    }

    fn wait_free(&mut self, t: &Ticket) -> Result<&mut [u8], TransportError> {
        let p = self.slot_bytes(t.slot())?;
        // SAFETY: the slot's `frame_len` bytes, owned by the transport. The
        // ring hands out a slot only after its previous frame was collected,
        // whose completion came after the read-back into this buffer; the
        // slice borrows `self` mutably, so it ends before the next call.
        Ok(unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), self.geometry.frame_len()) })
    }

    fn lend(&mut self, p: &Peek) -> Result<Option<PeekedFrame>, TransportError> {
        let bytes = self.slot_bytes(p.slot())?;
        // SAFETY: the slot's buffer (`frame_len` bytes) is owned by the
        // transport at a fixed address until it is dropped; the frame was
        // collected, so its read-back is done, and nothing writes the buffer
        // before the slot's next ticket (the producer after `wait_free` for
        // that ticket, the next read-back only after its ready signal).
        Ok(Some(unsafe {
            PeekedFrame::new(bytes, self.geometry.frame_len())
        }))
    }

    fn signal_ready(&mut self, t: &Ticket) -> Result<(), TransportError> {
        let slot = t.slot();
        let src = self.slot_bytes(slot)?;
        let len = self.geometry.frame_len();
        self.take_returns()?;
        let Some(dst) = self.free.pop() else {
            return Err(TransportError::new("no free frame buffer"));
        };
        self.ctx.bind().map_err(err("binding the CUDA context"))?;
        let began = Instant::now();
        let copy = self
            .ctx
            .backend()
            .table()
            .cuda
            .cuMemcpyHtoD
            .ok_or_else(|| TransportError::new("cuMemcpyHtoD is missing from the driver"))?;
        // SAFETY: `dst` is a pool buffer of `len` bytes that the stream gave
        // back (or never had); `src` the slot's `len` host bytes, which the
        // camera finished writing. The copy is synchronous.
        let r = unsafe { copy(dst, src.as_ptr().cast_const().cast(), len) };
        if r.0 != 0 {
            self.free.push(dst);
            return Err(TransportError::new(format!(
                "cuMemcpyHtoD of frame {}: {}",
                t.frame(),
                tegra_interop::core::CuResult(r.0)
            )));
        }
        let uploaded = Instant::now();
        let g = self.geometry;
        // SAFETY: `dst` is a pool buffer of `frame_len` = stride x rows bytes,
        // and a row of stride / 4 RGBA pixels fits the stride.
        let frame = unsafe {
            ProducerFrame::rgba_pitch(dst, (g.stride / 4) as u32, g.rows as u32, g.stride as u32)
        };
        let Some(producer) = self.producer.as_mut() else {
            return Err(TransportError::new("the producer has disconnected"));
        };
        // SAFETY: the pool's memory stays allocated until after the producer
        // disconnected (`shut_down`).
        if let Err(e) = unsafe { producer.present(&frame, Some(&self.pstream)) } {
            self.free.push(dst);
            return Err(err("cuEGLStreamProducerPresentFrame")(e));
        }
        self.figures.upload += uploaded - began;
        self.figures.present += uploaded.elapsed();
        self.presented[slot] = true;
        self.presented_any = true;
        Ok(())
    }

    fn queue_consumer(&mut self, t: &Ticket) -> Result<(), TransportError> {
        let (slot, frame) = (t.slot(), t.frame());
        if !self.presented.get(slot).copied().unwrap_or(false) {
            return Err(TransportError::new(format!(
                "consumer of frame {frame} in slot {slot} queued before the frame was presented"
            )));
        }
        let Some(consumer) = self.consumer.as_ref() else {
            return Err(TransportError::new("the consumer has disconnected"));
        };
        let began = Instant::now();
        let got = consumer
            .acquire(Some(&self.cstream), Some(STUCK))
            .map_err(err("cuEGLStreamConsumerAcquireFrame"))?
            .ok_or_else(|| {
                TransportError::new(format!(
                    "frame {frame} was presented but not acquired within {STUCK:?}"
                ))
            })?;
        self.figures.acquire += began.elapsed();
        self.figures.frames += 1;
        self.presented[slot] = false;
        let g = self.geometry;
        let ptr = {
            let f = got.frame().map_err(err("the acquired frame"))?;
            let fits = f.pitch() as usize == g.stride
                && f.height() as usize == g.rows
                && f.plane_count() == 1;
            match (fits, f.plane_ptr(0)) {
                (true, Some(p)) => p,
                _ => {
                    return Err(TransportError::new(format!(
                        "frame {frame} arrived as {}x{} pitch {} with {} plane(s); the ring's frames are {} bytes x {} lines in one pitch plane",
                        f.width(),
                        f.height(),
                        f.pitch(),
                        f.plane_count(),
                        g.stride,
                        g.rows
                    )))
                }
            }
        };
        // The consumer's work first, then the release ordered after it on
        // the same stream (the guard's release), then nothing else touches
        // the frame.
        let queued = self.queue_processing(slot, frame, ptr);
        let released = got
            .release()
            .map_err(err("cuEGLStreamConsumerReleaseFrame"));
        queued?;
        self.in_flight += 1;
        released
    }

    fn try_complete(&mut self) -> Result<Option<Completion>, TransportError> {
        match try_recv_completion(&self.done_rx)? {
            Some(c) => self.collected(c).map(Some),
            None => Ok(None),
        }
    }

    fn wait_complete(&mut self) -> Result<Completion, TransportError> {
        let c = wait_completion(&self.done_rx, self.in_flight, STUCK)?;
        self.collected(c)
    }

    fn details(&self) -> Option<String> {
        let f = &self.figures;
        let n = f.frames.max(1);
        let us = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(n);
        Some(format!(
            "EGLStream per frame: upload (cuMemcpyHtoD) {:.0} us, present {:.0} us, acquire {:.0} us, waiting for returned buffers {:.0} us",
            us(f.upload),
            us(f.present),
            us(f.acquire),
            us(f.returns_waited)
        ))
    }

    fn close(mut self: Box<Self>) -> Result<(), TransportError> {
        self.shut_down()
    }
}

/// Opens the transport on the simulator: a simulated FIFO stream of
/// `slots` frames, processing by a host function. Gives the simulator too,
/// for its ledger after the run.
pub fn open_sim(
    geometry: FrameGeometry,
    slots: usize,
) -> Result<(EglTransport, tegra_interop_sim::Sim), String> {
    use tegra_interop_sim::egl::EglStreamMode;
    let sim =
        tegra_interop_sim::Sim::new().map_err(|e| format!("cannot start the simulator: {e}"))?;
    let ctx = Context::new(sim.backend(), 0).map_err(|e| format!("CUDA context: {e}"))?;
    let fifo = u32::try_from(slots).map_err(|e| format!("ring size: {e}"))?;
    let stream = sim
        .create_egl_stream(EglStreamMode::Fifo(fifo))
        .ok_or("the simulator refused an EGLStream")?;
    let raw = stream.as_raw();
    // SAFETY: `stream` is the simulator's live stream, handed to the
    // transport, which drops it after both ends disconnected; the
    // host-function processing is for the simulator, which this is.
    let t = unsafe {
        EglTransport::open(
            &ctx,
            raw,
            Box::new(stream),
            "egl-sim",
            Processing::HostFnOverSimulatedDeviceMemory,
            geometry,
            slots,
        )
    }
    .map_err(|e| e.0)?;
    Ok((t, sim))
}

/// A real EGL display and one stream of it (the test kit's exporter),
/// destroyed together.
#[cfg(feature = "vulkan")]
struct RealEgl {
    stream: Option<crate::platform::egl::EglStream>,
    exporter: crate::platform::egl::EglExporter,
}

#[cfg(feature = "vulkan")]
impl Drop for RealEgl {
    fn drop(&mut self) {
        if let Some(s) = self.stream.take() {
            self.exporter.destroy_stream(s);
        }
    }
}

/// Opens the transport on the real driver with a real EGL display (the
/// device platform, headless) and a FIFO stream of `slots` frames,
/// processing by the NVRTC kernel. Gives the driver's backend too, for its
/// deferred release errors.
#[cfg(feature = "vulkan")]
pub fn open_real(
    geometry: FrameGeometry,
    slots: usize,
) -> Result<(EglTransport, Arc<tegra_interop::driver::Backend>), String> {
    let backend =
        tegra_interop::driver::Backend::real().map_err(|e| format!("CUDA driver: {e}"))?;
    let ctx = Context::new(Arc::clone(&backend), 0).map_err(|e| format!("CUDA context: {e}"))?;
    let exporter = crate::platform::egl::EglExporter::new().map_err(|e| e.to_string())?;
    let fifo = i32::try_from(slots).map_err(|e| format!("ring size: {e}"))?;
    let stream = exporter.create_stream(fifo).map_err(|e| e.to_string())?;
    let raw = stream.as_raw();
    let egl = RealEgl {
        stream: Some(stream),
        exporter,
    };
    // SAFETY: `raw` is a live stream of `egl`'s display, kept until `egl`
    // is dropped, which the transport does after both ends disconnected;
    // the kernel processing is for a real GPU, which this is.
    let t = unsafe {
        EglTransport::open(
            &ctx,
            raw,
            Box::new(egl),
            "egl-gpu",
            Processing::CudaKernel,
            geometry,
            slots,
        )
    }
    .map_err(|e| e.0)?;
    Ok((t, backend))
}

/// Without `--features vulkan` the test kit's EGL exporter is not built.
#[cfg(not(feature = "vulkan"))]
pub fn open_real(
    _geometry: FrameGeometry,
    _slots: usize,
) -> Result<(EglTransport, Arc<tegra_interop::driver::Backend>), String> {
    Err(
        "this program was built without `--features vulkan`, which brings the EGL display code"
            .into(),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::camera::TestPattern;
    use crate::ring::Ring;

    const G: FrameGeometry = FrameGeometry {
        stride: 64,
        rows: 8,
    };

    /// Every frame through the simulated EGLStream, checked on both sides
    /// (the consumer's mismatch count; the producer's read-back of the
    /// inverted frame when the slot comes round), for rings of 1 to 4
    /// slots; nothing left behind.
    #[test]
    fn frames_cross_the_stream_verified_and_nothing_is_left() {
        for slots in 1..=4usize {
            let (mut t, sim) = open_sim(G, slots).unwrap();
            let mut ring = Ring::new(slots).unwrap();
            let mut collected = Vec::new();
            let mut note = |c: &Completion| {
                assert_eq!(c.mismatches, 0, "frame {}", c.frame);
                collected.push(c.frame);
                Ok(())
            };
            for _ in 0..(3 * slots + 2) {
                ring.make_room(&mut t, |c, _| note(c)).unwrap();
                ring.produce(&mut t, |ticket, bytes| {
                    if ticket.free_wait() > 0 {
                        let prev = ticket.frame() - slots as u64;
                        let mut want = vec![0u8; bytes.len()];
                        TestPattern::new(prev, G.stride).fill(&mut want);
                        assert!(
                            bytes.iter().zip(&want).all(|(a, b)| *a == !*b),
                            "frame {prev} read back inverted"
                        );
                    }
                    TestPattern::new(ticket.frame(), G.stride).fill(bytes);
                    Ok((Instant::now(), 0))
                })
                .unwrap();
            }
            ring.drain(&mut t, |c, _| note(c)).unwrap();
            assert_eq!(collected, (0..(3 * slots as u64 + 2)).collect::<Vec<_>>());
            assert!(t.details().unwrap().starts_with("EGLStream per frame"));
            Box::new(t).close().unwrap();
            assert!(sim.ledger().is_clean(), "{}", sim.ledger());
            assert!(sim.diagnostics().is_empty(), "{:?}", sim.diagnostics());
        }
    }

    #[test]
    fn a_consumer_before_the_present_is_refused() {
        let (mut t, sim) = open_sim(G, 2).unwrap();
        let mut ring = Ring::new(2).unwrap();
        let ticket = ring.acquire().unwrap();
        t.wait_free(&ticket).unwrap();
        let e = t.queue_consumer(&ticket).unwrap_err();
        assert!(e.0.contains("before the frame was presented"), "{e}");
        drop(t);
        assert!(sim.ledger().is_clean(), "{}", sim.ledger());
    }

    #[test]
    fn odd_strides_are_refused_before_anything_is_made() {
        let g = FrameGeometry { stride: 6, rows: 2 };
        let e = open_sim(g, 2).err().unwrap();
        assert!(e.contains("multiple of 4"), "{e}");
    }
}
