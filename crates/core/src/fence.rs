//! Fence bookkeeping: timeline values and deterministic NvSciSync fence counts.
//!
//! Both trackers use reserve / commit / abort: reserve the value before enqueueing the signal,
//! commit it when the enqueue call succeeded, abort it when it failed, so a failed enqueue never
//! advances the count.
//!
//! ```
//! use tegra_interop_core::{DeterministicCounter, PrimitiveWidth, StreamId, TimelineTracker};
//!
//! let mut timeline = TimelineTracker::new(0);
//! let r = timeline.reserve_next()?;
//! assert_eq!(r.value(), 1);
//! // ... enqueue the signal with value 1; it succeeded:
//! timeline.commit(r)?;
//! assert_eq!(timeline.last(), 1);
//!
//! let mut det = DeterministicCounter::new(PrimitiveWidth::U32, 0)?;
//! let producer = StreamId(1);
//! // A waiter can build the fence for the next signal before it is enqueued:
//! assert_eq!(det.next_signal_value(), 1);
//! let r = det.reserve(producer)?;
//! det.abort(r)?; // the enqueue failed: nothing advanced
//! assert_eq!(det.signal_count(), 0);
//! # Ok::<(), tegra_interop_core::ValidationError>(())
//! ```

use tegra_interop_sys::nvsci::NvSciSyncAttrValPrimitiveType;

use crate::error::ValidationError;

/// A reserved timeline value: commit it after a successful enqueue, abort it after a failed one.
#[must_use = "commit or abort the reservation"]
#[derive(Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TimelineReservation {
    value: u64,
    stream: Option<StreamId>,
}

impl TimelineReservation {
    /// The value to signal.
    pub fn value(&self) -> u64 {
        self.value
    }

    /// The stream that will signal, if the reservation was made with
    /// [`TimelineTracker::reserve_on`].
    pub fn stream(&self) -> Option<StreamId> {
        self.stream
    }
}

/// Which streams may signal after which: the rule shared by [`TimelineTracker`] and
/// [`DeterministicCounter`].
///
/// A signal from a stream other than the one that signalled last is refused with
/// [`ValidationError::StreamNotOrdered`], unless an ordering was stated with
/// [`order_after`](Self::order_after) or the check was turned off with the `unsafe`
/// [`assume_streams_ordered`](Self::assume_streams_ordered). Two streams run independently:
/// without an ordering, the later call's signal may execute first on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamOrder {
    last_stream: Option<StreamId>,
    orderings: heapless::Vec<(StreamId, StreamId), MAX_STREAM_ORDERINGS>,
    any_order: bool,
}

impl StreamOrder {
    /// No signal seen yet, no ordering stated.
    pub const fn new() -> Self {
        Self {
            last_stream: None,
            orderings: heapless::Vec::new(),
            any_order: false,
        }
    }

    /// The stream that signalled last.
    pub const fn last_stream(&self) -> Option<StreamId> {
        self.last_stream
    }

    /// State that every signal `later` enqueues is ordered after all signals `earlier`
    /// enqueued before it (e.g. `later` waits on an event recorded on `earlier` after its
    /// signal, or both are the same underlying queue). The statement is yours; the core cannot
    /// check it. At most [`MAX_STREAM_ORDERINGS`] orderings are kept.
    pub fn order_after(
        &mut self,
        later: StreamId,
        earlier: StreamId,
    ) -> Result<(), ValidationError> {
        // A stream is always ordered after itself; nothing to store.
        if later == earlier || self.orderings.contains(&(later, earlier)) {
            return Ok(());
        }
        self.orderings
            .push((later, earlier))
            .map_err(|_| ValidationError::CapacityExceeded {
                capacity: MAX_STREAM_ORDERINGS,
            })
    }

    /// Turn the multi-stream check off.
    ///
    /// # Safety
    ///
    /// Sound only if every stream that signals is ordered after the stream that signalled
    /// before it. Otherwise signals can complete out of call order (see the owning tracker's
    /// docs for what that breaks).
    pub unsafe fn assume_streams_ordered(&mut self) {
        self.any_order = true;
    }

    /// Whether `stream` may signal next.
    #[inline]
    pub fn check(&self, stream: StreamId) -> Result<(), ValidationError> {
        match self.last_stream {
            None => Ok(()),
            Some(last) if last == stream || self.any_order => Ok(()),
            Some(last) if self.orderings.contains(&(stream, last)) => Ok(()),
            Some(last) => Err(ValidationError::StreamNotOrdered { stream, last }),
        }
    }

