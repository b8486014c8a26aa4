//! EGLStreams with CUDA at one end: the JetPack camera path (Argus or a GL
//! producer feeding a CUDA consumer) and a CUDA producer for tests and
//! discrete GPUs.
//!
//! The stream itself (`EGLStreamKHR`) stays the caller's: made with
//! `eglCreateStreamKHR` (FIFO length 0 is mailbox mode), destroyed with
//! `eglDestroyStreamKHR` after both ends disconnected. CUDA connects to it
//! as the consumer ([`EglStreamConsumer`]) or the producer
//! ([`EglStreamProducer`]); per the EGL_KHR_stream rules the consumer
//! connects first.
//!
//! A frame the consumer acquired is a guard ([`StreamFrame`]) that borrows
//! its consumer: its planes cannot be used after
//! [`release`](StreamFrame::release) (it is consumed), and the consumer
//! cannot be disconnected while a frame is out (`disconnect` takes the
//! consumer by value, which a borrowed consumer cannot give). A frame that
//! was leaked instead of released is counted and makes
//! [`EglStreamConsumer::disconnect`] a typed refusal.
//!
//! What the header documents and the wrappers keep: an acquire that times
//! out answers `CUDA_ERROR_LAUNCH_TIMEOUT` (`None` here; measured on the
//! H200, driver 580.159: it answers `CUDA_ERROR_UNKNOWN` once the timeout
//! passed, which is also `None` here); the consumer connects first
//! (measured: a producer connecting first gets `CUDA_ERROR_UNKNOWN`); a
//! presented frame's memory must stay allocated until the producer
//! disconnected (so [`EglStreamProducer::present`] is `unsafe`);
//! `cuEGLStreamProducerReturnFrame` answers `CUDA_ERROR_LAUNCH_TIMEOUT`
//! while the consumer has not handed a frame back (`None` here).
//!
//! ```
//! use std::time::Duration;
//! use tegra_interop_driver::egl::{EglStreamConsumer, EglStreamProducer, ProducerFrame};
//! use tegra_interop_driver::{Context, Stream};
//! use tegra_interop_sim::{egl::EglStreamMode, Sim};
//!
//! let sim = Sim::new()?;
//! let ctx = Context::new(sim.backend(), 0)?;
//! ctx.bind()?;
//! let stream = Stream::new(&ctx)?;
//! // The EGL side (here the simulator's stand-in for eglCreateStreamKHR).
//! let egl_stream = sim.create_egl_stream(EglStreamMode::Fifo(4)).unwrap();
//! // SAFETY: the stream is live and outlives both connections.
//! let consumer = unsafe { EglStreamConsumer::connect(&ctx, egl_stream.as_raw(), None)? };
//! // SAFETY: as above.
//! let mut producer = unsafe { EglStreamProducer::connect(&ctx, egl_stream.as_raw(), 64, 16)? };
//! // Nothing presented yet: the acquire times out.
//! assert!(consumer.acquire(Some(&stream), Some(Duration::from_millis(1)))?.is_none());
//! // Device memory for the frame (allocating is cudarc's business; raw here).
//! let backend = sim.backend();
//! let cuda = &backend.table().cuda;
//! let mut pixels = 0;
//! // SAFETY: a valid out-pointer; the context is current.
//! assert_eq!(unsafe { (cuda.cuMemAlloc.unwrap())(&mut pixels, 64 * 16 * 4) }.0, 0);
//! // SAFETY: the 4096 bytes just allocated.
//! assert_eq!(unsafe { (cuda.cuMemsetD8.unwrap())(pixels, 7, 64 * 16 * 4) }.0, 0);
//! // SAFETY: 64 x 16 RGBA pixels of pitch 256 are the 4096 bytes allocated.
//! let frame = unsafe { ProducerFrame::rgba_pitch(pixels, 64, 16, 64 * 4) };
//! // SAFETY: the memory stays allocated until the producer disconnected.
//! unsafe { producer.present(&frame, Some(&stream))? };
//! let got = consumer.acquire(Some(&stream), None)?.expect("a frame");
//! // The consumer gets its own copy of the planes (measured on the H200).
//! let mut row = [0u8; 256];
//! got.frame()?.copy_plane_to_host(0, &mut row)?;
//! assert_eq!(row, [7u8; 256]);
//! got.release()?;
//! // The stream keeps the last released frame for reuse (measured on the
//! // H200): nothing comes back to the producer yet.
//! assert!(producer.return_frame(Some(&stream))?.is_none());
//! producer.disconnect()?;
//! consumer.disconnect()?;
//! // SAFETY: allocated above; the producer disconnected.
//! assert_eq!(unsafe { (cuda.cuMemFree.unwrap())(pixels) }.0, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![allow(unsafe_code)] // calls of pointer-taking entry points, each with its `// SAFETY:` line

