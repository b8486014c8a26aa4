//! What the consumer does with a frame: the [`FrameWork`] trait, the
//! typed device view of a frame it is given ([`DeviceFrame`]), and its
//! error ([`WorkError`]).
//!
//! The ring's consumer ([`super::Consumer`]) runs one `FrameWork` on every
//! frame, between the transport's wait for the slot's *ready* fence and its
//! *free* signal, all queued on one CUDA stream:
//!
//! ```text
//!   stream:  wait ready(k+1) -> [copy in] -> work.queue(frame, stream) -> [copy back] -> signal free(k+1)
//!   host:    ... later, once everything above for the frame completed: work.finished(slot, frame)
//! ```
//!
//! The project's own work is [`CheckInvert`](super::builtin::CheckInvert)
//! (the check-and-invert kernel the `pipeline` program and the tests verify
//! with); [`Invert`](super::builtin::Invert) inverts every byte. A user's
//! kernel (PTX or a cubin loaded with the driver's `Module`, an NVRTC
//! string, a cudarc kernel) is one more implementation: see the crate
//! README's "Your own work" and the examples `user_ptx`, `user_chain` and
//! `user_cudarc`.
//!
//! # The contract (why the trait is safe and a launch is not)
//!
//! The trait itself is safe: the consumer calls it, and nothing it hands
//! out can be used after the slot's turn ([`DeviceFrame`] borrows for the
//! call, has no public constructor and is not `Clone`). Launching a kernel
//! is `unsafe` (the driver's `Launch::launch`, cudarc's `launch`): the
//! implementation's own `// SAFETY:` reasoning rests on these promises of
//! the consumer:
//!
//! - The frame's bytes at [`DeviceFrame::ptr`] ([`DeviceFrame::len`] of
//!   them) are valid, and touched by nobody else, for the work queued on
//!   the stream passed to [`FrameWork::queue`] during that call: the
//!   consumer queued the wait for *ready* (and, in copy placement, the copy
//!   in) before it, and queues the copy back and the *free* signal after
//!   it, on that stream or on one that waits for it. The producer writes
//!   the slot again only after *free*.
//! - Work queued on **other** streams is not ordered by anything the
//!   consumer does: the implementation must order it itself (record an
//!   event on the given stream and wait for it on the other, then the
//!   reverse before `queue` returns), or it may run outside the slot's turn.
//! - Memory the implementation owns (results, counters, scratch buffers)
//!   lives as long as the implementation, and the consumer drops the
//!   implementation only after its streams drained (or never, leaking it,
//!   where they cannot be drained). Reading results on the host is sound in
//!   [`FrameWork::finished`]: it is called once everything queued for that
//!   frame on the stream has completed.
//! - Calls come one at a time (`&mut self`), from the threads that queue
//!   and collect frames; a slot's next frame is queued only after its
//!   previous frame was finished (per-slot state indexed by
//!   [`DeviceFrame::slot`] needs no lock).

use std::borrow::Cow;
use std::fmt;

use tegra_interop::driver::{Context, DevicePtr, Stream};

use super::kernel::FrameMemory;
use crate::frame::{FrameLayout, PixelFormat};

/// The driver's error type (`tegra_interop::driver::Error`).
pub use tegra_interop::driver::Error as DriverError;

/// Why a [`FrameWork`] failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum WorkError {
    /// A CUDA call failed.
    Driver {
        /// What the work was doing.
        doing: Cow<'static, str>,
        /// The driver's error.
        source: DriverError,
    },
    /// The work cannot run on these frames or this placement (refused by
    /// [`FrameWork::prepare`], before any frame).
    Refused(Cow<'static, str>),
    /// Any other failure.
    Failed(String),
}

impl WorkError {
    /// A failed driver call while `doing` something.
    pub fn driver(doing: impl Into<Cow<'static, str>>, source: DriverError) -> WorkError {
        WorkError::Driver {
            doing: doing.into(),
            source,
        }
    }

    /// The work cannot run here ([`WorkError::Refused`]).
    pub fn refused(reason: impl Into<Cow<'static, str>>) -> WorkError {
        WorkError::Refused(reason.into())
    }

    /// Any other failure ([`WorkError::Failed`]).
    pub fn failed(msg: impl fmt::Display) -> WorkError {
        WorkError::Failed(msg.to_string())
    }
}