    /// `stream` signalled (the enqueue succeeded).
    #[inline]
    fn signalled(&mut self, stream: StreamId) {
        self.last_stream = Some(stream);
    }
}

impl Default for StreamOrder {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for StreamOrder {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(
            f,
            "StreamOrder {{ last_stream: {}, orderings: {=usize}, any_order: {=bool} }}",
            self.last_stream,
            self.orderings.len(),
            self.any_order
        )
    }
}

/// Tracks the values signalled on one timeline semaphore (or D3D fence): strictly increasing.
///
/// The driver does not protect monotonicity (signalling 3 after 8 really moves the counter
/// back); this tracker refuses any value that is not greater than the last committed one (or
/// the highest value [`observe`](Self::observe)d).
///
/// **Call order is not device order.** Signals enqueued on two streams can execute in either
/// order: signal 5 on stream A (queued behind a wait) and 6 on stream B, and the counter can end
/// at 5. So, like [`DeterministicCounter`], a signal from a stream other than the one that
/// signalled last ([`reserve_on`](Self::reserve_on)) is refused with
/// [`ValidationError::StreamNotOrdered`] unless you stated an ordering with
/// [`order_after`](Self::order_after) (or opted out with the `unsafe`
/// [`assume_streams_ordered`](Self::assume_streams_ordered)).
///
/// **What the tracker cannot see.** It knows only the signals made through it. Signals of the
/// same semaphore made elsewhere (by the exporter, e.g. Vulkan; through another import of the
/// same semaphore, which has its own tracker; by another process) are invisible unless you
/// report them with [`observe`](Self::observe), and so are their positions in device order.
/// Report a value only once it is reached (or once the signals you make through this tracker
/// are ordered after it), and keep one tracker per semaphore.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TimelineTracker {
    last: u64,
    pending: Option<u64>,
    order: StreamOrder,
}

impl TimelineTracker {
    /// A tracker for a semaphore whose current value is `initial` (Vulkan's initial value).
    pub const fn new(initial: u64) -> Self {
        Self {
            last: initial,
            pending: None,
            order: StreamOrder::new(),
        }
    }

    /// The floor: the last committed or observed value. A signal must exceed it.
    pub const fn last(&self) -> u64 {
        self.last
    }

    /// The value of the outstanding reservation, if any.
    pub const fn pending(&self) -> Option<u64> {
        self.pending
    }

    /// The stream that signalled last through [`reserve_on`](Self::reserve_on).
    pub const fn last_stream(&self) -> Option<StreamId> {
        self.order.last_stream()
    }

    /// Reports a value signalled outside this tracker (by the exporter, another import of the
    /// same semaphore, another process): the floor rises to `value` if it is higher; a lower
    /// value changes nothing. Returns the new floor.
    ///
    /// Refused with [`ValidationError::ReservationPending`] while a reservation is outstanding
    /// (its value was checked against the old floor).
    pub fn observe(&mut self, value: u64) -> Result<u64, ValidationError> {
        if self.pending.is_some() {
            return Err(ValidationError::ReservationPending);
        }
        if value > self.last {
            self.last = value;
        }
        Ok(self.last)
    }

    /// State that every signal `later` enqueues runs after all signals `earlier` enqueued
    /// before it; afterwards a signal from `later` may follow one from `earlier`. See
    /// [`StreamOrder::order_after`].
    pub fn order_after(
        &mut self,
        later: StreamId,
        earlier: StreamId,
    ) -> Result<(), ValidationError> {
        self.order.order_after(later, earlier)
    }

    /// Turn the multi-stream check off for this tracker.
    ///
    /// # Safety
    ///
    /// Sound only if every stream that signals this semaphore is ordered after the stream that
    /// signalled before it. Otherwise a smaller value can execute after a larger one and move
    /// the device's counter back, and waiters can unblock early or never.
    pub unsafe fn assume_streams_ordered(&mut self) {
        // SAFETY: the caller's contract is the same as ours.
        unsafe { self.order.assume_streams_ordered() }
    }

