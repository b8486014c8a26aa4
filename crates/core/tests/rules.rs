//! The rule table: one row per documented rule, each asserting the exact error.
//!
//! Rules come from the "Rules" and "Measured" sections of the project's CUDA facts and from
//! the NvSci facts; the row name says which.
#![allow(clippy::unwrap_used)] // tests unwrap on purpose

use core::ffi::c_void;
use core::ptr::{null, null_mut};

use tegra_interop_core::fence::MAX_STREAM_ORDERINGS;
use tegra_interop_core::memory::MemoryHandle;
use tegra_interop_core::nvsci::{
    self, BufAttr, BufAttrSet, GpuId, SyncAttr, SyncAttrSet, MAX_PLANES,
};
use tegra_interop_core::semaphore::SemaphoreHandle;
use tegra_interop_core::sys::cuda::{
    CUextSemaphore_st, CUDA_ARRAY3D_CUBEMAP, CUDA_ARRAY3D_LAYERED, CUDA_EXTERNAL_MEMORY_BUFFER_DESC,
};
use tegra_interop_core::sys::nvsci::{
    NvSciBufAttrKey, NvSciBufAttrValAccessPerm, NvSciSyncAccessPerm, NvSciSyncAttrValPrimitiveType,
    NvSciSyncFence,
};
use tegra_interop_core::*;

fn h() -> *mut c_void {
    core::ptr::without_provenance_mut::<c_void>(0x1000)
}
fn n() -> *const c_void {
    core::ptr::without_provenance::<c_void>(0x2000)
}
fn sem() -> *mut CUextSemaphore_st {
    core::ptr::without_provenance_mut::<CUextSemaphore_st>(0x3000)
}
fn fence_ptr() -> *mut NvSciSyncFence {
    core::ptr::without_provenance_mut::<NvSciSyncFence>(0x4000)
}

type E = ValidationError;
type M = MemoryHandleKind;
type S = SemaphoreHandleKind;

fn rgba(w: usize, hgt: usize) -> ArrayDesc {
    ArrayDesc::new_2d(w, hgt, ArrayFormat::U8, 4).unwrap()
}

/// The error of a result (`None` when it succeeded).
fn err<T>(r: Result<T, ValidationError>) -> Option<ValidationError> {
    r.err()
}

