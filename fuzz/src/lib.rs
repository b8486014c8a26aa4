//! Properties of `tegra-interop-core` checked on arbitrary input.
//!
//! Each public function takes raw fuzzer bytes, turns them into a sequence of
//! operations with `arbitrary`, runs them against the core, and panics (which
//! libFuzzer reports as a crash) when a property fails. The properties are
//! stated from the CUDA / NvSci rules in the project's notes, independent of
//! how the core implements them where the rule is precise, and as structural
//! invariants (reserved fields zero, round trips, counters that never drift)
//! everywhere else.
//!
//! Nothing here calls a driver: handles and pointers are plain numbers that
//! the core stores but never dereferences. The exception is `peer_messages`
//! (`src/peer.rs`): a hostile peer against the simulator's NvSci import
//! paths and the driver's receive side.

mod fdpeer;
mod peer;
pub use fdpeer::fd_peer;
pub use peer::peer_messages;

use arbitrary::{Arbitrary, Result, Unstructured};
use core::ffi::c_void;
use tegra_interop_core::fence::MAX_STREAM_ORDERINGS;
use tegra_interop_core::nvsci::{BufAttr, BufAttrSet, SyncAttr, SyncAttrSet};
use tegra_interop_core::{
    ArrayDesc, ArrayFormat, BufferMapping, DeterministicCounter, MemoryHandle, MemoryHandleKind,
    MemoryImport, MemoryImportFlags, MipmappedArrayMapping, PrimitiveWidth, SemaphoreHandle,
    SemaphoreHandleKind, SemaphoreImport, SignalBatch, SignalParams, StreamId, TimelineTracker,
    ValidationError, WaitBatch, WaitParams,
};
use tegra_interop_sys::cuda::{CUarray_format, CUexternalSemaphore, CUDA_ARRAY3D_DESCRIPTOR};
use tegra_interop_sys::nvsci::{NvSciBufAttrKey, NvSciSyncAttrKey};

fn ptr(addr: usize) -> *mut c_void {
    core::ptr::without_provenance_mut(addr)
}

/// A handle as the fuzzer sees it: any variant, any value.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum RawHandle {
    Fd(i32),
    Win32 { handle: usize, name: usize },
    Object(usize),
}

/// A u64 that often lands near interesting edges.
fn edgy_u64(u: &mut Unstructured<'_>) -> Result<u64> {
    Ok(match u.int_in_range(0..=5u8)? {
        0 => 0,
        1 => u.int_in_range(1..=64)?,
        2 => u64::MAX - u.int_in_range(0..=64)?,
        3 => u64::from(u32::MAX) - u.int_in_range(0..=64)?,
        4 => 1u64 << u.int_in_range(0..=63u32)?,
        _ => u.arbitrary()?,
    })
}

// ------------------------------------------------------------ descriptors --

/// Memory, buffer, array, semaphore and signal/wait descriptor builders.
pub fn descriptors(data: &[u8]) {
    let mut u = Unstructured::new(data);
    // Running out of input just ends the run.
    let _ = descriptors_inner(&mut u);
}

fn descriptors_inner(u: &mut Unstructured<'_>) -> Result<()> {
    let steps = u.int_in_range(1..=16u8)?;
    for _ in 0..steps {
        match u.int_in_range(0..=4u8)? {
            0 => memory_import(u)?,
            1 => array_mapping(u)?,
            2 => semaphore_import(u)?,
            3 => signal_wait(u)?,
            _ => batches(u)?,
        }
    }
    Ok(())
}

/// The import rules as the notes state them (cuda-facts.md), written
/// independently of the core's own classification.
fn memory_import_expected(kind: MemoryHandleKind, handle: RawHandle, size: u64) -> bool {
    use MemoryHandleKind as K;
    let fd_kind = matches!(kind, K::OpaqueFd | K::DmaBufFd);
    let kmt = matches!(kind, K::OpaqueWin32Kmt | K::D3d11ResourceKmt);
    let win32 = matches!(
        kind,
        K::OpaqueWin32 | K::D3d12Heap | K::D3d12Resource | K::D3d11Resource
    ) || kmt;
    size != 0
        && match handle {
            RawHandle::Fd(fd) => fd_kind && fd >= 0,
            RawHandle::Win32 { handle, name } if kmt => win32 && handle != 0 && name == 0,
            RawHandle::Win32 { handle, name } => win32 && ((handle == 0) != (name == 0)),
            RawHandle::Object(obj) => kind == K::NvSciBuf && obj != 0,
        }
}

