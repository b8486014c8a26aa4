//! Property tests: batches, both fence trackers (wrap, failed enqueues), and fuzz-style raw
//! inputs to every builder (they must return, never panic).
#![allow(clippy::unwrap_used)] // tests unwrap on purpose

use core::ffi::c_void;

use proptest::prelude::*;
use tegra_interop_core::memory::MemoryHandle;
use tegra_interop_core::nvsci::{BufAttr, SyncAttr};
use tegra_interop_core::semaphore::SemaphoreHandle;
use tegra_interop_core::sys::cuda::{
    CUarray_format, CUextSemaphore_st, CUDA_ARRAY3D_DESCRIPTOR, CUDA_EXTERNAL_MEMORY_BUFFER_DESC,
};
use tegra_interop_core::sys::nvsci::{NvSciBufAttrKey, NvSciSyncAttrKey, NvSciSyncFence};
use tegra_interop_core::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 256 },
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn any_sem_kind() -> impl Strategy<Value = SemaphoreHandleKind> {
    (0usize..10).prop_map(|i| SemaphoreHandleKind::ALL[i])
}

fn ptr(raw: usize) -> *mut c_void {
    core::ptr::without_provenance_mut::<c_void>(raw)
}

fn sem(raw: usize) -> *mut CUextSemaphore_st {
    core::ptr::without_provenance_mut::<CUextSemaphore_st>(raw)
}

/// Signal params of a random flavour (possibly wrong for the kind).
fn any_signal() -> impl Strategy<Value = SignalParams> {
    prop_oneof![
        Just(SignalParams::binary()),
        any::<u64>().prop_map(SignalParams::timeline),
        any::<u64>().prop_map(SignalParams::keyed_mutex),
        (0usize..3).prop_map(
            |p| SignalParams::nvscisync(core::ptr::without_provenance_mut::<NvSciSyncFence>(
                p * 64
            ))
        ),
    ]
}

fn any_wait() -> impl Strategy<Value = WaitParams> {
    prop_oneof![
        Just(WaitParams::binary()),
        any::<u64>().prop_map(WaitParams::timeline),
        (any::<u64>(), any::<u32>()).prop_map(|(k, t)| WaitParams::keyed_mutex(k, t)),
        (0usize..3).prop_map(|p| WaitParams::nvscisync(core::ptr::without_provenance::<
            NvSciSyncFence,
        >(p * 64))),
    ]
}

#[derive(Debug, Clone)]
enum TimelineOp {
    Reserve(u64),
    ReserveNext,
    Commit,
    Abort,
}

#[derive(Debug, Clone)]
enum StreamedOp {
    Reserve(u8, u64),
    Commit,
    Abort,
    Order(u8, u8),
    Observe(u64),
}

#[derive(Debug, Clone)]
enum DetOp {
    Reserve(u8),
    Commit,
    Abort,
    Order(u8, u8),
}

