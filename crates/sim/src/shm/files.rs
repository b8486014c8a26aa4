//! Memfd files and descriptors: making a memfd sealed against shrinking,
//! recognising the ones the simulator's exporter made (by their name),
//! duplicating a descriptor and asking `fstat` what one is.
//!
//! Unsafe code is allowed here: the `memfd_create`, `ftruncate`, `fcntl`
//! and `fstat` calls on descriptors (see the `shm` module doc).

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
#[cfg(not(miri))]
use std::os::fd::AsRawFd;
use std::os::fd::{BorrowedFd, OwnedFd};

/// The memfd name of memory made by [`crate::export::memory`]: the mark of a
/// "GPU allocation" that an `OPAQUE_FD` memory import accepts. A name is
/// part of the open file description, so it survives `dup` and SCM_RIGHTS
/// passing to another process (`readlink /proc/self/fd/N` shows
/// `/memfd:<name> (deleted)` there too).
pub(crate) const EXPORTED_MEMORY_NAME: &CStr = c"tegra-interop-sim:exported-gpu-memory";
/// The memfd name of an exported semaphore
/// ([`SharedSemaphore::create`](super::SharedSemaphore::create)).
pub(crate) const EXPORTED_SEMAPHORE_NAME: &CStr = c"tegra-interop-sim:exported-semaphore";

/// Whether `fd` is a memfd the simulator's exporter made under `name`: the
/// name (read back through `/proc/self/fd`) matches and the file is sealed
/// against shrinking, as [`memfd`] leaves it. Any other file, a memfd made
/// by someone else, or a system without `/proc` answers `false`.
#[cfg(not(miri))]
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

/// Under Miri: the name comes from the heap registry (`/proc/self/fd` shows
/// the host's descriptors, not Miri's), and every file made by [`memfd`]
/// there is as good as sealed (nothing in the simulator shrinks it).
#[cfg(miri)]
pub(crate) fn is_exported_memfd(fd: BorrowedFd<'_>, name: &CStr) -> bool {
    super::heap::lookup(fd).is_some_and(|(n, _)| n.as_c_str() == name)
}

/// Creates a sealed-against-shrinking memfd of `len` bytes.
///
/// Under Miri (no `memfd_create`, no `mmap` of a descriptor) the same call
/// makes an unlinked temporary file whose pages are a heap block; see
/// `shm::heap`.
#[cfg(miri)]
pub(crate) fn memfd(name: &CStr, len: u64) -> io::Result<OwnedFd> {
    super::heap::memfd(name, len)
}

/// Creates a sealed-against-shrinking memfd of `len` bytes.
#[cfg(not(miri))]
pub(crate) fn memfd(name: &CStr, len: u64) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
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
    let Some(st) = fstat(fd) else {
        return FdInfo::Bad;
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return FdInfo::NotAFile;
    }
    FdInfo::File(u64::try_from(st.st_size).unwrap_or(0))
}

/// `fstat` of a raw descriptor number (`None`: not open, or negative).
pub(crate) fn fstat(fd: i32) -> Option<libc::stat> {
    if fd < 0 {
        return None;
    }
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer; fstat on an arbitrary number is harmless.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some(st)
}