#[test]
fn rule_table() {
    let mut stale_timeline = TimelineTracker::new(8);
    let mut pending_timeline = TimelineTracker::new(0);
    let _held = pending_timeline.reserve(1).unwrap();
    let mut other_timeline = TimelineTracker::new(0);
    let foreign = TimelineTracker::new(10).reserve(11).unwrap();
    let mut max_timeline = TimelineTracker::new(u64::MAX);
    // Timeline signalled on stream 1: stream 2 needs a stated order.
    let mut streamed_timeline = TimelineTracker::new(0);
    let r = streamed_timeline.reserve_on(StreamId(1), 5).unwrap();
    streamed_timeline.commit(r).unwrap();
    let mut timeline_orders_full = TimelineTracker::new(0);
    for i in 0..MAX_STREAM_ORDERINGS as u64 {
        timeline_orders_full
            .order_after(StreamId(100 + i), StreamId(1))
            .unwrap();
    }
    // The exporter reached 10 (reported with observe).
    let mut observed_timeline = TimelineTracker::new(0);
    observed_timeline.observe(10).unwrap();
    let mut observe_pending = TimelineTracker::new(0);
    let _held3 = observe_pending.reserve_on(StreamId(1), 1).unwrap();

    let mut det = DeterministicCounter::new(PrimitiveWidth::U32, 0).unwrap();
    let r = det.reserve(StreamId(1)).unwrap();
    det.commit(r).unwrap();
    let mut det_full = DeterministicCounter::new(PrimitiveWidth::U32, 0).unwrap();
    for i in 0..MAX_STREAM_ORDERINGS as u64 {
        det_full
            .order_after(StreamId(100 + i), StreamId(1))
            .unwrap();
    }
    let mut det_pending = DeterministicCounter::new(PrimitiveWidth::U64, 0).unwrap();
    let _held2 = det_pending.reserve(StreamId(1)).unwrap();

    let mut binary_batch = SignalBatch::<2>::new();
    binary_batch
        .push(sem(), S::OpaqueFd, SignalParams::binary())
        .unwrap();

    let mut buf_dup = BufAttrSet::<4>::new();
    buf_dup.set(BufAttr::NeedCpuAccess(true)).unwrap();
    let mut buf_small = BufAttrSet::<1>::new();
    buf_small.set(BufAttr::NeedCpuAccess(true)).unwrap();
    let mut planes_mismatch = BufAttrSet::<4>::new();
    planes_mismatch.set(BufAttr::PlaneCount(2)).unwrap();
    planes_mismatch
        .set(BufAttr::plane_widths(&[640]).unwrap())
        .unwrap();
    let mut sync_dup = SyncAttrSet::<4>::new();
    sync_dup.set(SyncAttr::NeedCpuAccess(false)).unwrap();

    let buffer_flags = CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
        offset: 0,
        size: 16,
        flags: 1,
        reserved: [0; 16],
    };
    let mut buffer_reserved = buffer_flags;
    buffer_reserved.flags = 0;
    buffer_reserved.reserved[15] = 1;

    // SAFETY: only lowered and compared, never submitted to a driver.
    let skip_signal = unsafe { SignalParams::timeline(1).skip_nvscibuf_memsync() };
    // SAFETY: as above.
    let skip_wait = unsafe { WaitParams::binary().skip_nvscibuf_memsync() };

    let rows: Vec<(&str, Option<ValidationError>, ValidationError)> =
        vec![
        // --- memory imports ---
        (
            "fd >= 0 (OPAQUE_FD; the driver says UNKNOWN)",
            err(MemoryImport::opaque_fd(-1, 64)),
            E::NegativeFd { fd: -1 },
        ),
        (
            "fd >= 0 (DMABUF_FD)",
            err(MemoryImport::dma_buf_fd(-7, 64)),
            E::NegativeFd { fd: -7 },
        ),
        (
            "with_fd: the new fd >= 0",
            err(MemoryImport::opaque_fd(3, 64).and_then(|i| i.with_fd(-4))),
            E::NegativeFd { fd: -4 },
        ),
        (
            "with_fd: only fd kinds",
            err(MemoryImport::nvscibuf(h(), 64).and_then(|i| i.with_fd(5))),
            E::HandleKindMismatch,
        ),
        (
            "import size > 0",
            err(MemoryImport::opaque_fd(3, 0)),
            E::ZeroSize,
        ),
        (
            "NvSciBuf object non-NULL (driver: INVALID_VALUE)",
            err(MemoryImport::nvscibuf(null(), 64)),
            E::NullHandle,
        ),
        (
            "D3D12_RESOURCE needs DEDICATED",
            err(MemoryImport::d3d12_resource(h(), null(), 64)
                .and_then(|m| m.with_flags(MemoryImportFlags::empty()))),
            E::DedicatedRequired {
                kind: M::D3d12Resource,
            },
        ),
        (
            "D3D11_RESOURCE needs DEDICATED",
            err(MemoryImport::d3d11_resource(h(), null(), 64)
                .and_then(|m| m.with_flags(MemoryImportFlags::empty()))),
            E::DedicatedRequired {
                kind: M::D3d11Resource,
            },
        ),
        (
            "D3D11_RESOURCE_KMT needs DEDICATED",
            err(MemoryImport::d3d11_resource_kmt(h(), 64)
                .and_then(|m| m.with_flags(MemoryImportFlags::empty()))),
            E::DedicatedRequired {
                kind: M::D3d11ResourceKmt,
            },
        ),
        (
            "unknown memory import flag bits",
            err(MemoryImport::opaque_fd(3, 64)
                .and_then(|m| m.with_flags(MemoryImportFlags::from_bits_retain(0x6)))),
            E::UnknownFlags { bits: 0x6 },
        ),
        (
            "OPAQUE_WIN32: not both handle and name",
            err(MemoryImport::opaque_win32(h(), n(), 64)),
            E::Win32HandleAndName,
        ),
        (
            "OPAQUE_WIN32: one of handle and name",
            err(MemoryImport::opaque_win32(null_mut(), null(), 64)),
            E::Win32NoHandleOrName,
        ),
        (
            "D3D12_HEAP: not both handle and name",
            err(MemoryImport::d3d12_heap(h(), n(), 64)),
            E::Win32HandleAndName,
        ),
        (
            "D3D12_HEAP: one of handle and name",
            err(MemoryImport::d3d12_heap(null_mut(), null(), 64)),
            E::Win32NoHandleOrName,
        ),
        (
            "D3D12_RESOURCE: not both handle and name",
            err(MemoryImport::d3d12_resource(h(), n(), 64)),
            E::Win32HandleAndName,
        ),
        (
            "D3D11_RESOURCE: one of handle and name",
            err(MemoryImport::d3d11_resource(null_mut(), null(), 64)),
            E::Win32NoHandleOrName,
        ),
        (
            "OPAQUE_WIN32_KMT: handle non-NULL",
            err(MemoryImport::opaque_win32_kmt(null_mut(), 64)),
            E::NullHandle,
        ),
        (
            "OPAQUE_WIN32_KMT: name NULL",
            err(MemoryImport::new(
                M::OpaqueWin32Kmt,
                MemoryHandle::Win32 {
                    handle: h(),
                    name: n(),
                },
                64,
            )),
            E::Win32KmtName,
        ),
        (
            "D3D11_RESOURCE_KMT: handle non-NULL",
            err(MemoryImport::d3d11_resource_kmt(null_mut(), 64)),
            E::NullHandle,
        ),
        (
            "D3D11_RESOURCE_KMT: name NULL",
            err(MemoryImport::new(
                M::D3d11ResourceKmt,
                MemoryHandle::Win32 {
                    handle: h(),
                    name: n(),
                },
                64,
            )),
            E::Win32KmtName,
        ),
        (
            "handle fits the kind",
            err(MemoryImport::new(
                M::OpaqueFd,
                MemoryHandle::NvSciBuf(n()),
                64,
            )),
            E::HandleKindMismatch,
        ),
        (
            "memory handle type is documented",
            err(MemoryHandleKind::from_raw(10)),
            E::UnknownHandleType { raw: 10 },
        ),
        // --- buffer mappings ---
        (
            "buffer flags must be 0 (driver: INVALID_VALUE)",
            err(BufferMapping::from_raw(&buffer_flags, 64)),
            E::BufferFlagsNonZero { flags: 1 },
        ),
        (
            "buffer reserved must be 0",
            err(BufferMapping::from_raw(&buffer_reserved, 64)),
            E::ReservedNonZero,
        ),
        (
            "buffer range inside import (driver: INVALID_VALUE)",
            err(BufferMapping::new(60, 8).lower(64)),
            E::MappingOutOfRange {
                offset: 60,
                size: 8,
                import_size: 64,
            },
        ),
        (
            "buffer range end does not overflow",
            err(BufferMapping::new(u64::MAX, 2).lower(u64::MAX)),
            E::MappingOutOfRange {
                offset: u64::MAX,
                size: 2,
                import_size: u64::MAX,
            },
        ),
        (
            "buffer size > 0",
            err(BufferMapping::new(0, 0).lower(64)),
            E::ZeroSize,
        ),
        // --- arrays ---
        (
            "NvSciBuf arrays have numLevels == 1",
            err(MipmappedArrayMapping::new(0, rgba(64, 64), 2).lower(M::NvSciBuf, 1 << 20)),
            E::NvSciBufArrayLevels { num_levels: 2 },
        ),
        (
            "numLevels >= 1",
            err(MipmappedArrayMapping::new(0, rgba(64, 64), 0).lower(M::OpaqueFd, 1 << 20)),
            E::ArrayLevelsZero,
        ),
        (
            "numLevels <= levels of the extent",
            err(MipmappedArrayMapping::new(0, rgba(64, 64), 8).lower(M::OpaqueFd, 1 << 20)),
            E::ArrayTooManyLevels {
                num_levels: 8,
                max: 7,
            },
        ),
        (
            "array level 0 fits in the import",
            err(MipmappedArrayMapping::new(0, rgba(64, 64), 1).lower(M::OpaqueFd, 64 * 64 * 4 - 1)),
            E::MappingOutOfRange {
                offset: 0,
                size: 64 * 64 * 4,
                import_size: 64 * 64 * 4 - 1,
            },
        ),
        (
            "array channels are 1, 2 or 4",
            err(ArrayDesc::new_2d(8, 8, ArrayFormat::U8, 3)),
            E::ArrayChannels { channels: 3 },
        ),
        (
            "array format is a described one",
            err(ArrayFormat::from_raw(176)),
            E::ArrayFormat { raw: 176 },
        ),
        (
            "array width > 0",
            err(ArrayDesc::new(0, 8, 0, ArrayFormat::Float, 1)),
            E::ArrayExtent {
                width: 0,
                height: 8,
                depth: 0,
            },
        ),
        (
            "array: depth without height is not a shape",
            err(ArrayDesc::new(8, 0, 4, ArrayFormat::Float, 1)),
            E::ArrayExtent {
                width: 8,
                height: 0,
                depth: 4,
            },
        ),
        (
            "layered array has at least one layer",
            err(ArrayDesc::with_flags(
                8,
                8,
                0,
                ArrayFormat::Float,
                1,
                CUDA_ARRAY3D_LAYERED,
            )),
            E::ArrayExtent {
                width: 8,
                height: 8,
                depth: 0,
            },
        ),
        (
            "cubemap is square with 6 faces",
            err(ArrayDesc::with_flags(
                8,
                4,
                6,
                ArrayFormat::Float,
                1,
                CUDA_ARRAY3D_CUBEMAP,
            )),
            E::ArrayExtent {
                width: 8,
                height: 4,
                depth: 6,
            },
        ),
        (
            "array byte size does not overflow",
            err(ArrayDesc::new(
                usize::MAX,
                usize::MAX,
                0,
                ArrayFormat::Float,
                4,
            )),
            E::ArrayExtent {
                width: usize::MAX,
                height: usize::MAX,
                depth: 0,
            },
        ),
        (
            "array flags are known bits",
            err(ArrayDesc::with_flags(
                8,
                8,
                0,
                ArrayFormat::Float,
                1,
                0x1000,
            )),
            E::UnknownFlags { bits: 0x1000 },
        ),
        // --- semaphore imports ---
        (
            "semaphore fd >= 0",
            err(SemaphoreImport::opaque_fd(-1)),
            E::NegativeFd { fd: -1 },
        ),
        (
            "timeline fd >= 0",
            err(SemaphoreImport::timeline_fd(-2)),
            E::NegativeFd { fd: -2 },
        ),
        (
            "semaphore with_fd: the new fd >= 0",
            err(SemaphoreImport::timeline_fd(3).and_then(|i| i.with_fd(-5))),
            E::NegativeFd { fd: -5 },
        ),
        (
            "semaphore with_fd: only fd kinds",
            err(SemaphoreImport::nvscisync(h()).and_then(|i| i.with_fd(5))),
            E::HandleKindMismatch,
        ),
        (
            "NvSciSync object non-NULL",
            err(SemaphoreImport::nvscisync(null())),
            E::NullHandle,
        ),
        (
            "semaphore OPAQUE_WIN32: not both",
            err(SemaphoreImport::opaque_win32(h(), n())),
            E::Win32HandleAndName,
        ),
        (
            "D3D12_FENCE: one of handle and name",
            err(SemaphoreImport::d3d12_fence(null_mut(), null())),
            E::Win32NoHandleOrName,
        ),
        (
            "semaphore OPAQUE_WIN32_KMT: handle non-NULL",
            err(SemaphoreImport::opaque_win32_kmt(null_mut())),
            E::NullHandle,
        ),
        (
            "D3D11_KEYED_MUTEX_KMT: name NULL",
            err(SemaphoreImport::new(
                S::D3d11KeyedMutexKmt,
                SemaphoreHandle::Win32 {
                    handle: h(),
                    name: n(),
                },
            )),
            E::Win32KmtName,
        ),
        (
            "semaphore handle fits the kind",
            err(SemaphoreImport::new(S::NvSciSync, SemaphoreHandle::Fd(3))),
            E::HandleKindMismatch,
        ),
        (
            "semaphore handle type is documented",
            err(SemaphoreHandleKind::from_raw(11)),
            E::UnknownHandleType { raw: 11 },
        ),
        // --- signal / wait parameters ---
        (
            "signal flags only on NvSciSync (timeline: driver INVALID_VALUE)",
            err(skip_signal.lower_for(S::TimelineSemaphoreFd)),
            E::SemaphoreFlagsNotAllowed {
                kind: S::TimelineSemaphoreFd,
                flags: 1,
            },
        ),
        (
            "wait flags only on NvSciSync",
            err(skip_wait.lower_for(S::OpaqueFd)),
            E::SemaphoreFlagsNotAllowed {
                kind: S::OpaqueFd,
                flags: 2,
            },
        ),
        (
            "no fence value for binary semaphores",
            err(SignalParams::timeline(1).lower_for(S::OpaqueFd)),
            E::FenceValueNotSupported { kind: S::OpaqueFd },
        ),
        (
            "no fence value for NvSciSync",
            err(WaitParams::timeline(1).lower_for(S::NvSciSync)),
            E::FenceValueNotSupported { kind: S::NvSciSync },
        ),
        (
            "timeline needs a fence value",
            err(SignalParams::binary().lower_for(S::TimelineSemaphoreFd)),
            E::FenceValueRequired {
                kind: S::TimelineSemaphoreFd,
            },
        ),
        (
            "D3D12 fence needs a fence value",
            err(WaitParams::binary().lower_for(S::D3d12Fence)),
            E::FenceValueRequired {
                kind: S::D3d12Fence,
            },
        ),
        (
            "D3D11 fence needs a fence value",
            err(SignalParams::binary().lower_for(S::D3d11Fence)),
            E::FenceValueRequired {
                kind: S::D3d11Fence,
            },
        ),
        (
            "keyed-mutex key only for keyed mutexes",
            err(SignalParams::keyed_mutex(1).lower_for(S::TimelineSemaphoreFd)),
            E::KeyedMutexNotSupported {
                kind: S::TimelineSemaphoreFd,
            },
        ),
        (
            "keyed-mutex timeout only for keyed mutexes",
            err(WaitParams::keyed_mutex(1, KEYED_MUTEX_INFINITE).lower_for(S::OpaqueFd)),
            E::KeyedMutexNotSupported { kind: S::OpaqueFd },
        ),
        (
            "keyed mutex needs key/timeout",
            err(WaitParams::binary().lower_for(S::D3d11KeyedMutexKmt)),
            E::KeyedMutexRequired {
                kind: S::D3d11KeyedMutexKmt,
            },
        ),
        (
            "NvSciSync fence only for NvSciSync",
            err(SignalParams::nvscisync(fence_ptr()).lower_for(S::OpaqueFd)),
            E::NvSciSyncFenceNotSupported { kind: S::OpaqueFd },
        ),
        (
            "NvSciSync needs a fence",
            err(SignalParams::binary().lower_for(S::NvSciSync)),
            E::NvSciSyncFenceRequired,
        ),
        (
            "NvSciSync fence pointer non-NULL",
            err(WaitParams::nvscisync(null()).lower_for(S::NvSciSync)),
            E::NvSciSyncFenceRequired,
        ),
        // --- batches ---
        (
            "batch: handle non-NULL",
            SignalBatch::<1>::new()
                .push(null_mut(), S::OpaqueFd, SignalParams::binary())
                .err()
                .and_then(|e| e.validation_error()),
            E::NullHandle,
        ),
        (
            "batch: entries checked on push",
            WaitBatch::<1>::new()
                .push(sem(), S::OpaqueFd, WaitParams::timeline(3))
                .err()
                .and_then(|e| e.validation_error()),
            E::FenceValueNotSupported { kind: S::OpaqueFd },
        ),
        (
            "batch: fence update only on fence kinds",
            err(binary_batch.set_fence_value(0, 3)),
            E::FenceValueNotSupported { kind: S::OpaqueFd },
        ),
        (
            "batch: index in range",
            err(binary_batch.set_fence_value(5, 3)),
            E::IndexOutOfRange { index: 5, len: 1 },
        ),
        (
            "batch: all fence values only on fence kinds",
            err(binary_batch.set_fence_values(&[3])),
            E::FenceValueNotSupported { kind: S::OpaqueFd },
        ),
        (
            "batch: one fence value per entry",
            err(binary_batch.set_fence_values(&[3, 4])),
            E::IndexOutOfRange { index: 1, len: 1 },
        ),
        // --- timeline tracking (driver accepts 3 after 8 and goes back) ---
        (
            "timeline never goes back",
            err(stale_timeline.reserve(3)),
            E::FenceNotIncreasing {
                last: 8,
                requested: 3,
            },
        ),
        (
            "timeline never repeats",
            err(stale_timeline.reserve(8)),
            E::FenceNotIncreasing {
                last: 8,
                requested: 8,
            },
        ),
        (
            "timeline at u64::MAX has no next",
            err(max_timeline.reserve_next()),
            E::FenceExhausted,
        ),
        (
            "one reservation at a time",
            err(pending_timeline.reserve(2)),
            E::ReservationPending,
        ),
        (
            "commit only the tracker's reservation",
            err(other_timeline.commit(foreign)),
            E::ReservationMismatch,
        ),
        (
            "timeline: a second stream needs a stated order (device order is not call order)",
            err(streamed_timeline.reserve_on(StreamId(2), 6)),
            E::StreamNotOrdered {
                stream: StreamId(2),
                last: StreamId(1),
            },
        ),
        (
            "timeline: stream orderings are bounded",
            err(timeline_orders_full.order_after(StreamId(99), StreamId(1))),
            E::CapacityExceeded {
                capacity: MAX_STREAM_ORDERINGS,
            },
        ),
        (
            "timeline: an observed value raises the floor",
            err(observed_timeline.reserve_on(StreamId(1), 10)),
            E::FenceNotIncreasing {
                last: 10,
                requested: 10,
            },
        ),
        (
            "timeline: observe waits for the outstanding reservation",
            err(observe_pending.observe(5)),
            E::ReservationPending,
        ),
        // --- deterministic fences ---
        (
            "second stream needs a stated order",
            err(det.reserve(StreamId(2))),
            E::StreamNotOrdered {
                stream: StreamId(2),
                last: StreamId(1),
            },
        ),
        (
            "stream orderings are bounded",
            err(det_full.order_after(StreamId(99), StreamId(1))),
            E::CapacityExceeded {
                capacity: MAX_STREAM_ORDERINGS,
            },
        ),
        (
            "one deterministic reservation at a time",
            err(det_pending.reserve(StreamId(1))),
            E::ReservationPending,
        ),
        (
            "initial value fits the primitive width",
            err(DeterministicCounter::new(PrimitiveWidth::U32, 1 << 32)),
            E::FenceValueTooWide { value: 1 << 32 },
        ),
        (
            "primitive type is documented",
            err(PrimitiveWidth::from_primitive_type(
                NvSciSyncAttrValPrimitiveType(6),
            )),
            E::UnknownPrimitiveType { raw: 6 },
        ),
        // --- NvSci attribute sets ---
        (
            "NvSciBuf RequiredPerm is not Auto",
            err(BufAttrSet::<2>::new()
                .set(BufAttr::RequiredPerm(
                    NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_Auto,
                ))
                .map(|_| ())),
            E::AutoPermNotAllowed,
        ),
        (
            "NvSciBuf RequiredPerm is documented",
            err(BufAttrSet::<2>::new()
                .set(BufAttr::RequiredPerm(
                    NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_Invalid,
                ))
                .map(|_| ())),
            E::InvalidPerm { raw: 5 },
        ),
        (
            "NvSciSync RequiredPerm is not Auto",
            err(SyncAttrSet::<2>::new()
                .set(SyncAttr::RequiredPerm(
                    NvSciSyncAccessPerm::NvSciSyncAccessPerm_Auto,
                ))
                .map(|_| ())),
            E::AutoPermNotAllowed,
        ),
        (
            "NvSciSync RequiredPerm is documented",
            err(SyncAttrSet::<2>::new()
                .set(SyncAttr::RequiredPerm(NvSciSyncAccessPerm(0)))
                .map(|_| ())),
            E::InvalidPerm { raw: 0 },
        ),
        (
            "NvSciBuf key set once",
            err(buf_dup.set(BufAttr::NeedCpuAccess(false)).map(|_| ())),
            E::DuplicateKey { key: 2 },
        ),
        (
            "NvSciSync key set once",
            err(sync_dup.set(SyncAttr::NeedCpuAccess(true)).map(|_| ())),
            E::DuplicateKey { key: 1 },
        ),
        (
            "attribute set capacity",
            err(buf_small.set(BufAttr::RawSize(64)).map(|_| ())),
            E::CapacityExceeded { capacity: 1 },
        ),
        (
            "image planes <= MAX_PLANES",
            err(BufAttr::plane_widths(&[1, 2, 3, 4])),
            E::TooManyPlanes {
                count: 4,
                max: MAX_PLANES,
            },
        ),
        (
            "PlaneCount <= MAX_PLANES",
            err(BufAttrSet::<2>::new()
                .set(BufAttr::PlaneCount(4))
                .map(|_| ())),
            E::TooManyPlanes {
                count: 4,
                max: MAX_PLANES,
            },
        ),
        (
            "per-plane keys match PlaneCount",
            err(planes_mismatch.lower().map(|_| ())),
            E::PlaneCountMismatch {
                key: 0x2000c,
                expected: 2,
                actual: 1,
            },
        ),
        (
            "raw buffer size > 0",
            err(BufAttrSet::<2>::new().set(BufAttr::RawSize(0)).map(|_| ())),
            E::ZeroSize,
        ),
        (
            "raw buffer alignment is a power of two",
            err(BufAttrSet::<2>::new().set(BufAttr::RawAlign(3)).map(|_| ())),
            E::InvalidAttrValue { key: 0x10001 },
        ),
        (
            "PrimitiveInfo types are documented",
            err(SyncAttrSet::<2>::new()
                .set(SyncAttr::primitive_info(&[NvSciSyncAttrValPrimitiveType(9)]).unwrap())
                .map(|_| ())),
            E::UnknownPrimitiveType { raw: 9 },
        ),
        (
            "decoded value has the key's size",
            err(BufAttr::decode(
                NvSciBufAttrKey::NvSciBufRawBufferAttrKey_Size,
                &[0; 4],
            )),
            E::AttrLength {
                key: 0x10000,
                len: 4,
            },
        ),
        (
            "decoded key is described",
            err(BufAttr::decode(NvSciBufAttrKey(0x30000), &[0; 4])),
            E::UnknownAttrKey { key: 0x30000 },
        ),
        // --- NvSci value types and output-only keys (issue 12, nvsci-facts.md header check) ---
        (
            "NvSciBuf output-only key ActualPerm is not settable",
            err(BufAttrSet::<2>::new()
                .set(BufAttr::ActualPerm(
                    NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite,
                ))
                .map(|_| ())),
            E::OutputOnlyKey { key: 7 },
        ),
        (
            "NvSciBuf GpuSwNeedCacheCoherency is output-only",
            err(BufAttrSet::<2>::new()
                .set(BufAttr::GpuSwNeedCacheCoherency(
                    heapless::Vec::from_slice(&[nvsci::GpuCache::new(GpuId([1; 16]), true)])
                        .unwrap(),
                ))
                .map(|_| ())),
            E::OutputOnlyKey { key: 10 },
        ),
        (
            "NvSciBuf image outputs (PlanePitch) are not settable",
            err(BufAttrSet::<2>::new()
                .set(BufAttr::PlanePitch(heapless::Vec::from_slice(&[256]).unwrap()))
                .map(|_| ())),
            E::OutputOnlyKey { key: 0x20014 },
        ),
        (
            "NvSciSync output-only key MaxPrimitiveValue is not settable",
            err(SyncAttrSet::<2>::new()
                .set(SyncAttr::MaxPrimitiveValue(u64::MAX))
                .map(|_| ())),
            E::OutputOnlyKey { key: 9 },
        ),
        (
            "NvSciSync output-only key ActualPerm is not settable",
            err(SyncAttrSet::<2>::new()
                .set(SyncAttr::ActualPerm(
                    NvSciSyncAccessPerm::NvSciSyncAccessPerm_WaitOnly,
                ))
                .map(|_| ())),
            E::OutputOnlyKey { key: 3 },
        ),
        (
            "EnableGpuCache holds at least one per-GPU entry",
            err(BufAttrSet::<2>::new()
                .set(BufAttr::gpu_cache(&[]).unwrap())
                .map(|_| ())),
            E::InvalidAttrValue { key: 9 },
        ),
        (
            "EnableGpuCache is per-GPU 17-byte entries, not a 1-byte bool (library: BadParameter)",
            err(BufAttr::decode(
                NvSciBufAttrKey::NvSciBufGeneralAttrKey_EnableGpuCache,
                &[1],
            )),
            E::AttrLength { key: 9, len: 1 },
        ),
        (
            "EnableGpuCompression is per-GPU 20-byte entries",
            err(BufAttr::decode(
                NvSciBufAttrKey::NvSciBufGeneralAttrKey_EnableGpuCompression,
                &[0; 17],
            )),
            E::AttrLength { key: 11, len: 17 },
        ),
        (
            "EnableGpuCompression type is None or GenericCompressible",
            err(BufAttrSet::<2>::new()
                .set(
                    BufAttr::gpu_compression(&[nvsci::GpuCompression::new(
                        GpuId([1; 16]),
                        nvsci::CompressionType(7),
                    )])
                    .unwrap(),
                )
                .map(|_| ())),
            E::InvalidAttrValue { key: 11 },
        ),
        (
            "image ScanType is Progressive or Interlace",
            err(BufAttrSet::<2>::new()
                .set(BufAttr::ScanType(nvsci::ScanType(2)))
                .map(|_| ())),
            E::InvalidAttrValue { key: 0x2000e },
        ),
        (
            "a second value for a per-GPU key is refused",
            err(BufAttrSet::<3>::new()
                .set(BufAttr::gpu_cache(&[nvsci::GpuCache::new(GpuId([1; 16]), true)]).unwrap())
                .unwrap()
                .set(BufAttr::gpu_cache(&[nvsci::GpuCache::new(GpuId([1; 16]), false)]).unwrap())
                .map(|_| ())),
            E::DuplicateKey { key: 9 },
        ),
        // --- flags ---
        (
            "cuDeviceGetNvSciSyncAttributes needs a flag (driver: INVALID_VALUE)",
            err(NvSciSyncAttrFlags::empty().for_device_query()),
            E::NoNvSciSyncAttrFlags,
        ),
        (
            "flags refuse unknown bits",
            err(SignalFlags::checked(0x4)),
            E::UnknownFlags { bits: 0x4 },
        ),
    ];

    let mut failures = Vec::new();
    for (name, got, want) in &rows {
        if got.as_ref() != Some(want) {
            failures.push(format!("{name}: expected {want:?}, got {got:?}"));
        }
        // Every error has a non-empty message.
        assert!(!want.to_string().is_empty());
    }
    assert!(
        failures.is_empty(),
        "rule rows failed:\n{}",
        failures.join("\n")
    );
    assert!(rows.len() >= 80, "rule table shrank to {}", rows.len());
}

