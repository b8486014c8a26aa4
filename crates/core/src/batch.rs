//! Fixed-capacity semaphore batches: the two contiguous arrays one
//! `cuSignalExternalSemaphoresAsync` / `cuWaitExternalSemaphoresAsync` call takes.
//!
//! The core never knows whether a semaphore handle is still alive; entries take the raw
//! handle together with the semaphore's kind so the parameters can be checked, and the driver
//! crate wraps this with lifetimes. A batch is meant to be filled once and reused per frame:
//! `set_fence_value(i, v)` updates one entry in place without re-checking the others.
//!
//! ```
//! use tegra_interop_core::{SemaphoreHandleKind, SignalBatch, SignalParams};
//! use tegra_interop_core::sys::cuda::CUexternalSemaphore;
//!
//! # let sem_a = core::ptr::NonNull::<tegra_interop_core::sys::cuda::CUextSemaphore_st>::dangling().as_ptr();
//! # let sem_b = sem_a;
//! let mut batch = SignalBatch::<8>::new();
//! let a = batch.push(sem_a, SemaphoreHandleKind::TimelineSemaphoreFd, SignalParams::timeline(1))?;
//! batch.push(sem_b, SemaphoreHandleKind::OpaqueFd, SignalParams::binary())?;
//! assert_eq!(batch.handles().len(), 2);
//! assert_eq!(batch.params().len(), 2);
//!
//! // Next frame: only the timeline value changes.
//! batch.set_fence_value(a, 2)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use core::fmt;

use tegra_interop_sys::cuda::{
    CUexternalSemaphore, CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS, CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS,
};
use tegra_interop_sys::nvsci::NvSciSyncFence;

use crate::error::ValidationError;
use crate::semaphore::{SemaphoreHandleKind, SignalParams, WaitParams};

/// Why an entry was not added; the entry comes back either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushError<T> {
    /// The batch is at capacity.
    Full(T),
    /// The entry breaks a rule.
    Invalid(T, ValidationError),
}

impl<T> PushError<T> {
    /// The entry that was not added.
    pub fn into_inner(self) -> T {
        match self {
            Self::Full(t) | Self::Invalid(t, _) => t,
        }
    }

    /// The rule broken, for [`PushError::Invalid`].
    pub fn validation_error(&self) -> Option<ValidationError> {
        match self {
            Self::Full(_) => None,
            Self::Invalid(_, e) => Some(*e),
        }
    }
}

impl<T> fmt::Display for PushError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Full(_) => f.write_str("the semaphore batch is full"),
            Self::Invalid(_, e) => write!(f, "the semaphore entry is invalid: {e}"),
        }
    }
}

impl<T: fmt::Debug> core::error::Error for PushError<T> {}

#[cfg(feature = "defmt")]
impl<T> defmt::Format for PushError<T> {
    fn format(&self, f: defmt::Formatter<'_>) {
        match self {
            Self::Full(_) => defmt::write!(f, "PushError::Full"),
            Self::Invalid(_, e) => defmt::write!(f, "PushError::Invalid({})", e),
        }
    }
}

/// One entry of a [`SignalBatch`], handed back by a refused push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SignalEntry {
    /// The imported semaphore.
    pub handle: CUexternalSemaphore,
    /// Its kind (what it was imported as).
    pub kind: SemaphoreHandleKind,
    /// What to signal.
    pub params: SignalParams,
}

/// One entry of a [`WaitBatch`], handed back by a refused push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct WaitEntry {
    /// The imported semaphore.
    pub handle: CUexternalSemaphore,
    /// Its kind (what it was imported as).
    pub kind: SemaphoreHandleKind,
    /// What to wait for.
    pub params: WaitParams,
}