fn memory_handle(h: RawHandle) -> MemoryHandle {
    match h {
        RawHandle::Fd(fd) => MemoryHandle::Fd(fd),
        RawHandle::Win32 { handle, name } => MemoryHandle::Win32 {
            handle: ptr(handle),
            name: ptr(name).cast_const(),
        },
        RawHandle::Object(obj) => MemoryHandle::NvSciBuf(ptr(obj).cast_const()),
    }
}

fn any_memory_import(u: &mut Unstructured<'_>) -> Result<Option<MemoryImport>> {
    let raw_kind: u32 = u.int_in_range(0..=10)?;
    let kind = match MemoryHandleKind::from_raw(raw_kind) {
        Ok(kind) => {
            assert_eq!(kind.raw().0, raw_kind);
            kind
        }
        Err(e) => {
            assert!(
                !(1..=9).contains(&raw_kind),
                "kind {raw_kind} refused: {e:?}"
            );
            return Ok(None);
        }
    };
    let handle: RawHandle = u.arbitrary()?;
    let size = edgy_u64(u)?;
    let result = MemoryImport::new(kind, memory_handle(handle), size);
    assert_eq!(
        result.is_ok(),
        memory_import_expected(kind, handle, size),
        "{kind:?} {handle:?} size {size}: {result:?}"
    );
    let Ok(import) = result else { return Ok(None) };
    let raw = import.raw();
    assert_eq!(raw.type_, kind.raw());
    assert_eq!(raw.size, size);
    assert_eq!(import.size(), size);
    assert_eq!(raw.reserved, [0; 16]);
    // D3D12/D3D11 resources must be imported dedicated; nothing else gets a flag.
    let dedicated = matches!(
        kind,
        MemoryHandleKind::D3d12Resource
            | MemoryHandleKind::D3d11Resource
            | MemoryHandleKind::D3d11ResourceKmt
    );
    assert_eq!(raw.flags, u32::from(dedicated));
    if let RawHandle::Fd(fd) = handle {
        assert_eq!(import.fd(), Some(fd));
    } else {
        assert_eq!(import.fd(), None);
    }
    assert_eq!(import.handle(), memory_handle(handle));

    // Flags: only DEDICATED exists, and it cannot be dropped where required.
    let bits: u32 = u.arbitrary()?;
    match import.with_flags(MemoryImportFlags::from_bits_retain(bits)) {
        Ok(flagged) => {
            assert_eq!(bits & !1, 0, "unknown flag bits accepted: {bits:#x}");
            assert!(!dedicated || bits & 1 == 1);
            assert_eq!(flagged.raw().flags, bits);
            assert_eq!(flagged.raw().reserved, [0; 16]);
        }
        Err(_) => assert!(bits & !1 != 0 || (dedicated && bits & 1 == 0)),
    }
    Ok(Some(import))
}

fn memory_import(u: &mut Unstructured<'_>) -> Result<()> {
    let import = any_memory_import(u)?;
    let import_size = match import {
        Some(import) => import.size(),
        None => edgy_u64(u)?,
    };
    let offset = edgy_u64(u)?;
    let size = edgy_u64(u)?;
    let mapping = BufferMapping::new(offset, size);
    let fits = size != 0
        && offset
            .checked_add(size)
            .is_some_and(|end| end <= import_size);
    match mapping.lower(import_size) {
        Ok(raw) => {
            assert!(fits, "{mapping:?} accepted for {import_size} bytes");
            assert_eq!((raw.offset, raw.size, raw.flags), (offset, size, 0));
            assert_eq!(raw.reserved, [0; 16]);
            // What we lower, we accept back.
            assert_eq!(BufferMapping::from_raw(&raw, import_size), Ok(mapping));
            if let Some(import) = &import {
                assert_eq!(mapping.lower_for(import), Ok(raw));
            }
        }
        Err(e) => assert!(!fits, "{mapping:?} refused for {import_size} bytes: {e:?}"),
    }
    // A raw descriptor from elsewhere: flags and reserved must be zero.
    let mut raw = tegra_interop_sys::cuda::CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
        offset,
        size,
        ..Default::default()
    };
    if u.arbitrary()? {
        raw.flags = u.arbitrary()?;
    }
    if u.arbitrary()? {
        let i = u.choose_index(16)?;
        raw.reserved[i] = u.arbitrary()?;
    }
    let accepted = BufferMapping::from_raw(&raw, import_size).is_ok();
    assert_eq!(
        accepted,
        fits && raw.flags == 0 && raw.reserved == [0; 16],
        "{raw:?} for {import_size}"
    );
    Ok(())
}