use std::cell::Cell;
use std::fmt;
use std::time::Duration;

use tegra_interop_core::CuResult;
use tegra_interop_sys::cuda::{
    CUarray_format, CUdeviceptr, CUeglColorFormat, CUeglFrame, CUeglFrameType,
    CUeglStreamConnection, CUgraphicsResource, CUstream, EGLStreamKHR,
};

use super::{EglColorFormat, EglFrame};
use crate::ffi::{call, Bind, TryBind};
use crate::owner::{Owned, Release};
use crate::{Backend, Context, Error, Stream};

/// `CUDA_EGL_INFINITE_TIMEOUT`.
const INFINITE: u32 = u32::MAX;

/// Where a CUDA consumer wants its frames (`CUeglResourceLocationFlags`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EglResourceLocation {
    /// System memory (`CU_EGL_RESOURCE_LOCATION_SYSMEM`).
    SystemMemory,
    /// Video memory (`CU_EGL_RESOURCE_LOCATION_VIDMEM`, the driver's
    /// default for a plain connect).
    VideoMemory,
}

impl EglResourceLocation {
    fn raw(self) -> u32 {
        match self {
            EglResourceLocation::SystemMemory => 0,
            EglResourceLocation::VideoMemory => 1,
        }
    }
}

/// Which end of the stream a connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Consumer,
    Producer,
}

pub(crate) struct ConnectionRes {
    ctx: Context,
    raw: CUeglStreamConnection,
    end: End,
    /// Frames acquired and not released (a leaked guard stays counted).
    out: Cell<u32>,
}

// SAFETY: a `ConnectionRes` holds C handles (plain pointers to the driver's
// objects) and a context clone; the CUDA driver API lets any thread use a
// handle (calls that act in a context bind it first), so it may move
// between threads.
#[allow(unsafe_code)]
unsafe impl Send for ConnectionRes {}
// No `Sync`: a connection moves between threads but is not shared (a
// consumer counts its frames in a `Cell`).

/// Why a consumer with frames out is not disconnected.
const FRAMES_OUT: &str = "a frame acquired from the stream was never released (a leaked \
    StreamFrame): what the driver does on a disconnect with frames held is not measured, so it \
    is not asked; release the frame (EglStreamConsumer::release_leaked) and disconnect again";

impl Release for ConnectionRes {
    fn release(&mut self) -> Result<(), Error> {
        if self.out.get() > 0 {
            // The connection stays open (leaked with the frame) rather
            // than asking the driver something unmeasured.
            return Err(Error::Unsupported {
                operation: "EglStreamConsumer drop",
                reason: FRAMES_OUT,
            });
        }
        // Connected by us, disconnected once (`Owned`).
        match self.end {
            // SAFETY: `self.raw` is our connection (connected by us, disconnected once by `Owned`);
            // the driver writes one handle through the pointer.
            End::Consumer => unsafe {
                call::cuEGLStreamConsumerDisconnect(TryBind(&self.ctx), &mut self.raw)
            },
            // SAFETY: as for the consumer arm.
            End::Producer => unsafe {
                call::cuEGLStreamProducerDisconnect(TryBind(&self.ctx), &mut self.raw)
            },
        }
    }

    fn backend(&self) -> &Backend {
        self.ctx.backend()
    }
}

