//! What the driver crate adds to a semaphore signal or wait, measured without a GPU.
//!
//! The backend is a hand-made function table whose entry points do nothing but look at their
//! arguments (through `black_box`) and answer success, so every nanosecond measured on the
//! "ours" side that the "raw" side does not have is spent in this crate: the context check,
//! the parameter checks and lowering, the timeline bookkeeping, the table look-ups and
//! `Context::bind`. The raw side calls the same trivial function pointers directly with
//! arrays prepared outside the loop, the way `examples/gpu_bench.rs` calls the real driver.
//!
//! `cuCtxSetCurrent` / `cuCtxGetCurrent` keep the "current context" in a thread-local, as the
//! real driver does, so a get-and-compare costs about what a thread-local read costs.
#![allow(clippy::unwrap_used)] // benches unwrap on purpose

use std::cell::Cell;
use std::hint::black_box;
use std::os::fd::{FromRawFd, OwnedFd};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use tegra_interop_core::{SignalParams, WaitParams};
use tegra_interop_driver::stream::TimelineSignals;
use tegra_interop_driver::table::CudaApi;
use tegra_interop_driver::{
    Backend, Context, ExternalSemaphore, FunctionTable, SemaphoreSignal, SemaphoreWait, Stream,
};
use tegra_interop_sys::cuda::{
    CUcontext, CUdevice, CUexternalSemaphore, CUresult, CUstream,
    CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC, CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS,
    CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS,
};

const OK: CUresult = CUresult(0);

thread_local! {
    static CURRENT: Cell<CUcontext> = const { Cell::new(ptr::null_mut()) };
}

static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0x10_000);

unsafe extern "C" fn device_get(out: *mut CUdevice, ordinal: i32) -> CUresult {
    // SAFETY: the driver crate passes a valid out-pointer.
    unsafe { *out = ordinal };
    OK
}
unsafe extern "C" fn retain(out: *mut CUcontext, _dev: CUdevice) -> CUresult {
    // SAFETY: valid out-pointer; the fake context is an address never dereferenced.
    unsafe { *out = ptr::without_provenance_mut(0x1000) };
    OK
}
unsafe extern "C" fn ok_device(_dev: CUdevice) -> CUresult {
    OK
}
unsafe extern "C" fn set_current(ctx: CUcontext) -> CUresult {
    CURRENT.with(|c| c.set(black_box(ctx)));
    OK
}
unsafe extern "C" fn get_current(out: *mut CUcontext) -> CUresult {
    // SAFETY: the caller passes a valid out-pointer.
    unsafe { *out = CURRENT.with(Cell::get) };
    OK
}
unsafe extern "C" fn ok_none() -> CUresult {
    OK
}
unsafe extern "C" fn stream_create(out: *mut CUstream, _flags: u32) -> CUresult {
    // SAFETY: valid out-pointer; the fake stream is never dereferenced.
    unsafe { *out = ptr::without_provenance_mut(0x2000) };
    OK
}
unsafe extern "C" fn ok_stream(_s: CUstream) -> CUresult {
    OK
}
unsafe extern "C" fn import_sem(
    out: *mut CUexternalSemaphore,
    desc: *const CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC,
) -> CUresult {
    // SAFETY: the caller passes a valid descriptor of an fd kind; like the real driver, a
    // successful import takes ownership of the fd (closed here, since nothing uses it).
    drop(unsafe { OwnedFd::from_raw_fd((*desc).handle.fd) });
    let handle = NEXT_HANDLE.fetch_add(16, Ordering::Relaxed);
    // SAFETY: valid out-pointer; the fake handle is never dereferenced.
    unsafe { *out = ptr::without_provenance_mut(handle) };
    OK
}
unsafe extern "C" fn destroy_sem(_s: CUexternalSemaphore) -> CUresult {
    OK
}
unsafe extern "C" fn signal(
    sems: *const CUexternalSemaphore,
    params: *const CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS,
    n: u32,
    stream: CUstream,
) -> CUresult {
    black_box((sems, params, n, stream));
    OK
}
unsafe extern "C" fn wait(
    sems: *const CUexternalSemaphore,
    params: *const CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS,
    n: u32,
    stream: CUstream,
) -> CUresult {
    black_box((sems, params, n, stream));
    OK
}