#[test]
fn dedicated_is_set_for_kinds_that_need_it() {
    for kind in MemoryHandleKind::ALL {
        let handle = if kind.is_fd() {
            MemoryHandle::Fd(3)
        } else if kind.is_win32() {
            MemoryHandle::Win32 {
                handle: h(),
                name: null(),
            }
        } else {
            MemoryHandle::NvSciBuf(n())
        };
        let import = MemoryImport::new(kind, handle, 64).unwrap();
        assert_eq!(
            import.flags().contains(MemoryImportFlags::DEDICATED),
            kind.requires_dedicated(),
            "{kind}"
        );
        assert_eq!(import.raw().type_.0, kind as u32);
        assert_eq!(import.raw().reserved, [0; 16]);
        assert_eq!(MemoryHandleKind::from_raw(kind as u32), Ok(kind));
    }
}

#[test]
fn dmabuf_value_is_nine() {
    assert_eq!(MemoryHandleKind::DmaBufFd as u32, 9);
    assert_eq!(
        tegra_interop_core::memory::CU_EXTERNAL_MEMORY_HANDLE_TYPE_DMABUF_FD.0,
        9
    );
    let import = MemoryImport::dma_buf_fd(4, 64).unwrap();
    assert_eq!(import.raw().type_.0, 9);
    assert_eq!(import.fd(), Some(4));
}