    /// Reserve `value` for the next signal, without saying from which stream: it must be
    /// greater than the floor, and no other reservation may be outstanding.
    ///
    /// Only for callers with a single signalling queue: the stream rule is not checked here
    /// (use [`reserve_on`](Self::reserve_on) where several streams may signal).
    pub fn reserve(&mut self, value: u64) -> Result<TimelineReservation, ValidationError> {
        if self.pending.is_some() {
            return Err(ValidationError::ReservationPending);
        }
        if value <= self.last {
            return Err(ValidationError::FenceNotIncreasing {
                last: self.last,
                requested: value,
            });
        }
        self.pending = Some(value);
        Ok(TimelineReservation {
            value,
            stream: None,
        })
    }

    /// Reserve `value` for the next signal, enqueued on `stream`: as [`reserve`](Self::reserve),
    /// and `stream` must be the stream that signalled last or ordered after it.
    #[inline]
    pub fn reserve_on(
        &mut self,
        stream: StreamId,
        value: u64,
    ) -> Result<TimelineReservation, ValidationError> {
        self.check_on(stream, value)?;
        self.pending = Some(value);
        Ok(TimelineReservation {
            value,
            stream: Some(stream),
        })
    }

    /// Checks, without reserving anything, what [`reserve_on`](Self::reserve_on) checks:
    /// no reservation outstanding, `stream` may signal next, `value` exceeds the floor.
    ///
    /// For a caller that holds the tracker exclusively (`&mut`) from this check until the
    /// enqueue's answer: on success it calls [`record_on`](Self::record_on), on failure
    /// nothing (nothing was written). This is reserve/commit/abort without the reservation.
    #[inline]
    pub fn check_on(&self, stream: StreamId, value: u64) -> Result<(), ValidationError> {
        if self.pending.is_some() {
            return Err(ValidationError::ReservationPending);
        }
        self.order.check(stream)?;
        if value <= self.last {
            return Err(ValidationError::FenceNotIncreasing {
                last: self.last,
                requested: value,
            });
        }
        Ok(())
    }

    /// The enqueue of a signal of `value` on `stream`, checked with
    /// [`check_on`](Self::check_on) and held exclusively since, succeeded: `value` becomes the
    /// floor and `stream` the last signaller. Returns `value`.
    #[inline]
    pub fn record_on(&mut self, stream: StreamId, value: u64) -> u64 {
        self.last = value;
        self.order.signalled(stream);
        value
    }

    /// Reserve `last + 1`.
    pub fn reserve_next(&mut self) -> Result<TimelineReservation, ValidationError> {
        if self.pending.is_some() {
            return Err(ValidationError::ReservationPending);
        }
        let next = self
            .last
            .checked_add(1)
            .ok_or(ValidationError::FenceExhausted)?;
        self.reserve(next)
    }

    /// The enqueue succeeded: `reservation`'s value becomes the last value (and its stream, if
    /// it was made with [`reserve_on`](Self::reserve_on), the last signaller). Returns it.
    ///
    /// A reservation is recognised by its value: one that is not this tracker's outstanding
    /// reservation is refused with [`ValidationError::ReservationMismatch`].
    #[inline]
    pub fn commit(&mut self, reservation: TimelineReservation) -> Result<u64, ValidationError> {
        if self.pending != Some(reservation.value) {
            return Err(ValidationError::ReservationMismatch);
        }
        self.pending = None;
        self.last = reservation.value;
        if let Some(stream) = reservation.stream {
            self.order.signalled(stream);
        }
        Ok(reservation.value)
    }

    /// The enqueue failed: forget the reservation; the last value is unchanged.
    pub fn abort(&mut self, reservation: TimelineReservation) -> Result<(), ValidationError> {
        if self.pending != Some(reservation.value) {
            return Err(ValidationError::ReservationMismatch);
        }
        self.pending = None;
        Ok(())
    }
}

/// Width of an NvSciSync primitive's counter: fence values wrap at this width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PrimitiveWidth {
    /// 32-bit: syncpoints, sysmem and vidmem semaphores.
    U32,
    /// 64-bit: the `*Payload64b` semaphore kinds.
    U64,
}

impl PrimitiveWidth {
    /// The width of an NvSciSync primitive type.
    pub const fn from_primitive_type(
        ty: NvSciSyncAttrValPrimitiveType,
    ) -> Result<Self, ValidationError> {
        match ty.0 {
            1..=3 => Ok(Self::U32),
            4 | 5 => Ok(Self::U64),
            raw => Err(ValidationError::UnknownPrimitiveType { raw }),
        }
    }

    /// The largest value (`MaxPrimitiveValue`).
    pub const fn max_value(self) -> u64 {
        match self {
            Self::U32 => u32::MAX as u64,
            Self::U64 => u64::MAX,
        }
    }