fn backend() -> Arc<Backend> {
    let mut cuda = CudaApi::empty();
    cuda.cuDeviceGet = Some(device_get);
    cuda.cuDevicePrimaryCtxRetain = Some(retain);
    cuda.cuDevicePrimaryCtxRelease = Some(ok_device);
    cuda.cuCtxSetCurrent = Some(set_current);
    cuda.cuCtxGetCurrent = Some(get_current);
    cuda.cuCtxSynchronize = Some(ok_none);
    cuda.cuStreamCreate = Some(stream_create);
    cuda.cuStreamDestroy = Some(ok_stream);
    cuda.cuStreamSynchronize = Some(ok_stream);
    cuda.cuImportExternalSemaphore = Some(import_sem);
    cuda.cuDestroyExternalSemaphore = Some(destroy_sem);
    cuda.cuSignalExternalSemaphoresAsync = Some(signal);
    cuda.cuWaitExternalSemaphoresAsync = Some(wait);
    // SAFETY: each entry above has its PFN_ type's signature, writes only
    // through the out-pointers it is given (one value each), returns handles
    // that are plain numbers it never dereferences, is thread-safe (no
    // state) and touches no fd.
    unsafe {
        Backend::from_table(
            "trivial",
            FunctionTable {
                cuda,
                ..FunctionTable::empty()
            },
        )
    }
}

fn fd() -> OwnedFd {
    std::fs::File::open("/dev/null").unwrap().into()
}

fn check(r: CUresult) {
    if r != OK {
        panic!("trivial entry point failed: {r:?}");
    }
}

