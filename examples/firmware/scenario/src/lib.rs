//! What the firmware does with `tegra-interop-core`, written once and run twice: on the
//! Cortex-M4F under QEMU (each [`Event`] logged with defmt) and on the host by the checker
//! (each [`Event`] rendered with `core::fmt`). The checker compares the two sequences line by
//! line, so a fence value, a batch entry or a refusal that comes out differently on the 32-bit
//! target fails CI.
//!
//! The scenario is what a co-processor beside the SoC would do for a ring of
//! [`RING_SLOTS`] frame slots:
//!
//! - validate the memory import and one buffer descriptor per slot;
//! - fill fixed-capacity signal and wait batches (one timeline semaphore per slot) and update
//!   them in place every frame;
//! - count a 32-bit syncpoint with deterministic fences, started close to `u32::MAX` so that
//!   the run crosses the wrap, with one failed enqueue (aborted: nothing advances) and a
//!   change of signalling stream (refused until the ordering is stated);
//! - refuse bad input with typed errors ([`Event::Refused`]).
//!
//! Besides the log, the scenario checks itself: every fence value against a plain `u32`
//! computation, every refusal against the exact error expected, every batch read-back against
//! the value written. A difference ends the run with a [`Mismatch`] (the firmware then exits
//! with a failure status).
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use core::fmt;

use tegra_interop_core::sys::cuda::CUexternalSemaphore;
use tegra_interop_core::{
    BufferMapping, CuResult, DeterministicCounter, MemoryImport, MemoryImportFlags, NvSciError,
    NvSciSyncAttrFlags, PrimitiveWidth, PushError, SemaphoreHandleKind, SignalBatch, SignalEntry,
    SignalFlags, SignalParams, StreamId, TimelineTracker, ValidationError, WaitBatch, WaitEntry,
    WaitFlags, WaitParams,
};

/// Frame slots in the ring (and the capacity of each semaphore batch).
pub const RING_SLOTS: usize = 4;
/// Frames the scenario runs.
pub const FRAMES: u32 = 12;
/// Bytes per slot (a 640x480 RGBA8 frame).
pub const SLOT_BYTES: u64 = 640 * 480 * 4;
/// The syncpoint value read back from the first signal's fence: the counter learns its
/// initial value from it (as the driver does), 7 below the 32-bit wrap.
pub const FIRST_FENCE: u64 = 0xFFFF_FFF9;
/// The frame whose enqueue "fails": its reservation is aborted and retried.
pub const FAILED_ENQUEUE_FRAME: u32 = 3;
/// The frame from which a second stream signals.
pub const STREAM_SWITCH_FRAME: u32 = 8;
/// The stream that signals first.
pub const STREAM_A: StreamId = StreamId(1);
/// The stream that takes over at [`STREAM_SWITCH_FRAME`].
pub const STREAM_B: StreamId = StreamId(2);
/// The fd the import descriptor names (the co-processor only validates it; nothing is opened).
pub const IMPORT_FD: i32 = 7;

/// Log level an event is printed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Normal progress.
    Info,
    /// A refusal (expected by the scenario, still worth a warning in a real log).
    Warn,
}

impl Level {
    /// The level as defmt-print writes it (`{L}`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Info => "INFO",
            Self::Warn => "WARN",
        }
    }
}