    /// `value` reduced to this width (how the hardware wraps).
    #[inline]
    pub const fn wrap(self, value: u64) -> u64 {
        value & self.max_value()
    }
}

/// Identifies a stream to the core (the driver uses the `CUstream` address or an id of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct StreamId(pub u64);

/// A reserved deterministic signal: commit after a successful enqueue, abort after a failed one.
#[must_use = "commit or abort the reservation"]
#[derive(Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DeterministicReservation {
    index: u64,
    value: u64,
    stream: StreamId,
}

impl DeterministicReservation {
    /// The fence value this signal will produce.
    pub fn value(&self) -> u64 {
        self.value
    }

    /// Which signal it is (1 = the first signal counted by the counter).
    pub fn signal_index(&self) -> u64 {
        self.index
    }

    /// The stream that will signal.
    pub fn stream(&self) -> StreamId {
        self.stream
    }
}

/// How many stream orderings a [`DeterministicCounter`] can hold.
pub const MAX_STREAM_ORDERINGS: usize = 8;

/// Counts signals of an NvSciSync object with deterministic fences.
///
/// With `RequireDeterministicFences`, each signal increments the primitive by exactly 1, so
/// the fence of the k-th signal is `initial + k` (wrapped at the primitive's width) and a
/// waiter can build it (`NvSciSyncFenceUpdateFence(obj, 0, value)`) before the signal is even
/// enqueued.
///
/// **The initial value is learned, not assumed.** What a CUDA-signalled primitive starts at is
/// stated nowhere: read a fence of a known signal back (`NvSciSyncFenceExtractFence`) and pass
/// it to [`learn`](Self::learn). The std driver does this itself (its NvSciSync semaphores learn
/// from their first signal's fence).
///
/// **One stream at a time.** Signalling from several streams makes waiters unblock at the
/// wrong signal unless the streams are ordered; a signal from a stream other than the last
/// signaller is refused unless you declared, with [`order_after`](Self::order_after), that the
/// new stream's work runs after the last one's (or opted out with the `unsafe`
/// [`assume_streams_ordered`](Self::assume_streams_ordered)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeterministicCounter {
    width: PrimitiveWidth,
    initial: u64,
    count: u64,
    order: StreamOrder,
    pending: Option<u64>,
}

impl DeterministicCounter {
    /// A counter for a primitive of `width` whose value before the first counted signal is
    /// `initial_value` (see the type docs: verify it, do not assume it).
    pub fn new(width: PrimitiveWidth, initial_value: u64) -> Result<Self, ValidationError> {
        if initial_value > width.max_value() {
            return Err(ValidationError::FenceValueTooWide {
                value: initial_value,
            });
        }
        Ok(Self {
            width,
            initial: initial_value,
            count: 0,
            order: StreamOrder::new(),
            pending: None,
        })
    }

    /// A counter for an NvSci primitive type (`PrimitiveInfo` of the reconciled list).
    pub fn for_primitive(
        ty: NvSciSyncAttrValPrimitiveType,
        initial_value: u64,
    ) -> Result<Self, ValidationError> {
        Self::new(PrimitiveWidth::from_primitive_type(ty)?, initial_value)
    }

    /// The primitive width.
    pub fn width(&self) -> PrimitiveWidth {
        self.width
    }

    /// The value before the first counted signal.
    pub fn initial_value(&self) -> u64 {
        self.initial
    }

    /// How many signals were committed.
    pub fn signal_count(&self) -> u64 {
        self.count
    }

    /// The value the k-th signal produces (k = 1 is the first counted signal; k = 0 gives the
    /// initial value), wrapped at the primitive's width.
    #[inline]
    pub fn value_of_signal(&self, k: u64) -> u64 {
        self.width.wrap(self.initial.wrapping_add(k))
    }

    /// The value after all committed signals.
    pub fn current_value(&self) -> u64 {
        self.value_of_signal(self.count)
    }

    /// The value the next signal will produce: the fence to wait on for it, usable before that
    /// signal is enqueued.
    pub fn next_signal_value(&self) -> u64 {
        self.value_of_signal(self.count.wrapping_add(1))
    }

    /// The stream that signalled last.
    pub fn last_stream(&self) -> Option<StreamId> {
        self.order.last_stream()
    }

