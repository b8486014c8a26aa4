//! The driver on a CUDA 11.4 driver (JetPack 5, DRIVE OS 6.0): the
//! simulator's 11.4 profile (`SimConfig::with_driver_version(11040)`: that
//! `cuDriverGetVersion`, and no entry point introduced later, as a real
//! 11.4 `libcuda.so.1` exports none). What exists works; what needs a newer
//! entry point fails with `Error::NeedsNewerDriver` naming it and its
//! release, before any call; nothing panics. See `compat.rs`.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::sync::Arc;

use tegra_interop_core::{BufferMapping, SignalParams, WaitParams};
use tegra_interop_driver::device::attribute as attr;
use tegra_interop_driver::probe::{dma_buf_import, DmaBufImport};
use tegra_interop_driver::{
    Backend, Context, DeviceBuffer, DevicePtr, Error, Event, EventFlags, ExternalMemory,
    ExternalSemaphore, Module, Nvrtc, PinnedHostBuffer, Stream,
};
use tegra_interop_sim::kernels::KernelSpec;
use tegra_interop_sim::{export, Sim, SimConfig};

fn sim_11_4() -> Sim {
    let sim =
        Sim::with_config(SimConfig::tegra().with_driver_version(SimConfig::CUDA_11_4)).unwrap();
    register_scale(&sim);
    sim
}

/// The twin of `scale` below, per block: the bytes its threads'
/// `i = blockIdx.x * blockDim.x + threadIdx.x < len` name, times `k`.
fn register_scale(sim: &Sim) {
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

const SOURCE: &str = r#"
extern "C" __global__ void scale(unsigned char *buf, unsigned long long len, unsigned int k) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) buf[i] = (unsigned char)(buf[i] * k);
}
"#;

#[test]
fn the_profile_reports_11_4_and_lacks_exactly_the_newer_entry_points() {
    let sim = sim_11_4();
    let backend = sim.backend();
    assert_eq!(backend.driver_version().unwrap(), 11040);
    let missing: Vec<&str> = backend.table().cuda.missing().collect();
    // The simulator never provides cuEventCreateFromEGLSync (issue 14);
    // the 11.4 profile takes away the two entries newer than 11.4.
    assert_eq!(
        missing,
        [
            "cuMemGetHandleForAddressRange",
            "cuFuncGetParamInfo",
            "cuEventCreateFromEGLSync"
        ]
    );
    // The default machine has both.
    let new = Sim::new().unwrap();
    let present: Vec<&str> = new.backend().table().cuda.present().collect();
    assert!(present.contains(&"cuFuncGetParamInfo"));
    assert!(present.contains(&"cuMemGetHandleForAddressRange"));
}

#[test]
fn a_newer_entry_point_is_a_typed_error_naming_it_and_its_release() {
    let sim = sim_11_4();
    let backend = sim.backend();
    let calls = sim.calls();
    let err = backend.entry_point("cuFuncGetParamInfo").unwrap_err();
    let Error::NeedsNewerDriver {
        symbol,
        library,
        since,
        driver,
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!(
        (symbol, library, since, driver),
        ("cuFuncGetParamInfo", "libcuda.so.1", 12040, 11040)
    );
    let text = backend
        .entry_point("cuMemGetHandleForAddressRange")
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("cuMemGetHandleForAddressRange needs a CUDA 11.7 driver")
            && text.contains("is CUDA 11.4 (cuDriverGetVersion = 11040)"),
        "{text}"
    );
    // Only cuDriverGetVersion was asked: the missing entry was never called.
    assert_eq!(sim.call_log()[calls as usize..], ["cuDriverGetVersion"; 2]);
    // An entry 11.4 has is fine; a symbol missing on a driver new enough
    // for it stays NotSupported.
    backend.entry_point("cuLaunchKernel").unwrap();
    assert!(matches!(
        backend.entry_point("cuEventCreateFromEGLSync").unwrap_err(),
        Error::NotSupported {
            symbol: "cuEventCreateFromEGLSync",
            ..
        }
    ));
}