/// One step of the scenario, as logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The run starts.
    Start {
        /// Ring slots.
        slots: usize,
        /// Frames to run.
        frames: u32,
    },
    /// The memory import descriptor was accepted.
    Import {
        /// Its size in bytes.
        size: u64,
    },
    /// A slot's buffer descriptor was lowered (values read back from the C structure).
    Mapping {
        /// The slot.
        slot: usize,
        /// Offset in the import.
        offset: u64,
        /// Size in bytes.
        size: u64,
    },
    /// A semaphore batch was filled to capacity.
    BatchFilled {
        /// `"signal"` or `"wait"`.
        batch: &'static str,
        /// Entries.
        len: usize,
        /// The batch's C count (`numExtSems`).
        count: u32,
    },
    /// The syncpoint counter learned its initial value from a fence read back.
    Learned {
        /// The learned initial value (the value before the first counted signal).
        initial: u64,
        /// The value the first signal produces.
        first: u64,
    },
    /// A frame was handed over: the slot's signal and wait entries carry the new values.
    Frame {
        /// Frame number.
        frame: u32,
        /// Slot.
        slot: usize,
        /// Which syncpoint signal (1 = first).
        signal: u64,
        /// The syncpoint fence value of that signal (32-bit, wrapped).
        fence: u64,
        /// The timeline value signalled for the slot.
        timeline: u64,
        /// The value the wait batch holds for the slot, read back from its C parameters.
        wait: u64,
        /// The stream that signals.
        stream: u64,
    },
    /// An enqueue failed: the reservation was aborted and nothing advanced.
    Aborted {
        /// Frame number.
        frame: u32,
        /// The value the next signal will still produce.
        next: u64,
    },
    /// The stated ordering lets a second stream signal after the first.
    Ordered {
        /// The stream that may now signal.
        later: u64,
        /// The stream it runs after.
        earlier: u64,
    },
    /// The core refused bad input with the expected typed error.
    Refused {
        /// What was tried.
        what: &'static str,
        /// The error.
        error: ValidationError,
    },
    /// The signal batch at capacity refused one more entry (handed back whole).
    SignalBatchFull {
        /// Its capacity.
        capacity: usize,
        /// The entry that came back.
        entry: SignalEntry,
    },
    /// The wait batch at capacity refused one more entry (handed back whole).
    WaitBatchFull {
        /// Its capacity.
        capacity: usize,
        /// The entry that came back.
        entry: WaitEntry,
    },
    /// A CUDA result code the application core reported back (the co-processor only logs
    /// it; an unknown code is kept as a number).
    CudaAnswer {
        /// The call that answered.
        call: &'static str,
        /// Its result.
        code: CuResult,
    },
    /// An NvSci error code the application core reported back.
    NvSciAnswer {
        /// The call that answered.
        call: &'static str,
        /// Its error.
        code: NvSciError,
    },
    /// Flag sets as the application core might send them (unknown bits included: the core
    /// keeps and shows them, and refuses them when lowering).
    Flags {
        /// Memory import flags.
        import: MemoryImportFlags,
        /// Signal flags.
        signal: SignalFlags,
        /// Wait flags.
        wait: WaitFlags,
        /// NvSciSync attribute flags.
        sync: NvSciSyncAttrFlags,
    },
    /// The run ended with every check passed.
    Done {
        /// Frames handed over.
        frames: u32,
        /// Refusals seen (all expected).
        refusals: u32,
        /// Syncpoint signals committed.
        signals: u64,
        /// The syncpoint's value at the end.
        fence: u64,
    },
}

impl Event {
    /// The level the firmware logs this event at.
    pub const fn level(&self) -> Level {
        match self {
            Self::Refused { .. }
            | Self::SignalBatchFull { .. }
            | Self::WaitBatchFull { .. }
            | Self::CudaAnswer { .. }
            | Self::NvSciAnswer { .. } => Level::Warn,
            _ => Level::Info,
        }
    }
}

