//! Shared host memory: memfd files, mappings of them, and the semaphore
//! word that lives in a memfd so that every process mapping it sees it.
//!
//! Everything the simulator shares between a producer and a consumer is a
//! memfd: exported memory is the memfd's bytes, an exported semaphore is a
//! one-page memfd holding a small block (magic, kind,
//! value, wake-up sequence word). Waiters sleep on the sequence word with a
//! non-private futex, so the same file works across processes.
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

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes of a semaphore memfd.
pub(crate) const SEM_FILE_LEN: usize = 4096;
/// First word of a semaphore memfd.
const SEM_MAGIC: u64 = u64::from_le_bytes(*b"TISIMSEM");

/// The memfd name of memory made by [`crate::export::memory`]: the mark of a
/// "GPU allocation" that an `OPAQUE_FD` memory import accepts. A name is
/// part of the open file description, so it survives `dup` and SCM_RIGHTS
/// passing to another process (`readlink /proc/self/fd/N` shows
/// `/memfd:<name> (deleted)` there too).
pub(crate) const EXPORTED_MEMORY_NAME: &CStr = c"tegra-interop-sim:exported-gpu-memory";
/// The memfd name of an exported semaphore ([`SharedSemaphore::create`]).
pub(crate) const EXPORTED_SEMAPHORE_NAME: &CStr = c"tegra-interop-sim:exported-semaphore";

/// Whether `fd` is a memfd the simulator's exporter made under `name`: the
/// name (read back through `/proc/self/fd`) matches and the file is sealed
/// against shrinking, as [`memfd`] leaves it. Any other file, a memfd made
/// by someone else, or a system without `/proc` answers `false`.
pub(crate) fn is_exported_memfd(fd: BorrowedFd<'_>, name: &CStr) -> bool {
    let Ok(target) = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) else {
        return false;
    };
    let want = format!("/memfd:{} (deleted)", name.to_string_lossy());
    if target.as_os_str().as_encoded_bytes() != want.as_bytes() {
        return false;
    }
    // SAFETY: plain fcntl on a descriptor the caller keeps open.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    seals >= 0 && seals & libc::F_SEAL_SHRINK != 0
}

/// Creates a sealed-against-shrinking memfd of `len` bytes.
pub(crate) fn memfd(name: &CStr, len: u64) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid NUL-terminated string; the flags are plain bits.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a new descriptor that nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let len_off =
        libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `fd` is a valid open memfd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len_off) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // Sealing against shrinking means a mapping of the first `len` bytes can
    // never turn into SIGBUS because somebody truncated the file.
    // SAFETY: plain fcntl on a valid descriptor.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Duplicates `fd` (close-on-exec).
pub(crate) fn dup(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    fd.try_clone_to_owned()
}

/// What `fstat` says about a descriptor the simulator is asked to import.
pub(crate) enum FdInfo {
    /// Not an open descriptor.
    Bad,
    /// Open, but not a regular file (memfds are regular files).
    NotAFile,
    /// A regular file of this many bytes.
    File(u64),
}

/// Inspects a raw descriptor without taking ownership.
pub(crate) fn inspect_fd(fd: i32) -> FdInfo {
    if fd < 0 {
        return FdInfo::Bad;
    }
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer; fstat on an arbitrary number is harmless.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return FdInfo::Bad;
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return FdInfo::NotAFile;
    }
    FdInfo::File(u64::try_from(st.st_size).unwrap_or(0))
}

/// The system page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

fn round_up(v: usize, page: usize) -> Option<usize> {
    v.checked_add(page - 1).map(|x| x & !(page - 1))
}

/// One mapping owned by the simulator; unmapped on drop.
pub(crate) struct Region {
    base: *mut u8,
    len: usize,
}

// SAFETY: a Region is a plain address range; every access through it goes
// through raw pointers whose synchronisation is the caller's concern (as with
// device memory), and munmap may be called from any thread.
unsafe impl Send for Region {}
// SAFETY: see `Send`; `&Region` only hands out the address.
unsafe impl Sync for Region {}