#[test]
fn with_fd_changes_only_the_fd() {
    let import = MemoryImport::dma_buf_fd(4, 64).unwrap().dedicated();
    let moved = import.with_fd(11).unwrap();
    assert_eq!(moved.fd(), Some(11));
    // SAFETY: an fd import writes the fd member of the union.
    assert_eq!(unsafe { moved.raw().handle.fd }, 11);
    assert_eq!(moved.kind(), import.kind());
    assert_eq!(moved.size(), 64);
    assert_eq!(moved.flags(), import.flags());
    let sem = SemaphoreImport::timeline_fd(4)
        .unwrap()
        .with_fd(12)
        .unwrap();
    assert_eq!(sem.fd(), Some(12));
    // SAFETY: as above.
    assert_eq!(unsafe { sem.raw().handle.fd }, 12);
    assert_eq!(sem.kind(), SemaphoreHandleKind::TimelineSemaphoreFd);
}

#[test]
fn win32_by_name_is_accepted() {
    let m = MemoryImport::opaque_win32(null_mut(), n(), 64).unwrap();
    // SAFETY: a Win32 import writes the win32 member of the (zero-initialised) union.
    let win32 = unsafe { m.raw().handle.win32 };
    assert_eq!(win32.name, n());
    assert!(win32.handle.is_null());
    let s = SemaphoreImport::timeline_win32(h(), null()).unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { s.raw().handle.win32.handle }, h());
}

