//! The CUDA + NvSci flow of NVIDIA's sample, on the simulator: two CUDA
//! participants share a raw buffer and an image through NvSciBuf, the
//! producer signals an NvSciSync object, the consumer waits on the
//! deterministic fence of each frame, built before the producer signals,
//! and checks the data. Plus wrap-around, 64-bit primitives, memsync skip,
//! and failure injection at every NvSci call of the flow.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use tegra_interop_core::nvsci::{
    BufAttr, BufAttrSet, ColorFormat, GpuId, ScanType, SyncAttr, SyncAttrSet,
};
use tegra_interop_core::sys::cuda::{CUarray, CUmemorytype, CUDA_MEMCPY3D};
use tegra_interop_core::sys::nvsci::{
    NvSciBufAttrValAccessPerm, NvSciBufAttrValImageLayoutType, NvSciBufType, NvSciSyncAccessPerm,
    NvSciSyncAttrValPrimitiveType,
};
use tegra_interop_core::{CuResult, PrimitiveWidth};
use tegra_interop_driver::nvsci::{
    BufModule, CpuWaitContext, Fence, FenceValue, SyncModule, Timeout,
};
use tegra_interop_driver::{Backend, Context, Stream};
use tegra_interop_sim::nvsci::MemsyncOp;
use tegra_interop_sim::{Sim, SimConfig};

type Res<T = ()> = Result<T, Box<dyn StdError>>;

const RAW_SIZE: u64 = 1 << 16;
const W: u32 = 64;
const H: u32 = 16;

fn raw_attrs(size: u64, gpu: GpuId) -> BufAttrSet<8> {
    let mut a = BufAttrSet::new();
    a.set(BufAttr::types(&[NvSciBufType::NvSciBufType_RawBuffer]).unwrap())
        .unwrap();
    a.set(BufAttr::RawSize(size)).unwrap();
    a.set(BufAttr::RawAlign(4096)).unwrap();
    a.set(BufAttr::NeedCpuAccess(true)).unwrap();
    a.set(BufAttr::RequiredPerm(
        NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite,
    ))
    .unwrap();
    a.set(BufAttr::gpu_ids(&[gpu]).unwrap()).unwrap();
    a
}

fn image_attrs(gpu: GpuId) -> BufAttrSet<12> {
    let mut a = BufAttrSet::new();
    a.set(BufAttr::types(&[NvSciBufType::NvSciBufType_Image]).unwrap())
        .unwrap();
    a.set(BufAttr::Layout(
        NvSciBufAttrValImageLayoutType::NvSciBufImage_PitchLinearType,
    ))
    .unwrap();
    a.set(BufAttr::PlaneCount(1)).unwrap();
    a.set(BufAttr::ScanType(ScanType::PROGRESSIVE)).unwrap();
    a.set(BufAttr::plane_color_formats(&[ColorFormat::A8B8G8R8]).unwrap())
        .unwrap();
    a.set(BufAttr::plane_widths(&[W]).unwrap()).unwrap();
    a.set(BufAttr::plane_heights(&[H]).unwrap()).unwrap();
    a.set(BufAttr::NeedCpuAccess(true)).unwrap();
    a.set(BufAttr::RequiredPerm(
        NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite,
    ))
    .unwrap();
    a.set(BufAttr::gpu_ids(&[gpu]).unwrap()).unwrap();
    a
}