#[test]
fn missing_entry_points_say_what_each_costs() {
    let sim = sim_11_4();
    let missing = sim.backend().missing_entry_points();
    let names: Vec<(&str, Option<i32>)> = missing.iter().map(|m| (m.symbol, m.since)).collect();
    assert_eq!(
        names,
        [
            ("cuMemGetHandleForAddressRange", Some(11070)),
            ("cuFuncGetParamInfo", Some(12040)),
            ("cuEventCreateFromEGLSync", Some(9000)),
        ]
    );
    assert!(matches!(missing[0].error, Error::NeedsNewerDriver { .. }));
    assert!(matches!(missing[2].error, Error::NotSupported { .. }));
    assert!(
        missing[1].costs.contains("not checked"),
        "{}",
        missing[1].costs
    );
}

#[test]
fn the_dma_buf_probe_says_the_driver_is_too_old() {
    let sim = sim_11_4();
    let ctx = Context::new(sim.backend(), 0).unwrap();
    let calls = sim.calls();
    let DmaBufImport::Unknown { reason } = dma_buf_import(&ctx) else {
        panic!("the probe cannot run on 11.4")
    };
    assert!(
        reason.contains("cuMemGetHandleForAddressRange needs a CUDA 11.7 driver"),
        "{reason}"
    );
    assert!(
        !sim.call_log()[calls as usize..].contains(&"cuMemAlloc"),
        "refused before the first step"
    );
    drop(ctx);
    assert!(sim.ledger().is_clean(), "{}", sim.ledger());
}

#[test]
fn an_attribute_newer_than_11_4_is_refused_and_older_ones_answer() {
    let sim = sim_11_4();
    let backend = sim.backend();
    let device = backend.device(0).unwrap();
    assert_eq!(device.attribute(attr::INTEGRATED).unwrap(), 1);
    assert_eq!(
        device
            .attribute(attr::TIMELINE_SEMAPHORE_INTEROP_SUPPORTED)
            .unwrap(),
        1
    );
    let err = device.attribute(attr::DMA_BUF_SUPPORTED).unwrap_err();
    assert_eq!(
        err.code(),
        Some(tegra_interop_core::CuResult::INVALID_VALUE),
        "{err}"
    );
}

/// External memory and semaphores (the interop itself), the consumer's
/// pinned memory, copies, events, NVRTC, modules and launches.
fn main_operations(backend: &Arc<Backend>) -> Result<Vec<u8>, Error> {
    const N: usize = 4096;
    let (mem_fd, exported) = export::memory(N).unwrap();
    let (sem_fd, exported_sem) = export::timeline_semaphore(0).unwrap();
    let ctx = Context::new(backend.clone(), 0)?;
    let stream = Stream::new(&ctx)?;
    let memory = ExternalMemory::opaque_fd(&ctx, mem_fd, N as u64)?;
    let mapped = memory.map_buffer(BufferMapping::new(0, N as u64))?;
    let mut semaphore = ExternalSemaphore::timeline_fd(&ctx, sem_fd)?;
    mapped.copy_from_host(0, &[3u8; N])?;

    let ptx = Nvrtc::new(backend)?.compile(SOURCE, "scale.cu", &[])?;
    let module = Module::load(&ctx, &ptx)?;
    let scale = module.function("scale")?;
    assert_eq!(scale.param_sizes(), None, "no cuFuncGetParamInfo on 11.4");
    let mut pinned = PinnedHostBuffer::new(&ctx, N)?;
    let device = DeviceBuffer::new(&ctx, N)?;
    let done = Event::new(&ctx, EventFlags::NO_TIMING)?;
    pinned.as_mut_slice().fill(1);
    // SAFETY: (pointer, u64, u32) as the kernel declares; every buffer
    // outlives the work (the stream is synchronised below before anything
    // is dropped, also on failure); the host touches none of them meanwhile.
    let queued = unsafe {
        (|| {
            stream.wait(&semaphore, WaitParams::timeline(0))?;
            scale
                .launch(16u32, 256u32)
                .arg(DevicePtr::of(&mapped))
                .arg(N as u64)
                .arg(5u32)
                .launch(&stream)?;
            device.copy_from_pinned_async(0, &pinned, 0, N, &stream)?;
            scale
                .launch(16u32, 256u32)
                .arg(&device)
                .arg(N as u64)
                .arg(7u32)
                .launch(&stream)?;
            device.copy_to_pinned_async(0, &pinned, 0, N, &stream)?;
            stream.signal(&mut semaphore, SignalParams::timeline(1))?;
            done.record(&stream)
        })()
    };
    let synced = stream.synchronize();
    if synced.is_err() {
        let _ = ctx.synchronize();
    }
    queued?;
    synced?;
    assert!(done.is_complete()?);
    assert_eq!(exported_sem.value(), 1);
    let mut seen = vec![0u8; N];
    exported.read(0, &mut seen).unwrap();
    let mut out = pinned.as_slice().to_vec();
    out.extend_from_slice(&seen);
    done.destroy()?;
    device.destroy()?;
    pinned.destroy()?;
    drop(scale);
    module.destroy()?;
    semaphore.destroy()?;
    mapped.destroy()?;
    memory.destroy()?;
    stream.destroy()?;
    ctx.destroy()?;
    Ok(out)
}