#[test]
fn every_semaphore_kind_accepts_its_own_params() {
    let mut fence = NvSciSyncFence::default();
    for kind in SemaphoreHandleKind::ALL {
        let (signal, wait) = if kind.has_fence_value() {
            (SignalParams::timeline(5), WaitParams::timeline(5))
        } else if kind.is_keyed_mutex() {
            (SignalParams::keyed_mutex(2), WaitParams::keyed_mutex(2, 16))
        } else if kind.is_nvscisync() {
            (
                SignalParams::nvscisync(&mut fence),
                WaitParams::nvscisync(&fence),
            )
        } else {
            (SignalParams::binary(), WaitParams::binary())
        };
        let s = signal.lower_for(kind).unwrap();
        let w = wait.lower_for(kind).unwrap();
        assert_eq!(s.flags, 0);
        assert_eq!(w.flags, 0);
        assert_eq!(s.reserved, [0; 16]);
        assert_eq!(w.reserved, [0; 16]);
        assert_eq!(s.params.reserved, [0; 12]);
        assert_eq!(w.params.reserved, [0; 10]);
        if kind.has_fence_value() {
            assert_eq!(s.params.fence.value, 5);
            assert_eq!(w.params.fence.value, 5);
        } else {
            assert_eq!(s.params.fence.value, 0);
        }
        if kind.is_keyed_mutex() {
            assert_eq!(s.params.keyedMutex.key, 2);
            assert_eq!(w.params.keyedMutex.key, 2);
            assert_eq!(w.params.keyedMutex.timeoutMs, 16);
        } else {
            assert_eq!(w.params.keyedMutex.timeoutMs, 0);
        }
        // SAFETY: the union is zero-initialised and both members are 8-byte plain data.
        let s_fence = unsafe { s.params.nvSciSync.fence };
        if kind.is_nvscisync() {
            assert_eq!(s_fence, (&raw mut fence).cast());
        } else {
            assert!(s_fence.is_null());
        }
    }
}