macro_rules! batch {
    ($(#[$meta:meta])* $name:ident, $entry:ident, $params:ident, $raw:ty) => {
        $(#[$meta])*
        pub struct $name<const N: usize> {
            handles: heapless::Vec<CUexternalSemaphore, N>,
            params: heapless::Vec<$raw, N>,
            kinds: heapless::Vec<SemaphoreHandleKind, N>,
            /// How many entries have a kind without a fence value (kept with `kinds`, so
            /// `set_fence_values` answers without scanning them).
            fenceless: usize,
        }

        impl<const N: usize> $name<N> {
            const CAPACITY_FITS_U32: () = assert!(N as u64 <= u32::MAX as u64, "batch capacity must fit in u32");

            /// An empty batch.
            pub const fn new() -> Self {
                #[allow(clippy::let_unit_value)]
                let () = Self::CAPACITY_FITS_U32;
                Self {
                    handles: heapless::Vec::new(),
                    params: heapless::Vec::new(),
                    kinds: heapless::Vec::new(),
                    fenceless: 0,
                }
            }

            /// Checks `params` against `kind` and appends the entry; returns its index.
            /// A NULL handle is refused. When full, the entry comes back in `PushError::Full`.
            pub fn push(
                &mut self,
                handle: CUexternalSemaphore,
                kind: SemaphoreHandleKind,
                params: $params,
            ) -> Result<usize, PushError<$entry>> {
                self.push_entry($entry { handle, kind, params })
            }

            /// [`push`](Self::push) taking an entry.
            pub fn push_entry(&mut self, entry: $entry) -> Result<usize, PushError<$entry>> {
                if self.is_full() {
                    return Err(PushError::Full(entry));
                }
                if entry.handle.is_null() {
                    return Err(PushError::Invalid(entry, ValidationError::NullHandle));
                }
                if let Err(e) = entry.params.check_for(entry.kind) {
                    return Err(PushError::Invalid(entry, e));
                }
                let index = self.handles.len();
                // The three vectors always have the same length, so after the fullness
                // check above none of these pushes can fail; the item is still handed back
                // (and the vectors rolled back) rather than assumed.
                if self.params.push(<$raw>::default()).is_err() {
                    return Err(PushError::Full(entry));
                }
                if self.handles.push(entry.handle).is_err() {
                    self.params.truncate(index);
                    return Err(PushError::Full(entry));
                }
                if self.kinds.push(entry.kind).is_err() {
                    self.handles.truncate(index);
                    self.params.truncate(index);
                    return Err(PushError::Full(entry));
                }
                if !entry.kind.has_fence_value() {
                    self.fenceless += 1;
                }
                if let Some(raw) = self.params.last_mut() {
                    entry.params.fill(raw);
                }
                Ok(index)
            }

            /// The semaphore handles, contiguous (the `extSemArray` argument).
            pub fn handles(&self) -> &[CUexternalSemaphore] {
                self.handles.as_slice()
            }

            /// The parameters, contiguous and in the same order (the `paramsArray` argument).
            pub fn params(&self) -> &[$raw] {
                self.params.as_slice()
            }

            /// The kind of each entry.
            pub fn kinds(&self) -> &[SemaphoreHandleKind] {
                self.kinds.as_slice()
            }

            /// Number of entries.
            pub fn len(&self) -> usize {
                self.handles.len()
            }

            /// Number of entries as the C `unsigned int numExtSems` argument.
            pub fn count(&self) -> u32 {
                // N fits in u32 (checked at compile time in `new`), and len <= N.
                self.handles.len() as u32
            }

            /// `true` when there are no entries.
            pub fn is_empty(&self) -> bool {
                self.handles.is_empty()
            }

            /// `true` when no more entries fit.
            pub fn is_full(&self) -> bool {
                self.handles.len() >= N
            }

            /// The fixed capacity `N`.
            pub const fn capacity(&self) -> usize {
                N
            }

            /// Removes all entries (the storage stays).
            pub fn clear(&mut self) {
                self.handles.clear();
                self.params.clear();
                self.kinds.clear();
                self.fenceless = 0;
            }

            fn check_index(&self, index: usize) -> Result<SemaphoreHandleKind, ValidationError> {
                self.kinds
                    .get(index)
                    .copied()
                    .ok_or(ValidationError::IndexOutOfRange {
                        index,
                        len: self.kinds.len(),
                    })
            }

            fn raw_mut(&mut self, index: usize) -> Result<&mut $raw, ValidationError> {
                let len = self.params.len();
                self.params
                    .get_mut(index)
                    .ok_or(ValidationError::IndexOutOfRange { index, len })
            }

            /// Entry `index`'s parameter block, when its kind is a keyed mutex.
            fn keyed_mutex_raw(&mut self, index: usize) -> Result<&mut $raw, ValidationError> {
                let kind = self.check_index(index)?;
                if !kind.is_keyed_mutex() {
                    return Err(ValidationError::KeyedMutexNotSupported { kind });
                }
                self.raw_mut(index)
            }

            /// Entry `index`'s parameter block, when its kind is NvSciSync and the new fence
            /// pointer is not NULL.
            fn nvscisync_raw(
                &mut self,
                index: usize,
                fence_is_null: bool,
            ) -> Result<&mut $raw, ValidationError> {
                let kind = self.check_index(index)?;
                if !kind.is_nvscisync() {
                    return Err(ValidationError::NvSciSyncFenceNotSupported { kind });
                }
                if fence_is_null {
                    return Err(ValidationError::NvSciSyncFenceRequired);
                }
                self.raw_mut(index)
            }

            /// Replaces entry `index`'s parameters, checking only that entry.
            pub fn set(&mut self, index: usize, params: $params) -> Result<(), ValidationError> {
                let kind = self.check_index(index)?;
                let raw = params.lower_for(kind)?;
                *self.raw_mut(index)? = raw;
                Ok(())
            }

            /// Updates the fence value of entry `index` (timeline semaphores, D3D fences).
            pub fn set_fence_value(&mut self, index: usize, value: u64) -> Result<(), ValidationError> {
                let kind = self.check_index(index)?;
                if !kind.has_fence_value() {
                    return Err(ValidationError::FenceValueNotSupported { kind });
                }
                self.raw_mut(index)?.params.fence.value = value;
                Ok(())
            }

            /// Sets every entry's fence value at once, `values[i]` for entry `i`: the
            /// per-frame update of a batch lowered once (a fixed set of timeline
            /// semaphores). Checked before anything is written, so a refusal changes
            /// nothing: `values` must hold exactly one value per entry
            /// ([`ValidationError::IndexOutOfRange`] names the first index without a
            /// partner) and every entry's kind must carry a fence value.
            pub fn set_fence_values(&mut self, values: &[u64]) -> Result<(), ValidationError> {
                let len = self.params.len();
                if values.len() != len {
                    return Err(ValidationError::IndexOutOfRange {
                        index: values.len().min(len),
                        len,
                    });
                }
                if self.fenceless != 0 {
                    return Err(self.first_fenceless());
                }
                for (raw, &value) in self.params.iter_mut().zip(values) {
                    raw.params.fence.value = value;
                }
                Ok(())
            }

            /// The refusal naming the first entry whose kind has no fence value.
            #[cold]
            fn first_fenceless(&self) -> ValidationError {
                match self.kinds.iter().find(|k| !k.has_fence_value()) {
                    Some(&kind) => ValidationError::FenceValueNotSupported { kind },
                    // `fenceless` counts such entries, so one exists; an index past the end
                    // is the honest answer should the count ever disagree.
                    None => ValidationError::IndexOutOfRange {
                        index: self.kinds.len(),
                        len: self.kinds.len(),
                    },
                }
            }

            /// The fence value of entry `index` (`None` for kinds without one).
            pub fn fence_value(&self, index: usize) -> Result<Option<u64>, ValidationError> {
                let kind = self.check_index(index)?;
                Ok(if kind.has_fence_value() {
                    self.params.get(index).map(|p| p.params.fence.value)
                } else {
                    None
                })
            }
        }

        impl<const N: usize> Default for $name<N> {
            fn default() -> Self {
                Self::new()
            }
        }

        impl<const N: usize> fmt::Debug for $name<N> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("handles", &self.handles.as_slice())
                    .field("kinds", &self.kinds.as_slice())
                    .finish_non_exhaustive()
            }
        }

        /// The same fields as `Debug`, word for word (the firmware example compares the two).
        #[cfg(feature = "defmt")]
        impl<const N: usize> defmt::Format for $name<N> {
            fn format(&self, f: defmt::Formatter<'_>) {
                defmt::write!(
                    f,
                    "{=str} {{ handles: {}, kinds: {}, .. }}",
                    stringify!($name),
                    self.handles.as_slice(),
                    self.kinds.as_slice()
                )
            }
        }
    };
}