impl fmt::Display for WorkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkError::Driver { doing, source } => write!(f, "{doing}: {source}"),
            WorkError::Refused(why) => write!(f, "the frame work was refused: {why}"),
            WorkError::Failed(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for WorkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WorkError::Driver { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// `during` for the driver's results inside a [`FrameWork`]: the error
/// becomes [`WorkError::Driver`] with what was being done.
pub trait WorkResultExt<T> {
    /// Maps the driver's error to [`WorkError::Driver`] with `doing`.
    fn during(self, doing: impl Into<Cow<'static, str>>) -> Result<T, WorkError>;
}

impl<T> WorkResultExt<T> for Result<T, DriverError> {
    fn during(self, doing: impl Into<Cow<'static, str>>) -> Result<T, WorkError> {
        self.map_err(|e| WorkError::driver(doing, e))
    }
}

/// Where the frame a [`FrameWork`] sees lives, relative to the ring's slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Zero-copy: the work sees the slot's frame itself (imported memory
    /// the producer also maps). One stream.
    InPlace,
    /// Copy: the consumer copies the slot's frame into a device-local
    /// buffer of the slot, the work sees that copy, and the consumer copies
    /// it back into the slot afterwards (so changes the work makes reach
    /// the slot in both placements). The copy in and the work run on the
    /// entry stream, the copy back on the exit stream after the work.
    DeviceCopy(super::CopyWith),
    /// An acquired EGL frame (`Consumer::queue_acquired`): the work sees
    /// that frame, the consumer then copies it into the slot's pinned host
    /// buffer. One stream.
    ReadBack,
}

/// The frame a [`FrameWork`] works on, for the time of one
/// [`FrameWork::queue`] call: a typed device view (address, layout, frame
/// number, slot).
///
/// It borrows from the consumer for the call (`'a`), has no public
/// constructor and is not `Clone`: the address it gives is valid for work
/// queued on the call's stream (see the [module docs](self) for the whole
/// contract), not after the slot's turn.
#[derive(Debug)]
pub struct DeviceFrame<'a> {
    ptr: DevicePtr<'a>,
    layout: FrameLayout,
    number: u64,
    slot: usize,
    memory: FrameMemory,
}

impl<'a> DeviceFrame<'a> {
    /// The view of the frame `number` of `slot` at `ptr` (crate-private:
    /// only the consumer, which keeps the contract, makes one).
    pub(crate) fn new(
        ptr: DevicePtr<'a>,
        layout: FrameLayout,
        number: u64,
        slot: usize,
        memory: FrameMemory,
    ) -> DeviceFrame<'a> {
        DeviceFrame {
            ptr,
            layout,
            number,
            slot,
            memory,
        }
    }

    /// The frame's first byte on the device, as a kernel argument. Valid
    /// for work queued on the stream of this call (see [`DeviceFrame`]).
    pub fn ptr(&self) -> DevicePtr<'_> {
        self.ptr
    }

    /// The frame's layout (width, height, pitch, pixel format).
    pub fn layout(&self) -> FrameLayout {
        self.layout
    }

    /// Pixels per line.
    pub fn width(&self) -> u32 {
        self.layout.width()
    }

    /// Lines.
    pub fn height(&self) -> u32 {
        self.layout.height()
    }

    /// Bytes from one line's start to the next's.
    pub fn pitch(&self) -> usize {
        self.layout.pitch()
    }

    /// The pixels' format.
    pub fn format(&self) -> PixelFormat {
        self.layout.format()
    }

    /// Bytes of the frame (`pitch * height`).
    pub fn len(&self) -> usize {
        self.layout.frame_len()
    }

    /// Whether the frame has no bytes (never: layouts have none).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The frame's number (0, 1, 2, ... in the ring's order).
    pub fn number(&self) -> u64 {
        self.number
    }

    /// The ring slot the frame is in (`0..slots`).
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Where the bytes live: [`FrameMemory::Device`] (a device-local copy,
    /// or an EGL frame) or [`FrameMemory::System`] (memory the CPU maps
    /// too, where a kernel may prefer loads that bypass stale cache lines).
    pub fn memory(&self) -> FrameMemory {
        self.memory
    }
}