#[test]
fn memsync_skip_is_accepted_on_nvscisync_only() {
    let mut fence = NvSciSyncFence::default();
    // SAFETY: (test) the parameters are only lowered and inspected, never submitted.
    let signal = unsafe { SignalParams::nvscisync(&mut fence).skip_nvscibuf_memsync() };
    let raw = signal.lower_for(SemaphoreHandleKind::NvSciSync).unwrap();
    assert_eq!(raw.flags, 1);
    // SAFETY: (test) as above.
    let wait = unsafe { WaitParams::nvscisync(&fence).skip_nvscibuf_memsync() };
    assert_eq!(
        wait.lower_for(SemaphoreHandleKind::NvSciSync)
            .unwrap()
            .flags,
        2
    );
}

#[test]
fn keyed_mutex_infinite_is_named() {
    assert_eq!(KEYED_MUTEX_INFINITE, 0xFFFF_FFFF);
}

#[test]
fn buffer_offset_one_is_accepted() {
    // Measured: offset 1 -> SUCCESS, so the core must not refuse it.
    let raw = BufferMapping::new(1, 63).lower(64).unwrap();
    assert_eq!(
        (raw.offset, raw.size, raw.flags, raw.reserved),
        (1, 63, 0, [0; 16])
    );
}

#[test]
fn deterministic_second_stream_allowed_once_ordered() {
    let mut det = DeterministicCounter::new(PrimitiveWidth::U32, 0).unwrap();
    let r = det.reserve(StreamId(1)).unwrap();
    det.commit(r).unwrap();
    det.order_after(StreamId(2), StreamId(1)).unwrap();
    let r = det.reserve(StreamId(2)).unwrap();
    assert_eq!(det.commit(r), Ok(2));
    // Back to stream 1 needs its own statement.
    assert!(det.reserve(StreamId(1)).is_err());
    // SAFETY: (test) no real streams are involved.
    unsafe { det.assume_streams_ordered() };
    let r = det.reserve(StreamId(1)).unwrap();
    assert_eq!(det.commit(r), Ok(3));
}

