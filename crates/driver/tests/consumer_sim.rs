//! The consumer's CUDA work (pinned memory, device buffers, copies,
//! events, NVRTC, modules, launches) on the simulator: the typed error for
//! a machine without NVRTC, and a failure injected at every call of the
//! whole scenario, each leaving nothing behind.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::sync::Arc;

use tegra_interop_core::CuResult;
use tegra_interop_driver::{
    Backend, Context, DeviceBuffer, DevicePtr, Error, Event, EventFlags, Module, Nvrtc,
    NvrtcResult, PinnedHostBuffer, Stream,
};
use tegra_interop_sim::kernels::KernelSpec;
use tegra_interop_sim::{Sim, SimConfig};

const SOURCE: &str = r#"
extern "C" __global__ void scale(unsigned char *buf, unsigned long long len, unsigned int k) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) buf[i] = (unsigned char)(buf[i] * k);
}
"#;

/// The twin of `scale` below, per block: the bytes its threads'
/// `i = blockIdx.x * blockDim.x + threadIdx.x < len` name, times `k`.
fn register(sim: &Sim) {
    sim.register_block_kernel(KernelSpec::new("scale", &[8, 8, 4]), |b| {
        let (buf, len, factor) = (b.arg_u64(0)?, b.arg_u64(1)?, b.arg_u32(2)?);
        for r in b.indices_x(len) {
            let mut bytes = vec![0u8; (r.end - r.start) as usize];
            b.read(buf + r.start, &mut bytes)?;
            for v in &mut bytes {
                *v = v.wrapping_mul(factor as u8);
            }
            b.write(buf + r.start, &bytes)?;
        }
        Ok(())
    });
}

/// The consumer's steps, each handle destroyed explicitly (so a failed
/// release is reported, not only recorded).
fn scenario(backend: &Arc<Backend>) -> Result<Vec<u8>, Error> {
    const N: usize = 4096;
    let ptx = Nvrtc::new(backend)?.compile(SOURCE, "scale.cu", &[])?;
    let ctx = Context::new(backend.clone(), 0)?;
    let stream = Stream::new(&ctx)?;
    let module = Module::load(&ctx, &ptx)?;
    let scale = module.function("scale")?;
    let mut pinned = PinnedHostBuffer::new(&ctx, N)?;
    let device = DeviceBuffer::new(&ctx, N)?;
    let done = Event::new(&ctx, EventFlags::NO_TIMING)?;
    pinned.as_mut_slice().fill(3);
    // SAFETY: (pointer, u64, u32) as the kernel declares; the buffers live
    // until the work completed: on every path the stream (or, if that
    // fails, the context) is synchronised before anything is dropped; the
    // host touches none of them meanwhile.
    let queued = unsafe {
        (|| {
            device.copy_from_pinned_async(0, &pinned, 0, N, &stream)?;
            scale
                .launch(16u32, 256u32)
                .arg(&device)
                .arg(N as u64)
                .arg(5u32)
                .launch(&stream)?;
            scale
                .launch(16u32, 256u32)
                .arg(DevicePtr::of(&pinned))
                .arg(N as u64)
                .arg(2u32)
                .launch(&stream)?;
            device.copy_to_pinned_async(0, &pinned, 0, N / 2, &stream)?;
            done.record(&stream)
        })()
    };
    let synced = stream.synchronize();
    if synced.is_err() {
        // The work may still be running: wait for the whole context before
        // the buffers can go.
        let _ = ctx.synchronize();
    }
    queued?;
    synced?;
    assert!(done.is_complete()?);
    let out = pinned.as_slice().to_vec();
    done.destroy()?;
    device.destroy()?;
    pinned.destroy()?;
    drop(scale);
    module.destroy()?;
    stream.destroy()?;
    ctx.destroy()?;
    Ok(out)
}

#[test]
fn the_scenario_computes_on_the_simulator() {
    let sim = Sim::new().unwrap();
    register(&sim);
    let out = scenario(&sim.backend()).unwrap();
    assert!(out[..2048].iter().all(|b| *b == 15), "device half");
    assert!(out[2048..].iter().all(|b| *b == 6), "zero-copy half");
    assert!(sim.ledger().is_clean(), "{}", sim.ledger());
    assert!(sim.diagnostics().is_empty(), "{:?}", sim.diagnostics());
}