fn array_mapping(u: &mut Unstructured<'_>) -> Result<()> {
    let small = |u: &mut Unstructured<'_>| -> Result<usize> {
        Ok(match u.int_in_range(0..=3u8)? {
            0 => 0,
            1 => u.int_in_range(1..=4096)?,
            2 => usize::MAX - u.int_in_range(0..=8)?,
            _ => u.arbitrary()?,
        })
    };
    let raw = CUDA_ARRAY3D_DESCRIPTOR {
        Width: small(u)?,
        Height: small(u)?,
        Depth: small(u)?,
        Format: CUarray_format(u.arbitrary()?),
        NumChannels: u.int_in_range(0..=5)?,
        Flags: if u.arbitrary()? { u.arbitrary()? } else { 0 },
    };
    let Ok(desc) = ArrayDesc::from_raw(&raw) else {
        // A plain 1D/2D array of a supported format with a small extent and
        // no flags is always valid.
        let plain = (1..=4096).contains(&raw.Width)
            && raw.Height <= 4096
            && raw.Depth == 0
            && matches!(raw.NumChannels, 1 | 2 | 4)
            && raw.Flags == 0
            && ArrayFormat::from_raw(raw.Format.0).is_ok();
        assert!(!plain, "{raw:?} refused");
        return Ok(());
    };
    // Accepted descriptors: 1, 2 or 4 channels, a computable size, exact round trip.
    assert!(matches!(desc.channels(), 1 | 2 | 4));
    assert!(raw.Width > 0);
    assert_eq!(desc.raw(), raw);
    let level0 = desc
        .level0_bytes()
        .expect("accepted descriptors have a size");
    assert!(level0 > 0);
    let max = desc.max_levels();
    assert!(max >= 1);

    let kind = *u.choose(&MemoryHandleKind::ALL)?;
    let import_size = edgy_u64(u)?;
    let offset = edgy_u64(u)?;
    let levels: u32 = u.int_in_range(0..=40)?;
    let mapping = MipmappedArrayMapping::new(offset, desc, levels);
    match mapping.lower(kind, import_size) {
        Ok(lowered) => {
            assert!(levels >= 1 && levels <= max);
            // NvSciBuf-backed mipmapped arrays have exactly one level.
            assert!(kind != MemoryHandleKind::NvSciBuf || levels == 1);
            assert!(offset
                .checked_add(level0)
                .is_some_and(|end| end <= import_size));
            assert_eq!(lowered.offset, offset);
            assert_eq!(lowered.arrayDesc, raw);
            assert_eq!(lowered.numLevels, levels);
            assert_eq!(lowered.reserved, [0; 16]);
        }
        Err(_) => assert!(
            levels == 0
                || levels > max
                || (kind == MemoryHandleKind::NvSciBuf && levels != 1)
                || offset
                    .checked_add(level0)
                    .is_none_or(|end| end > import_size)
        ),
    }
    Ok(())
}