/// Copies between host memory and level 0 of a mapped array (`cuMemcpy3D`).
fn array_copy(
    ctx: &Context,
    array: CUarray,
    host: *mut u8,
    to_array: bool,
    row: usize,
    rows: usize,
) -> Res {
    ctx.bind()?;
    let copy = ctx
        .backend()
        .table()
        .cuda
        .cuMemcpy3D
        .ok_or("no cuMemcpy3D")?;
    // SAFETY: an all-zero CUDA_MEMCPY3D is a valid "nothing" descriptor.
    let mut m: CUDA_MEMCPY3D = unsafe { std::mem::zeroed() };
    let (host_ty, array_ty) = (CUmemorytype(1), CUmemorytype(3));
    if to_array {
        m.srcMemoryType = host_ty;
        m.srcHost = host.cast();
        m.srcPitch = row;
        m.dstMemoryType = array_ty;
        m.dstArray = array;
    } else {
        m.srcMemoryType = array_ty;
        m.srcArray = array;
        m.dstMemoryType = host_ty;
        m.dstHost = host.cast();
        m.dstPitch = row;
    }
    m.WidthInBytes = row;
    m.Height = rows;
    m.Depth = 1;
    // SAFETY: the host side is `row * rows` bytes owned by the caller; the
    // array is a live level of a mapping of that shape.
    let code = CuResult::from(unsafe { copy(&m) });
    if code.is_success() {
        Ok(())
    } else {
        Err(format!("cuMemcpy3D: {code}").into())
    }
}

/// Options of one run of the flow.
#[derive(Clone, Copy)]
struct Flow {
    frames: u64,
    initial: u64,
    prim64: bool,
    skip_memsync: bool,
}

impl Default for Flow {
    fn default() -> Self {
        Flow {
            frames: 3,
            initial: 0,
            prim64: false,
            skip_memsync: false,
        }
    }
}