/// What the ring's consumer does with each frame: the user's CUDA work.
///
/// [`prepare`](Self::prepare) once, before the first frame (compile and
/// load kernels, allocate per-slot results); [`queue`](Self::queue) per
/// frame, on the stream the ring's fences are ordered on;
/// [`finished`](Self::finished) per frame, once its work completed. See
/// the [module docs](self) for the ordering contract an implementation's
/// `unsafe` launches rest on.
pub trait FrameWork: Send {
    /// A short name for reports and errors.
    fn name(&self) -> &str;

    /// How the work reads the ring's bytes. The transports carry frames
    /// as `rows` lines of `stride` bytes; the consumer gives the work the
    /// layout of `stride / bytes_per_pixel` pixels of this format per line
    /// (pitch = stride), and refuses a stride that is not whole pixels. The
    /// default is [`PixelFormat::Gray8`]: one byte per pixel.
    fn pixel_format(&self) -> PixelFormat {
        PixelFormat::Gray8
    }

    /// Called once by the consumer before any frame: `ctx` is the
    /// consumer's CUDA context (launch in it), `layout` every frame's
    /// layout, `slots` the ring's size, `placement` where the frames will
    /// be. Refuse what the work cannot handle here ([`WorkError::Refused`]).
    fn prepare(
        &mut self,
        ctx: &Context,
        layout: FrameLayout,
        slots: usize,
        placement: Placement,
    ) -> Result<(), WorkError>;

    /// Queues the work for `frame` on `stream` (returns once queued; do not
    /// wait for the device here). The consumer queued the wait for the
    /// slot's *ready* fence before, and queues its *free* signal after.
    fn queue(&mut self, frame: &DeviceFrame<'_>, stream: &Stream) -> Result<(), WorkError>;

    /// Called once everything queued for frame `frame` (in `slot`) on the
    /// stream has completed, in frame order: read results back here. The
    /// value is the number of problems the work found in the frame (the
    /// check's mismatching bytes; the ring reports a frame with any as
    /// corrupt). The default finds none.
    fn finished(&mut self, slot: usize, frame: u64) -> Result<u64, WorkError> {
        let _ = (slot, frame);
        Ok(0)
    }
}

impl fmt::Debug for dyn FrameWork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FrameWork({})", self.name())
    }
}

/// A [`FrameWork`] made of a closure: `queue` calls it, `prepare` accepts
/// every layout and `finished` finds no problems. For work that needs
/// nothing prepared (say, a kernel loaded before the ring opens).
///
/// ```
/// use tegra_interop_pipeline::consumer::work::{FnWork, FrameWork};
///
/// use tegra_interop_pipeline::frame::PixelFormat;
///
/// let work = FnWork::new("count", |frame, _stream| {
///     // Launch a kernel over `frame.ptr()` on `_stream` here.
///     let _ = frame.number();
///     Ok(())
/// })
/// .with_format(PixelFormat::Rgba8);
/// assert_eq!(work.name(), "count");
/// assert_eq!(work.pixel_format(), PixelFormat::Rgba8);
/// ```
pub struct FnWork<F> {
    name: String,
    format: PixelFormat,
    queue: F,
}

impl<F> FnWork<F>
where
    F: FnMut(&DeviceFrame<'_>, &Stream) -> Result<(), WorkError> + Send,
{
    /// Work called `name` that runs `queue` on every frame.
    pub fn new(name: impl Into<String>, queue: F) -> FnWork<F> {
        FnWork {
            name: name.into(),
            format: PixelFormat::Gray8,
            queue,
        }
    }

    /// The same work, reading the frames as `format` pixels
    /// ([`FrameWork::pixel_format`]; [`PixelFormat::Gray8`] unless set).
    pub fn with_format(mut self, format: PixelFormat) -> FnWork<F> {
        self.format = format;
        self
    }
}

impl<F> fmt::Debug for FnWork<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnWork").field("name", &self.name).finish()
    }
}

impl<F> FrameWork for FnWork<F>
where
    F: FnMut(&DeviceFrame<'_>, &Stream) -> Result<(), WorkError> + Send,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn pixel_format(&self) -> PixelFormat {
        self.format
    }

    fn prepare(
        &mut self,
        _ctx: &Context,
        _layout: FrameLayout,
        _slots: usize,
        _placement: Placement,
    ) -> Result<(), WorkError> {
        Ok(())
    }

    fn queue(&mut self, frame: &DeviceFrame<'_>, stream: &Stream) -> Result<(), WorkError> {
        (self.queue)(frame, stream)
    }
}