/// The CUDA stream handle a call takes by pointer (`NULL` stream: `None`).
fn stream_handle(stream: Option<&Stream>) -> CUstream {
    stream.map_or(std::ptr::null_mut(), Stream::as_raw)
}

/// Refuses a CUDA stream of another context than the connection's.
fn same_context(ctx: &Context, stream: &Stream, operation: &'static str) -> Result<(), Error> {
    if stream.context().as_raw() == ctx.as_raw() {
        return Ok(());
    }
    Err(Error::Unsupported {
        operation,
        reason: "the CUDA stream belongs to another context than the EGLStream connection; \
                 use a stream of the context the connection was made in",
    })
}

/// Microseconds for an acquire (`None`: wait for ever). Refused when the
/// timeout does not fit the call's 32 bits below the "infinite" value.
fn timeout_us(timeout: Option<Duration>) -> Result<u32, Error> {
    match timeout {
        None => Ok(INFINITE),
        Some(t) => u32::try_from(t.as_micros())
            .ok()
            .filter(|&us| us != INFINITE)
            .ok_or(Error::Unsupported {
                operation: "EglStreamConsumer::acquire",
                reason:
                    "the timeout does not fit the call's microseconds (under about 71 minutes); \
                         pass None to wait for ever",
            }),
    }
}

/// `Ok(false)` for `CUDA_ERROR_LAUNCH_TIMEOUT` (no frame), `Ok(true)` for
/// success, the error otherwise.
fn timed_out(r: Result<(), Error>) -> Result<bool, Error> {
    match r {
        Ok(()) => Ok(true),
        Err(Error::Driver { code, .. }) if code == CuResult::LAUNCH_TIMEOUT => Ok(false),
        Err(e) => Err(e),
    }
}

/// An acquire's answer: as [`timed_out`], and also `Ok(false)` for
/// `CUDA_ERROR_UNKNOWN` once the whole timeout has passed. Measured on the
/// H200 (driver 580.159): an acquire on an empty stream answers UNKNOWN
/// after its timeout, not the LAUNCH_TIMEOUT the header documents. An
/// UNKNOWN before the timeout passed stays an error.
fn acquire_answer(
    r: Result<(), Error>,
    waited: Duration,
    timeout: Option<Duration>,
) -> Result<bool, Error> {
    match (r, timeout) {
        (Err(Error::Driver { code, .. }), Some(t)) if code == CuResult::UNKNOWN && waited >= t => {
            Ok(false)
        }
        (r, _) => timed_out(r),
    }
}

/// CUDA connected to an `EGLStreamKHR` as its consumer; disconnected on
/// drop or with [`disconnect`](Self::disconnect).
pub struct EglStreamConsumer {
    res: Owned<ConnectionRes>,
    /// Acquires so far (numbers each acquire from 1, wrapping) and the
    /// number of the frame in `kept` (0: none yet).
    numbers: Cell<(u32, u32)>,
    /// Of the frames released, the first plane of the one acquired last
    /// (the frame the stream keeps for reuse).
    kept: Cell<usize>,
}

impl fmt::Debug for EglStreamConsumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EglStreamConsumer")
            .field("raw", &self.res.raw)
            .field("frames_out", &self.res.out.get())
            .finish()
    }
}