impl Region {
    /// Private zeroed memory of at least `len` bytes (cuMemAlloc).
    pub(crate) fn anonymous(len: usize) -> io::Result<Region> {
        let len = round_up(len.max(1), page_size())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: an anonymous private mapping with no address hint.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Region {
            base: p.cast(),
            len,
        })
    }

    /// Maps `[offset, offset + len)` of a file of `file_len` bytes and returns
    /// the region plus the address of byte `offset` inside it.
    ///
    /// Pages of the range that lie wholly past the end of the file are backed
    /// by private zero pages instead of the file, so touching them never
    /// raises SIGBUS (the simulator's answer to an import declared larger
    /// than the exporter's allocation).
    pub(crate) fn map_file(
        fd: BorrowedFd<'_>,
        file_len: u64,
        offset: u64,
        len: usize,
    ) -> io::Result<(Region, *mut u8)> {
        let einval = || io::Error::from_raw_os_error(libc::EINVAL);
        let page = page_size();
        let offset_us = usize::try_from(offset).map_err(|_| einval())?;
        let start = offset_us & !(page - 1);
        let delta = offset_us - start;
        let total = delta
            .checked_add(len.max(1))
            .and_then(|t| round_up(t, page))
            .ok_or_else(einval)?;
        let region = Region::anonymous(total)?;
        let file_len = usize::try_from(file_len).unwrap_or(usize::MAX);
        if start < file_len {
            let file_part = round_up(file_len - start, page).unwrap_or(total).min(total);
            let start_off = libc::off_t::try_from(start).map_err(|_| einval())?;
            // SAFETY: the target range lies inside `region`, which we own, so
            // MAP_FIXED only replaces our own reservation; the file part
            // covers only pages that hold file bytes.
            let p = unsafe {
                libc::mmap(
                    region.base.cast(),
                    file_part,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd.as_raw_fd(),
                    start_off,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: `delta < page <= total`, so the result stays inside the region.
        let at = unsafe { region.base.add(delta) };
        Ok((region, at))
    }

    /// First byte of the mapping.
    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }

    /// Whether `[addr, addr + n)` lies inside the mapping.
    pub(crate) fn contains(&self, addr: usize, n: usize) -> bool {
        let start = self.base as usize;
        addr >= start
            && addr
                .checked_add(n)
                .is_some_and(|end| end <= start + self.len)
    }

    /// Copies the `out.len()` bytes at address `addr` (inside the mapping)
    /// into `out`; `false` (nothing copied) when the range is not inside.
    pub(crate) fn read_at(&self, addr: usize, out: &mut [u8]) -> bool {
        if !self.contains(addr, out.len()) {
            return false;
        }
        // SAFETY: the range lies inside our live mapping (checked); `out`
        // is a distinct Rust buffer.
        unsafe { core::ptr::copy(addr as *const u8, out.as_mut_ptr(), out.len()) };
        true
    }

    /// Copies `data` to address `addr` (inside the mapping); `false`
    /// (nothing copied) when the range is not inside.
    pub(crate) fn write_at(&self, addr: usize, data: &[u8]) -> bool {
        if !self.contains(addr, data.len()) {
            return false;
        }
        // SAFETY: as in `read_at`, for a write.
        unsafe { core::ptr::copy(data.as_ptr(), addr as *mut u8, data.len()) };
        true
    }

    /// Sets the `n` bytes at address `addr` (inside the mapping) to `v`;
    /// `false` (nothing written) when the range is not inside.
    pub(crate) fn fill_at(&self, addr: usize, v: u8, n: usize) -> bool {
        if !self.contains(addr, n) {
            return false;
        }
        // SAFETY: as in `read_at`, for a write.
        unsafe { core::ptr::write_bytes(addr as *mut u8, v, n) };
        true
    }

    /// The `n` bytes at address `addr` (inside the mapping), borrowed from
    /// the region (the plane views of a simulated EGL image).
    pub(crate) fn bytes(&self, addr: usize, n: usize) -> Option<&[u8]> {
        if !self.contains(addr, n) {
            return None;
        }
        // SAFETY: inside our live mapping (checked), which lives as long as
        // the borrow of `self`.
        Some(unsafe { core::slice::from_raw_parts(addr as *const u8, n) })
    }

    /// The `n` bytes at address `addr`, writable; `&mut self` makes this
    /// the only view through this region.
    pub(crate) fn bytes_mut(&mut self, addr: usize, n: usize) -> Option<&mut [u8]> {
        if !self.contains(addr, n) {
            return None;
        }
        // SAFETY: as in `bytes`; `&mut self` excludes other views of ours.
        Some(unsafe { core::slice::from_raw_parts_mut(addr as *mut u8, n) })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` describe a mapping this Region created and owns.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

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