#[test]
fn deterministic_counter_learns_its_initial_value() {
    // A 32-bit primitive that started just below the wrap: the first signal read back as
    // u32::MAX, so the second produces 0.
    let mut det = DeterministicCounter::new(PrimitiveWidth::U32, 0).unwrap();
    let r = det.reserve(StreamId(1)).unwrap();
    det.commit(r).unwrap();
    assert_eq!(
        det.learn(1, u64::from(u32::MAX)),
        Ok(u64::from(u32::MAX) - 1)
    );
    assert_eq!(det.current_value(), u64::from(u32::MAX));
    assert_eq!(det.next_signal_value(), 0);
    // The stream rule survives learning.
    assert!(det.reserve(StreamId(2)).is_err());
    // Learning from signal 0 (the current value) wraps backwards correctly too.
    let mut early = DeterministicCounter::new(PrimitiveWidth::U32, 9).unwrap();
    assert_eq!(early.learn(3, 1), Ok(u64::from(u32::MAX) - 1));
    assert_eq!(early.value_of_signal(3), 1);
    // A value wider than the primitive is refused and changes nothing.
    assert_eq!(
        det.learn(1, 1 << 32),
        Err(ValidationError::FenceValueTooWide { value: 1 << 32 })
    );
    assert_eq!(det.current_value(), u64::from(u32::MAX));
    let mut wide = DeterministicCounter::new(PrimitiveWidth::U64, 0).unwrap();
    assert_eq!(wide.learn(2, 1), Ok(u64::MAX));
}

