//! Cost of the core's checks, each beside the same work done unchecked (the raw C structures
//! filled by hand) as the baseline.
#![allow(clippy::unwrap_used)] // benches unwrap on purpose

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use tegra_interop_core::sys::cuda::{
    CUextSemaphore_st, CUexternalMemoryHandleType, CUexternalSemaphore,
    CUDA_EXTERNAL_MEMORY_BUFFER_DESC, CUDA_EXTERNAL_MEMORY_HANDLE_DESC,
    CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS,
};
use tegra_interop_core::*;

fn sem(i: usize) -> CUexternalSemaphore {
    core::ptr::without_provenance_mut::<CUextSemaphore_st>(0x1000 + i * 16)
}

fn descriptors(c: &mut Criterion) {
    let mut g = c.benchmark_group("descriptor build+validate");
    g.bench_function("core: import + buffer + signal", |b| {
        b.iter(|| {
            let import = MemoryImport::opaque_fd(black_box(5), black_box(8 << 20)).unwrap();
            let buf = BufferMapping::new(black_box(4096), black_box(1 << 20))
                .lower_for(&import)
                .unwrap();
            let sig = SignalParams::timeline(black_box(7))
                .lower_for(SemaphoreHandleKind::TimelineSemaphoreFd)
                .unwrap();
            black_box((import.raw().size, buf, sig.params.fence.value))
        })
    });
    g.bench_function("unchecked: raw structs by hand", |b| {
        b.iter(|| {
            let mut import = CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
                type_: CUexternalMemoryHandleType(1),
                ..Default::default()
            };
            import.handle.fd = black_box(5);
            import.size = black_box(8 << 20);
            let buf = CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
                offset: black_box(4096),
                size: black_box(1 << 20),
                flags: 0,
                reserved: [0; 16],
            };
            let mut sig = CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default();
            sig.params.fence.value = black_box(7);
            black_box((import.size, buf, sig.params.fence.value))
        })
    });
    g.finish();
}

fn batches(c: &mut Criterion) {
    let mut g = c.benchmark_group("batch fill of 8");
    let mut batch = SignalBatch::<8>::new();
    g.bench_function("core: SignalBatch<8> clear + 8 checked pushes", |b| {
        b.iter(|| {
            batch.clear();
            for i in 0..8 {
                batch
                    .push(
                        sem(i),
                        SemaphoreHandleKind::TimelineSemaphoreFd,
                        SignalParams::timeline(black_box(i as u64)),
                    )
                    .unwrap();
            }
            black_box(batch.params().as_ptr());
        })
    });
    // Filled here, not by the bench above: a filter (`-- fence`) that skips
    // that one must not leave this one an empty batch.
    batch.clear();
    for i in 0..8 {
        batch
            .push(
                sem(i),
                SemaphoreHandleKind::TimelineSemaphoreFd,
                SignalParams::timeline(i as u64),
            )
            .unwrap();
    }
    g.bench_function("core: SignalBatch<8> update 8 fence values in place", |b| {
        b.iter(|| {
            for i in 0..8 {
                batch.set_fence_value(i, black_box(i as u64)).unwrap();
            }
            black_box(batch.params().as_ptr());
        })
    });
    let mut handles: [CUexternalSemaphore; 8] = [core::ptr::null_mut(); 8];
    let mut params = [CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default(); 8];
    g.bench_function("unchecked: two arrays filled by hand", |b| {
        b.iter(|| {
            for i in 0..8 {
                handles[i] = sem(i);
                params[i] = CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default();
                params[i].params.fence.value = black_box(i as u64);
            }
            black_box((handles.as_ptr(), params.as_ptr()));
        })
    });
    g.finish();
}

fn fences(c: &mut Criterion) {
    let mut g = c.benchmark_group("fence ops");
    let mut timeline = TimelineTracker::new(0);
    g.bench_function("core: timeline reserve_next + commit", |b| {
        b.iter(|| {
            let r = timeline.reserve_next().unwrap();
            black_box(timeline.commit(r).unwrap())
        })
    });
    let mut det = DeterministicCounter::new(PrimitiveWidth::U32, 0).unwrap();
    g.bench_function("core: deterministic reserve + commit (u32 wrap)", |b| {
        b.iter(|| {
            let r = det.reserve(black_box(StreamId(1))).unwrap();
            black_box(det.commit(r).unwrap())
        })
    });
    let mut counter = 0u64;
    g.bench_function("unchecked: plain counter += 1 (u32 wrap)", |b| {
        b.iter(|| {
            counter = black_box(counter.wrapping_add(1) & 0xFFFF_FFFF);
            counter
        })
    });
    g.finish();
}

criterion_group!(benches, descriptors, batches, fences);
criterion_main!(benches);
