//! The C arrays of one semaphore batch call ([`Lowered`]).
//!
//! # Safety
//!
//! The arrays are `MaybeUninit` so that a batch touches only the entries
//! pushed; [`Lowered::as_call`] hands the C call pointers to them with the
//! count of entries written, so the callee reads only initialised entries.
//! No `unsafe` block is needed here: the pointers are made safely, and the
//! reading happens in the `unsafe` call of the batch wrapper, whose call
//! site relies on this count.

use std::mem::MaybeUninit;

use tegra_interop_sys::cuda::CUexternalSemaphore;

use crate::Error;

/// The two C arrays of one semaphore batch call (handles and parameter
/// blocks), on the stack with room for `CAP` entries and only the entries
/// pushed ever written: building a batch of 8 touches 8 blocks, not `CAP`.
pub(crate) struct Lowered<P, const CAP: usize> {
    handles: [MaybeUninit<CUexternalSemaphore>; CAP],
    params: [MaybeUninit<P>; CAP],
    len: usize,
}

impl<P: Default, const CAP: usize> Lowered<P, CAP> {
    /// Empty arrays (nothing written).
    #[inline]
    pub(crate) fn new() -> Self {
        Lowered {
            handles: [const { MaybeUninit::uninit() }; CAP],
            params: [const { MaybeUninit::uninit() }; CAP],
            len: 0,
        }
    }

    /// Appends `handle` and a parameter block, zeroed and then filled by
    /// `lower`. Refused past `CAP` (the caller checks the length first).
    #[inline]
    pub(crate) fn push<E>(
        &mut self,
        handle: CUexternalSemaphore,
        lower: impl FnOnce(&mut P) -> Result<(), E>,
    ) -> Result<(), Error>
    where
        Error: From<E>,
    {
        let (Some(h), Some(p)) = (
            self.handles.get_mut(self.len),
            self.params.get_mut(self.len),
        ) else {
            return Err(Error::Validation(
                tegra_interop_core::ValidationError::CapacityExceeded { capacity: CAP },
            ));
        };
        let block = p.write(P::default());
        lower(block)?;
        h.write(handle);
        self.len += 1;
        Ok(())
    }

    /// The two arrays for the call and their entry count: exactly the
    /// entries pushed, all written.
    #[inline]
    pub(crate) fn as_call(&self) -> (*const CUexternalSemaphore, *const P, u32) {
        const { assert!(CAP <= u32::MAX as usize) };
        // `len <= CAP`, which fits (checked at compile time above).
        let count = self.len as u32;
        (
            self.handles.as_ptr().cast(),
            self.params.as_ptr().cast(),
            count,
        )
    }
}