    /// State that every signal `later` enqueues is ordered after all signals `earlier` enqueued
    /// before it (e.g. `later` waits on an event recorded on `earlier` after its signal, or both
    /// are the same underlying queue). Afterwards a signal from `later` may follow one from
    /// `earlier`. The statement is yours; the core cannot check it.
    pub fn order_after(
        &mut self,
        later: StreamId,
        earlier: StreamId,
    ) -> Result<(), ValidationError> {
        self.order.order_after(later, earlier)
    }

    /// Turn the multi-stream check off for this counter.
    ///
    /// # Safety
    ///
    /// Sound only if every stream that signals this object is ordered after the stream that
    /// signalled before it (so the k-th signal really completes k-th). Otherwise a waiter built
    /// for signal k may unblock on another signal and read memory still being written.
    pub unsafe fn assume_streams_ordered(&mut self) {
        // SAFETY: the caller's contract is the same as ours.
        unsafe { self.order.assume_streams_ordered() }
    }

    /// Learn the initial value from an observation: signal `k` (counted from the initial value,
    /// k = 0 being the initial value itself) produced `value`, as read back from a fence of that
    /// signal (`NvSciSyncFenceExtractFence` on the fence the driver filled in or the library
    /// generated). Afterwards `value_of_signal(k) == value`; the signal count, the stream order
    /// and a pending reservation are kept. Returns the learned initial value.
    ///
    /// This is how the initial value of a CUDA-signalled primitive, stated nowhere, is obtained
    /// at run time instead of assumed.
    pub fn learn(&mut self, k: u64, value: u64) -> Result<u64, ValidationError> {
        if value > self.width.max_value() {
            return Err(ValidationError::FenceValueTooWide { value });
        }
        self.initial = self.width.wrap(value.wrapping_sub(self.width.wrap(k)));
        Ok(self.initial)
    }

    /// Reserve the next signal on `stream`.
    pub fn reserve(
        &mut self,
        stream: StreamId,
    ) -> Result<DeterministicReservation, ValidationError> {
        let index = self.check_next(stream)?;
        self.pending = Some(index);
        Ok(DeterministicReservation {
            index,
            value: self.value_of_signal(index),
            stream,
        })
    }

    /// Checks, without reserving anything, what [`reserve`](Self::reserve) checks (no
    /// reservation outstanding, `stream` may signal next, the count is not exhausted); returns
    /// the index the next signal would have.
    ///
    /// For a caller that holds the counter exclusively (`&mut`) from this check until the
    /// enqueue's answer: on success it calls [`record_next`](Self::record_next), on failure
    /// nothing (nothing was written).
    #[inline]
    pub fn check_next(&self, stream: StreamId) -> Result<u64, ValidationError> {
        if self.pending.is_some() {
            return Err(ValidationError::ReservationPending);
        }
        self.order.check(stream)?;
        self.count
            .checked_add(1)
            .ok_or(ValidationError::FenceExhausted)
    }

    /// The enqueue of the next signal on `stream`, checked with
    /// [`check_next`](Self::check_next) and held exclusively since, succeeded: the count
    /// advances and `stream` becomes the last signaller. Returns the value the signal produces.
    #[inline]
    pub fn record_next(&mut self, stream: StreamId) -> u64 {
        // `check_next` proved the increment does not overflow.
        self.count = self.count.saturating_add(1);
        self.order.signalled(stream);
        self.value_of_signal(self.count)
    }

    /// The enqueue succeeded: the count advances and `stream` becomes the last signaller.
    /// Returns the value this signal produces.
    pub fn commit(
        &mut self,
        reservation: DeterministicReservation,
    ) -> Result<u64, ValidationError> {
        if self.pending != Some(reservation.index) {
            return Err(ValidationError::ReservationMismatch);
        }
        self.pending = None;
        self.count = reservation.index;
        self.order.signalled(reservation.stream);
        Ok(reservation.value)
    }

    /// The enqueue failed: nothing advances.
    pub fn abort(&mut self, reservation: DeterministicReservation) -> Result<(), ValidationError> {
        if self.pending != Some(reservation.index) {
            return Err(ValidationError::ReservationMismatch);
        }
        self.pending = None;
        Ok(())
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for DeterministicCounter {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(
            f,
            "DeterministicCounter {{ width: {}, initial: {=u64}, count: {=u64}, last_stream: {} }}",
            self.width,
            self.initial,
            self.count,
            self.order.last_stream()
        )
    }
}