/// The sample flow; returns the fence values the producer's signals made.
fn sample_flow(backend: &Arc<Backend>, opts: Flow) -> Res<Vec<u64>> {
    let producer = Context::create(Arc::clone(backend), 0, 0)?;
    let consumer = Context::create(Arc::clone(backend), 0, 0)?;
    let bufs = BufModule::open(backend)?;
    let syncs = SyncModule::open(backend)?;
    let gpu = GpuId(backend.device(0)?.uuid()?);

    // Buffers: every list that sets the raw size sets the same one (the
    // library refuses different sizes; it does not take the largest).
    let p_raw = bufs.attr_list(&raw_attrs(RAW_SIZE, gpu))?;
    let c_raw = bufs.attr_list(&raw_attrs(RAW_SIZE, gpu))?;
    let raw_list = bufs.reconcile(&[&p_raw, &c_raw])?;
    let raw = raw_list.alloc()?;
    assert_eq!(raw.size()?, RAW_SIZE);
    assert_eq!(raw.alignment()?, 4096);
    let p_img = bufs.attr_list(&image_attrs(gpu))?;
    let c_img = bufs.attr_list(&image_attrs(gpu))?;
    let image = bufs.reconcile_and_alloc(&[&p_img, &c_img])?;
    let planes = image.image_planes()?;
    assert_eq!(planes.len(), 1);
    assert_eq!(
        (planes[0].width, planes[0].height, planes[0].bits_per_pixel),
        (W, H, 32)
    );

    // Sync: a CUDA signaller (deterministic fences), a CUDA waiter, a CPU waiter.
    let mut sig = syncs.empty_attr_list()?;
    let mut extra = SyncAttrSet::<2>::new();
    extra.set(SyncAttr::RequireDeterministicFences(true))?;
    if opts.prim64 {
        extra.set(SyncAttr::primitive_info(&[
            NvSciSyncAttrValPrimitiveType::NvSciSyncAttrValPrimitiveType_SysmemSemaphorePayload64b,
        ])?)?;
    }
    sig.set(&extra)?;
    sig.add_cuda_attributes(&producer, tegra_interop_core::NvSciSyncAttrFlags::SIGNAL)?;
    let wait = syncs.cuda_waiter_attrs(&consumer)?;
    let mut cpu = SyncAttrSet::<2>::new();
    cpu.set(SyncAttr::NeedCpuAccess(true))?;
    cpu.set(SyncAttr::RequiredPerm(
        NvSciSyncAccessPerm::NvSciSyncAccessPerm_WaitOnly,
    ))?;
    let cpu = syncs.attr_list(&cpu)?;
    let sync = syncs.reconcile_and_alloc(&[&sig, &wait, &cpu])?;
    let expect_width = if opts.prim64 {
        PrimitiveWidth::U64
    } else {
        PrimitiveWidth::U32
    };
    assert_eq!(sync.width()?, expect_width);
    // What the simulator's primitive starts at, known to this test only: the
    // semaphore must learn it.
    let truth = tegra_interop_core::DeterministicCounter::new(expect_width, opts.initial)?;

    // CUDA imports in both contexts.
    let p_mem = raw.import_cuda(&producer)?;
    let c_mem = raw.import_cuda(&consumer)?;
    assert_eq!(p_mem.size(), RAW_SIZE);
    let p_buf = p_mem.map_whole()?;
    let c_buf = c_mem.map_whole()?;
    let p_img_mem = image.import_cuda(&producer)?;
    let c_img_mem = image.import_cuda(&consumer)?;
    let p_arr = p_img_mem.map_plane(0)?;
    let c_arr = c_img_mem.map_plane(0)?;
    let mut signaler = sync.import_cuda_signaler(&producer)?;
    assert!(
        signaler.counter().is_none(),
        "nothing learned before a signal"
    );
    let waiter = sync.import_cuda_waiter(&consumer)?;
    let ps = Stream::new(&producer)?;
    let cs = Stream::new(&consumer)?;
    let mut cpu_wait = CpuWaitContext::new(&syncs)?;

    let row = W as usize * 4;
    let mut values = Vec::new();
    for k in 1..=opts.frames {
        let queue_wait = |fence: &Fence| {
            if opts.skip_memsync {
                // SAFETY: (test) the simulator's memory is coherent; the test
                // only checks that the flag reaches the driver.
                unsafe { waiter.wait_skip_memsync(&cs, fence) }
            } else {
                waiter.wait(&cs, fence)
            }
        };
        // From frame 2 on, the consumer builds the fence of the k-th signal
        // from the learned counter and queues its wait before the producer
        // has written or signalled anything; frame 1's fence is received.
        let value = truth.value_of_signal(k);
        let built = match signaler.counter() {
            Some(counter) => {
                assert_eq!(counter.value_of_signal(k), value, "frame {k}");
                let expected = sync.fence_for_value(value)?;
                queue_wait(&expected)?;
                assert!(
                    !cs.is_idle()?,
                    "the wait for frame {k} completed before its signal"
                );
                true
            }
            None => {
                assert_eq!(k, 1, "the counter is learned from the first signal");
                false
            }
        };

        let frame = vec![k as u8; 256];
        p_buf.copy_from_host(0, &frame)?;
        let mut pixels: Vec<u8> = (0..row * H as usize)
            .map(|i| (i as u64 * 7 + k) as u8)
            .collect();
        array_copy(
            &producer,
            p_arr.level(0)?,
            pixels.as_mut_ptr(),
            true,
            row,
            H as usize,
        )?;
        let fence = if opts.skip_memsync {
            // SAFETY: (test) as above.
            unsafe { signaler.signal_skip_memsync(&ps)? }
        } else {
            signaler.signal(&ps)?
        };
        assert_eq!(fence.extract()?, Some(FenceValue { id: 0, value }));
        // (An injected ExtractFence failure leaves the counter unlearned:
        // reported as an error here, not a panic.)
        let learned = signaler.counter().ok_or("the counter was not learned")?;
        assert_eq!(learned.current_value(), value);
        if !built {
            queue_wait(&fence)?;
        }
        assert!(fence.wait(&mut cpu_wait, Timeout::After(Duration::from_secs(10)))?);
        values.push(value);

        cs.synchronize()?;
        let mut seen = vec![0u8; 256];
        c_buf.copy_to_host(0, &mut seen)?;
        assert_eq!(seen, frame, "frame {k}: raw buffer");
        let mut got = vec![0u8; pixels.len()];
        array_copy(
            &consumer,
            c_arr.level(0)?,
            got.as_mut_ptr(),
            false,
            row,
            H as usize,
        )?;
        assert_eq!(got, pixels, "frame {k}: image plane");
    }
    ps.synchronize()?;
    Ok(values)
}

fn tegra() -> Sim {
    Sim::with_config(SimConfig::tegra()).unwrap()
}