fn semaphore_import(u: &mut Unstructured<'_>) -> Result<()> {
    let raw_kind: u32 = u.int_in_range(0..=11)?;
    let Ok(kind) = SemaphoreHandleKind::from_raw(raw_kind) else {
        assert!(!(1..=10).contains(&raw_kind));
        return Ok(());
    };
    assert_eq!(kind.raw().0, raw_kind);
    let handle: RawHandle = u.arbitrary()?;
    let sem_handle = match handle {
        RawHandle::Fd(fd) => SemaphoreHandle::Fd(fd),
        RawHandle::Win32 { handle, name } => SemaphoreHandle::Win32 {
            handle: ptr(handle),
            name: ptr(name).cast_const(),
        },
        RawHandle::Object(obj) => SemaphoreHandle::NvSciSync(ptr(obj).cast_const()),
    };
    use SemaphoreHandleKind as K;
    let result = SemaphoreImport::new(kind, sem_handle);
    // Rules stated in the notes; other Win32 kinds only need to be Win32.
    let fd_kind = matches!(kind, K::OpaqueFd | K::TimelineSemaphoreFd);
    let kmt = matches!(kind, K::OpaqueWin32Kmt | K::D3d11KeyedMutexKmt);
    match handle {
        RawHandle::Fd(fd) => assert_eq!(result.is_ok(), fd_kind && fd >= 0, "{kind:?} fd {fd}"),
        RawHandle::Object(obj) => {
            assert_eq!(result.is_ok(), kind == K::NvSciSync && obj != 0);
        }
        RawHandle::Win32 { handle, name } => {
            if kmt {
                assert_eq!(result.is_ok(), handle != 0 && name == 0);
            } else if matches!(kind, K::OpaqueWin32 | K::D3d12Fence) {
                assert_eq!(result.is_ok(), (handle == 0) != (name == 0));
            } else if result.is_ok() {
                assert!(kind.is_win32() && (handle != 0 || name != 0));
            }
        }
    }
    if let Ok(import) = result {
        assert_eq!(import.kind(), kind);
        assert_eq!(import.raw().type_, kind.raw());
        assert_eq!(import.raw().flags, 0);
        assert_eq!(import.raw().reserved, [0; 16]);
        assert_eq!(import.handle(), sem_handle);
    }
    Ok(())
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum RawPayload {
    Binary,
    Fence(u64),
    NvSciSync(usize),
    KeyedMutex { key: u64, timeout_ms: u32 },
}

fn signal_params(p: RawPayload, skip: bool) -> SignalParams {
    let params = match p {
        RawPayload::Binary => SignalParams::binary(),
        RawPayload::Fence(v) => SignalParams::fence(v),
        RawPayload::NvSciSync(f) => SignalParams::nvscisync(ptr(f).cast()),
        RawPayload::KeyedMutex { key, .. } => SignalParams::keyed_mutex(key),
    };
    if skip {
        // SAFETY: the parameters are only lowered and inspected here, never
        // handed to a driver, so skipping memory synchronisation has no effect.
        unsafe { params.skip_nvscibuf_memsync() }
    } else {
        params
    }
}

fn wait_params(p: RawPayload, skip: bool) -> WaitParams {
    let params = match p {
        RawPayload::Binary => WaitParams::binary(),
        RawPayload::Fence(v) => WaitParams::fence(v),
        RawPayload::NvSciSync(f) => WaitParams::nvscisync(ptr(f).cast_const().cast()),
        RawPayload::KeyedMutex { key, timeout_ms } => WaitParams::keyed_mutex(key, timeout_ms),
    };
    if skip {
        // SAFETY: as in `signal_params`: lowered and inspected only.
        unsafe { params.skip_nvscibuf_memsync() }
    } else {
        params
    }
}

/// What the notes say must hold for a payload on a kind.
fn payload_allowed(kind: SemaphoreHandleKind, p: RawPayload, skip: bool) -> bool {
    use SemaphoreHandleKind as K;
    let fence_kind = matches!(
        kind,
        K::D3d12Fence | K::D3d11Fence | K::TimelineSemaphoreFd | K::TimelineSemaphoreWin32
    );
    let mutex_kind = matches!(kind, K::D3d11KeyedMutex | K::D3d11KeyedMutexKmt);
    let nvsci = kind == K::NvSciSync;
    // Flags are only for NvSciSync semaphores.
    if skip && !nvsci {
        return false;
    }
    match p {
        RawPayload::Binary => !fence_kind && !mutex_kind && !nvsci,
        RawPayload::Fence(_) => fence_kind,
        RawPayload::NvSciSync(f) => nvsci && f != 0,
        RawPayload::KeyedMutex { .. } => mutex_kind,
    }
}

fn signal_wait(u: &mut Unstructured<'_>) -> Result<()> {
    let kind = *u.choose(&SemaphoreHandleKind::ALL)?;
    let payload: RawPayload = u.arbitrary()?;
    let skip: bool = u.arbitrary()?;
    let allowed = payload_allowed(kind, payload, skip);

    let signal = signal_params(payload, skip).lower_for(kind);
    assert_eq!(
        signal.is_ok(),
        allowed,
        "signal {kind:?} {payload:?} skip {skip}: {:?}",
        signal.as_ref().err()
    );
    if let Ok(raw) = signal {
        assert_eq!(raw.reserved, [0; 16]);
        assert_eq!(raw.params.reserved, [0; 12]);
        assert_eq!(raw.flags, u32::from(skip));
        match payload {
            RawPayload::Fence(v) => assert_eq!(raw.params.fence.value, v),
            RawPayload::KeyedMutex { key, .. } => assert_eq!(raw.params.keyedMutex.key, key),
            RawPayload::NvSciSync(f) => {
                // SAFETY: reading the pointer member of a plain-data union
                // whose every bit pattern is a valid pointer value.
                assert_eq!(unsafe { raw.params.nvSciSync.fence } as usize, f);
            }
            RawPayload::Binary => assert_eq!(raw.params.fence.value, 0),
        }
    }
    let wait = wait_params(payload, skip).lower_for(kind);
    assert_eq!(
        wait.is_ok(),
        allowed,
        "wait {kind:?} {payload:?} skip {skip}: {:?}",
        wait.as_ref().err()
    );
    if let Ok(raw) = wait {
        assert_eq!(raw.reserved, [0; 16]);
        assert_eq!(raw.params.reserved, [0; 10]);
        // The wait flag is bit 1 (SKIP_NVSCIBUF_MEMSYNC = 0x2).
        assert_eq!(raw.flags, if skip { 2 } else { 0 });
        match payload {
            RawPayload::Fence(v) => assert_eq!(raw.params.fence.value, v),
            RawPayload::KeyedMutex { key, timeout_ms } => {
                assert_eq!(raw.params.keyedMutex.key, key);
                assert_eq!(raw.params.keyedMutex.timeoutMs, timeout_ms);
            }
            RawPayload::NvSciSync(f) => {
                // SAFETY: as above.
                assert_eq!(unsafe { raw.params.nvSciSync.fence } as usize, f);
            }
            RawPayload::Binary => assert_eq!(raw.params.fence.value, 0),
        }
    }
    Ok(())
}

fn batches(u: &mut Unstructured<'_>) -> Result<()> {
    let mut signals = SignalBatch::<4>::new();
    let mut waits = WaitBatch::<3>::new();
    let pushes = u.int_in_range(0..=10u8)?;
    for _ in 0..pushes {
        let handle: CUexternalSemaphore = ptr(u.int_in_range(0..=3usize)?).cast();
        let kind = *u.choose(&SemaphoreHandleKind::ALL)?;
        let payload: RawPayload = u.arbitrary()?;
        let skip: bool = u.arbitrary()?;
        let ok = !handle.is_null() && payload_allowed(kind, payload, skip);

        let before = signals.len();
        let result = signals.push(handle, kind, signal_params(payload, skip));
        if before == signals.capacity() {
            assert!(result.is_err() && signals.len() == before);
        } else {
            assert_eq!(result.is_ok(), ok, "{result:?}");
            assert_eq!(signals.len(), before + usize::from(ok));
            if let Ok(index) = result {
                assert_eq!(index, before);
                assert_eq!(signals.handles()[index], handle);
                assert_eq!(signals.kinds()[index], kind);
            }
        }
        // The two arrays one FFI call takes always line up.
        assert_eq!(signals.handles().len(), signals.len());
        assert_eq!(signals.params().len(), signals.len());
        assert_eq!(signals.count() as usize, signals.len());
        assert!(signals.len() <= 4);

        let before = waits.len();
        let result = waits.push(handle, kind, wait_params(payload, skip));
        if before == waits.capacity() {
            assert!(result.is_err() && waits.len() == before);
        } else {
            assert_eq!(result.is_ok(), ok, "{result:?}");
            assert_eq!(waits.len(), before + usize::from(ok));
        }
        assert_eq!(waits.handles().len(), waits.len());
        assert_eq!(waits.params().len(), waits.len());
        assert!(waits.len() <= 3);
    }
    if u.arbitrary()? {
        signals.clear();
        assert!(signals.is_empty() && signals.params().is_empty());
    }
    Ok(())
}

// ---------------------------------------------------------- attr lowering --

/// Every NvSciBuf key value the notes list, plus neighbours.
const BUF_KEYS: &[u32] = &[
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x10000, 0x10001, 0x10002, 0x20000, 0x20001, 0x20002,
    0x20003, 0x20004, 0x20005, 0x20006, 0x20007, 0x20008, 0x20009, 0x2000a, 0x2000b, 0x2000c,
    0x2000d, 0x2000e, 0x2000f, 0x20010, 0x20011, 0x20012, 0x20013, 0x20014, 0x20015, 0x20016,
    0x20017, 0x20018, 0x20019, 0x30000, 0x40000, 0x50000,
];
/// Every NvSciSync key value the notes list.
const SYNC_KEYS: &[u32] = &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

fn key_and_bytes<'a>(u: &mut Unstructured<'a>, keys: &[u32]) -> Result<(u32, &'a [u8])> {
    let key = if u.ratio(7, 8)? {
        *u.choose(keys)?
    } else {
        u.arbitrary()?
    };
    // Mostly the widths the attributes use, sometimes anything.
    let len = match u.int_in_range(0..=7u8)? {
        0 => 1,
        1 => 4,
        2 => 8,
        3 => 16 * u.int_in_range(1..=5usize)?,
        4 => 4 * u.int_in_range(1..=5usize)?,
        // Per-GPU cache entries (17 bytes) and compression entries (20 bytes).
        5 => 17 * u.int_in_range(1..=5usize)?,
        6 => 20 * u.int_in_range(1..=5usize)?,
        _ => u.int_in_range(0..=100usize)?,
    };
    Ok((key, u.bytes(len)?))
}