// The two renderings below must stay word for word the same: the checker compares the
// firmware's defmt log (the `defmt::Format` one) with the host's `Display` one. The core's
// errors are rendered by their own implementations (`ValidationError`: `Debug` on the host,
// its derived `defmt::Format` on the target; `CuResult` and `NvSciError`: `Display` and their
// `defmt::Format`), so the comparison also shows that the two renderings agree.

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Start { slots, frames } => write!(f, "start: ring of {slots} slots, {frames} frames"),
            Self::Import { size } => write!(f, "import: opaque fd, {size} bytes"),
            Self::Mapping { slot, offset, size } => {
                write!(f, "mapping: slot {slot}, offset {offset}, size {size}")
            }
            Self::BatchFilled { batch, len, count } => {
                write!(f, "batch: {batch} filled, len {len}, count {count}")
            }
            Self::Learned { initial, first } => {
                write!(f, "syncpoint: initial {initial:#x} learned, first signal {first:#x}")
            }
            Self::Frame { frame, slot, signal, fence, timeline, wait, stream } => write!(
                f,
                "frame {frame}: slot {slot}, signal {signal}, fence {fence:#x}, timeline {timeline}, wait {wait}, stream {stream}"
            ),
            Self::Aborted { frame, next } => {
                write!(f, "frame {frame}: enqueue failed, aborted, next fence still {next:#x}")
            }
            Self::Ordered { later, earlier } => {
                write!(f, "order: stream {later} after stream {earlier}")
            }
            Self::Refused { what, error } => write!(f, "refused: {what}: {error:?}"),
            Self::SignalBatchFull { capacity, entry } => {
                write!(f, "refused: signal batch full at {capacity}: {entry:?}")
            }
            Self::WaitBatchFull { capacity, entry } => {
                write!(f, "refused: wait batch full at {capacity}: {entry:?}")
            }
            Self::CudaAnswer { call, code } => write!(f, "answer: {call}: {code}"),
            Self::NvSciAnswer { call, code } => write!(f, "answer: {call}: {code}"),
            Self::Flags { import, signal, wait, sync } => {
                write!(f, "flags: {import:?}, {signal:?}, {wait:?}, {sync:?}")
            }
            Self::Done { frames, refusals, signals, fence } => write!(
                f,
                "done: {frames} frames, {refusals} refusals, {signals} signals, fence {fence:#x}"
            ),
        }
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for Event {
    fn format(&self, f: defmt::Formatter<'_>) {
        match *self {
            Self::Start { slots, frames } => {
                defmt::write!(f, "start: ring of {=usize} slots, {=u32} frames", slots, frames)
            }
            Self::Import { size } => defmt::write!(f, "import: opaque fd, {=u64} bytes", size),
            Self::Mapping { slot, offset, size } => defmt::write!(
                f,
                "mapping: slot {=usize}, offset {=u64}, size {=u64}",
                slot,
                offset,
                size
            ),
            Self::BatchFilled { batch, len, count } => defmt::write!(
                f,
                "batch: {=str} filled, len {=usize}, count {=u32}",
                batch,
                len,
                count
            ),
            Self::Learned { initial, first } => defmt::write!(
                f,
                "syncpoint: initial {=u64:#x} learned, first signal {=u64:#x}",
                initial,
                first
            ),
            Self::Frame { frame, slot, signal, fence, timeline, wait, stream } => defmt::write!(
                f,
                "frame {=u32}: slot {=usize}, signal {=u64}, fence {=u64:#x}, timeline {=u64}, wait {=u64}, stream {=u64}",
                frame,
                slot,
                signal,
                fence,
                timeline,
                wait,
                stream
            ),
            Self::Aborted { frame, next } => defmt::write!(
                f,
                "frame {=u32}: enqueue failed, aborted, next fence still {=u64:#x}",
                frame,
                next
            ),
            Self::Ordered { later, earlier } => {
                defmt::write!(f, "order: stream {=u64} after stream {=u64}", later, earlier)
            }
            Self::Refused { what, error } => {
                defmt::write!(f, "refused: {=str}: {}", what, error)
            }
            Self::SignalBatchFull { capacity, entry } => {
                defmt::write!(f, "refused: signal batch full at {=usize}: {}", capacity, entry)
            }
            Self::WaitBatchFull { capacity, entry } => {
                defmt::write!(f, "refused: wait batch full at {=usize}: {}", capacity, entry)
            }
            Self::CudaAnswer { call, code } => {
                defmt::write!(f, "answer: {=str}: {}", call, code)
            }
            Self::NvSciAnswer { call, code } => {
                defmt::write!(f, "answer: {=str}: {}", call, code)
            }
            Self::Flags { import, signal, wait, sync } => {
                defmt::write!(f, "flags: {}, {}, {}, {}", import, signal, wait, sync)
            }
            Self::Done { frames, refusals, signals, fence } => defmt::write!(
                f,
                "done: {=u32} frames, {=u32} refusals, {=u64} signals, fence {=u64:#x}",
                frames,
                refusals,
                signals,
                fence
            ),
        }
    }
}

/// Where the scenario's events go: the firmware's defmt logger, or the host checker's list.
pub trait Sink {
    /// Records one event.
    fn event(&mut self, event: Event);

    /// Records the filled wait batch whole, as `batch: <the batch>` at the info level: with
    /// the batch's `defmt::Format` on the target, its `Debug` on the host.
    fn wait_batch(&mut self, batch: &WaitBatch<RING_SLOTS>);
}

