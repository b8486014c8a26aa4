//! The semaphore that lives in a one-page memfd: its kinds
//! ([`SemaphoreKind`]), the layout of the page, and [`SharedSemaphore`]
//! with its signal, reserve and futex-based wait operations.
//!
//! Unsafe code is allowed here: atomics placed on the mapped page and the
//! `futex` syscalls on its wake-up word (see the `shm` module doc).

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{inspect_fd, is_exported_memfd, memfd, FdInfo, Region, EXPORTED_SEMAPHORE_NAME};

/// Bytes of a semaphore memfd.
pub(crate) const SEM_FILE_LEN: usize = 4096;
/// First word of a semaphore memfd.
const SEM_MAGIC: u64 = u64::from_le_bytes(*b"TISIMSEM");

/// What kind of semaphore a semaphore memfd holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SemaphoreKind {
    /// Binary: signalled or not; a wait consumes the signal.
    Binary,
    /// Timeline: a 64-bit counter; a signal stores a value, a wait waits
    /// until the counter is at least the value.
    Timeline,
    /// Deterministic (NvSciSync-like): each signal adds exactly one; a wait
    /// waits until the counter has reached the value. `wrap32` makes the
    /// counter a 32-bit one that wraps (compared modulo 2^32).
    Deterministic {
        /// The counter is 32 bits wide and wraps.
        wrap32: bool,
    },
}

impl SemaphoreKind {
    fn encode(self) -> u64 {
        match self {
            SemaphoreKind::Binary => 1,
            SemaphoreKind::Timeline => 2,
            SemaphoreKind::Deterministic { wrap32: false } => 3,
            SemaphoreKind::Deterministic { wrap32: true } => 4,
        }
    }

    fn decode(v: u64) -> Option<Self> {
        match v {
            1 => Some(SemaphoreKind::Binary),
            2 => Some(SemaphoreKind::Timeline),
            3 => Some(SemaphoreKind::Deterministic { wrap32: false }),
            4 => Some(SemaphoreKind::Deterministic { wrap32: true }),
            _ => None,
        }
    }
}

/// How a wait on a [`SharedSemaphore`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitEnd {
    /// The condition was met.
    Reached,
    /// The deadline passed first.
    TimedOut,
    /// The cancel check said stop.
    Cancelled,
}

/// A semaphore whose state lives in a shared memfd page.
///
/// Layout of the page: `[0] magic u64`, `[8] kind u64`, `[16] value u64`,
/// `[24] wake-up sequence u32` (the futex word), `[32] issued u64` (for
/// deterministic semaphores: the value handed out by the latest
/// [`SharedSemaphore::reserve_next`], i.e. the fence of the latest signal
/// that was enqueued anywhere).
pub(crate) struct SharedSemaphore {
    region: Region,
    kind: SemaphoreKind,
}

impl SharedSemaphore {
    /// Creates a new semaphore file and maps it; returns the file too.
    pub(crate) fn create(
        kind: SemaphoreKind,
        initial: u64,
    ) -> io::Result<(OwnedFd, SharedSemaphore)> {
        let fd = memfd(EXPORTED_SEMAPHORE_NAME, SEM_FILE_LEN as u64)?;
        let (region, _) = Region::map_file(fd.as_fd(), SEM_FILE_LEN as u64, 0, SEM_FILE_LEN)?;
        let sem = SharedSemaphore { region, kind };
        sem.word64(8).store(kind.encode(), Ordering::Relaxed);
        sem.word64(16)
            .store(sem.normalize(initial), Ordering::Relaxed);
        sem.word64(32)
            .store(sem.normalize(initial), Ordering::Relaxed);
        sem.word64(0).store(SEM_MAGIC, Ordering::Release);
        Ok((fd, sem))
    }

    /// Maps an existing semaphore file. `None` when the file is not one
    /// (not a memfd made by [`SharedSemaphore::create`], or without the
    /// semaphore block).
    pub(crate) fn open(fd: BorrowedFd<'_>) -> Option<SharedSemaphore> {
        if !is_exported_memfd(fd, EXPORTED_SEMAPHORE_NAME) {
            return None;
        }
        let FdInfo::File(len) = inspect_fd(fd.as_raw_fd()) else {
            return None;
        };
        if len < SEM_FILE_LEN as u64 {
            return None;
        }
        let (region, _) = Region::map_file(fd, len, 0, SEM_FILE_LEN).ok()?;
        let probe = SharedSemaphore {
            region,
            kind: SemaphoreKind::Binary,
        };
        if probe.word64(0).load(Ordering::Acquire) != SEM_MAGIC {
            return None;
        }
        let kind = SemaphoreKind::decode(probe.word64(8).load(Ordering::Relaxed))?;
        Some(SharedSemaphore {
            region: probe.region,
            kind,
        })
    }