/// NvSciBuf / NvSciSync attribute decoding, typed sets and their lowering
/// to C key/value arrays.
pub fn attr_lowering(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let _ = buf_attrs(&mut u);
    let _ = sync_attrs(&mut u);
}

fn buf_attrs(u: &mut Unstructured<'_>) -> Result<()> {
    let mut set = BufAttrSet::<8>::new();
    let mut inputs: Vec<(u32, Vec<u8>)> = Vec::new();
    let n = u.int_in_range(0..=12u8)?;
    for _ in 0..n {
        let (key, bytes) = key_and_bytes(u, BUF_KEYS)?;
        let Ok(attr) = BufAttr::decode(NvSciBufAttrKey(key), bytes) else {
            continue;
        };
        assert_eq!(attr.key().0, key, "decode kept the key");
        let duplicate = set.get(attr.key()).is_some();
        let full = set.len() == 8;
        // Output-only keys decode (they are read back) but are never settable.
        let valid = attr.validate().is_ok() && !attr.is_output_only();
        let before = set.len();
        match set.set(attr.clone()) {
            Ok(_) => {
                assert!(!duplicate && !full && valid);
                assert_eq!(set.len(), before + 1);
                assert_eq!(set.get(attr.key()), Some(&attr));
                inputs.push((key, bytes.to_vec()));
            }
            Err(e) => {
                assert!(duplicate || full || !valid, "{attr:?} refused: {e:?}");
                assert_eq!(set.len(), before);
                if duplicate && valid {
                    assert_eq!(e, ValidationError::DuplicateKey { key });
                }
            }
        }
    }
    let lowered = set.lower();
    assert_eq!(lowered.is_ok(), set.validate().is_ok());
    let Ok(lowered) = lowered else { return Ok(()) };
    assert_eq!(lowered.len(), set.len());
    for ((pair, attr), (key, bytes)) in lowered.as_slice().iter().zip(set.attrs()).zip(&inputs) {
        assert_eq!(pair.key, attr.key());
        assert_eq!(pair.key.0, *key);
        assert!(!pair.value.is_null());
        // SAFETY: the lowered pairs point into `set`, which is alive and
        // unchanged; `len` is the size of the value they point at.
        let lowered_bytes =
            unsafe { core::slice::from_raw_parts(pair.value.cast::<u8>(), pair.len) };
        assert_eq!(
            lowered_bytes,
            bytes.as_slice(),
            "bytes of key {key:#x} round trip"
        );
        // SAFETY: as above.
        let back = unsafe { BufAttr::decode_pair(pair) };
        assert_eq!(back, Ok(Some(attr.clone())));
    }
    Ok(())
}