impl EglStreamConsumer {
    /// Connects CUDA in `ctx` as the consumer of `stream`
    /// (`cuEGLStreamConsumerConnect`, or `...ConnectWithFlags` when a
    /// location is given).
    ///
    /// # Safety
    /// `stream` must be a live `EGLStreamKHR` of an EGL display this
    /// process's CUDA driver can reach, and stay alive (not destroyed with
    /// `eglDestroyStreamKHR`) until this connection ends.
    #[allow(unsafe_code)]
    pub unsafe fn connect(
        ctx: &Context,
        stream: EGLStreamKHR,
        location: Option<EglResourceLocation>,
    ) -> Result<EglStreamConsumer, Error> {
        if stream.is_null() {
            return Err(Error::Unsupported {
                operation: "EglStreamConsumer::connect",
                reason: "the EGLStream is NULL (EGL_NO_STREAM_KHR): eglCreateStreamKHR failed?",
            });
        }
        let mut raw: CUeglStreamConnection = std::ptr::null_mut();
        match location {
            // SAFETY: `raw` is a local the driver writes one connection to; `stream` is the
            // caller's live EGLStream (`connect`'s contract).
            None => unsafe { call::cuEGLStreamConsumerConnect(Bind(ctx), &mut raw, stream) }?,
            Some(l) => {
                // SAFETY: as above; `l.raw()` is a location enum value.
                unsafe {
                    call::cuEGLStreamConsumerConnectWithFlags(Bind(ctx), &mut raw, stream, l.raw())
                }?
            }
        }
        Ok(EglStreamConsumer {
            res: Owned::new(ConnectionRes {
                ctx: ctx.clone(),
                raw,
                end: End::Consumer,
                out: Cell::new(0),
            }),
            numbers: Cell::new((0, 0)),
            kept: Cell::new(0),
        })
    }

    /// Acquires the next frame (`cuEGLStreamConsumerAcquireFrame`), waiting
    /// at most `timeout` (`None`: for ever); `Ok(None)` when none came in
    /// time. The frame is ordered on `stream` (`None`: the NULL stream).
    pub fn acquire(
        &self,
        stream: Option<&Stream>,
        timeout: Option<Duration>,
    ) -> Result<Option<StreamFrame<'_>>, Error> {
        if let Some(s) = stream {
            same_context(&self.res.ctx, s, "EglStreamConsumer::acquire")?;
        }
        let us = timeout_us(timeout)?;
        let mut resource: CUgraphicsResource = std::ptr::null_mut();
        let mut cu_stream = stream_handle(stream);
        let mut conn = self.res.raw;
        let began = std::time::Instant::now();
        // SAFETY: `conn`, `resource` and `cu_stream` are locals the driver reads and writes one
        // handle each through; `conn` is our live connection.
        let r = unsafe {
            call::cuEGLStreamConsumerAcquireFrame(
                Bind(&self.res.ctx),
                &mut conn,
                &mut resource,
                &mut cu_stream,
                us,
            )
        };
        let got = acquire_answer(r, began.elapsed(), timeout)?;
        if !got {
            return Ok(None);
        }
        self.res.out.set(self.res.out.get().saturating_add(1));
        let (last, kept) = self.numbers.get();
        let seq = last.wrapping_add(1).max(1);
        self.numbers.set((seq, kept));
        let mut guard = StreamFrame {
            consumer: self,
            resource,
            stream: cu_stream,
            raw: CUeglFrame::default(),
            released: false,
            seq,
            repeat: false,
        };
        // On failure the guard's drop releases the frame again.
        // SAFETY: `guard.raw` is a frame the driver writes whole; `resource` was just acquired on
        // this connection.
        unsafe {
            call::cuGraphicsResourceGetMappedEglFrame(
                Bind(&self.res.ctx),
                &mut guard.raw,
                resource,
                0,
                0,
            )
        }?;
        guard.repeat = kept != 0 && self.kept.get() == first_plane(&guard.raw);
        Ok(Some(guard))
    }

    /// Frames acquired and not released (a guard that was leaked with
    /// `mem::forget` stays counted).
    pub fn frames_out(&self) -> u32 {
        self.res.out.get()
    }

    /// Releases a frame whose guard was leaked (`mem::forget`), by the
    /// resource [`StreamFrame::as_raw`] showed, ordered on `stream`.
    ///
    /// # Safety
    /// `resource` must be a frame this consumer acquired whose guard was
    /// leaked and that was not released since: releasing a frame a live
    /// guard still holds would leave the guard's planes dangling.
    #[allow(unsafe_code)]
    pub unsafe fn release_leaked(
        &self,
        resource: CUgraphicsResource,
        stream: Option<&Stream>,
    ) -> Result<(), Error> {
        if self.res.out.get() == 0 {
            return Err(Error::Unsupported {
                operation: "EglStreamConsumer::release_leaked",
                reason: "no frame of this consumer is out",
            });
        }
        if let Some(s) = stream {
            same_context(&self.res.ctx, s, "EglStreamConsumer::release_leaked")?;
        }
        let mut conn = self.res.raw;
        let mut cu_stream = stream_handle(stream);
        // SAFETY: `conn` and `cu_stream` are locals holding our live connection and a stream of
        // this context; `resource` is the caller's (the function's contract).
        unsafe {
            call::cuEGLStreamConsumerReleaseFrame(
                Bind(&self.res.ctx),
                &mut conn,
                resource,
                &mut cu_stream,
            )
        }?;
        self.res.out.set(self.res.out.get().saturating_sub(1));
        Ok(())
    }

    /// The raw connection (still owned by this value).
    pub fn as_raw(&self) -> CUeglStreamConnection {
        self.res.raw
    }

    /// Disconnects now (`cuEGLStreamConsumerDisconnect`) and reports the
    /// driver's answer. Refused while a leaked frame was never released:
    /// the consumer comes back in the error, still connected, so the frame
    /// can be released with [`release_leaked`](Self::release_leaked). (A
    /// consumer dropped with a leaked frame stays connected, and the drop
    /// records the refusal.)
    pub fn disconnect(self) -> Result<(), DisconnectRefused> {
        if self.res.out.get() > 0 {
            return Err(DisconnectRefused {
                error: Error::Unsupported {
                    operation: "EglStreamConsumer::disconnect",
                    reason: FRAMES_OUT,
                },
                consumer: Some(self),
            });
        }
        self.res.destroy().map_err(|error| DisconnectRefused {
            error,
            consumer: None,
        })
    }
}