fn overhead(c: &mut Criterion) {
    let backend = backend();
    let ctx = Context::primary(backend.clone(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut one = ExternalSemaphore::timeline_fd(&ctx, fd()).unwrap();
    let mut eight: [ExternalSemaphore; 8] =
        std::array::from_fn(|_| ExternalSemaphore::timeline_fd(&ctx, fd()).unwrap());

    // The raw side: the same trivial entry points, called directly. `black_box` on the
    // pointers keeps the compiler from seeing through them, as it cannot for the table.
    let cuda = &backend.table().cuda;
    let raw_signal = black_box(cuda.cuSignalExternalSemaphoresAsync.unwrap());
    let raw_wait = black_box(cuda.cuWaitExternalSemaphoresAsync.unwrap());
    let raw_set = black_box(cuda.cuCtxSetCurrent.unwrap());
    let raw_get = black_box(cuda.cuCtxGetCurrent.unwrap());
    let raw_ctx = ctx.as_raw();
    let raw_stream = stream.as_raw();
    let raw_one = [one.as_raw()];
    let raw_eight: [CUexternalSemaphore; 8] = std::array::from_fn(|i| eight[i].as_raw());

    // -- one timeline signal --
    let mut g = c.benchmark_group("signal (1 timeline)");
    let mut value = 0u64;
    g.bench_function("ours: Stream::signal", |b| {
        b.iter(|| {
            value += 1;
            let v = stream
                .signal(&mut one, SignalParams::timeline(black_box(value)))
                .unwrap();
            black_box(v)
        })
    });
    let mut raw_value = 0u64;
    let mut p = [CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default()];
    g.bench_function("raw: signal", |b| {
        b.iter(|| {
            raw_value += 1;
            p[0].params.fence.value = black_box(raw_value);
            // SAFETY: one handle and one parameter block; the trivial entry only reads pointers.
            check(unsafe { raw_signal(raw_one.as_ptr(), p.as_ptr(), 1, raw_stream) })
        })
    });
    g.bench_function("raw: cuCtxSetCurrent + signal", |b| {
        b.iter(|| {
            raw_value += 1;
            p[0].params.fence.value = black_box(raw_value);
            // SAFETY: as above; the fake context is never dereferenced.
            check(unsafe { raw_set(raw_ctx) });
            // SAFETY: as above.
            check(unsafe { raw_signal(raw_one.as_ptr(), p.as_ptr(), 1, raw_stream) })
        })
    });
    g.finish();

    // -- one timeline wait --
    let mut g = c.benchmark_group("wait (1 timeline)");
    g.bench_function("ours: Stream::wait", |b| {
        b.iter(|| {
            stream
                .wait(&one, WaitParams::timeline(black_box(1)))
                .unwrap()
        })
    });
    let mut wp = [CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default()];
    wp[0].params.fence.value = 1;
    g.bench_function("raw: wait", |b| {
        b.iter(|| {
            // SAFETY: one handle and one parameter block; the trivial entry only reads pointers.
            check(unsafe { raw_wait(raw_one.as_ptr(), wp.as_ptr(), 1, raw_stream) })
        })
    });
    g.bench_function("raw: cuCtxSetCurrent + wait", |b| {
        b.iter(|| {
            // SAFETY: as above; the fake context is never dereferenced.
            check(unsafe { raw_set(raw_ctx) });
            // SAFETY: as above.
            check(unsafe { raw_wait(raw_one.as_ptr(), wp.as_ptr(), 1, raw_stream) })
        })
    });
    g.finish();

    // -- eight timeline signals in one call --
    let mut g = c.benchmark_group("signal_batch (8 timelines)");
    let mut batch_value = 0u64;
    g.bench_function("ours: Stream::signal_batch", |b| {
        b.iter(|| {
            batch_value += 1;
            let v = black_box(batch_value);
            let mut batch = eight.each_mut().map(|s| SemaphoreSignal::timeline(s, v));
            stream.signal_batch(&mut batch).unwrap();
            black_box(batch[7].tracked())
        })
    });
    {
        let mut set = TimelineSignals::new(&stream, eight.iter_mut()).unwrap();
        g.bench_function("ours: TimelineSignals::signal", |b| {
            b.iter(|| {
                batch_value += 1;
                let v = black_box(batch_value);
                set.signal(&stream, &[v; 8]).unwrap();
            })
        });
    }
    let mut raw_batch_value = 0u64;
    let mut p8 = [CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default(); 8];
    g.bench_function("raw: signal (8)", |b| {
        b.iter(|| {
            raw_batch_value += 1;
            let v = black_box(raw_batch_value);
            for q in &mut p8 {
                q.params.fence.value = v;
            }
            // SAFETY: eight handles and eight parameter blocks; the entry only reads pointers.
            check(unsafe { raw_signal(raw_eight.as_ptr(), p8.as_ptr(), 8, raw_stream) })
        })
    });
    g.bench_function("raw: cuCtxSetCurrent + signal (8)", |b| {
        b.iter(|| {
            raw_batch_value += 1;
            let v = black_box(raw_batch_value);
            for q in &mut p8 {
                q.params.fence.value = v;
            }
            // SAFETY: as above; the fake context is never dereferenced.
            check(unsafe { raw_set(raw_ctx) });
            // SAFETY: as above.
            check(unsafe { raw_signal(raw_eight.as_ptr(), p8.as_ptr(), 8, raw_stream) })
        })
    });
    g.finish();

    // -- eight timeline waits in one call --
    let mut g = c.benchmark_group("wait_batch (8 timelines)");
    g.bench_function("ours: Stream::wait_batch", |b| {
        b.iter(|| {
            let v = black_box(1);
            stream
                .wait_batch(&eight.each_ref().map(|s| SemaphoreWait::timeline(s, v)))
                .unwrap()
        })
    });
    let mut wp8 = [CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default(); 8];
    for q in &mut wp8 {
        q.params.fence.value = 1;
    }
    g.bench_function("raw: wait (8)", |b| {
        b.iter(|| {
            // SAFETY: eight handles and eight parameter blocks; the entry only reads pointers.
            check(unsafe { raw_wait(raw_eight.as_ptr(), wp8.as_ptr(), 8, raw_stream) })
        })
    });
    g.bench_function("raw: cuCtxSetCurrent + wait (8)", |b| {
        b.iter(|| {
            // SAFETY: as above; the fake context is never dereferenced.
            check(unsafe { raw_set(raw_ctx) });
            // SAFETY: as above.
            check(unsafe { raw_wait(raw_eight.as_ptr(), wp8.as_ptr(), 8, raw_stream) })
        })
    });
    g.finish();

    // -- the bind alone --
    let mut g = c.benchmark_group("bind");
    g.bench_function("ours: Context::bind", |b| b.iter(|| ctx.bind().unwrap()));
    g.bench_function("raw: cuCtxSetCurrent", |b| {
        // SAFETY: the fake context is never dereferenced.
        b.iter(|| check(unsafe { raw_set(black_box(raw_ctx)) }))
    });
    g.bench_function("raw: cuCtxGetCurrent + compare", |b| {
        b.iter(|| {
            let mut current: CUcontext = ptr::null_mut();
            // SAFETY: a valid out-pointer.
            check(unsafe { raw_get(&mut current) });
            black_box(current == black_box(raw_ctx))
        })
    });
    g.finish();

    drop(eight);
    drop(one);
    drop(stream);
    ctx.destroy().unwrap();
    assert!(backend.take_drop_errors().is_empty());
}

criterion_group!(benches, overhead);
criterion_main!(benches);