batch!(
    /// Up to `N` semaphores to signal in one `cuSignalExternalSemaphoresAsync` call.
    SignalBatch, SignalEntry, SignalParams, CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS
);

batch!(
    /// Up to `N` semaphores to wait on in one `cuWaitExternalSemaphoresAsync` call.
    ///
    /// ```
    /// use tegra_interop_core::{SemaphoreHandleKind, WaitBatch, WaitParams};
    /// # let sem = core::ptr::NonNull::<tegra_interop_core::sys::cuda::CUextSemaphore_st>::dangling().as_ptr();
    /// let mut batch = WaitBatch::<1>::new();
    /// batch.push(sem, SemaphoreHandleKind::TimelineSemaphoreFd, WaitParams::timeline(5)).unwrap();
    /// // Full: the entry comes back.
    /// let refused = batch.push(sem, SemaphoreHandleKind::OpaqueFd, WaitParams::binary()).unwrap_err();
    /// assert_eq!(refused.into_inner().kind, SemaphoreHandleKind::OpaqueFd);
    /// ```
    WaitBatch, WaitEntry, WaitParams, CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS
);

impl<const N: usize> SignalBatch<N> {
    /// Updates the keyed-mutex key of entry `index`.
    pub fn set_keyed_mutex_key(&mut self, index: usize, key: u64) -> Result<(), ValidationError> {
        self.keyed_mutex_raw(index)?.params.keyedMutex.key = key;
        Ok(())
    }

    /// Points entry `index` at another NvSciSync fence for the driver to fill.
    pub fn set_nvscisync_fence(
        &mut self,
        index: usize,
        fence: *mut NvSciSyncFence,
    ) -> Result<(), ValidationError> {
        self.nvscisync_raw(index, fence.is_null())?
            .params
            .nvSciSync
            .fence = fence.cast();
        Ok(())
    }
}

impl<const N: usize> WaitBatch<N> {
    /// Updates the keyed-mutex key and timeout of entry `index`.
    pub fn set_keyed_mutex(
        &mut self,
        index: usize,
        key: u64,
        timeout_ms: u32,
    ) -> Result<(), ValidationError> {
        let raw = self.keyed_mutex_raw(index)?;
        raw.params.keyedMutex.key = key;
        raw.params.keyedMutex.timeoutMs = timeout_ms;
        Ok(())
    }

    /// Points entry `index` at another NvSciSync fence to wait on.
    pub fn set_nvscisync_fence(
        &mut self,
        index: usize,
        fence: *const NvSciSyncFence,
    ) -> Result<(), ValidationError> {
        self.nvscisync_raw(index, fence.is_null())?
            .params
            .nvSciSync
            .fence = fence.cast_mut().cast();
        Ok(())
    }
}
