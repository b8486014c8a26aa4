//! The exporter side for tests: stands in for Vulkan (or any producer that
//! hands CUDA a file descriptor).
//!
//! Memory is a memfd; the exporter keeps its own mapping, so bytes written
//! here are seen by CUDA through an imported mapping and the other way round.
//! A semaphore is a one-page memfd holding the semaphore state, so the
//! exporter and the simulated driver (or another process) share it.
//!
//! The memfds carry distinctive names (`tegra-interop-sim:exported-gpu-memory`,
//! `tegra-interop-sim:exported-semaphore`) and are sealed against shrinking.
//! The simulator accepts only these as `OPAQUE_FD` memory / semaphore
//! imports (the name travels with the open file, so an fd passed to another
//! process is still recognised): any other memfd or file is not a GPU
//! allocation, and the real driver answers UNKNOWN for it.
//!
//! Each returned `OwnedFd` is the handle to import; a successful
//! `cuImportExternalMemory` / `cuImportExternalSemaphore` consumes (closes)
//! it, exactly like the real driver. Use `export_fd()` for another one.
//!
//! # Safety
//! The unsafe code here reads and writes the exporter's own mapping of the
//! memory it created (bounds-checked against its size) and declares that
//! mapping `Send`/`Sync` (plain shared memory).

#![allow(unsafe_code)]

use std::fmt;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::shm::{self, Region, SemaphoreKind, SharedSemaphore, WaitEnd};

/// An access outside the exported memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfRange {
    /// Requested offset.
    pub offset: usize,
    /// Requested length.
    pub len: usize,
    /// Size of the memory.
    pub size: usize,
}

impl fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "range {}..+{} is outside the exported memory of {} bytes",
            self.offset, self.len, self.size
        )
    }
}

impl std::error::Error for OutOfRange {}

/// A host signal of an exported timeline semaphore that would not move it
/// forward ([`ExportedTimelineSemaphore::signal`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimelineNotIncreasing {
    /// The value the signal asked for.
    pub value: u64,
    /// The counter's value, which the signal left as it was.
    pub current: u64,
}

impl fmt::Display for TimelineNotIncreasing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "host signal of the timeline to {} refused: the counter is already at {} and a \
             host signal must be greater (Vulkan, VUID-VkSemaphoreSignalInfo-value-03258)",
            self.value, self.current
        )
    }
}

impl std::error::Error for TimelineNotIncreasing {}

/// Exports `size` bytes of zeroed shared memory (a memfd).
///
/// Returns the descriptor to import (as `OPAQUE_FD` or `DMABUF_FD`) and the
/// exporter's own view of the bytes.
pub fn memory(size: usize) -> io::Result<(OwnedFd, ExportedMemory)> {
    if size == 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let fd = shm::memfd(shm::EXPORTED_MEMORY_NAME, size as u64)?;
    let (region, ptr) = Region::map_file(fd.as_fd(), size as u64, 0, size)?;
    let keep = shm::dup(fd.as_fd())?;
    Ok((
        fd,
        ExportedMemory {
            fd: keep,
            _region: region,
            ptr,
            size,
        },
    ))
}

/// The exporter's mapping of memory made by [`memory`].
pub struct ExportedMemory {
    fd: OwnedFd,
    _region: Region,
    ptr: *mut u8,
    size: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; all access
// goes through raw copies (the same contract as device memory: concurrent
// writers must synchronise, for example with a semaphore).
unsafe impl Send for ExportedMemory {}
// SAFETY: see `Send`.
unsafe impl Sync for ExportedMemory {}

impl fmt::Debug for ExportedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportedMemory")
            .field("size", &self.size)
            .finish()
    }
}

impl ExportedMemory {
    /// Size in bytes, as exported.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Address of the first byte of the exporter's mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), OutOfRange> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(OutOfRange {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    /// Copies `data` into the memory at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), OutOfRange> {
        self.check(offset, data.len())?;
        // SAFETY: the range was checked to lie inside the live mapping.
        unsafe { core::ptr::copy(data.as_ptr(), self.ptr.add(offset), data.len()) };
        Ok(())
    }

    /// Copies bytes at `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfRange> {
        self.check(offset, out.len())?;
        // SAFETY: the range was checked to lie inside the live mapping.
        unsafe { core::ptr::copy(self.ptr.add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// A copy of all bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.size];
        // SAFETY: `v` has exactly `size` bytes and the mapping too.
        unsafe { core::ptr::copy(self.ptr, v.as_mut_ptr(), self.size) };
        v
    }

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        // SAFETY: the whole mapping is `size` bytes long.
        unsafe { core::ptr::write_bytes(self.ptr, byte, self.size) };
    }

    /// Another descriptor for the same memory (to import it again).
    pub fn export_fd(&self) -> io::Result<OwnedFd> {
        shm::dup(self.fd.as_fd())
    }
}

