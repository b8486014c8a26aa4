//! Memory the simulator maps for itself: the system page size and
//! [`Region`], a mapping it owns (anonymous, or of a file with zero pages
//! past the file's end), with bounds-checked copies and views.
//!
//! Unsafe code is allowed here: `sysconf`, `mmap`/`munmap`, and the copies
//! and slices inside a mapping the region owns (see the `shm` module doc).

#![allow(unsafe_code)]

use std::io;
#[cfg(not(miri))]
use std::os::fd::AsRawFd;
use std::os::fd::BorrowedFd;

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

/// One mapping owned by the simulator, unmapped on drop; or (made by
/// [`Region::borrowed`]) a caller's memory the simulator only reads and
/// writes, never unmaps.
pub(crate) struct Region {
    base: *mut u8,
    len: usize,
    /// The caller's memory (`cuMemHostRegister`): not unmapped on drop.
    #[cfg(not(miri))]
    borrowed: bool,
    /// Under Miri, what the range lives in (see `shm::heap`); never read,
    /// held to keep that memory alive while the region is.
    #[cfg(miri)]
    #[allow(dead_code)]
    backing: Backing,
    /// Under Miri, for a device mapping ([`Region::map_file_device`]): a
    /// block of the same length whose addresses the callers see instead of
    /// the file's (see there).
    #[cfg(miri)]
    window: Option<super::heap::Block>,
}

/// Under Miri a region is heap memory: its own block (anonymous) or a
/// range of a file's registered block (a "shared mapping"). Never read:
/// held to keep the memory alive.
#[cfg(miri)]
#[allow(dead_code)]
enum Backing {
    Own(super::heap::Block),
    Shared(std::sync::Arc<super::heap::Block>),
    /// The caller's memory ([`Region::borrowed`]): nothing to keep alive.
    Caller,
}

// SAFETY: a Region is a plain address range; every access through it goes
// through raw pointers whose synchronisation is the caller's concern (as with
// device memory), and munmap may be called from any thread.
unsafe impl Send for Region {}
// SAFETY: see `Send`; `&Region` only hands out the address.
unsafe impl Sync for Region {}

impl Region {
    /// Private zeroed memory of at least `len` bytes (cuMemAlloc): under
    /// Miri, a page-aligned heap block.
    #[cfg(miri)]
    pub(crate) fn anonymous(len: usize) -> io::Result<Region> {
        let page = page_size();
        let len =
            round_up(len.max(1), page).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        let block = super::heap::Block::zeroed(len, page)?;
        Ok(Region {
            base: block.base(),
            len,
            backing: Backing::Own(block),
            window: None,
        })
    }

    /// Under Miri: `[offset, offset + len)` of a file made by
    /// [`super::memfd`], as a view of the file's heap block (shared with
    /// every other region of that file). A descriptor the heap registry
    /// does not know, or a range reaching past the file's last page (the
    /// zero pages of the real mapping cannot be spliced onto a heap block),
    /// is refused with EINVAL.
    #[cfg(miri)]
    pub(crate) fn map_file(
        fd: BorrowedFd<'_>,
        file_len: u64,
        offset: u64,
        len: usize,
    ) -> io::Result<(Region, *mut u8)> {
        let einval = || io::Error::from_raw_os_error(libc::EINVAL);
        let _ = file_len;
        let (_, block) = super::heap::lookup(fd).ok_or_else(einval)?;
        let page = page_size();
        let offset_us = usize::try_from(offset).map_err(|_| einval())?;
        let start = offset_us & !(page - 1);
        let delta = offset_us - start;
        let total = delta
            .checked_add(len.max(1))
            .and_then(|t| round_up(t, page))
            .ok_or_else(einval)?;
        if start.checked_add(total).is_none_or(|end| end > block.len()) {
            return Err(einval());
        }
        // SAFETY: `start + total <= block.len()` (checked), so both pointers
        // stay inside the block, which the region keeps alive.
        let (base, at) = unsafe { (block.base().add(start), block.base().add(offset_us)) };
        Ok((
            Region {
                base,
                len: total,
                backing: Backing::Shared(block),
                window: None,
            },
            at,
        ))
    }

