//! The one release-once owner of every C object the driver creates.
//!
//! Each handle type ([`Context`](crate::Context), [`Stream`](crate::Stream),
//! [`ExternalMemory`](crate::ExternalMemory), [`MappedBuffer`](crate::MappedBuffer),
//! [`MappedArray`](crate::MappedArray), [`ExternalSemaphore`](crate::ExternalSemaphore))
//! describes its C object with a small struct implementing [`Release`] and
//! keeps it in an [`Owned`]. The rules are written here once:
//!
//! - the release call is made at most once: by `destroy` (which reports the
//!   driver's answer) or else by `Drop`; a failed destroy is not retried;
//! - `CUDA_ERROR_DEINITIALIZED` (the driver already shut down, the object
//!   went with it) is success for `destroy` and silent in `Drop`;
//! - `Drop` never panics: other failures are kept on the backend
//!   ([`Backend::take_drop_errors`](crate::Backend::take_drop_errors));
//! - what the object depends on (its context, its memory) is a field of the
//!   described struct, so it is dropped only after the release call.
#![deny(unsafe_code)]

use std::ops::Deref;

use crate::{logging, Backend, Error};

/// A C object that is released with one call.
pub(crate) trait Release {
    /// Makes the release call. Called at most once per value.
    fn release(&mut self) -> Result<(), Error>;
    /// Where `Drop` keeps a failure.
    fn backend(&self) -> &Backend;
}

/// Owns a `T` and releases it exactly once (see the module docs).
pub(crate) struct Owned<T: Release> {
    value: T,
    released: bool,
}

impl<T: Release> Owned<T> {
    /// Takes ownership of a created object.
    pub(crate) fn new(value: T) -> Self {
        Owned {
            value,
            released: false,
        }
    }

    /// Mutable access to the description (never to release it).
    pub(crate) fn get_mut(&mut self) -> &mut T {
        &mut self.value
    }

    /// Releases now and reports the answer; `DEINITIALIZED` counts as
    /// success.
    pub(crate) fn destroy(mut self) -> Result<(), Error> {
        self.released = true;
        match self.value.release() {
            Err(e) if e.is_driver_shut_down() => Ok(()),
            other => other,
        }
    }
}

impl<T: Release> Deref for Owned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: Release> Drop for Owned<T> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        if let Err(e) = self.value.release() {
            if e.is_driver_shut_down() {
                logging::trace!(
                    target: logging::DROP,
                    "Drop after the driver shut down (the object went with it): {e}"
                );
            } else {
                self.value.backend().record_drop_error(e);
            }
        }
    }
}

impl<T: Release + std::fmt::Debug> std::fmt::Debug for Owned<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.value.fmt(f)
    }
}