fn sync_attrs(u: &mut Unstructured<'_>) -> Result<()> {
    let mut set = SyncAttrSet::<6>::new();
    let mut inputs: Vec<(u32, Vec<u8>)> = Vec::new();
    let n = u.int_in_range(0..=10u8)?;
    for _ in 0..n {
        let (key, bytes) = key_and_bytes(u, SYNC_KEYS)?;
        let Ok(attr) = SyncAttr::decode(NvSciSyncAttrKey(key), bytes) else {
            continue;
        };
        assert_eq!(attr.key().0, key);
        let duplicate = set.get(attr.key()).is_some();
        let full = set.len() == 6;
        // Output-only keys decode (they are read back) but are never settable.
        let valid = attr.validate().is_ok() && !attr.is_output_only();
        let before = set.len();
        match set.set(attr.clone()) {
            Ok(_) => {
                assert!(!duplicate && !full && valid);
                assert_eq!(set.len(), before + 1);
                inputs.push((key, bytes.to_vec()));
            }
            Err(e) => {
                assert!(duplicate || full || !valid, "{attr:?} refused: {e:?}");
                assert_eq!(set.len(), before);
            }
        }
    }
    let Ok(lowered) = set.lower() else {
        return Ok(());
    };
    assert_eq!(lowered.len(), set.len());
    for ((pair, attr), (key, bytes)) in lowered.as_slice().iter().zip(set.attrs()).zip(&inputs) {
        assert_eq!(pair.attrKey, attr.key());
        assert_eq!(pair.attrKey.0, *key);
        // SAFETY: the pairs point into `set`, alive and unchanged.
        let lowered_bytes =
            unsafe { core::slice::from_raw_parts(pair.value.cast::<u8>(), pair.len) };
        assert_eq!(
            lowered_bytes,
            bytes.as_slice(),
            "bytes of key {key:#x} round trip"
        );
        // SAFETY: as above.
        let back = unsafe { SyncAttr::decode_pair(pair) };
        assert_eq!(back, Ok(Some(attr.clone())));
    }
    Ok(())
}

