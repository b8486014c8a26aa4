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

use tegra_interop::driver::memory::MappedBuffer;
use tegra_interop::driver::nvsci::BufObj;
use tegra_interop::driver::{BackendKind, Stream};

use crate::transport::{DriverError, DriverResultExt, TransportError};

/// A collected frame's bytes, lent by [`FrameTransport::lend`](crate::transport::FrameTransport::lend) for reading
/// **beyond that call**, on another thread: the producer's read-back check
/// runs while the camera writes the next frames and the handover goes on.
/// It is a pointer and a length; the ring's
/// [`SlotState::Lent`](crate::ring::SlotState::Lent) keeps the slot's next
/// ticket from being handed out until the reader gives the frame back
/// ([`Ring::give_back`](crate::ring::Ring::give_back)).
#[derive(Debug)]
pub struct PeekedFrame {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: a pointer to bytes that nothing writes while the frame is lent
// (the contract of `PeekedFrame::new`); reading them from another thread is
// what the type is for, and `bytes` states when that is allowed.
unsafe impl Send for PeekedFrame {}

impl PeekedFrame {
    /// Lends `len` bytes at `ptr`.
    ///
    /// # Safety
    /// The bytes must be readable, stay allocated at that address and be
    /// written by nobody (the transport, its consumer, the device) from now
    /// until the transport is given the slot's next ticket, or is closed or
    /// dropped, whichever comes first.
    pub unsafe fn new(ptr: std::ptr::NonNull<u8>, len: usize) -> PeekedFrame {
        PeekedFrame { ptr, len }
    }

    /// Lends the bytes of `bytes`, a safe shorthand for borrowed memory the
    /// caller keeps for as long as the frame is read (tests).
    pub fn from_slice(bytes: &[u8]) -> PeekedFrame {
        PeekedFrame {
            ptr: std::ptr::NonNull::from(bytes).cast(),
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

    /// The address of the first lent byte (to tell which buffer was lent;
    /// reading through it is [`PeekedFrame::bytes`]'s business).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr().cast_const()
    }

    /// The lent bytes.
    ///
    /// # Safety
    /// Only while the lending transport is alive and has not been given the
    /// slot's next ticket (the ring refuses that ticket while the slot is
    /// lent), and, for [`PeekedFrame::from_slice`], while the slice it was
    /// made from is alive.
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` readable bytes that nobody writes
        // until the slot's next ticket (the contract of `new`), which the
        // caller has not passed yet (this function's contract).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast_const(), self.len) }
    }
}

/// The producer's view of one NvSciBuf buffer through its CPU mapping:
/// owns the object (so the mapping lives as long as the view), `len` bytes.
pub(crate) struct CpuFrame {
    buf: BufObj,
    ptr: NonNull<u8>,
    len: usize,
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

    /// Lends the collected frame's bytes until the slot's next ticket.
    pub(crate) fn lend(&self) -> PeekedFrame {
        // SAFETY: the mapping stays at this address while the object lives,
        // which the transport keeps until it is dropped; nothing writes the
        // slot before its next ticket, which the ring refuses while lent.
        unsafe { PeekedFrame::new(self.ptr, self.len) }
    }

    /// Queues on `stream` a host function that runs `process` over the
    /// frame's bytes (the simulator's processing; the stream orders it
    /// between the wait for *ready* and the *free* signal queued around it).
    ///
    /// The transport drains `stream` before it drops the object (or leaks
    /// the object when it cannot), so the bytes outlive the function.
    pub(crate) fn queue_host_processing(
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

/// Why [`queue_sim_host_processing`] did not queue.
#[derive(Debug)]
pub(crate) enum SimHostError {
    /// The stream is on the real driver, or the mapping is smaller than
    /// the frame: the bytes are not host memory of that length.
    Refused(String),
    /// `cuLaunchHostFunc` failed.
    Driver(DriverError),
}

/// Queues on `stream` a host function that runs `process` over the first
/// `len` bytes of `map`, a mapped external buffer, as host memory: the
/// simulator's processing of a frame it imported (on the simulator a device
/// pointer is the host address of the memory behind it). Refused on the
/// real driver, where a device pointer is not a host address, and when the
/// mapping is shorter than `len`.
///
/// The caller drains `stream` before it drops `map` (or leaks the mapping
/// when it cannot), so the bytes outlive the function; the stream orders
/// the function between its wait for *ready* and its *free* signal, the
/// slot's consumer side of the protocol.
pub(crate) fn queue_sim_host_processing(
    stream: &Stream,
    map: &MappedBuffer,
    len: usize,
    process: impl FnOnce(&mut [u8]) + Send + 'static,
) -> Result<(), SimHostError> {
    if stream.context().backend().kind() == BackendKind::Real {
        return Err(SimHostError::Refused(
            "host processing of a mapped buffer needs the simulator: on the real driver a device pointer is no host address".into(),
        ));
    }
    if map.size() < len as u64 {
        return Err(SimHostError::Refused(format!(
            "the mapping has {} bytes, a frame needs {len}",
            map.size()
        )));
    }
    let addr = map.device_ptr() as usize;
    stream
        .launch_host_fn(move || {
            // SAFETY: on the simulator (checked above) the device pointer is
            // the host address of the mapping's memory, at least `len`
            // bytes (checked above), alive until the stream drained (see
            // above); the function runs after the stream's wait for *ready*
            // and before its *free* signal, when only the consumer touches
            // the slot.
            let bytes = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
            process(bytes);
        })
        .map_err(SimHostError::Driver)
}