proptest! {
    #![proptest_config(config())]

    /// Pushing up to and past capacity: accepted entries land in both arrays in order, refused
    /// ones come back unchanged, the arrays never diverge.
    #[test]
    fn signal_batch_model(entries in prop::collection::vec((1usize..1000, any_sem_kind(), any_signal()), 0..20)) {
        let mut batch = SignalBatch::<8>::new();
        let mut model: Vec<(usize, SemaphoreHandleKind, SignalParams)> = Vec::new();
        for (h, kind, params) in entries {
            let expected = params.lower_for(kind);
            match batch.push(sem(h * 8), kind, params) {
                Ok(i) => {
                    prop_assert!(expected.is_ok());
                    prop_assert_eq!(i, model.len());
                    model.push((h * 8, kind, params));
                }
                Err(PushError::Full(e)) => {
                    prop_assert_eq!(model.len(), 8);
                    prop_assert_eq!(e.params, params);
                    prop_assert_eq!(e.kind, kind);
                }
                Err(PushError::Invalid(e, why)) => {
                    prop_assert_eq!(Some(why), expected.err());
                    prop_assert_eq!(e.params, params);
                }
            }
            prop_assert_eq!(batch.handles().len(), model.len());
            prop_assert_eq!(batch.params().len(), model.len());
            prop_assert_eq!(batch.count() as usize, model.len());
        }
        for (i, (h, kind, params)) in model.iter().enumerate() {
            prop_assert_eq!(batch.handles()[i] as usize, *h);
            prop_assert_eq!(batch.kinds()[i], *kind);
            let raw = params.lower_for(*kind).unwrap();
            prop_assert_eq!(batch.params()[i].params.fence.value, raw.params.fence.value);
            prop_assert_eq!(batch.params()[i].params.keyedMutex.key, raw.params.keyedMutex.key);
            prop_assert_eq!(batch.params()[i].flags, raw.flags);
        }
        batch.clear();
        prop_assert!(batch.is_empty());
        prop_assert_eq!(batch.params().len(), 0);
    }

    /// Per-frame reuse: updating the fence value of one entry changes only that entry.
    #[test]
    fn batch_fence_update_touches_one_entry(values in prop::collection::vec(any::<u64>(), 1..8), idx in 0usize..8, new_value: u64) {
        let mut batch = WaitBatch::<8>::new();
        for (i, v) in values.iter().enumerate() {
            batch.push(sem(0x100 + i * 8), SemaphoreHandleKind::TimelineSemaphoreFd, WaitParams::timeline(*v)).unwrap();
        }
        let result = batch.set_fence_value(idx, new_value);
        if idx < values.len() {
            prop_assert!(result.is_ok());
        } else {
            prop_assert_eq!(result, Err(ValidationError::IndexOutOfRange { index: idx, len: values.len() }));
        }
        for (i, v) in values.iter().enumerate() {
            let want = if i == idx { new_value } else { *v };
            prop_assert_eq!(batch.fence_value(i), Ok(Some(want)));
        }
    }

    #[test]
    fn wait_batch_rejects_like_lower_for(kind in any_sem_kind(), params in any_wait(), h in 0usize..4) {
        let mut batch = WaitBatch::<2>::new();
        let got = batch.push(sem(h * 16), kind, params);
        let want = if h == 0 { Err(ValidationError::NullHandle) } else { params.lower_for(kind).map(|_| ()) };
        match (got, want) {
            (Ok(0), Ok(())) => {}
            (Err(e), Err(w)) => prop_assert_eq!(e.validation_error(), Some(w)),
            (g, w) => prop_assert!(false, "push {:?} vs rule {:?}", g.map_err(|e| e.validation_error()), w),
        }
    }

    /// Timeline tracker against a model: committed values strictly increase, aborts and
    /// refusals never change the last value.
    #[test]
    fn timeline_model(initial in any::<u64>(), ops in prop::collection::vec(prop_oneof![
        any::<u64>().prop_map(TimelineOp::Reserve),
        (0u64..4).prop_map(TimelineOp::Reserve),
        Just(TimelineOp::ReserveNext),
        Just(TimelineOp::Commit),
        Just(TimelineOp::Abort),
    ], 0..40)) {
        let mut t = TimelineTracker::new(initial);
        let mut last = initial;
        let mut pending = None;
        for op in ops {
            match op {
                TimelineOp::Reserve(v) => {
                    let got = t.reserve(v);
                    match (pending.is_some(), v > last) {
                        (true, _) => prop_assert_eq!(got.err(), Some(ValidationError::ReservationPending)),
                        (false, false) => prop_assert_eq!(got.err(), Some(ValidationError::FenceNotIncreasing { last, requested: v })),
                        (false, true) => pending = Some(got.unwrap()),
                    }
                }
                TimelineOp::ReserveNext => {
                    let got = t.reserve_next();
                    if pending.is_some() {
                        prop_assert_eq!(got.err(), Some(ValidationError::ReservationPending));
                    } else if last == u64::MAX {
                        prop_assert_eq!(got.err(), Some(ValidationError::FenceExhausted));
                    } else {
                        let r = got.unwrap();
                        prop_assert_eq!(r.value(), last + 1);
                        pending = Some(r);
                    }
                }
                TimelineOp::Commit => if let Some(r) = pending.take() {
                    let v = r.value();
                    prop_assert_eq!(t.commit(r), Ok(v));
                    prop_assert!(v > last);
                    last = v;
                },
                TimelineOp::Abort => if let Some(r) = pending.take() {
                    prop_assert_eq!(t.abort(r), Ok(()));
                },
            }
            prop_assert_eq!(t.last(), last);
        }
    }

    /// Timeline tracker with streams and observed values, against a model: a reservation on a
    /// stream other than the last signaller is refused unless ordered after it; observed
    /// values only raise the floor; the floor never goes down; every committed value exceeds
    /// everything committed or observed before it.
    #[test]
    fn streamed_timeline_model(initial in 0u64..1000, ops in prop::collection::vec(prop_oneof![
        (0u8..3, 0u64..1200).prop_map(|(s, v)| StreamedOp::Reserve(s, v)),
        Just(StreamedOp::Commit),
        Just(StreamedOp::Abort),
        (0u8..3, 0u8..3).prop_map(|(a, b)| StreamedOp::Order(a, b)),
        (0u64..1200).prop_map(StreamedOp::Observe),
    ], 0..60)) {
        let mut t = TimelineTracker::new(initial);
        let mut floor = initial;
        let mut last: Option<u8> = None;
        let mut orders: Vec<(u8, u8)> = Vec::new();
        let mut pending = None;
        for op in ops {
            match op {
                StreamedOp::Reserve(s, v) => {
                    let got = t.reserve_on(StreamId(u64::from(s)), v);
                    let allowed = match last { None => true, Some(l) => l == s || orders.contains(&(s, l)) };
                    if pending.is_some() {
                        prop_assert_eq!(got.err(), Some(ValidationError::ReservationPending));
                    } else if !allowed {
                        prop_assert_eq!(got.err(), Some(ValidationError::StreamNotOrdered { stream: StreamId(u64::from(s)), last: StreamId(u64::from(last.unwrap())) }));
                    } else if v <= floor {
                        prop_assert_eq!(got.err(), Some(ValidationError::FenceNotIncreasing { last: floor, requested: v }));
                    } else {
                        let r = got.unwrap();
                        prop_assert_eq!(r.stream(), Some(StreamId(u64::from(s))));
                        pending = Some((r, s));
                    }
                }
                StreamedOp::Commit => if let Some((r, s)) = pending.take() {
                    let v = r.value();
                    prop_assert!(v > floor);
                    prop_assert_eq!(t.commit(r), Ok(v));
                    floor = v;
                    last = Some(s);
                },
                StreamedOp::Abort => if let Some((r, _)) = pending.take() {
                    prop_assert_eq!(t.abort(r), Ok(()));
                },
                StreamedOp::Order(a, b) => {
                    prop_assert_eq!(t.order_after(StreamId(u64::from(a)), StreamId(u64::from(b))), Ok(()));
                    if a != b && !orders.contains(&(a, b)) {
                        orders.push((a, b));
                    }
                }
                StreamedOp::Observe(v) => {
                    let got = t.observe(v);
                    if pending.is_some() {
                        prop_assert_eq!(got, Err(ValidationError::ReservationPending));
                    } else {
                        floor = floor.max(v);
                        prop_assert_eq!(got, Ok(floor));
                    }
                }
            }
            prop_assert_eq!(t.last(), floor);
            prop_assert_eq!(t.last_stream(), last.map(|s| StreamId(u64::from(s))));
        }
    }

    /// Deterministic counter against a model in u128: value of signal k is
    /// (initial + k) mod 2^width; failed enqueues (abort) do not advance; a second stream is
    /// refused until ordered after the last signaller.
    #[test]
    fn deterministic_model(
        wide in any::<bool>(),
        initial_raw in any::<u64>(),
        near_wrap in any::<bool>(),
        ops in prop::collection::vec(prop_oneof![
            (0u8..4).prop_map(DetOp::Reserve),
            Just(DetOp::Commit),
            Just(DetOp::Abort),
            (0u8..4, 0u8..4).prop_map(|(a, b)| DetOp::Order(a, b)),
        ], 0..60),
    ) {
        let width = if wide { PrimitiveWidth::U64 } else { PrimitiveWidth::U32 };
        let modulus: u128 = if wide { 1 << 64 } else { 1 << 32 };
        // Start near the wrap point half of the time so wrap-around is exercised.
        let initial = if near_wrap { width.max_value() - (initial_raw % 8) } else { width.wrap(initial_raw) };
        let mut c = DeterministicCounter::new(width, initial).unwrap();
        let mut count: u64 = 0;
        let mut last: Option<u8> = None;
        let mut orders: Vec<(u8, u8)> = Vec::new();
        let mut pending = None;
        for op in ops {
            match op {
                DetOp::Reserve(s) => {
                    let got = c.reserve(StreamId(u64::from(s)));
                    let allowed = match last { None => true, Some(l) => l == s || orders.contains(&(s, l)) };
                    if pending.is_some() {
                        prop_assert_eq!(got.err(), Some(ValidationError::ReservationPending));
                    } else if !allowed {
                        prop_assert_eq!(got.err(), Some(ValidationError::StreamNotOrdered { stream: StreamId(u64::from(s)), last: StreamId(u64::from(last.unwrap())) }));
                    } else {
                        let r = got.unwrap();
                        let want = ((u128::from(initial) + u128::from(count) + 1) % modulus) as u64;
                        prop_assert_eq!(r.value(), want);
                        prop_assert_eq!(r.signal_index(), count + 1);
                        pending = Some((r, s));
                    }
                }
                DetOp::Commit => if let Some((r, s)) = pending.take() {
                    let v = r.value();
                    prop_assert_eq!(c.commit(r), Ok(v));
                    count += 1;
                    last = Some(s);
                },
                DetOp::Abort => if let Some((r, _)) = pending.take() {
                    prop_assert_eq!(c.abort(r), Ok(()));
                },
                DetOp::Order(a, b) => {
                    let got = c.order_after(StreamId(u64::from(a)), StreamId(u64::from(b)));
                    if a == b || orders.contains(&(a, b)) {
                        prop_assert_eq!(got, Ok(()));
                    } else if orders.len() == tegra_interop_core::fence::MAX_STREAM_ORDERINGS {
                        prop_assert_eq!(got, Err(ValidationError::CapacityExceeded { capacity: tegra_interop_core::fence::MAX_STREAM_ORDERINGS }));
                    } else {
                        prop_assert_eq!(got, Ok(()));
                        orders.push((a, b));
                    }
                }
            }
            prop_assert_eq!(c.signal_count(), count);
            let cur = ((u128::from(initial) + u128::from(count)) % modulus) as u64;
            prop_assert_eq!(c.current_value(), cur);
            prop_assert_eq!(c.next_signal_value(), ((u128::from(cur) + 1) % modulus) as u64);
            prop_assert!(c.current_value() <= width.max_value());
        }
    }

    #[test]
    fn value_of_signal_wraps(initial in any::<u32>(), k in any::<u64>()) {
        let c = DeterministicCounter::new(PrimitiveWidth::U32, u64::from(initial)).unwrap();
        prop_assert_eq!(c.value_of_signal(k), ((u128::from(initial) + u128::from(k)) % (1 << 32)) as u64);
        let c64 = DeterministicCounter::new(PrimitiveWidth::U64, u64::from(initial)).unwrap();
        prop_assert_eq!(c64.value_of_signal(k), ((u128::from(initial) + u128::from(k)) % (1 << 64)) as u64);
    }

    // ---- fuzz-style: raw inputs never panic, and accepted values obey the rules ----

    #[test]
    fn fuzz_memory_import(kind_raw in 0u32..12, fd: i32, h in 0usize..3, n in 0usize..3, size: u64, flags: u32) {
        let Ok(kind) = MemoryHandleKind::from_raw(kind_raw) else { return Ok(()); };
        let handle = match kind_raw % 3 {
            0 => MemoryHandle::Fd(fd),
            1 => MemoryHandle::Win32 { handle: ptr(h * 8), name: ptr(n * 8).cast_const() },
            _ => MemoryHandle::NvSciBuf(ptr(h * 8).cast_const()),
        };
        if let Ok(import) = MemoryImport::new(kind, handle, size) {
            prop_assert!(import.size() > 0);
            prop_assert_eq!(import.raw().reserved, [0; 16]);
            if let Some(fd) = import.fd() { prop_assert!(fd >= 0); }
            let _ = import.with_flags(MemoryImportFlags::from_bits_retain(flags));
        }
    }

    #[test]
    fn fuzz_buffer_mapping(offset: u64, size: u64, import_size: u64, flags in 0u32..3, reserved in 0u32..2) {
        let mut raw = CUDA_EXTERNAL_MEMORY_BUFFER_DESC { offset, size, flags, reserved: [0; 16] };
        raw.reserved[3] = reserved;
        if let Ok(m) = BufferMapping::from_raw(&raw, import_size) {
            prop_assert!(m.size > 0);
            prop_assert!(u128::from(m.offset) + u128::from(m.size) <= u128::from(import_size));
        }
        if let Ok(desc) = BufferMapping::new(offset, size).lower(import_size) {
            prop_assert_eq!(desc.flags, 0);
            prop_assert!(u128::from(desc.offset) + u128::from(desc.size) <= u128::from(import_size));
        }
    }

    #[test]
    fn fuzz_array(w: usize, hgt: usize, d: usize, format: u32, channels: u32, flags: u32, offset: u64, levels: u32, import_size: u64, nvsci: bool) {
        let raw = CUDA_ARRAY3D_DESCRIPTOR { Width: w, Height: hgt, Depth: d, Format: CUarray_format(format), NumChannels: channels, Flags: flags };
        if let Ok(desc) = ArrayDesc::from_raw(&raw) {
            prop_assert!(matches!(desc.channels(), 1 | 2 | 4));
            prop_assert!(desc.level0_bytes().is_some());
            let kind = if nvsci { MemoryHandleKind::NvSciBuf } else { MemoryHandleKind::OpaqueFd };
            if let Ok(m) = MipmappedArrayMapping::new(offset, desc, levels).lower(kind, import_size) {
                prop_assert!(m.numLevels >= 1);
                if nvsci { prop_assert_eq!(m.numLevels, 1); }
                prop_assert_eq!(m.reserved, [0; 16]);
            }
        }
    }

    #[test]
    fn fuzz_small_arrays(w in 0usize..70, hgt in 0usize..70, d in 0usize..13, fmt_i in 0usize..8, channels in 0u32..6, flags in 0u32..16, levels in 0u32..10) {
        let formats = [1u32, 2, 3, 8, 9, 10, 16, 32];
        let format = ArrayFormat::from_raw(formats[fmt_i]).unwrap();
        if let Ok(desc) = ArrayDesc::with_flags(w, hgt, d, format, channels, flags) {
            let _ = MipmappedArrayMapping::new(0, desc, levels).lower_for(&MemoryImport::opaque_fd(3, 1 << 40).unwrap());
            prop_assert!(desc.max_levels() >= 1);
        }
    }

    #[test]
    fn fuzz_semaphore(kind_raw in 0u32..12, fd: i32, h in 0usize..3, n in 0usize..3, signal in any_signal(), wait in any_wait()) {
        let Ok(kind) = SemaphoreHandleKind::from_raw(kind_raw) else { return Ok(()); };
        let handle = match kind_raw % 3 {
            0 => SemaphoreHandle::Fd(fd),
            1 => SemaphoreHandle::Win32 { handle: ptr(h * 8), name: ptr(n * 8).cast_const() },
            _ => SemaphoreHandle::NvSciSync(ptr(h * 8).cast_const()),
        };
        if let Ok(s) = SemaphoreImport::new(kind, handle) {
            prop_assert_eq!(s.raw().flags, 0);
            prop_assert_eq!(s.raw().reserved, [0; 16]);
        }
        if let Ok(raw) = signal.lower_for(kind) {
            if !kind.has_fence_value() { prop_assert_eq!(raw.params.fence.value, 0); }
            if !kind.is_keyed_mutex() { prop_assert_eq!(raw.params.keyedMutex.key, 0); }
        }
        if let Ok(raw) = wait.lower_for(kind) {
            if !kind.is_keyed_mutex() { prop_assert_eq!(raw.params.keyedMutex.timeoutMs, 0); }
        }
    }

    #[test]
    fn fuzz_flags(bits: u32) {
        let checked = MemoryImportFlags::checked(bits);
        prop_assert_eq!(checked.is_ok(), bits & !1 == 0);
        prop_assert_eq!(SignalFlags::checked(bits).is_ok(), bits & !1 == 0);
        prop_assert_eq!(WaitFlags::checked(bits).is_ok(), bits & !2 == 0);
        let sync = NvSciSyncAttrFlags::from_bits_retain(bits).for_device_query();
        prop_assert_eq!(sync.is_ok(), bits != 0 && bits & !3 == 0);
    }

    #[test]
    fn fuzz_attr_decode(key: u32, bytes in prop::collection::vec(any::<u8>(), 0..80)) {
        if let Ok(attr) = BufAttr::decode(NvSciBufAttrKey(key), &bytes) {
            prop_assert_eq!(attr.key().0, key);
        }
        if let Ok(attr) = SyncAttr::decode(NvSciSyncAttrKey(key % 16), &bytes) {
            prop_assert_eq!(attr.key().0, key % 16);
        }
    }

    #[test]
    fn fuzz_codes(code: u32) {
        let _ = CuResult(code).to_string();
        let _ = NvSciError(code).to_string();
        let _ = CuResult(code).hint();
        let _ = CuResult(code).hint_for("cuSignalExternalSemaphoresAsync");
        let _ = NvSciError(code).hint();
    }
}