/// A step whose outcome was not the one the scenario expects (the run stops there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// Which step.
    pub step: &'static str,
    /// The error the core returned, if the step failed with one.
    pub error: Option<ValidationError>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.error {
            Some(e) => write!(f, "unexpected outcome at `{}`: {e:?}", self.step),
            None => write!(f, "unexpected outcome at `{}`", self.step),
        }
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for Mismatch {
    fn format(&self, f: defmt::Formatter<'_>) {
        match self.error {
            Some(e) => defmt::write!(f, "unexpected outcome at `{=str}`: {}", self.step, e),
            None => defmt::write!(f, "unexpected outcome at `{=str}`", self.step),
        }
    }
}

/// What a successful run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Frames handed over.
    pub frames: u32,
    /// Refusals seen (every one expected).
    pub refusals: u32,
    /// Syncpoint signals committed.
    pub signals: u64,
    /// The syncpoint's value at the end.
    pub fence: u64,
}

/// `Ok` from the core where the scenario expects it, else a [`Mismatch`] naming the step.
fn ok<T>(step: &'static str, r: Result<T, ValidationError>) -> Result<T, Mismatch> {
    r.map_err(|e| Mismatch {
        step,
        error: Some(e),
    })
}

/// `true` where the scenario expects it, else a [`Mismatch`] naming the step.
fn ensure(step: &'static str, holds: bool) -> Result<(), Mismatch> {
    if holds {
        Ok(())
    } else {
        Err(Mismatch { step, error: None })
    }
}

/// The run's state that refusals are counted in.
struct Run<'s, S: Sink> {
    sink: &'s mut S,
    refusals: u32,
}

impl<S: Sink> Run<'_, S> {
    /// Expects the core to refuse with exactly `expected`; logs the refusal.
    fn refused<T>(
        &mut self,
        what: &'static str,
        r: Result<T, ValidationError>,
        expected: ValidationError,
    ) -> Result<(), Mismatch> {
        match r {
            Err(error) if error == expected => {
                self.refusals += 1;
                self.sink.event(Event::Refused { what, error });
                Ok(())
            }
            Err(error) => Err(Mismatch {
                step: what,
                error: Some(error),
            }),
            Ok(_) => Err(Mismatch {
                step: what,
                error: None,
            }),
        }
    }

    /// Expects a push into a full batch to be refused as `Full`; logs the entry handed back.
    fn full<T>(
        &mut self,
        batch: &'static str,
        r: Result<usize, PushError<T>>,
        event: impl FnOnce(T) -> Event,
    ) -> Result<(), Mismatch> {
        match r {
            Err(PushError::Full(entry)) => {
                self.refusals += 1;
                self.sink.event(event(entry));
                Ok(())
            }
            Err(PushError::Invalid(_, e)) => Err(Mismatch {
                step: batch,
                error: Some(e),
            }),
            Ok(_) => Err(Mismatch {
                step: batch,
                error: None,
            }),
        }
    }
}

/// The semaphore handle of a slot. The core never dereferences handles (the driver owns
/// them), so the firmware names them by address alone.
fn semaphore(slot: usize) -> CUexternalSemaphore {
    core::ptr::without_provenance_mut(0x1000 + 0x40 * slot)
}

/// The syncpoint value of signal `k`, computed without the core: a `u32` that wraps.
fn syncpoint_after(k: u64) -> u64 {
    // The first signal (k = 1) read back FIRST_FENCE.
    let first = FIRST_FENCE as u32;
    u64::from(first.wrapping_add((k as u32).wrapping_sub(1)))
}

