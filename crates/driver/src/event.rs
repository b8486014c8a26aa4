//! [`Event`]: a marker recorded in a stream's order, for the host to wait
//! on (with a limit), for another stream to wait on, and for timing.
#![allow(unsafe_code)] // calls of pointer-taking entry points, each with its `// SAFETY:` line

use std::ptr;
use std::time::{Duration, Instant};

use tegra_interop_core::CuResult;
use tegra_interop_sys::cuda::CUevent;

use crate::ffi::{call, code, Bind, Current, TryBind};
use crate::owner::{Owned, Release};
use crate::{Backend, Context, Error, Stream};

/// How an event is created (`CU_EVENT_*` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventFlags {
    /// `CU_EVENT_BLOCKING_SYNC` (1): `cuEventSynchronize` sleeps instead of
    /// spinning. (This crate's [`Event::synchronize`] polls either way.)
    pub blocking_sync: bool,
    /// `CU_EVENT_DISABLE_TIMING` (2): cheaper; [`Event::elapsed_since`]
    /// is refused for such events.
    pub disable_timing: bool,
}

impl EventFlags {
    /// Timing enabled, spinning synchronisation (`CU_EVENT_DEFAULT`).
    pub const DEFAULT: EventFlags = EventFlags {
        blocking_sync: false,
        disable_timing: false,
    };
    /// No timing (`CU_EVENT_DISABLE_TIMING`): the cheapest marker.
    pub const NO_TIMING: EventFlags = EventFlags {
        blocking_sync: false,
        disable_timing: true,
    };

    /// The C flag word.
    pub fn bits(self) -> u32 {
        u32::from(self.blocking_sync) | (u32::from(self.disable_timing) << 1)
    }
}

/// A CUDA event of a [`Context`] (`cuEventCreate`), destroyed
/// (`cuEventDestroy`) when dropped. Holds its context.
///
/// `Send + Sync`: it holds a context clone and a C handle the driver lets
/// any thread use; `&Event` allows only calls the driver serialises.
pub struct Event {
    res: Owned<EventRes>,
    flags: EventFlags,
}

struct EventRes {
    ctx: Context,
    raw: CUevent,
}

// SAFETY: a C handle (a plain pointer to the driver's object) and a context
// clone; the CUDA driver API lets any thread use an event.
unsafe impl Send for EventRes {}
// SAFETY: `&EventRes` only allows calls the driver serialises.
unsafe impl Sync for EventRes {}

impl Release for EventRes {
    fn release(&mut self) -> Result<(), Error> {
        // Created by us, destroyed once (`Owned`); the driver defers the
        // release of an event still pending in a stream.
        call::cuEventDestroy(TryBind(&self.ctx), self.raw)
    }
    fn backend(&self) -> &Backend {
        self.ctx.backend()
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("context", &self.res.ctx.id())
            .field("raw", &self.res.raw)
            .field("flags", &self.flags)
            .finish()
    }
}

fn wrong_context(operation: &'static str) -> Error {
    Error::Unsupported {
        operation,
        reason: "the stream belongs to another context than the event",
    }
}

impl Event {
    /// Creates an event in `ctx` (`cuEventCreate(flags)`).
    pub fn new(ctx: &Context, flags: EventFlags) -> Result<Event, Error> {
        let mut raw: CUevent = ptr::null_mut();
        // SAFETY: `raw` is a local the driver writes one event handle to.
        unsafe { call::cuEventCreate(Bind(ctx), &mut raw, flags.bits()) }?;
        Ok(Event {
            res: Owned::new(EventRes {
                ctx: ctx.clone(),
                raw,
            }),
            flags,
        })
    }

    /// The flags it was created with.
    pub fn flags(&self) -> EventFlags {
        self.flags
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Context {
        &self.res.ctx
    }

    /// The raw `CUevent` (still owned by this value).
    pub fn as_raw(&self) -> CUevent {
        self.res.raw
    }

    /// Records the event at the current end of `stream`'s queue
    /// (`cuEventRecord`): it completes when the work queued before it has.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a stream of another context (refused
    /// before the call); [`Error::Driver`].
    pub fn record(&self, stream: &Stream) -> Result<(), Error> {
        if !stream.context().same(&self.res.ctx) {
            return Err(wrong_context("Event::record"));
        }
        call::cuEventRecord(Current(stream.context()), self.res.raw, stream.as_raw())
    }

    /// `true` when the work before the last record has completed (or the
    /// event was never recorded): `cuEventQuery`, `NOT_READY` is `false`.
    pub fn is_complete(&self) -> Result<bool, Error> {
        match CuResult::from(code::cuEventQuery(Current(&self.res.ctx), self.res.raw)?) {
            CuResult::SUCCESS => Ok(true),
            CuResult::NOT_READY => Ok(false),
            code => Err(Error::Driver {
                call: "cuEventQuery",
                code,
            }),
        }
    }

    /// Waits until [`is_complete`](Self::is_complete), at most `limit`:
    /// polls `cuEventQuery` (yielding for the first 200 µs, then sleeping
    /// 50 µs between queries), so the wait is bounded even when the GPU
    /// work never finishes.
    ///
    /// # Errors
    /// [`Error::Timeout`] naming this event and the limit; driver errors
    /// of the query.
    pub fn synchronize(&self, limit: Duration) -> Result<(), Error> {
        let start = Instant::now();
        loop {
            if self.is_complete()? {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= limit {
                return Err(Error::Timeout {
                    waited_for: format!(
                        "the work recorded before event {:p} of {} to complete",
                        self.res.raw,
                        self.res.ctx.id()
                    ),
                    limit,
                });
            }
            if waited < Duration::from_micros(200) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50).min(limit - waited));
            }
        }
    }

    /// The time between `start`'s completion and this event's
    /// (`cuEventElapsedTime`; both recorded and complete).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when either was created with
    /// `disable_timing` or belongs to another context (refused before the
    /// call); [`Error::Driver`] (`NOT_READY` when one has not completed).
    pub fn elapsed_since(&self, start: &Event) -> Result<Duration, Error> {
        if self.flags.disable_timing || start.flags.disable_timing {
            return Err(Error::Unsupported {
                operation: "Event::elapsed_since",
                reason: "an event created with disable_timing has no time stamp",
            });
        }
        if !start.res.ctx.same(&self.res.ctx) {
            return Err(Error::Unsupported {
                operation: "Event::elapsed_since",
                reason: "the two events belong to different contexts",
            });
        }
        let mut ms = 0f32;
        // SAFETY: `ms` is a local the driver writes one float to; both
        // events are live handles of this context.
        unsafe {
            call::cuEventElapsedTime(Bind(&self.res.ctx), &mut ms, start.res.raw, self.res.raw)
        }?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1000.0))
    }

    /// Destroys now (`cuEventDestroy`) and reports the driver's answer.
    pub fn destroy(self) -> Result<(), Error> {
        self.res.destroy()
    }
}

impl Stream {
    /// Makes work queued on this stream after this call wait until `event`
    /// completes (`cuStreamWaitEvent`); the host does not wait.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for an event of another context (refused
    /// before the call); [`Error::Driver`].
    pub fn wait_event(&self, event: &Event) -> Result<(), Error> {
        if !self.context().same(&event.res.ctx) {
            return Err(wrong_context("Stream::wait_event"));
        }
        call::cuStreamWaitEvent(Current(self.context()), self.as_raw(), event.res.raw, 0)
    }
}