/// A failed [`EglStreamConsumer::disconnect`]: the error, and the consumer
/// when it was not disconnected (a frame still out).
#[derive(Debug)]
pub struct DisconnectRefused {
    /// What went wrong.
    pub error: Error,
    /// The consumer, still connected, when the refusal was ours; `None`
    /// when the driver's disconnect itself failed (the connection is gone).
    pub consumer: Option<EglStreamConsumer>,
}

impl fmt::Display for DisconnectRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for DisconnectRefused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<DisconnectRefused> for Error {
    fn from(r: DisconnectRefused) -> Error {
        r.error
    }
}

/// A frame acquired by an [`EglStreamConsumer`]: released on drop or with
/// [`release`](Self::release), after which its planes are gone.
pub struct StreamFrame<'c> {
    consumer: &'c EglStreamConsumer,
    resource: CUgraphicsResource,
    stream: CUstream,
    raw: CUeglFrame,
    released: bool,
    /// This consumer's acquire number for the frame (from 1, wrapping).
    seq: u32,
    /// The stream handed back a frame this consumer saw before.
    repeat: bool,
}

/// The first plane word of a frame (a pitch frame's device address, an
/// array frame's array): which of the stream's buffers it is.
fn first_plane(f: &CUeglFrame) -> usize {
    crate::ffi::egl_plane_words(f)[0]
}

impl fmt::Debug for StreamFrame<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamFrame")
            .field("resource", &self.resource)
            .field("acquire", &self.seq)
            .field("repeat", &self.repeat)
            .finish()
    }
}