#[test]
fn without_nvrtc_the_error_names_the_library() {
    let sim = Sim::with_config(SimConfig::default().with_nvrtc(false)).unwrap();
    let err = Nvrtc::new(&sim.backend()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotSupported {
                library: "libnvrtc.so.12",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("libnvrtc.so.12"), "{err}");
}

#[test]
fn an_unregistered_kernel_does_not_compile_and_the_log_says_why() {
    let sim = Sim::new().unwrap();
    let err = Nvrtc::new(&sim.backend())
        .unwrap()
        .compile(SOURCE, "scale.cu", &[])
        .unwrap_err();
    let Error::CompileFailed { code, log, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(*code, NvrtcResult::COMPILATION);
    assert!(
        log.contains("`scale`") && log.contains("not registered"),
        "{log}"
    );
    assert!(err.to_string().contains("not registered"), "{err}");
    assert_eq!(sim.ledger().live_programs, 0);
}

const INJECTED: CuResult = CuResult(999);

/// The ledger once the work of streams destroyed on an error path has run
/// (it finishes asynchronously, as on the real driver); bounded.
fn settled(sim: &Sim) -> tegra_interop_sim::Ledger {
    for _ in 0..2500 {
        let l = sim.ledger();
        if l.pending_work == 0 {
            return l;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    sim.ledger()
}

fn is_release(symbol: &str) -> bool {
    matches!(
        symbol,
        "cuMemFree"
            | "cuMemFreeHost"
            | "cuEventDestroy"
            | "cuModuleUnload"
            | "cuStreamDestroy"
            | "cuDevicePrimaryCtxRelease"
            | "nvrtcDestroyProgram"
    )
}

#[test]
fn a_failure_at_any_call_is_typed_and_leaks_nothing() {
    let sim = Sim::new().unwrap();
    register(&sim);
    let backend = sim.backend();
    scenario(&backend).unwrap();
    let log = sim.call_log();
    drop(backend);
    drop(sim);
    assert!(log.len() > 20, "{log:?}");
    const MIRI_STRIDE: usize = 5;
    let chosen = |i: usize| !cfg!(miri) || i.is_multiple_of(MIRI_STRIDE) || i + 1 == log.len();
    for (index, symbol) in log.iter().enumerate().filter(|(i, _)| chosen(*i)) {
        let sim = Sim::new().unwrap();
        register(&sim);
        let backend = sim.backend();
        sim.fail_at(index as u64, INJECTED.0);
        let result = scenario(&backend);
        let recorded = backend.take_drop_errors();
        let best_effort_bind =
            *symbol == "cuCtxSetCurrent" && log.get(index + 1).is_some_and(|next| is_release(next));
        match &result {
            Ok(_) if best_effort_bind => {}
            Ok(_) if *symbol == "nvrtcDestroyProgram" => {
                // A program that would not go is kept as a drop error.
                assert!(
                    recorded.iter().any(|e| matches!(e, Error::Nvrtc { call: "nvrtcDestroyProgram", code } if code.0 == 999)),
                    "call #{index} ({symbol}): {recorded:?}"
                );
            }
            Ok(v) => panic!("call #{index} ({symbol}) failed but the scenario succeeded: {v:?}"),
            Err(Error::Driver { code, .. }) => {
                assert_eq!(*code, INJECTED, "call #{index} ({symbol})")
            }
            Err(Error::Nvrtc { code, .. }) | Err(Error::CompileFailed { code, .. }) => {
                assert_eq!(code.0, 999, "call #{index} ({symbol})")
            }
            Err(e) => panic!("call #{index} ({symbol}): untyped {e:?}"),
        }
        drop(backend);
        let ledger = settled(&sim);
        if is_release(symbol) {
            let leaked = ledger.live_allocations
                + ledger.live_host_allocations
                + ledger.live_events
                + ledger.live_modules
                + ledger.live_streams
                + ledger.primary_context_refs
                + ledger.live_programs;
            assert!(leaked <= 1, "call #{index} ({symbol}): {ledger}");
            assert_eq!(ledger.pending_work, 0, "call #{index} ({symbol}): {ledger}");
        } else {
            assert!(ledger.is_clean(), "call #{index} ({symbol}): {ledger}");
        }
        assert!(
            sim.diagnostics().is_empty(),
            "call #{index} ({symbol}): {:?}",
            sim.diagnostics()
        );
        assert_eq!(sim.injected_failures(), 1, "call #{index} ({symbol})");
    }
}