// --------------------------------------------------------- fence trackers --

#[derive(Arbitrary, Debug)]
enum TimelineOp {
    Reserve(u64),
    ReserveNext,
    Commit,
    Abort,
}

#[derive(Arbitrary, Debug)]
enum CounterOp {
    Reserve(u8),
    Commit,
    Abort,
    OrderAfter(u8, u8),
}

/// Timeline tracker and deterministic counter against a model: a failed
/// enqueue (abort) never advances, values never drift from
/// `initial + signals` wrapped at the primitive's width, unordered streams
/// are refused.
pub fn fence_trackers(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let _ = timeline(&mut u);
    let _ = counter(&mut u);
}

fn timeline(u: &mut Unstructured<'_>) -> Result<()> {
    let initial = edgy_u64(u)?;
    let mut t = TimelineTracker::new(initial);
    let mut last = initial;
    let mut held = None;
    let n = u.int_in_range(0..=64u8)?;
    for _ in 0..n {
        match u.arbitrary::<TimelineOp>()? {
            TimelineOp::Reserve(v) => {
                let r = t.reserve(v);
                assert_eq!(
                    r.is_ok(),
                    held.is_none() && v > last,
                    "reserve {v} after {last}"
                );
                if let Ok(r) = r {
                    assert_eq!(r.value(), v);
                    held = Some(r);
                }
            }
            TimelineOp::ReserveNext => {
                let r = t.reserve_next();
                assert_eq!(r.is_ok(), held.is_none() && last < u64::MAX);
                if let Ok(r) = r {
                    assert_eq!(r.value(), last + 1);
                    held = Some(r);
                }
            }
            TimelineOp::Commit => {
                if let Some(r) = held.take() {
                    let v = r.value();
                    assert_eq!(t.commit(r), Ok(v));
                    last = v;
                }
            }
            TimelineOp::Abort => {
                if let Some(r) = held.take() {
                    assert_eq!(t.abort(r), Ok(()));
                }
            }
        }
        assert_eq!(t.last(), last);
        assert_eq!(t.pending(), held.as_ref().map(|r| r.value()));
    }
    if let Some(r) = held.take() {
        assert!(t.abort(r).is_ok());
    }
    Ok(())
}

fn counter(u: &mut Unstructured<'_>) -> Result<()> {
    let width = if u.arbitrary()? {
        PrimitiveWidth::U32
    } else {
        PrimitiveWidth::U64
    };
    let initial = edgy_u64(u)?;
    let created = DeterministicCounter::new(width, initial);
    assert_eq!(created.is_ok(), initial <= width.max_value());
    let Ok(mut c) = created else { return Ok(()) };

    let mut count = 0u64;
    let mut last_stream: Option<u8> = None;
    let mut orderings: Vec<(u8, u8)> = Vec::new();
    let mut held = None;
    let wrap = |v: u64| v & width.max_value();
    let n = u.int_in_range(0..=128u8)?;
    for _ in 0..n {
        match u.arbitrary::<CounterOp>()? {
            CounterOp::Reserve(s) => {
                let s = s % 4;
                let ordered = match last_stream {
                    None => true,
                    Some(last) => last == s || orderings.contains(&(s, last)),
                };
                let r = c.reserve(StreamId(u64::from(s)));
                assert_eq!(
                    r.is_ok(),
                    held.is_none() && ordered,
                    "reserve on {s} after {last_stream:?}"
                );
                if let Ok(r) = r {
                    assert_eq!(r.signal_index(), count + 1);
                    assert_eq!(r.value(), wrap(initial.wrapping_add(count + 1)));
                    assert_eq!(r.value(), c.next_signal_value());
                    assert_eq!(r.stream(), StreamId(u64::from(s)));
                    held = Some((r, s));
                }
            }
            CounterOp::Commit => {
                if let Some((r, s)) = held.take() {
                    let v = r.value();
                    assert_eq!(c.commit(r), Ok(v));
                    count += 1;
                    last_stream = Some(s);
                }
            }
            CounterOp::Abort => {
                if let Some((r, _)) = held.take() {
                    assert_eq!(c.abort(r), Ok(()));
                }
            }
            CounterOp::OrderAfter(later, earlier) => {
                let pair = (later % 4, earlier % 4);
                // A stream is always ordered after itself: accepted, not stored.
                let known = pair.0 == pair.1 || orderings.contains(&pair);
                let r = c.order_after(StreamId(u64::from(pair.0)), StreamId(u64::from(pair.1)));
                assert_eq!(r.is_ok(), known || orderings.len() < MAX_STREAM_ORDERINGS);
                if r.is_ok() && !known {
                    orderings.push(pair);
                }
            }
        }
        // No drift: the counter is always exactly initial + committed signals.
        assert_eq!(c.signal_count(), count);
        assert_eq!(c.current_value(), wrap(initial.wrapping_add(count)));
        assert_eq!(c.next_signal_value(), wrap(initial.wrapping_add(count + 1)));
        assert!(c.current_value() <= width.max_value());
        assert_eq!(c.last_stream(), last_stream.map(|s| StreamId(u64::from(s))));
        for k in [0, 1, count, count.wrapping_add(7)] {
            assert_eq!(c.value_of_signal(k), wrap(initial.wrapping_add(k)));
        }
    }
    if let Some((r, _)) = held.take() {
        assert!(c.abort(r).is_ok());
    }
    Ok(())
}