impl StreamFrame<'_> {
    /// The frame as CUDA sees it (planes, pitch, size, format); borrows the
    /// guard, so it cannot outlive the release.
    pub fn frame(&self) -> Result<EglFrame<'_>, Error> {
        Ok(EglFrame::from_raw(self.raw, &self.consumer.res.ctx))
    }

    /// The graphics resource the driver mapped the frame on.
    pub fn as_raw(&self) -> CUgraphicsResource {
        self.resource
    }

    /// Whether this acquire handed back a frame this consumer had already
    /// acquired and released, instead of a new one. With nothing new
    /// presented an acquire may take the stream's kept frame again
    /// (`EGL_SUPPORT_REUSE_NV`, on by default): the same bytes, which a
    /// consumer counting camera frames must not count twice.
    ///
    /// CUDA's frame description carries no frame number, so this is told
    /// from the buffer: of the frames released, the stream keeps the one
    /// acquired last (the others go back to the producer) and hands a new
    /// frame a buffer the producer gave back, so a frame in the kept
    /// frame's buffer is that frame again. Measured on the simulator's
    /// model of the H200 and checked on a GPU by
    /// `crates/testkit/tests/gpu_egl_stream.rs`
    /// (`stream_frame_says_when_it_is_a_repeat`).
    pub fn is_repeat(&self) -> bool {
        self.repeat
    }

    /// Hands the frame back to the stream (`cuEGLStreamConsumerReleaseFrame`,
    /// ordered on the stream it was acquired on) and reports the answer.
    pub fn release(mut self) -> Result<(), Error> {
        self.released = true;
        self.release_inner()
    }

    fn release_inner(&mut self) -> Result<(), Error> {
        let c = self.consumer;
        let mut conn = c.res.raw;
        let mut stream = self.stream;
        // SAFETY: `conn` and `stream` are locals holding the live connection and the stream the
        // frame was acquired on; the resource is this frame's, released once.
        let r = unsafe {
            call::cuEGLStreamConsumerReleaseFrame(
                TryBind(&c.res.ctx),
                &mut conn,
                self.resource,
                &mut stream,
            )
        };
        c.res.out.set(c.res.out.get().saturating_sub(1));
        let (last, kept) = c.numbers.get();
        // Acquired after the kept one (serial-number order: the numbers
        // wrap, and frames out at once are never 2^31 acquires apart).
        let later = kept == 0 || (self.seq.wrapping_sub(kept) as i32) > 0;
        if r.is_ok() && later {
            c.numbers.set((last, self.seq));
            c.kept.set(first_plane(&self.raw));
        }
        r
    }
}

impl Drop for StreamFrame<'_> {
    fn drop(&mut self) {
        if !self.released {
            if let Err(e) = self.release_inner() {
                self.consumer.res.ctx.backend().record_drop_error(e);
            }
        }
    }
}

/// A frame for [`EglStreamProducer::present`]: a pitch-linear description of
/// device memory the caller owns.
#[derive(Clone, Copy)]
pub struct ProducerFrame {
    raw: CUeglFrame,
}

impl fmt::Debug for ProducerFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProducerFrame")
            .field("planes", &crate::ffi::egl_plane_words(&self.raw))
            .field("width", &self.raw.width)
            .field("height", &self.raw.height)
            .field("pitch", &self.raw.pitch)
            .field("color_format", &self.color_format())
            .finish()
    }
}

impl ProducerFrame {
    /// One RGBA8 plane of `width` x `height` pixels at `ptr`, rows `pitch`
    /// bytes apart.
    ///
    /// # Safety
    /// `ptr` must be device memory of at least `pitch` x `height` bytes,
    /// with `pitch >= 4 * width`: the driver reads that much from it when
    /// the frame is presented, and [`EglStreamProducer::present`] relies on
    /// this (its own contract adds how long the memory must live).
    #[allow(unsafe_code)] // the caller vouches for the device pointer
    pub unsafe fn rgba_pitch(
        ptr: CUdeviceptr,
        width: u32,
        height: u32,
        pitch: u32,
    ) -> ProducerFrame {
        let mut raw = CUeglFrame {
            width,
            height,
            depth: 1,
            pitch,
            planeCount: 1,
            numChannels: 4,
            frameType: CUeglFrameType::CU_EGL_FRAME_TYPE_PITCH,
            eglColorFormat: CUeglColorFormat::CU_EGL_COLOR_FORMAT_RGBA,
            cuFormat: CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8,
            ..CUeglFrame::default()
        };
        crate::ffi::set_egl_plane_words(&mut raw, [ptr as usize, 0, 0]);
        ProducerFrame { raw }
    }