#[test]
fn the_main_operations_work_on_11_4() {
    let sim = sim_11_4();
    let out = main_operations(&sim.backend()).unwrap();
    assert!(out[..4096].iter().all(|b| *b == 7), "device buffer");
    assert!(out[4096..].iter().all(|b| *b == 15), "imported memory");
    assert!(sim.ledger().is_clean(), "{}", sim.ledger());
    assert!(sim.diagnostics().is_empty(), "{:?}", sim.diagnostics());
}

#[test]
fn nvrtc_on_the_profile_is_of_the_same_release() {
    let sim = sim_11_4();
    let nvrtc = Nvrtc::new(&sim.backend()).unwrap();
    assert_eq!(nvrtc.version().unwrap(), (11, 4));
}

#[test]
fn the_argument_size_check_exists_from_12_4_only() {
    // 12.9: the sizes come from cuFuncGetParamInfo and a wrong argument
    // count is refused before the call. 11.4: nothing gives the sizes, so
    // `param_sizes` is None and a correct launch runs unchecked (see
    // the_main_operations_work_on_11_4). A wrong launch is not tried
    // there: without the check it breaks `Launch::launch`'s safety
    // contract (the driver reads one parameter pointer per kernel
    // parameter; Miri reports the simulator's read past the array as UB).
    for (version, sizes) in [
        (SimConfig::CUDA_12_9, Some(&[8usize, 8, 4][..])),
        (SimConfig::CUDA_11_4, None),
    ] {
        let sim = Sim::with_config(SimConfig::default().with_driver_version(version)).unwrap();
        register_scale(&sim);
        let backend = sim.backend();
        let ptx = Nvrtc::new(&backend)
            .unwrap()
            .compile(SOURCE, "scale.cu", &[])
            .unwrap();
        let ctx = Context::new(backend.clone(), 0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let module = Module::load(&ctx, &ptx).unwrap();
        let scale = module.function("scale").unwrap();
        assert_eq!(scale.param_sizes(), sizes, "{version}");
        if sizes.is_some() {
            let device = DeviceBuffer::new(&ctx, 16).unwrap();
            let calls = sim.calls();
            // SAFETY: refused by the builder before the call (checked below).
            let r = unsafe { scale.launch(1u32, 1u32).arg(&device).launch(&stream) };
            assert!(matches!(r, Err(Error::BadLaunch { .. })), "{r:?}");
            assert_eq!(sim.calls(), calls, "no call was made");
        }
    }
}