fn deadline(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// Exports a binary semaphore (import it as `OPAQUE_FD`).
pub fn binary_semaphore() -> io::Result<(OwnedFd, ExportedBinarySemaphore)> {
    let (fd, sem) = SharedSemaphore::create(SemaphoreKind::Binary, 0)?;
    let keep = shm::dup(fd.as_fd())?;
    Ok((fd, ExportedBinarySemaphore { fd: keep, sem }))
}

/// Exports a timeline semaphore starting at `initial` (import it as
/// `TIMELINE_SEMAPHORE_FD`).
pub fn timeline_semaphore(initial: u64) -> io::Result<(OwnedFd, ExportedTimelineSemaphore)> {
    let (fd, sem) = SharedSemaphore::create(SemaphoreKind::Timeline, initial)?;
    let keep = shm::dup(fd.as_fd())?;
    Ok((fd, ExportedTimelineSemaphore { fd: keep, sem }))
}

/// The exporter's side of a binary semaphore.
pub struct ExportedBinarySemaphore {
    fd: OwnedFd,
    sem: SharedSemaphore,
}

impl fmt::Debug for ExportedBinarySemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportedBinarySemaphore")
            .field("signaled", &self.is_signaled())
            .finish()
    }
}

impl ExportedBinarySemaphore {
    /// Signals it (as a Vulkan queue submit with a signal would).
    pub fn signal(&self) {
        self.sem.signal_binary();
    }

    /// Whether it is signalled and not yet consumed by a wait.
    pub fn is_signaled(&self) -> bool {
        self.sem.value() != 0
    }

    /// Waits up to `timeout` for a signal and consumes it; `false` on timeout.
    pub fn wait(&self, timeout: Duration) -> bool {
        self.sem.wait(1, deadline(timeout), &|| false) == WaitEnd::Reached
    }

    /// Another descriptor for the same semaphore.
    pub fn export_fd(&self) -> io::Result<OwnedFd> {
        shm::dup(self.fd.as_fd())
    }
}

/// The exporter's side of a timeline semaphore.
pub struct ExportedTimelineSemaphore {
    fd: OwnedFd,
    sem: SharedSemaphore,
}

impl fmt::Debug for ExportedTimelineSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportedTimelineSemaphore")
            .field("value", &self.value())
            .finish()
    }
}

impl ExportedTimelineSemaphore {
    /// Host signal (as Vulkan's `vkSignalSemaphore`): sets the counter to
    /// `value`, which must be greater than the current counter.
    ///
    /// # Errors
    /// [`TimelineNotIncreasing`] (the counter unchanged) when `value` is
    /// not greater than the current counter, whoever set it (this
    /// exporter or a CUDA signal): Vulkan forbids such a signal
    /// (VUID-VkSemaphoreSignalInfo-value-03258), so the stand-in refuses it
    /// rather than move the timeline backwards. (A CUDA-side signal with a
    /// smaller value is accepted and does move it back, as measured.)
    pub fn signal(&self, value: u64) -> Result<(), TimelineNotIncreasing> {
        self.sem
            .advance(value)
            .map_err(|current| TimelineNotIncreasing { value, current })
    }

    /// The current counter.
    pub fn value(&self) -> u64 {
        self.sem.value()
    }

    /// Waits up to `timeout` until the counter is at least `value`;
    /// `false` on timeout.
    pub fn wait(&self, value: u64, timeout: Duration) -> bool {
        self.sem.wait(value, deadline(timeout), &|| false) == WaitEnd::Reached
    }

    /// Another descriptor for the same semaphore.
    pub fn export_fd(&self) -> io::Result<OwnedFd> {
        shm::dup(self.fd.as_fd())
    }
}