    /// NV12 (YUV 4:2:0 semi-planar): a Y plane of `width` x `height` bytes
    /// at `y` and an interleaved U/V plane of half the rows at `uv`, both
    /// with rows `pitch` bytes apart.
    ///
    /// # Safety
    /// `y` must be device memory of at least `pitch` x `height` bytes and
    /// `uv` of at least `pitch` x `height.div_ceil(2)` bytes, with
    /// `pitch >= width`: the driver reads that much from them when the frame
    /// is presented, and [`EglStreamProducer::present`] relies on this.
    #[allow(unsafe_code)] // the caller vouches for the device pointers
    pub unsafe fn nv12_pitch(
        y: CUdeviceptr,
        uv: CUdeviceptr,
        width: u32,
        height: u32,
        pitch: u32,
    ) -> ProducerFrame {
        let mut raw = CUeglFrame {
            width,
            height,
            depth: 1,
            pitch,
            planeCount: 2,
            numChannels: 1,
            frameType: CUeglFrameType::CU_EGL_FRAME_TYPE_PITCH,
            eglColorFormat: CUeglColorFormat::CU_EGL_COLOR_FORMAT_YUV420_SEMIPLANAR,
            cuFormat: CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8,
            ..CUeglFrame::default()
        };
        crate::ffi::set_egl_plane_words(&mut raw, [y as usize, uv as usize, 0]);
        ProducerFrame { raw }
    }

    /// The device pointer of plane `i` (`None` past the frame's planes or
    /// for an array frame).
    pub fn plane_ptr(&self, i: usize) -> Option<CUdeviceptr> {
        if self.raw.frameType != CUeglFrameType::CU_EGL_FRAME_TYPE_PITCH
            || i >= self.raw.planeCount as usize
        {
            return None;
        }
        crate::ffi::egl_plane_words(&self.raw)
            .get(i)
            .map(|w| *w as CUdeviceptr)
    }

    /// The colour format.
    pub fn color_format(&self) -> EglColorFormat {
        EglColorFormat(self.raw.eglColorFormat.0)
    }

    /// The C description.
    pub fn as_raw(&self) -> &CUeglFrame {
        &self.raw
    }
}

/// CUDA connected to an `EGLStreamKHR` as its producer; disconnected on
/// drop or with [`disconnect`](Self::disconnect).
pub struct EglStreamProducer {
    res: Owned<ConnectionRes>,
}

impl fmt::Debug for EglStreamProducer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EglStreamProducer")
            .field("raw", &self.res.raw)
            .finish()
    }
}

impl EglStreamProducer {
    /// Connects CUDA in `ctx` as the producer of `stream` for frames of
    /// `width` x `height` (`cuEGLStreamProducerConnect`). Connect the
    /// consumer first.
    ///
    /// # Safety
    /// As [`EglStreamConsumer::connect`].
    #[allow(unsafe_code)]
    pub unsafe fn connect(
        ctx: &Context,
        stream: EGLStreamKHR,
        width: u32,
        height: u32,
    ) -> Result<EglStreamProducer, Error> {
        if stream.is_null() {
            return Err(Error::Unsupported {
                operation: "EglStreamProducer::connect",
                reason: "the EGLStream is NULL (EGL_NO_STREAM_KHR): eglCreateStreamKHR failed?",
            });
        }
        let (Ok(w), Ok(h)) = (i32::try_from(width), i32::try_from(height)) else {
            return Err(Error::Unsupported {
                operation: "EglStreamProducer::connect",
                reason: "width and height must fit an EGLint",
            });
        };
        let mut raw: CUeglStreamConnection = std::ptr::null_mut();
        // SAFETY: `raw` is a local the driver writes one connection to; `stream` is the caller's
        // live EGLStream (`connect`'s contract).
        unsafe { call::cuEGLStreamProducerConnect(Bind(ctx), &mut raw, stream, w, h) }?;
        Ok(EglStreamProducer {
            res: Owned::new(ConnectionRes {
                ctx: ctx.clone(),
                raw,
                end: End::Producer,
                out: Cell::new(0),
            }),
        })
    }