fn assert_clean(sim: &Sim) {
    assert!(sim.ledger().is_clean(), "CUDA ledger: {}", sim.ledger());
    assert!(
        sim.nvsci_ledger().is_clean(),
        "NvSci ledger: {}",
        sim.nvsci_ledger()
    );
    assert!(sim.diagnostics().is_empty(), "{:#?}", sim.diagnostics());
}

#[test]
fn sample_flow_buffer_and_image_single_process() {
    let sim = tegra();
    let values = sample_flow(&sim.backend(), Flow::default()).unwrap();
    assert_eq!(values, vec![1, 2, 3]);
    assert_clean(&sim);
    assert!(sim.backend().take_drop_errors().is_empty());
}

#[test]
fn deterministic_fences_survive_a_32_bit_wrap() {
    let sim = tegra();
    let initial = u64::from(u32::MAX) - 1;
    sim.nvsci_set_next_sync_initial(initial);
    let values = sample_flow(
        &sim.backend(),
        Flow {
            frames: 4,
            initial,
            ..Flow::default()
        },
    )
    .unwrap();
    assert_eq!(values, vec![u64::from(u32::MAX), 0, 1, 2]);
    assert_clean(&sim);
}

#[test]
fn sixty_four_bit_primitive_does_not_wrap_at_32_bits() {
    let mut cfg = SimConfig::tegra();
    cfg.integrated = false; // sysmem semaphores, 32- and 64-bit payloads
    let sim = Sim::with_config(cfg).unwrap();
    let initial = u64::from(u32::MAX) - 1;
    sim.nvsci_set_next_sync_initial(initial);
    let values = sample_flow(
        &sim.backend(),
        Flow {
            frames: 3,
            initial,
            prim64: true,
            ..Flow::default()
        },
    )
    .unwrap();
    let max = u64::from(u32::MAX);
    assert_eq!(values, vec![max, max + 1, max + 2]);
    assert_clean(&sim);
}

#[test]
fn memsync_runs_by_default_and_the_unsafe_opt_in_skips_it() {
    let sim = tegra();
    sample_flow(
        &sim.backend(),
        Flow {
            frames: 2,
            ..Flow::default()
        },
    )
    .unwrap();
    let log = sim.nvsci_memsync_log();
    assert_eq!(log.len(), 4);
    assert!(log.iter().all(|e| e.ran), "{log:?}");

    let sim = tegra();
    sample_flow(
        &sim.backend(),
        Flow {
            frames: 2,
            skip_memsync: true,
            ..Flow::default()
        },
    )
    .unwrap();
    let log = sim.nvsci_memsync_log();
    assert_eq!(log.iter().filter(|e| e.op == MemsyncOp::Signal).count(), 2);
    assert_eq!(log.iter().filter(|e| e.op == MemsyncOp::Wait).count(), 2);
    assert!(log.iter().all(|e| !e.ran), "{log:?}");
    assert_clean(&sim);
}