#[test]
fn set_fence_values_writes_every_entry_or_nothing() {
    let mut batch = SignalBatch::<4>::new();
    for _ in 0..3 {
        batch
            .push(sem(), S::TimelineSemaphoreFd, SignalParams::timeline(1))
            .unwrap();
    }
    batch.set_fence_values(&[5, 6, 7]).unwrap();
    let seen: Vec<_> = (0..3).map(|i| batch.fence_value(i).unwrap()).collect();
    assert_eq!(seen, [Some(5), Some(6), Some(7)]);
    // Too few and too many values: refused before anything is written.
    assert_eq!(
        batch.set_fence_values(&[9, 9]),
        Err(E::IndexOutOfRange { index: 2, len: 3 })
    );
    assert_eq!(
        batch.set_fence_values(&[9, 9, 9, 9]),
        Err(E::IndexOutOfRange { index: 3, len: 3 })
    );
    // A kind without a fence value anywhere in the batch: nothing written.
    batch
        .push(sem(), S::OpaqueFd, SignalParams::binary())
        .unwrap();
    assert_eq!(
        batch.set_fence_values(&[8, 8, 8, 8]),
        Err(E::FenceValueNotSupported { kind: S::OpaqueFd })
    );
    let seen: Vec<_> = (0..3).map(|i| batch.fence_value(i).unwrap()).collect();
    assert_eq!(seen, [Some(5), Some(6), Some(7)]);
}