/// Runs the scenario, sending every step to `sink`. Every outcome is checked as it happens;
/// the first unexpected one ends the run.
pub fn run<S: Sink>(sink: &mut S) -> Result<Summary, Mismatch> {
    let mut run = Run { sink, refusals: 0 };
    run.sink.event(Event::Start {
        slots: RING_SLOTS,
        frames: FRAMES,
    });

    // Descriptors: the import, then one buffer per slot, each range checked against it.
    let import_size = SLOT_BYTES * RING_SLOTS as u64;
    run.refused(
        "import fd -1",
        MemoryImport::opaque_fd(-1, import_size),
        ValidationError::NegativeFd { fd: -1 },
    )?;
    run.refused(
        "import of 0 bytes",
        MemoryImport::opaque_fd(IMPORT_FD, 0),
        ValidationError::ZeroSize,
    )?;
    let import = ok("import", MemoryImport::opaque_fd(IMPORT_FD, import_size))?;
    run.sink.event(Event::Import {
        size: import.size(),
    });
    for slot in 0..RING_SLOTS {
        let offset = SLOT_BYTES * slot as u64;
        let desc = ok(
            "mapping",
            BufferMapping::new(offset, SLOT_BYTES).lower_for(&import),
        )?;
        ensure(
            "mapping read-back",
            desc.offset == offset && desc.size == SLOT_BYTES,
        )?;
        run.sink.event(Event::Mapping {
            slot,
            offset: desc.offset,
            size: desc.size,
        });
    }
    let past_end = import_size - SLOT_BYTES / 2;
    run.refused(
        "mapping past the end",
        BufferMapping::new(past_end, SLOT_BYTES).lower_for(&import),
        ValidationError::MappingOutOfRange {
            offset: past_end,
            size: SLOT_BYTES,
            import_size,
        },
    )?;
    run.refused(
        "mapping whose end overflows",
        BufferMapping::new(u64::MAX - 16, SLOT_BYTES).lower_for(&import),
        ValidationError::MappingOutOfRange {
            offset: u64::MAX - 16,
            size: SLOT_BYTES,
            import_size,
        },
    )?;

    // Semaphore batches: one timeline semaphore per slot, filled once, updated in place.
    let kind = SemaphoreHandleKind::TimelineSemaphoreFd;
    let mut signals = SignalBatch::<RING_SLOTS>::new();
    let mut waits = WaitBatch::<RING_SLOTS>::new();
    run.refused(
        "signal entry with a NULL handle",
        signals
            .push(core::ptr::null_mut(), kind, SignalParams::timeline(1))
            .map_err(|e| e.validation_error().unwrap_or(ValidationError::NullHandle)),
        ValidationError::NullHandle,
    )?;
    run.refused(
        "fence value on a binary semaphore",
        SignalParams::timeline(1).check_for(SemaphoreHandleKind::OpaqueFd),
        ValidationError::FenceValueNotSupported {
            kind: SemaphoreHandleKind::OpaqueFd,
        },
    )?;
    for slot in 0..RING_SLOTS {
        let i = signals
            .push(semaphore(slot), kind, SignalParams::timeline(0))
            .map_err(|e| Mismatch {
                step: "signal push",
                error: e.validation_error(),
            })?;
        let j = waits
            .push(semaphore(slot), kind, WaitParams::timeline(0))
            .map_err(|e| Mismatch {
                step: "wait push",
                error: e.validation_error(),
            })?;
        ensure("batch index", i == slot && j == slot)?;
    }
    run.sink.event(Event::BatchFilled {
        batch: "signal",
        len: signals.len(),
        count: signals.count(),
    });
    run.sink.event(Event::BatchFilled {
        batch: "wait",
        len: waits.len(),
        count: waits.count(),
    });
    run.sink.wait_batch(&waits);
    run.full(
        "signal batch full",
        signals.push(semaphore(RING_SLOTS), kind, SignalParams::timeline(1)),
        |entry| Event::SignalBatchFull {
            capacity: RING_SLOTS,
            entry,
        },
    )?;
    run.full(
        "wait batch full",
        waits.push(semaphore(RING_SLOTS), kind, WaitParams::timeline(1)),
        |entry| Event::WaitBatchFull {
            capacity: RING_SLOTS,
            entry,
        },
    )?;
    run.refused(
        "fence value for a slot past the end",
        waits.set_fence_value(RING_SLOTS, 1),
        ValidationError::IndexOutOfRange {
            index: RING_SLOTS,
            len: RING_SLOTS,
        },
    )?;

    // The 32-bit syncpoint: its initial value learned from the first signal's fence.
    run.refused(
        "syncpoint initial value above u32::MAX",
        DeterministicCounter::new(PrimitiveWidth::U32, 1 << 32),
        ValidationError::FenceValueTooWide { value: 1 << 32 },
    )?;
    let mut syncpoint = ok(
        "syncpoint",
        DeterministicCounter::new(PrimitiveWidth::U32, 0),
    )?;
    let initial = ok("learn", syncpoint.learn(1, FIRST_FENCE))?;
    ensure(
        "learned initial",
        syncpoint.value_of_signal(1) == FIRST_FENCE,
    )?;
    run.sink.event(Event::Learned {
        initial,
        first: syncpoint.next_signal_value(),
    });

    // Frames: the slot's signal and wait entries get the timeline's next value; the
    // syncpoint counts one signal per frame handed over.
    let mut timeline = TimelineTracker::new(0);
    let mut stream = STREAM_A;
    for frame in 0..FRAMES {
        let slot = frame as usize % RING_SLOTS;
        if frame == STREAM_SWITCH_FRAME {
            run.refused(
                "signal from a second stream, no ordering stated",
                syncpoint.reserve(STREAM_B),
                ValidationError::StreamNotOrdered {
                    stream: STREAM_B,
                    last: STREAM_A,
                },
            )?;
            ok("order", syncpoint.order_after(STREAM_B, STREAM_A))?;
            run.sink.event(Event::Ordered {
                later: STREAM_B.0,
                earlier: STREAM_A.0,
            });
            stream = STREAM_B;
        }
        let reserved = ok("reserve", syncpoint.reserve(stream))?;
        if frame == FAILED_ENQUEUE_FRAME {
            run.refused(
                "second reservation while one is pending",
                syncpoint.reserve(stream),
                ValidationError::ReservationPending,
            )?;
            let next = reserved.value();
            ok("abort", syncpoint.abort(reserved))?;
            ensure(
                "abort keeps the count",
                syncpoint.next_signal_value() == next,
            )?;
            run.sink.event(Event::Aborted { frame, next });
            continue;
        }
        let t = ok("timeline reserve", timeline.reserve_next())?;
        ok("signal value", signals.set_fence_value(slot, t.value()))?;
        ok("wait value", waits.set_fence_value(slot, t.value()))?;
        let tv = ok("timeline commit", timeline.commit(t))?;
        let signal = reserved.signal_index();
        let fence = ok("commit", syncpoint.commit(reserved))?;
        ensure("fence value after wrap", fence == syncpoint_after(signal))?;
        let wait = ok("wait read-back", waits.fence_value(slot))?.unwrap_or(u64::MAX);
        let signalled = ok("signal read-back", signals.fence_value(slot))?.unwrap_or(u64::MAX);
        ensure("batch read-back", wait == tv && signalled == tv)?;
        run.sink.event(Event::Frame {
            frame,
            slot,
            signal,
            fence,
            timeline: tv,
            wait,
            stream: stream.0,
        });
    }
    run.refused(
        "timeline value that goes back",
        timeline.reserve(1),
        ValidationError::FenceNotIncreasing {
            last: timeline.last(),
            requested: 1,
        },
    )?;

    // Result codes the application core sends back, known and unknown, logged as received.
    for (call, code) in [
        ("cuSignalExternalSemaphoresAsync", CuResult::INVALID_VALUE),
        ("cuWaitExternalSemaphoresAsync", CuResult(1234)),
    ] {
        run.sink.event(Event::CudaAnswer { call, code });
    }
    for (call, code) in [
        ("NvSciSyncObjAlloc", NvSciError::BAD_PARAMETER),
        ("NvSciSyncFenceWait", NvSciError(7)),
    ] {
        run.sink.event(Event::NvSciAnswer { call, code });
    }

    // Flag sets: none, all known, known plus unknown bits, unknown bits alone.
    for bits in [0, 0b1, 0b11, 0x11, 0x8] {
        run.sink.event(Event::Flags {
            import: MemoryImportFlags::from_bits_retain(bits),
            signal: SignalFlags::from_bits_retain(bits),
            wait: WaitFlags::from_bits_retain(bits),
            sync: NvSciSyncAttrFlags::from_bits_retain(bits),
        });
    }
    run.refused(
        "signal flags with an unknown bit",
        SignalFlags::checked(0x11),
        ValidationError::UnknownFlags { bits: 0x10 },
    )?;

    let summary = Summary {
        frames: FRAMES - 1,
        refusals: run.refusals,
        signals: syncpoint.signal_count(),
        fence: syncpoint.current_value(),
    };
    ensure("signal count", summary.signals == u64::from(summary.frames))?;
    run.sink.event(Event::Done {
        frames: summary.frames,
        refusals: summary.refusals,
        signals: summary.signals,
        fence: summary.fence,
    });
    Ok(summary)
}