// ------------------------------------------------------------ ipc frames --

/// The message codec of NvSciIpc channels (`tegra_interop_core::ipc`): an
/// untrusted peer's frames never panic the receiver, never yield bytes
/// outside the frame or beyond the announced length, never let a message
/// exceed the receiver's limit; and every message survives the round trip
/// through frames of any size.
pub fn ipc_frames(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let _ = ipc_frames_inner(&mut u);
}

fn ipc_frames_inner(u: &mut Unstructured<'_>) -> Result<()> {
    use tegra_interop_core::ipc::{Assembly, FrameHeader, Frames, FRAME_HEADER_LEN};

    // Round trip.
    let frame_size = u.int_in_range(FRAME_HEADER_LEN + 1..=FRAME_HEADER_LEN + 64)?;
    let len = u.int_in_range(0..=300usize)?;
    let message: Vec<u8> = (0..len).map(|i| (i * 31) as u8).collect();
    let seq: u32 = u.arbitrary()?;
    let mut assembly = Assembly::new(seq, 300);
    let mut got = Vec::new();
    let mut buf = vec![0u8; frame_size];
    for f in Frames::new(&message, seq, frame_size) {
        buf.fill(0xa5);
        let n = f.write_to(&mut buf).expect("frame_size holds a frame");
        assert!(n <= frame_size);
        // Channels deliver whole frames: the padding travels too.
        let c = assembly.accept(&buf).expect("our own frames are accepted");
        assert_eq!(c.offset, got.len());
        got.extend_from_slice(c.bytes);
    }
    assert!(assembly.is_complete());
    assert_eq!(got, message);

    // Untrusted frames: garbage, forged headers, replays.
    let max = u.int_in_range(0..=4096u32)?;
    let mut a = Assembly::new(u.arbitrary()?, max);
    let mut received = 0usize;
    for _ in 0..u.int_in_range(0..=16u8)? {
        let frame: Vec<u8> = if u.arbitrary()? {
            let h = FrameHeader {
                seq: u.arbitrary()?,
                total: u.int_in_range(0..=8192u32)?,
                offset: u.int_in_range(0..=8192u32)?,
            };
            let mut f = h.encode().to_vec();
            let extra = u.int_in_range(0..=64usize)?;
            f.extend(u.bytes(extra)?);
            f
        } else {
            let n = u.int_in_range(0..=96usize)?;
            u.bytes(n)?.to_vec()
        };
        if let Ok(c) = a.accept(&frame) {
            assert!(c.total as u64 <= u64::from(max), "a message above the limit");
            assert_eq!(c.offset, received, "a chunk that does not continue the message");
            assert!(c.offset + c.bytes.len() <= c.total, "bytes beyond the announced length");
            let payload = &frame[FRAME_HEADER_LEN..];
            assert!(c.bytes.len() <= payload.len());
            assert_eq!(c.bytes, &payload[..c.bytes.len()], "bytes from outside the frame");
            received += c.bytes.len();
        }
    }
    Ok(())
}
