//! Shared memory under Miri: the heap stands in for memfd pages.
//!
//! Miri runs neither `memfd_create` nor `mmap` of a descriptor, so under
//! `cfg(miri)` (and only there) [`super::memfd`] makes an unlinked temporary
//! file of the requested length instead (a real descriptor: `fstat`, `dup`,
//! `fcntl(F_DUPFD_CLOEXEC)` and `close` behave as on a memfd) and keeps its
//! bytes in a zeroed heap block registered under the file's identity
//! (device and inode, which every duplicate shares). Mapping such a file
//! ([`super::Region::map_file`]) points into that block, so the exporter and
//! every importer see the same bytes, as with a shared mapping, and Miri
//! checks every access through them. The file name given to `memfd` is kept
//! in the registry: it is what `/proc/self/fd` shows for a real memfd, which
//! Miri cannot read for its own descriptors.
//!
//! The registry keeps a block until a new file takes the same identity (the
//! host reuses an inode only after the last descriptor of the old file is
//! closed); a Miri run is short, so that is enough.
//!
//! Unsafe code is allowed here: the allocation and release of the blocks.

#![allow(unsafe_code)]

use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// A zeroed, page-aligned heap block: the pages of one file.
pub(crate) struct Block {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: a Block is an owned allocation; accesses through its address are
// raw copies whose synchronisation is the caller's concern (as with a shared
// mapping), and it may be freed from any thread.
unsafe impl Send for Block {}
// SAFETY: see `Send`; `&Block` only hands out the address and length.
unsafe impl Sync for Block {}

impl Block {
    /// A zeroed block of `len` bytes (at least one) aligned to `align`.
    pub(crate) fn zeroed(len: usize, align: usize) -> io::Result<Block> {
        let layout = Layout::from_size_align(len.max(1), align)
            .map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::Error::from_raw_os_error(libc::ENOMEM));
        }
        Ok(Block { ptr, layout })
    }

    /// First byte.
    pub(crate) fn base(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes in the block.
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with this layout and is
        // freed only here.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// One file made by [`memfd`]: its name and its pages.
struct File {
    name: CString,
    block: Arc<Block>,
}

/// Files by (device, inode).
static FILES: Mutex<Option<HashMap<(u64, u64), File>>> = Mutex::new(None);

fn identity(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
    super::files::fstat(fd.as_raw_fd()).map(|st| (st.st_dev, st.st_ino))
}

/// The heap stand-in for `memfd_create` + `ftruncate`: an unlinked file of
/// `len` bytes whose pages are a registered heap block.
pub(crate) fn memfd(name: &CStr, len: u64) -> io::Result<OwnedFd> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let len_us = usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let page = super::page_size();
    let pages = len_us
        .checked_add(page - 1)
        .map(|x| x & !(page - 1))
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
    let path = std::env::temp_dir().join(format!(
        "tegra-interop-sim-miri-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    // Unlinked at once, as a memfd has no name in the file system.
    std::fs::remove_file(&path)?;
    file.set_len(len)?;
    let fd = OwnedFd::from(file);
    let key = identity(fd.as_fd()).ok_or_else(io::Error::last_os_error)?;
    let block = Arc::new(Block::zeroed(pages, page)?);
    let mut files = FILES.lock().unwrap_or_else(PoisonError::into_inner);
    files.get_or_insert_with(HashMap::new).insert(
        key,
        File {
            name: name.to_owned(),
            block,
        },
    );
    Ok(fd)
}

/// The name and pages of the file `fd` refers to, if [`memfd`] made it.
pub(crate) fn lookup(fd: BorrowedFd<'_>) -> Option<(CString, Arc<Block>)> {
    let key = identity(fd)?;
    let files = FILES.lock().unwrap_or_else(PoisonError::into_inner);
    let f = files.as_ref()?.get(&key)?;
    Some((f.name.clone(), Arc::clone(&f.block)))
}