    /// Private zeroed memory of at least `len` bytes (cuMemAlloc).
    #[cfg(not(miri))]
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
            borrowed: false,
        })
    }

    /// Maps `[offset, offset + len)` of a file of `file_len` bytes and returns
    /// the region plus the address of byte `offset` inside it.
    ///
    /// Pages of the range that lie wholly past the end of the file are backed
    /// by private zero pages instead of the file, so touching them never
    /// raises SIGBUS (the simulator's answer to an import declared larger
    /// than the exporter's allocation).
    #[cfg(not(miri))]
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

    /// A mapping of a file whose addresses are device pointers (CUDA's
    /// mapped buffers and arrays of imported memory): natively, exactly
    /// [`Region::map_file`].
    #[cfg(not(miri))]
    pub(crate) fn map_file_device(
        fd: BorrowedFd<'_>,
        file_len: u64,
        offset: u64,
        len: usize,
    ) -> io::Result<(Region, *mut u8)> {
        Region::map_file(fd, file_len, offset, len)
    }

    /// Under Miri: as [`Region::map_file`], but the addresses handed out
    /// come from a block of the region's own (its "window"), and every
    /// access through the region is translated to the file's block. The
    /// heap cannot map one file at two addresses, so without the window two
    /// device mappings of one file would share an address, where natively
    /// each mapping has its own, and the simulator's books, kept by device
    /// address, would take them for one allocation. The window's bytes are
    /// never used: the simulator reaches device memory only through its
    /// regions.
    #[cfg(miri)]
    pub(crate) fn map_file_device(
        fd: BorrowedFd<'_>,
        file_len: u64,
        offset: u64,
        len: usize,
    ) -> io::Result<(Region, *mut u8)> {
        let (mut region, at) = Region::map_file(fd, file_len, offset, len)?;
        let window = super::heap::Block::zeroed(region.len, page_size())?;
        let delta = at.addr() - region.base.addr();
        let at = window.base().wrapping_add(delta);
        region.window = Some(window);
        Ok((region, at))
    }

    /// The first address callers see for this region.
    #[cfg(not(miri))]
    fn start(&self) -> usize {
        self.base as usize
    }

    /// The first address callers see for this region: the window's, if
    /// it has one.
    #[cfg(miri)]
    fn start(&self) -> usize {
        self.window
            .as_ref()
            .map_or(self.base.addr(), |w| w.base().addr())
    }

    /// The memory behind address `addr` (which `contains` accepted).
    #[cfg(not(miri))]
    fn host(&self, addr: usize) -> *mut u8 {
        self.base.with_addr(addr)
    }

    /// The memory behind address `addr` (which `contains` accepted),
    /// translated from the window, if any.
    #[cfg(miri)]
    fn host(&self, addr: usize) -> *mut u8 {
        self.base.wrapping_add(addr - self.start())
    }

    /// The caller's `len` bytes at `base` (memory registered with
    /// `cuMemHostRegister`), read and written like the simulator's own
    /// memory, and left alone on drop.
    ///
    /// # Safety
    /// `base..base + len` must stay readable and writable memory of this
    /// process until the region is dropped (the registration's contract:
    /// the caller unregisters before the memory goes).
    pub(crate) unsafe fn borrowed(base: *mut u8, len: usize) -> Region {
        Region {
            base,
            len,
            #[cfg(not(miri))]
            borrowed: true,
            #[cfg(miri)]
            backing: Backing::Caller,
            #[cfg(miri)]
            window: None,
        }
    }

    /// First byte of the mapping.
    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }

    /// Whether `[addr, addr + n)` lies inside the mapping.
    pub(crate) fn contains(&self, addr: usize, n: usize) -> bool {
        let start = self.start();
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
        unsafe { core::ptr::copy(self.host(addr), out.as_mut_ptr(), out.len()) };
        true
    }

    /// Copies `data` to address `addr` (inside the mapping); `false`
    /// (nothing copied) when the range is not inside.
    pub(crate) fn write_at(&self, addr: usize, data: &[u8]) -> bool {
        if !self.contains(addr, data.len()) {
            return false;
        }
        // SAFETY: as in `read_at`, for a write.
        unsafe { core::ptr::copy(data.as_ptr(), self.host(addr), data.len()) };
        true
    }

    /// Sets the `n` bytes at address `addr` (inside the mapping) to `v`;
    /// `false` (nothing written) when the range is not inside.
    pub(crate) fn fill_at(&self, addr: usize, v: u8, n: usize) -> bool {
        if !self.contains(addr, n) {
            return false;
        }
        // SAFETY: as in `read_at`, for a write.
        unsafe { core::ptr::write_bytes(self.host(addr), v, n) };
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
        Some(unsafe { core::slice::from_raw_parts(self.host(addr), n) })
    }

    /// The `n` bytes at address `addr`, writable; `&mut self` makes this
    /// the only view through this region.
    pub(crate) fn bytes_mut(&mut self, addr: usize, n: usize) -> Option<&mut [u8]> {
        if !self.contains(addr, n) {
            return None;
        }
        // SAFETY: as in `bytes`; `&mut self` excludes other views of ours.
        Some(unsafe { core::slice::from_raw_parts_mut(self.host(addr), n) })
    }
}

#[cfg(not(miri))]
impl Drop for Region {
    fn drop(&mut self) {
        if self.borrowed {
            return; // the caller's memory: theirs to unmap
        }
        // SAFETY: `base`/`len` describe a mapping this Region created and owns.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}
