//! A steady-state frame (build descriptors, fill a batch, track fences, lower attribute sets)
//! performs zero heap allocations, counted with a global allocator that counts allocations
//! made on the current thread while armed.
#![allow(clippy::unwrap_used)] // tests unwrap on purpose

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt::Write as _;

use tegra_interop_core::nvsci::{BufAttr, BufAttrSet, GpuId, SyncAttr, SyncAttrSet};
use tegra_interop_core::sys::cuda::CUextSemaphore_st;
use tegra_interop_core::sys::nvsci::{NvSciBufAttrValAccessPerm, NvSciBufType, NvSciSyncFence};
use tegra_interop_core::*;

struct Counting;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: the allocator can run while thread-locals are being torn down.
    let _ = ARMED.try_with(|armed| {
        if armed.get() {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }
    });
}

// SAFETY: defers every operation to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn count_allocs(f: impl FnOnce()) -> usize {
    COUNT.with(|c| c.set(0));
    ARMED.with(|a| a.set(true));
    f();
    ARMED.with(|a| a.set(false));
    COUNT.with(|c| c.get())
}

struct Frame {
    signal: SignalBatch<8>,
    wait: WaitBatch<8>,
    timeline: TimelineTracker,
    det: DeterministicCounter,
    fence: NvSciSyncFence,
    text: heapless::String<256>,
}

fn sem(i: usize) -> *mut CUextSemaphore_st {
    core::ptr::without_provenance_mut::<CUextSemaphore_st>(0x1000 + i * 16)
}

fn frame(state: &mut Frame, frame_no: u64) -> u64 {
    let mut checksum = 0u64;
    // Descriptors.
    let import = MemoryImport::opaque_fd(5, 8 << 20).unwrap().dedicated();
    let buf = BufferMapping::new(4096, 1 << 20)
        .lower_for(&import)
        .unwrap();
    checksum ^= buf.size;
    let image = ArrayDesc::new_2d(1024, 1024, ArrayFormat::U8, 4).unwrap();
    let arr = MipmappedArrayMapping::new(0, image, 1)
        .lower_for(&import)
        .unwrap();
    checksum ^= arr.arrayDesc.Width as u64;
    let s = SemaphoreImport::timeline_fd(6).unwrap();
    checksum ^= s.raw().type_.0 as u64;

    // Fences: reserve, "enqueue", commit; plus one failed enqueue that is aborted.
    let r = state.timeline.reserve_next().unwrap();
    let value = r.value();
    state.timeline.commit(r).unwrap();
    let failed = state.timeline.reserve_next().unwrap();
    state.timeline.abort(failed).unwrap();
    let d = state.det.reserve(StreamId(1)).unwrap();
    let wait_for = d.value();
    state.det.commit(d).unwrap();

    // Batches: refill every frame, and also update in place.
    state.signal.clear();
    for i in 0..7 {
        state
            .signal
            .push(
                sem(i),
                SemaphoreHandleKind::TimelineSemaphoreFd,
                SignalParams::timeline(value),
            )
            .unwrap();
    }
    state
        .signal
        .push(
            sem(7),
            SemaphoreHandleKind::NvSciSync,
            SignalParams::nvscisync(&mut state.fence),
        )
        .unwrap();
    // Full: the entry comes back without allocating.
    let refused = state.signal.push(
        sem(8),
        SemaphoreHandleKind::OpaqueFd,
        SignalParams::binary(),
    );
    assert!(matches!(refused, Err(PushError::Full(_))));
    if state.wait.is_empty() {
        for i in 0..8 {
            state
                .wait
                .push(
                    sem(i),
                    SemaphoreHandleKind::TimelineSemaphoreFd,
                    WaitParams::timeline(0),
                )
                .unwrap();
        }
    }
    for i in 0..8 {
        state.wait.set_fence_value(i, value).unwrap();
    }
    checksum ^= state.signal.params()[3].params.fence.value ^ wait_for ^ state.wait.count() as u64;

    // NvSci attribute sets.
    let mut buf_attrs = BufAttrSet::<8>::new();
    buf_attrs
        .set(BufAttr::types(&[NvSciBufType::NvSciBufType_RawBuffer]).unwrap())
        .unwrap();
    buf_attrs.set(BufAttr::RawSize(8 << 20)).unwrap();
    buf_attrs
        .set(BufAttr::RequiredPerm(
            NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite,
        ))
        .unwrap();
    buf_attrs
        .set(BufAttr::gpu_ids(&[GpuId([1; 16])]).unwrap())
        .unwrap();
    checksum ^= buf_attrs.lower().unwrap().len() as u64;
    let mut sync_attrs = SyncAttrSet::<4>::new();
    sync_attrs
        .set(SyncAttr::RequireDeterministicFences(true))
        .unwrap();
    checksum ^= sync_attrs.lower().unwrap().len() as u64;

    // Errors: refusal and formatting into a fixed buffer.
    let e = BufferMapping::new(0, 1 << 30)
        .lower_for(&import)
        .unwrap_err();
    state.text.clear();
    let _ = write!(
        state.text,
        "{e} / {} / {}",
        CuResult::INVALID_VALUE,
        CuResult(frame_no as u32 + 5000)
    );
    checksum ^= state.text.len() as u64;
    checksum
}

#[test]
#[cfg_attr(
    miri,
    ignore = "counts real allocator calls; Miri's allocator tracking is not the point here and the frame loop is slow under Miri"
)]
fn steady_state_frame_does_not_allocate() {
    let mut state = Frame {
        signal: SignalBatch::new(),
        wait: WaitBatch::new(),
        timeline: TimelineTracker::new(0),
        det: DeterministicCounter::new(PrimitiveWidth::U32, u64::from(u32::MAX) - 2).unwrap(),
        fence: NvSciSyncFence::default(),
        text: heapless::String::new(),
    };
    // Warm-up frame (first use of thread-locals, etc.), then the measured frames.
    let mut sink = frame(&mut state, 0);
    let allocs = count_allocs(|| {
        for n in 1..100 {
            sink ^= frame(&mut state, n);
        }
    });
    std::hint::black_box(sink);
    assert_eq!(allocs, 0, "a steady-state frame allocated {allocs} times");
    // The deterministic counter wrapped at 32 bits on the way.
    assert_eq!(state.det.signal_count(), 100);
    assert_eq!(
        state.det.current_value(),
        (u64::from(u32::MAX) - 2 + 100) & 0xFFFF_FFFF
    );
    assert_eq!(state.timeline.last(), 100);
}

#[test]
#[cfg_attr(miri, ignore = "counts real allocator calls")]
fn the_counter_sees_allocations() {
    // The harness itself must detect an allocation, or the test above proves nothing.
    let allocs = count_allocs(|| {
        let v: Vec<u8> = std::hint::black_box(Vec::with_capacity(16));
        drop(v);
    });
    assert_eq!(allocs, 1);
}