    fn word64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: the region is at least one page, page-aligned, and stays
        // mapped for the lifetime of `self`; `off` is 8-aligned and at most 32.
        unsafe { AtomicU64::from_ptr(self.region.base().add(off).cast()) }
    }

    fn seq(&self) -> &AtomicU32 {
        // SAFETY: as in `word64`; offset 24 is 4-aligned.
        unsafe { AtomicU32::from_ptr(self.region.base().add(24).cast()) }
    }

    fn normalize(&self, v: u64) -> u64 {
        match self.kind {
            SemaphoreKind::Deterministic { wrap32: true } => v & 0xffff_ffff,
            _ => v,
        }
    }

    /// The kind stored in the file.
    pub(crate) fn kind(&self) -> SemaphoreKind {
        self.kind
    }

    /// The current counter (binary: 1 signalled, 0 not).
    pub(crate) fn value(&self) -> u64 {
        self.word64(16).load(Ordering::Acquire)
    }

    fn wake(&self) {
        self.seq().fetch_add(1, Ordering::Release);
        let addr: *const AtomicU32 = self.seq();
        // SAFETY: FUTEX_WAKE on a valid, mapped, 4-aligned word; no other
        // pointer arguments are read for this operation.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                addr,
                libc::FUTEX_WAKE,
                i32::MAX,
                0usize,
                0usize,
                0u32,
            );
        }
    }

    /// Binary: marks the semaphore signalled.
    pub(crate) fn signal_binary(&self) {
        self.word64(16).store(1, Ordering::Release);
        self.wake();
    }

    /// Timeline: stores `value` (even a smaller one, as the real driver does).
    pub(crate) fn store(&self, value: u64) {
        self.word64(16)
            .store(self.normalize(value), Ordering::Release);
        self.wake();
    }

    /// Timeline: stores `value` only if it is larger than the current
    /// counter (a compare-and-swap, so a racing signal from a stream is
    /// never overwritten); `Err(current)` otherwise.
    pub(crate) fn advance(&self, value: u64) -> Result<(), u64> {
        let w = self.word64(16);
        let value = self.normalize(value);
        let mut cur = w.load(Ordering::Acquire);
        loop {
            if value <= cur {
                return Err(cur);
            }
            match w.compare_exchange_weak(cur, value, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.wake();
                    return Ok(());
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Deterministic: adds one (wrapping at 32 bits for `wrap32`); returns
    /// the new value.
    pub(crate) fn increment(&self) -> u64 {
        let w = self.word64(16);
        let mut cur = w.load(Ordering::Acquire);
        loop {
            let next = self.normalize(cur.wrapping_add(1));
            match w.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.wake();
                    return next;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Deterministic: hands out the value the next enqueued signal will
    /// produce (one more than the previous reservation, wrapping for
    /// `wrap32`). Whoever reserves must later call [`Self::increment`] once.
    pub(crate) fn reserve_next(&self) -> u64 {
        let w = self.word64(32);
        let mut cur = w.load(Ordering::Acquire);
        loop {
            let next = self.normalize(cur.wrapping_add(1));
            match w.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return next,
                Err(now) => cur = now,
            }
        }
    }

    /// Whether `value` has been reached by the counter (kind-aware).
    pub(crate) fn reached(&self, target: u64) -> bool {
        let cur = self.value();
        match self.kind {
            SemaphoreKind::Binary => cur != 0,
            SemaphoreKind::Timeline | SemaphoreKind::Deterministic { wrap32: false } => {
                cur >= target
            }
            SemaphoreKind::Deterministic { wrap32: true } => {
                // Modulo-2^32 comparison: reached when the distance from the
                // target forward to the counter is less than half the range.
                ((cur as u32).wrapping_sub(target as u32) as i32) >= 0
            }
        }
    }

    /// Waits until the semaphore reaches `target` (binary: until signalled,
    /// then consumes the signal), `deadline` passes or `cancel()` is true.
    pub(crate) fn wait(
        &self,
        target: u64,
        deadline: Option<Instant>,
        cancel: &dyn Fn() -> bool,
    ) -> WaitEnd {
        loop {
            let seq = self.seq().load(Ordering::Acquire);
            match self.kind {
                SemaphoreKind::Binary => {
                    if self
                        .word64(16)
                        .compare_exchange(1, 0, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        return WaitEnd::Reached;
                    }
                }
                _ => {
                    if self.reached(target) {
                        return WaitEnd::Reached;
                    }
                }
            }
            if cancel() {
                return WaitEnd::Cancelled;
            }
            let mut slice = Duration::from_millis(20);
            if let Some(d) = deadline {
                let now = Instant::now();
                if now >= d {
                    return WaitEnd::TimedOut;
                }
                slice = slice.min(d - now);
            }
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::c_long::try_from(slice.as_nanos()).unwrap_or(20_000_000),
            };
            let addr: *const AtomicU32 = self.seq();
            // SAFETY: FUTEX_WAIT on a valid mapped word with a valid relative
            // timeout; it only sleeps while the word still equals `seq`.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    addr,
                    libc::FUTEX_WAIT,
                    seq,
                    &ts as *const libc::timespec,
                    0usize,
                    0u32,
                );
            }
        }
    }
}