#[test]
fn a_wait_for_frame_two_does_not_wake_on_frame_one() {
    let sim = tegra();
    let backend = sim.backend();
    {
        let producer = Context::create(Arc::clone(&backend), 0, 0).unwrap();
        let consumer = Context::create(Arc::clone(&backend), 0, 0).unwrap();
        let bufs = BufModule::open(&backend).unwrap();
        let syncs = SyncModule::open(&backend).unwrap();
        let gpu = GpuId(backend.device(0).unwrap().uuid().unwrap());
        let a = bufs.attr_list(&raw_attrs(4096, gpu)).unwrap();
        let raw = bufs.reconcile_and_alloc(&[&a]).unwrap();
        let mut det = SyncAttrSet::<1>::new();
        det.set(SyncAttr::RequireDeterministicFences(true)).unwrap();
        let mut sig = syncs.cuda_signaler_attrs(&producer).unwrap();
        sig.set(&det).unwrap();
        let wait = syncs.cuda_waiter_attrs(&consumer).unwrap();
        let sync = syncs.reconcile_and_alloc(&[&sig, &wait]).unwrap();
        let (p_mem, c_mem) = (
            raw.import_cuda(&producer).unwrap(),
            raw.import_cuda(&consumer).unwrap(),
        );
        let (p_buf, c_buf) = (p_mem.map_whole().unwrap(), c_mem.map_whole().unwrap());
        let mut signaler = sync.import_cuda_signaler(&producer).unwrap();
        let waiter = sync.import_cuda_waiter(&consumer).unwrap();
        let (ps, cs) = (
            Stream::new(&producer).unwrap(),
            Stream::new(&consumer).unwrap(),
        );
        // Frame 0 teaches the signaller its counter.
        let first = signaler.signal(&ps).unwrap();
        waiter.wait(&cs, &first).unwrap();
        cs.synchronize().unwrap();
        let counter = signaler.counter().unwrap().clone();

        // The consumer wants frame 2 and says so first.
        let second = sync.fence_for_value(counter.value_of_signal(3)).unwrap();
        waiter.wait(&cs, &second).unwrap();
        p_buf.copy_from_host(0, b"one").unwrap();
        signaler.signal(&ps).unwrap();
        ps.synchronize().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !cs.is_idle().unwrap(),
            "the wait for frame 2 woke on frame 1"
        );
        p_buf.copy_from_host(0, b"two").unwrap();
        signaler.signal(&ps).unwrap();
        cs.synchronize().unwrap();
        let mut seen = [0u8; 3];
        c_buf.copy_to_host(0, &mut seen).unwrap();
        assert_eq!(&seen, b"two");
    }
    assert_clean(&sim);
}

/// NvSci entry points without a result: an injected failure cannot reach them.
const VOID: &[&str] = &[
    "NvSciBufModuleClose",
    "NvSciBufAttrListFree",
    "NvSciBufObjFree",
    "NvSciBufAttrListFreeDesc",
    "NvSciSyncModuleClose",
    "NvSciSyncAttrListFree",
    "NvSciSyncObjFree",
    "NvSciSyncCpuWaitContextFree",
    "NvSciSyncFenceClear",
    "NvSciIpcDeinit",
    "NvSciIpcCloseEndpoint",
];

#[test]
fn failure_at_every_nvsci_call_of_the_flow_leaks_nothing() {
    let opts = Flow {
        frames: 2,
        ..Flow::default()
    };
    let log = {
        let sim = tegra();
        sample_flow(&sim.backend(), opts).unwrap();
        assert_clean(&sim);
        sim.call_log()
    };
    let targets: Vec<(u64, &str)> = log
        .iter()
        .enumerate()
        .filter(|(_, s)| s.starts_with("NvSci") || **s == "cuDeviceGetNvSciSyncAttributes")
        .map(|(i, s)| (i as u64, *s))
        .collect();
    assert!(targets.len() > 40, "only {} NvSci calls?", targets.len());
    // Miri interprets every call: under Miri, every 8th target and the last.
    let last = targets.len() - 1;
    let chosen = |k: usize| !cfg!(miri) || k.is_multiple_of(8) || k == last;
    let targets = targets
        .into_iter()
        .enumerate()
        .filter(|(k, _)| chosen(*k))
        .map(|(_, t)| t);
    for (index, symbol) in targets {
        let sim = tegra();
        let code = if symbol.starts_with("NvSci") {
            0x100
        } else {
            1
        };
        sim.fail_at(index, code);
        let result = sample_flow(&sim.backend(), opts);
        assert_eq!(sim.injected_failures(), 1, "call #{index} {symbol}");
        // A failed version probe only makes the version read lower (or
        // unknown, then 2.0): the flow may still run.
        if !VOID.contains(&symbol) && !symbol.ends_with("CheckVersionCompatibility") {
            assert!(
                result.is_err(),
                "call #{index} {symbol} failed but the flow succeeded"
            );
        }
        assert!(
            sim.ledger().is_clean(),
            "call #{index} {symbol}: CUDA ledger {}",
            sim.ledger()
        );
        assert!(
            sim.nvsci_ledger().is_clean(),
            "call #{index} {symbol}: NvSci ledger {}",
            sim.nvsci_ledger()
        );
        assert!(
            sim.diagnostics().is_empty(),
            "call #{index} {symbol}: {:#?}",
            sim.diagnostics()
        );
    }
}
