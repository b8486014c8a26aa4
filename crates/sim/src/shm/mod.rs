//! Shared host memory: memfd files, mappings of them, and the semaphore
//! word that lives in a memfd so that every process mapping it sees it.
//!
//! Everything the simulator shares between a producer and a consumer is a
//! memfd: exported memory is the memfd's bytes, an exported semaphore is a
//! one-page memfd holding a small block (magic, kind,
//! value, wake-up sequence word). Waiters sleep on the sequence word with a
//! non-private futex, so the same file works across processes.
//!
//! The code is split by topic: `files` creates, recognises and inspects
//! memfd descriptors, `region` holds the mappings the simulator owns
//! ([`Region`]), and `semaphore` the semaphore block ([`SharedSemaphore`],
//! [`SemaphoreKind`]). This file only re-exports them; the unsafe code
//! described below is in those submodules, each of which allows it.
//!
//! # Safety
//! The unsafe code here is syscalls on the simulator's own descriptors and
//! mappings (memfd_create, ftruncate, fcntl, fstat, mmap, munmap, futex) and
//! access to memory the simulator mapped itself: a [`Region`] owns its
//! mapping until it is dropped, and every access through it is bounds-checked
//! against that mapping. Shared mappings may be written by the exporter or
//! another process at the same time (as device memory is); accesses are
//! copies through raw pointers, never references held across such writes,
//! except the plane views of a simulated EGL image that `&`/`&mut` of the
//! image hand out (as before).

#![allow(unsafe_code)]

mod files;
#[cfg(miri)]
mod heap;
mod region;
mod semaphore;

pub(crate) use files::{
    dup, inspect_fd, is_exported_memfd, memfd, FdInfo, EXPORTED_MEMORY_NAME,
    EXPORTED_SEMAPHORE_NAME,
};
pub(crate) use region::{page_size, Region};
pub use semaphore::SemaphoreKind;
pub(crate) use semaphore::{SharedSemaphore, WaitEnd};
