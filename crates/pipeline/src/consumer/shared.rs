//! Host views of frame memory that a device or another thread shares:
//! [`PeekedFrame`] (a collected frame lent for reading beyond a call) and
//! `CpuFrame` (the producer's view of an NvSciBuf buffer through its CPU
//! mapping, and the simulator's host-function processing over it).
//!
//! Their soundness rests on the ring's protocol ([`crate::ring`]): a slot's
//! bytes are written by one side at a time, the producer between its wait
//! for *free* and its *ready* signal, the consumer between the wait for
//! *ready* and the *free* signal; the views below hand out slices only on
//! the side that holds the slot, and borrow the view for as long as the
//! slice lives.

use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tegra_interop::driver::nvsci::BufObj;
use tegra_interop::driver::{PinnedHostBuffer, RegisteredHostMemory, Stream};

use crate::error::{DriverError, DriverResultExt, TransportError};

/// How long a transport waits for a lent frame to be given back (every
/// [`PeekedFrame`] of it dropped) before it writes the frame's memory or
/// lets the device at it: the ring gives a lent frame back before its
/// slot's next ticket, so this is only reached when a caller keeps a lent
/// frame past that ticket (the transport then refuses with a timeout).
pub const LEND_RETURN_WAIT: Duration = Duration::from_secs(5);

/// Memory a frame can be lent from: its bytes, readable through `&self`
/// from any thread.
pub(crate) trait LentBytes: Send + Sync + 'static {
    /// The whole of the memory's bytes.
    fn lent_bytes(&self) -> &[u8];
}

impl LentBytes for Box<[u8]> {
    fn lent_bytes(&self) -> &[u8] {
        self
    }
}

impl LentBytes for Vec<u8> {
    fn lent_bytes(&self) -> &[u8] {
        self
    }
}

/// A collected frame's bytes, lent by a transport's `lend` for reading
/// **beyond that call**, on another thread: the producer's read-back check
/// runs while the camera writes the next frames and the handover goes on.
///
/// Safe by its type: it shares ownership of the memory it was lent from
/// (the memory outlives it, even when the transport is dropped first), and
/// while it lives the lending transport neither writes that memory nor
/// lets the device at it: the slot's next `take_slot`, ready signal and
/// consumer queueing wait for it to be dropped (at most
/// [`LEND_RETURN_WAIT`], then refuse with a timeout error). The ring's
/// [`SlotState::Lent`](crate::slots::SlotState::Lent) keeps the slot's next
/// ticket from being handed out until the reader gives the frame back (the
/// ring's read lease, which holds it, is dropped).
pub struct PeekedFrame {
    frame: Arc<dyn LentBytes>,
    len: usize,
}

impl std::fmt::Debug for PeekedFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeekedFrame")
            .field("at", &self.as_ptr())
            .field("len", &self.len)
            .finish()
    }
}

impl PeekedFrame {
    /// A lent frame of its own: a copy of `bytes` (for tests, and for a
    /// transport whose memory cannot be lent).
    pub fn copied(bytes: &[u8]) -> PeekedFrame {
        PeekedFrame {
            frame: Arc::new(bytes.to_vec()),
            len: bytes.len(),
        }
    }

    /// Bytes lent.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no byte is lent.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first lent byte (to tell which buffer was lent).
    pub fn as_ptr(&self) -> *const u8 {
        self.bytes().as_ptr()
    }

    /// The lent bytes.
    pub fn bytes(&self) -> &[u8] {
        // `len` was checked against the memory when the frame was lent;
        // the fallback (never taken) is an empty view, not a panic.
        self.frame.lent_bytes().get(..self.len).unwrap_or(&[])
    }
}

/// A slot's frame memory that a transport may lend ([`PeekedFrame`]): the
/// transport's own handle and every lent frame share it; the transport
/// gets `&mut` access (or lets the device at the memory) only once no lent
/// frame is left, waiting at most [`LEND_RETURN_WAIT`] for that.
pub(crate) struct Lendable<T: LentBytes> {
    inner: Arc<T>,
}

impl<T: LentBytes> Lendable<T> {
    /// `value`, not lent.
    pub(crate) fn new(value: T) -> Lendable<T> {
        Lendable {
            inner: Arc::new(value),
        }
    }

    /// Shared access (reads; lent frames may read at the same time).
    pub(crate) fn get(&self) -> &T {
        &self.inner
    }

    /// Whether a lent frame of it is alive.
    pub(crate) fn is_lent(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
    }