    /// Presents `frame` to the consumer (`cuEGLStreamProducerPresentFrame`),
    /// ordered on `stream` (`None`: the NULL stream).
    ///
    /// # Safety
    /// The frame's planes must be live device memory of this producer's
    /// context, at least `pitch` x rows bytes each (what the frame's unsafe
    /// constructors promised, or a frame [`return_frame`](Self::return_frame)
    /// handed back), and stay allocated until
    /// the producer disconnected (the header: freeing a presented frame
    /// before that is undefined behaviour); the producer must not write
    /// them while the consumer may hold the frame (get it back with
    /// [`return_frame`](Self::return_frame) first).
    #[allow(unsafe_code)]
    pub unsafe fn present(
        &mut self,
        frame: &ProducerFrame,
        stream: Option<&Stream>,
    ) -> Result<(), Error> {
        if let Some(s) = stream {
            same_context(&self.res.ctx, s, "EglStreamProducer::present")?;
        }
        let mut conn = self.res.raw;
        let mut cu_stream = stream_handle(stream);
        // SAFETY: `conn` and `cu_stream` are locals; the frame is passed by value and its planes
        // are the caller's promise (`present`'s contract).
        unsafe {
            call::cuEGLStreamProducerPresentFrame(
                Bind(&self.res.ctx),
                &mut conn,
                frame.raw,
                &mut cu_stream,
            )
        }
    }

    /// A frame the consumer released, back for reuse
    /// (`cuEGLStreamProducerReturnFrame`); `Ok(None)` while none is
    /// (`CUDA_ERROR_LAUNCH_TIMEOUT`: the header says to retry). That answer
    /// takes about 2 ms (measured on an H100, driver 580.159), so ask when a
    /// buffer is needed, not after every frame. Before anything was
    /// presented the driver answers `CUDA_ERROR_UNKNOWN` (measured), an
    /// error here.
    pub fn return_frame(
        &mut self,
        stream: Option<&Stream>,
    ) -> Result<Option<ProducerFrame>, Error> {
        if let Some(s) = stream {
            same_context(&self.res.ctx, s, "EglStreamProducer::return_frame")?;
        }
        let mut conn = self.res.raw;
        let mut cu_stream = stream_handle(stream);
        let mut raw = CUeglFrame::default();
        // SAFETY: `conn`, `raw` and `cu_stream` are locals the driver reads and writes one value
        // each through; `conn` is our live connection.
        let got = timed_out(unsafe {
            call::cuEGLStreamProducerReturnFrame(
                Bind(&self.res.ctx),
                &mut conn,
                &mut raw,
                &mut cu_stream,
            )
        })?;
        Ok(got.then_some(ProducerFrame { raw }))
    }

    /// The raw connection (still owned by this value).
    pub fn as_raw(&self) -> CUeglStreamConnection {
        self.res.raw
    }

    /// The context the producer was connected in.
    pub fn context(&self) -> &Context {
        &self.res.ctx
    }

    /// Disconnects now (`cuEGLStreamProducerDisconnect`) and reports the
    /// driver's answer.
    pub fn disconnect(self) -> Result<(), Error> {
        self.res.destroy()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_answer_is_a_timeout_only_after_the_timeout() {
        let unknown = || {
            Err(Error::Driver {
                call: "cuEGLStreamConsumerAcquireFrame",
                code: CuResult::UNKNOWN,
            })
        };
        let ms = Duration::from_millis;
        assert_eq!(acquire_answer(unknown(), ms(6), Some(ms(5))), Ok(false));
        assert!(acquire_answer(unknown(), ms(1), Some(ms(5))).is_err());
        assert!(acquire_answer(unknown(), ms(9), None).is_err());
        let timeout = Err(Error::Driver {
            call: "cuEGLStreamConsumerAcquireFrame",
            code: CuResult::LAUNCH_TIMEOUT,
        });
        assert_eq!(acquire_answer(timeout, ms(0), Some(ms(5))), Ok(false));
        assert_eq!(acquire_answer(Ok(()), ms(0), None), Ok(true));
    }

    #[test]
    fn timeouts_fit_the_call() {
        assert_eq!(timeout_us(None), Ok(INFINITE));
        assert_eq!(timeout_us(Some(Duration::from_millis(3))), Ok(3000));
        assert!(timeout_us(Some(Duration::from_micros(u64::from(u32::MAX)))).is_err());
        assert!(timeout_us(Some(Duration::from_secs(1 << 40))).is_err());
    }
}