    /// Waits until no lent frame of it is alive (at most
    /// [`LEND_RETURN_WAIT`]; `slot` names the memory in the timeout error).
    /// Every reader's accesses happen before this returns.
    pub(crate) fn wait_returned(&self, slot: usize) -> Result<(), TransportError> {
        self.wait_returned_within(slot, LEND_RETURN_WAIT)
    }

    /// [`Lendable::wait_returned`] with `limit` instead of
    /// [`LEND_RETURN_WAIT`].
    fn wait_returned_within(&self, slot: usize, limit: Duration) -> Result<(), TransportError> {
        let began = Instant::now();
        let mut spins = 0u32;
        while self.is_lent() {
            if began.elapsed() >= limit {
                return Err(TransportError::timeout(
                    format!("slot {slot}'s lent frame to be given back (dropped)"),
                    limit,
                ));
            }
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        // The last lent frame's `Arc` drop released its count (a release
        // decrement); this fence orders its reads of the memory before
        // whatever the caller does to it next.
        std::sync::atomic::fence(Ordering::Acquire);
        Ok(())
    }

    /// Exclusive access, once no lent frame is alive (waits as
    /// [`Lendable::wait_returned`]).
    pub(crate) fn get_mut(&mut self, slot: usize) -> Result<&mut T, TransportError> {
        self.wait_returned(slot)?;
        Arc::get_mut(&mut self.inner).ok_or_else(|| {
            TransportError::misuse(format!(
                "slot {slot}'s frame was lent again while it was being taken back"
            ))
        })
    }

    /// Lends the first `len` bytes (refused when the memory is shorter).
    pub(crate) fn lend(&self, len: usize) -> Result<PeekedFrame, TransportError> {
        let have = self.inner.lent_bytes().len();
        if have < len {
            return Err(TransportError::refused(format!(
                "a lent frame of {len} bytes from memory of {have}"
            )));
        }
        let frame: Arc<dyn LentBytes> = self.inner.clone();
        Ok(PeekedFrame { frame, len })
    }
}

impl crate::frame::LeasedMemory for Lendable<Box<[u8]>> {
    fn bytes_mut(&mut self, slot: usize) -> Result<&mut [u8], TransportError> {
        Ok(self.get_mut(slot)?)
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

impl crate::frame::LeasedMemory for Lendable<HostFrame> {
    fn bytes_mut(&mut self, slot: usize) -> Result<&mut [u8], TransportError> {
        Ok(self.get_mut(slot)?.bytes_mut())
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

impl crate::frame::LeasedMemory for Lendable<CpuFrame> {
    fn bytes_mut(&mut self, slot: usize) -> Result<&mut [u8], TransportError> {
        Ok(self.get_mut(slot)?.bytes_mut())
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

#[cfg(feature = "vulkan")]
impl crate::frame::LeasedMemory for Lendable<VulkanFrame> {
    fn bytes_mut(&mut self, slot: usize) -> Result<&mut [u8], TransportError> {
        Lendable::<VulkanFrame>::bytes_mut(self, slot)
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

/// A consumer slot's pinned host frame ([`Placement::ReadBack`](super::Placement::ReadBack)):
/// the buffer and a shared view of its bytes, so that a lent frame can read
/// them through `&self` from another thread.
pub(crate) struct HostFrame {
    buf: PinnedHostBuffer,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is `Send + Sync`; the pointer is the start of its
// pinned allocation, valid from any thread while the buffer lives.
unsafe impl Send for HostFrame {}
// SAFETY: through `&HostFrame` the host only reads the bytes (`bytes`);
// it writes them through `&mut HostFrame` (`bytes_mut`) alone, and never
// makes the buffer's atomic views (which write through `&self`).
unsafe impl Sync for HostFrame {}

impl HostFrame {
    /// Wraps `buf`.
    pub(crate) fn new(mut buf: PinnedHostBuffer) -> HostFrame {
        let bytes = buf.as_mut_slice();
        let (ptr, len) = (NonNull::from(&mut *bytes).cast(), bytes.len());
        HostFrame { buf, ptr, len }
    }

    /// The bytes, read by the host (lent frames included).
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes of the pinned allocation, alive while
        // `self.buf` is; the host writes them only through `&mut self`,
        // excluded while this borrow lives; device writes are queued only by
        // the consumer, once the slot's lent frames were given back and while
        // the slot is in flight (no host view is handed out then).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast_const(), self.len) }
    }

    /// The bytes, written by the host.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        self.buf.as_mut_slice()
    }

    /// The buffer, for the consumer's queued copies into it.
    pub(crate) fn pinned(&self) -> &PinnedHostBuffer {
        &self.buf
    }
}

impl LentBytes for HostFrame {
    fn lent_bytes(&self) -> &[u8] {
        self.bytes()
    }
}

/// A GPU slot's frame: a host-visible Vulkan allocation the device shares
/// (imported into CUDA), with its persistent host mapping, for the
/// producer's writes (`&mut`, through [`Lendable::get_mut`]) and lent
/// frames' reads.
///
/// Like [`CpuFrame`], its host views rest on the ring's protocol for the
/// device's side: the transport hands them out only between the wait for
/// the slot's *free* fence (with the device's writes made visible to the
/// host) and the slot's next *ready* signal, which waits for every lent
/// frame to be dropped.
#[cfg(feature = "vulkan")]
pub(crate) struct VulkanFrame {
    memory: Arc<VulkanAllocation>,
    ptr: NonNull<u8>,
    len: usize,
}

/// A frame's Vulkan allocation (and so its host mapping), shared by the
/// frame and by the frame's CUDA registration ([`RegisteredFrame`]), so the
/// mapping outlives both whichever goes first.
#[cfg(feature = "vulkan")]
struct VulkanAllocation(crate::platform::vulkan::VulkanMemory);

// SAFETY: `VulkanMemory` is `Send` but not `Sync` (it writes through
// `&self`). The allocation is reached through `&` only by the frame's one
// owner (`Lendable::<VulkanFrame>::memory`, behind `&mut`); a lent frame
// reads the mapping through the frame's own pointer, and a registration's
// clone only keeps the allocation alive, never dereferencing it. So no two
// threads use it at once.
#[cfg(feature = "vulkan")]
unsafe impl Sync for VulkanAllocation {}

/// A frame's host memory page-locked for CUDA in place (the consumer's
/// copy-mode copies read and write it, [`crate::consumer::Consumer::copy_through_registered`]),
/// with what keeps that memory mapped: dropped after the registration
/// (field order), so the memory is unregistered before it can go.
pub(crate) struct RegisteredFrame {
    registration: RegisteredHostMemory,
    _keep: Option<Arc<dyn Send + Sync>>,
}

impl RegisteredFrame {
    /// A registration whose memory the caller keeps mapped for as long as
    /// it lives (it promised so to `RegisteredHostMemory::register`).
    #[cfg(test)]
    pub(crate) fn new(registration: RegisteredHostMemory) -> RegisteredFrame {
        RegisteredFrame {
            registration,
            _keep: None,
        }
    }

    /// The page-locked memory.
    pub(crate) fn memory(&self) -> &RegisteredHostMemory {
        &self.registration
    }
}

// SAFETY: `VulkanMemory` is `Send`; the pointer is an address in its
// mapping, valid from any thread while it lives.
#[cfg(feature = "vulkan")]
unsafe impl Send for VulkanFrame {}
// SAFETY: `VulkanMemory` is not `Sync` because it writes through `&self`.
// A `VulkanFrame` shared between threads (a lent frame's `Arc`) is reached
// through `&self` only by `lent_bytes`, which reads `ptr`, `len` and the
// mapped bytes; the allocation itself is reached only through
// `&mut Lendable` (`memory`, `bytes_mut`), by its one owner.
#[cfg(feature = "vulkan")]
unsafe impl Sync for VulkanFrame {}

#[cfg(feature = "vulkan")]
impl VulkanFrame {
    /// The frame over `memory`, which must be host-visible (refused
    /// otherwise).
    pub(crate) fn new(
        mut memory: crate::platform::vulkan::VulkanMemory,
    ) -> Result<VulkanFrame, crate::platform::vulkan::Error> {
        let (ptr, len) = {
            // SAFETY: the slice only tells the mapping's address and length;
            // it is gone at the end of this block, before anything reads or
            // writes through it (the transport makes the frame at set-up,
            // before any GPU work over the memory is queued).
            let bytes = unsafe { memory.host_bytes_mut() }?;
            (NonNull::from(&mut *bytes).cast(), bytes.len())
        };
        Ok(VulkanFrame {
            memory: Arc::new(VulkanAllocation(memory)),
            ptr,
            len,
        })
    }

    /// The mapped bytes, read by the host.
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes of the persistent mapping, alive while
        // `self.memory` is; the host writes them only through
        // `Lendable::<VulkanFrame>::bytes_mut`, which needs every shared view
        // gone; the device writes them only between the slot's *ready*
        // signal (which waits for every lent frame to be dropped) and its
        // *free* fence, which the transport waits for before it lends.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast_const(), self.len) }
    }
}

#[cfg(feature = "vulkan")]
impl LentBytes for VulkanFrame {
    fn lent_bytes(&self) -> &[u8] {
        self.bytes()
    }
}

#[cfg(feature = "vulkan")]
impl Lendable<VulkanFrame> {
    /// The allocation, for the handover batches (its owner only).
    pub(crate) fn memory(&mut self) -> &crate::platform::vulkan::VulkanMemory {
        &self.inner.memory.0
    }

    /// The frame's whole host mapping, in whole pages, page-locked for CUDA
    /// in place (`cuMemHostRegister` with PORTABLE | DEVICEMAP), for copy
    /// mode's copies. The registration holds the allocation (its `Arc`),
    /// so the mapping outlives it.
    ///
    /// # Errors
    /// Refused when the mapping does not start on a page (it could not be
    /// page-locked whole); the driver's refusal, with its code.
    pub(crate) fn register_for_copies(
        &self,
        ctx: &tegra_interop::driver::Context,
    ) -> Result<RegisteredFrame, TransportError> {
        use tegra_interop::driver::{host_page_size, HostRegistration};
        let frame = &self.inner;
        let page = host_page_size();
        if !frame.ptr.as_ptr().addr().is_multiple_of(page) {
            return Err(TransportError::refused(format!(
                "a frame's Vulkan host mapping does not start on a page ({:p}): it cannot be page-locked whole",
                frame.ptr
            )));
        }
        // Mappings are made of whole pages, so the last page is mapped
        // whole.
        let len = frame.len.div_ceil(page) * page;
        // SAFETY: `ptr..ptr + len` is the allocation's persistent mapping
        // (its last page whole), which stays mapped while the allocation
        // lives, and the registration holds the allocation (`_keep`,
        // dropped after it). The device reads and writes it only through
        // the consumer's copies, which the ring orders against the host's
        // access (the *ready* and *free* fences), as for the import.
        let registration = unsafe {
            RegisteredHostMemory::register(ctx, frame.ptr, len, HostRegistration::Memory)
        }
        .during("page-locking a frame's host mapping for CUDA (cuMemHostRegister)")?;
        let keep: Arc<dyn Send + Sync> = frame.memory.clone();
        Ok(RegisteredFrame {
            registration,
            _keep: Some(keep),
        })
    }

    /// The mapped bytes, for the producer's writes, once no lent frame of
    /// them is alive (waits as [`Lendable::wait_returned`]). Call it only
    /// after the slot's *free* fence was reached with the device's writes
    /// made visible to the host (the ring's protocol, as for
    /// [`CpuFrame::bytes_mut`]).
    pub(crate) fn bytes_mut(&mut self, slot: usize) -> Result<&mut [u8], TransportError> {
        let frame = self.get_mut(slot)?;
        // SAFETY: `len` bytes of the persistent mapping, alive while the
        // frame is; `&mut` to the only handle of it (no lent frame is left)
        // excludes every other host view; the device's side is the
        // protocol's (see the type's docs).
        Ok(unsafe { std::slice::from_raw_parts_mut(frame.ptr.as_ptr(), frame.len) })
    }
}

/// The producer's view of one NvSciBuf buffer through its CPU mapping:
/// owns the object (so the mapping lives as long as the view), `len` bytes.
pub(crate) struct CpuFrame {
    buf: BufObj,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the pointer is an address in the CPU mapping the owned object
// keeps (valid from any thread); the object itself is `Send`.
unsafe impl Send for CpuFrame {}
// SAFETY: `&CpuFrame` gives only shared reads of the mapping (`bytes`,
// `buf`, queueing host processing, which the stream orders); writes need
// `&mut CpuFrame`, and the object is `Sync`.
unsafe impl Sync for CpuFrame {}

impl LentBytes for CpuFrame {
    fn lent_bytes(&self) -> &[u8] {
        self.bytes()
    }
}

impl CpuFrame {
    /// The CPU mapping of `buf` (`NvSciBufObjGetCpuPtr`), refused when the
    /// object is smaller than `len`.
    pub(crate) fn new(buf: BufObj, len: usize) -> Result<CpuFrame, TransportError> {
        let have = buf.size().during("NvSciBuf size")?;
        if have < len as u64 {
            return Err(TransportError::refused(format!(
                "NvSciBuf object has {have} bytes, a frame needs {len}"
            )));
        }
        let ptr = buf.cpu_ptr().during("NvSciBufObjGetCpuPtr")?;
        Ok(CpuFrame { buf, ptr, len })
    }

    #[cfg_attr(not(feature = "cli"), allow(dead_code))] // used by `app::process`
    /// The CPU mapping of the whole of `buf` (its reconciled size): for a
    /// side that sized the buffer itself and wants the driver's error as is.
    pub(crate) fn whole(buf: BufObj) -> Result<CpuFrame, DriverError> {
        let size = buf.size()?;
        let ptr = buf.cpu_ptr()?;
        // A mapping in this process's address space has a size that fits a
        // usize; should the library say more, the view is empty (and every
        // frame too large for it) rather than longer than the mapping.
        let len = usize::try_from(size).unwrap_or(0);
        Ok(CpuFrame { buf, ptr, len })
    }

    /// The frame's bytes, for reading by the side that holds the slot (the
    /// producer after its wait for *free*).
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes of the object's CPU mapping, alive while
        // `self.buf` is; the device and the host-function consumer write
        // them only between *ready* and *free* (the protocol), and `&self`
        // excludes `bytes_mut` for as long as the slice lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast_const(), self.len) }
    }

    /// The NvSciBuf object.
    pub(crate) fn buf(&self) -> &BufObj {
        &self.buf
    }

    /// The frame's bytes, for the producer that holds the slot (after its
    /// wait for *free*, before its *ready* signal).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes of the object's CPU mapping (size checked at
        // `new`), alive while `self.buf` is; `&mut self` excludes every other
        // view this type gives; the device and the host-function consumer
        // touch the bytes only between *ready* and *free* (the protocol).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Queues on `stream` a host function that runs `process` over the
    /// frame's bytes (the simulator's processing; the stream orders it
    /// between the wait for *ready* and the *free* signal queued around it).
    ///
    /// The transport drains `stream` before it drops the object (or leaks
    /// the object when it cannot), so the bytes outlive the function.
    fn queue_host_processing(
        &self,
        stream: &Stream,
        process: impl FnOnce(&mut [u8]) + Send + 'static,
    ) -> Result<(), TransportError> {
        let (addr, len) = (self.ptr.as_ptr() as usize, self.len);
        stream
            .launch_host_fn(move || {
                // SAFETY: `len` bytes of the object's CPU mapping, alive
                // until the stream drained (see above); the function runs
                // after the stream's wait for *ready* and before its *free*
                // signal, when only the consumer touches the slot.
                let bytes = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
                process(bytes);
            })
            .during("cuLaunchHostFunc")
    }
}

impl Lendable<CpuFrame> {
    /// [`CpuFrame::queue_host_processing`] once no lent frame of it is
    /// alive (waits as [`Lendable::wait_returned`]): the host function
    /// writes the bytes.
    pub(crate) fn queue_host_processing(
        &self,
        slot: usize,
        stream: &Stream,
        process: impl FnOnce(&mut [u8]) + Send + 'static,
    ) -> Result<(), TransportError> {
        self.wait_returned(slot)?;
        self.get().queue_host_processing(stream, process)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_lent_frame_reads_the_memory_it_shares_and_outlives_its_owner() {
        let owner = Lendable::new(vec![7u8; 16]);
        let lent = owner.lend(8).unwrap();
        assert_eq!(lent.bytes(), &[7; 8][..]);
        assert_eq!(lent.as_ptr(), owner.get().as_ptr(), "shared, not copied");
        assert!(owner.is_lent());
        drop(owner);
        assert_eq!(lent.bytes(), &[7; 8][..], "kept alive by the lent frame");
        assert!(
            Lendable::new(vec![0u8; 4]).lend(5).is_err(),
            "longer than the memory"
        );
    }

    #[test]
    fn exclusive_access_waits_for_the_lent_frame_then_refuses_with_a_timeout() {
        let mut owner = Lendable::new(vec![1u8; 4]);
        let lent = owner.lend(4).unwrap();
        let e = owner
            .wait_returned_within(3, Duration::from_millis(20))
            .unwrap_err();
        assert!(matches!(e, TransportError::Timeout { .. }), "{e:?}");
        assert!(e.to_string().contains("slot 3's lent frame"), "{e}");
        // Dropped on another thread while the owner waits: the wait ends,
        // and the reader saw the bytes before they were written.
        let dropped = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                assert_eq!(lent.bytes(), &[1; 4][..]);
                dropped.store(true, Ordering::SeqCst);
                drop(lent);
            });
            let bytes = owner.get_mut(3).unwrap();
            assert!(dropped.load(Ordering::SeqCst), "written while lent");
            bytes.fill(2);
        });
        assert!(!owner.is_lent());
        assert_eq!(owner.lend(4).unwrap().bytes(), &[2; 4][..]);
    }

    #[test]
    fn a_copied_frame_is_its_own() {
        let mut source = vec![5u8; 3];
        let lent = PeekedFrame::copied(&source);
        source.fill(0);
        assert_eq!(lent.bytes(), &[5; 3][..]);
        assert_eq!((lent.len(), lent.is_empty()), (3, false));
    }
}
