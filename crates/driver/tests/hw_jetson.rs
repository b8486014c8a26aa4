//! The CUDA + NvSci flow against the real libraries on a Jetson / DRIVE
//! (`Backend::real()`: libcuda.so.1, libnvscibuf.so.1, libnvscisync.so.1).
//! Every test is ignored by default; on the device:
//!
//! ```sh
//! cargo test -p tegra-interop-driver --test hw_jetson -- --ignored --test-threads=1 --nocapture
//! ```
//!
//! Status: written against the simulator's behaviour and the project's fact
//! sheet (real colour format A8B8G8R8 = 106 for RGBA8, ScanType set, equal
//! sizes in every list); **not yet run on hardware**. `hw_two_process_flow`
//! needs `TEGRA_INTEROP_IPC_ENDPOINTS=<producer>,<consumer>` (a BSP pair). The flow prints the
//! NvSciBuf / NvSciSync versions it found and how the waiter gets its fences:
//! built with `FenceUpdateFence` where the library has it (the initial value
//! of the primitive is then not assumed: a first signal is made and its
//! fence value read back, and the deterministic counter starts there), or
//! received from the signaller where it does not (NvSciSync 2.0, the 2.4
//! flavour).
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use tegra_interop_core::nvsci::{
    BufAttr, BufAttrSet, ColorFormat, GpuId, ScanType, SyncAttr, SyncAttrSet,
};
use tegra_interop_core::sys::cuda::{CUarray, CUmemorytype, CUDA_MEMCPY3D};
use tegra_interop_core::sys::nvsci::{
    NvSciBufAttrKey, NvSciBufAttrValAccessPerm, NvSciBufAttrValImageLayoutType, NvSciBufType,
    NvSciSyncAccessPerm, NvSciSyncAttrKey,
};
use tegra_interop_core::CuResult;
use tegra_interop_driver::nvsci::{BufModule, CpuWaitContext, FenceSource, SyncModule, Timeout};
use tegra_interop_driver::{Backend, Context, Stream};

type Res<T = ()> = Result<T, Box<dyn StdError>>;

const NEEDS: &str = "needs a Jetson (NvSci + CUDA); run with --ignored on hardware";
const SIZE: u64 = 1 << 20;
const FRAMES: u64 = 4;

fn backend() -> Arc<Backend> {
    let b = Backend::real().expect("Backend::real(): no CUDA driver");
    assert!(
        b.table().nvscibuf.NvSciBufModuleOpen.is_some()
            && b.table().nvscisync.NvSciSyncModuleOpen.is_some(),
        "libnvscibuf.so.1 / libnvscisync.so.1 not found: {NEEDS}"
    );
    b
}

fn buf_attrs(gpu: GpuId, image: bool) -> Res<BufAttrSet<12>> {
    let mut a = BufAttrSet::new();
    match image {
        false => {
            a.set(BufAttr::types(&[NvSciBufType::NvSciBufType_RawBuffer])?)?;
            a.set(BufAttr::RawSize(SIZE))?;
            a.set(BufAttr::RawAlign(4096))?;
        }
        true => {
            a.set(BufAttr::types(&[NvSciBufType::NvSciBufType_Image])?)?;
            a.set(BufAttr::Layout(
                NvSciBufAttrValImageLayoutType::NvSciBufImage_PitchLinearType,
            ))?;
            a.set(BufAttr::ScanType(ScanType::PROGRESSIVE))?;
            a.set(BufAttr::PlaneCount(1))?;
            a.set(BufAttr::plane_color_formats(&[ColorFormat::A8B8G8R8])?)?;
            a.set(BufAttr::plane_widths(&[256])?)?;
            a.set(BufAttr::plane_heights(&[64])?)?;
        }
    }
    a.set(BufAttr::NeedCpuAccess(true))?;
    a.set(BufAttr::RequiredPerm(
        NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite,
    ))?;
    a.set(BufAttr::gpu_ids(&[gpu])?)?;
    Ok(a)
}

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
        (m.srcMemoryType, m.srcHost, m.srcPitch) = (host_ty, host.cast(), row);
        (m.dstMemoryType, m.dstArray) = (array_ty, array);
    } else {
        (m.srcMemoryType, m.srcArray) = (array_ty, array);
        (m.dstMemoryType, m.dstHost, m.dstPitch) = (host_ty, host.cast(), row);
    }
    (m.WidthInBytes, m.Height, m.Depth) = (row, rows, 1);
    // SAFETY: the host side is `row * rows` bytes owned by the caller; the
    // array is a live level of that shape.
    let code = CuResult::from(unsafe { copy(&m) });
    code.is_success()
        .then_some(())
        .ok_or_else(|| format!("cuMemcpy3D: {code}").into())
}

/// The sample flow on the device: two contexts, one buffer (raw or image),
/// a CUDA signaller, a CUDA waiter and a CPU waiter.
fn flow(image: bool) -> Res {
    let backend = backend();
    let producer = Context::create(Arc::clone(&backend), 0, 0)?;
    let consumer = Context::create(Arc::clone(&backend), 0, 0)?;
    let bufs = BufModule::open(&backend)?;
    let syncs = SyncModule::open(&backend)?;
    let gpu = GpuId(backend.device(0)?.uuid()?);
    let source = syncs.fence_source();
    println!(
        "NvSciBuf {}, NvSciSync {}: waiter fences {}",
        bufs.version(),
        syncs.version(),
        source.name()
    );
    let (a, b) = (
        bufs.attr_list(&buf_attrs(gpu, image)?)?,
        bufs.attr_list(&buf_attrs(gpu, image)?)?,
    );
    let obj = bufs.reconcile_and_alloc(&[&a, &b])?;
    println!(
        "buffer: {} bytes, alignment {}",
        obj.size()?,
        obj.alignment()?
    );

    let mut sig = syncs.cuda_signaler_attrs(&producer)?;
    if source == FenceSource::Built {
        let mut det = SyncAttrSet::<1>::new();
        det.set(SyncAttr::RequireDeterministicFences(true))?;
        sig.set(&det)?;
    }
    let wait = syncs.cuda_waiter_attrs(&consumer)?;
    let mut cpu = SyncAttrSet::<2>::new();
    cpu.set(SyncAttr::NeedCpuAccess(true))?;
    cpu.set(SyncAttr::RequiredPerm(
        NvSciSyncAccessPerm::NvSciSyncAccessPerm_WaitOnly,
    ))?;
    let cpu = syncs.attr_list(&cpu)?;
    let sync = syncs.reconcile_and_alloc(&[&sig, &wait, &cpu])?;
    // PrimitiveInfo needs NvSciSync 2.5, MaxPrimitiveValue 2.3.
    println!(
        "primitive {:?}, width {:?}",
        sync.primitive_type(),
        sync.width()
    );

    let p_mem = obj.import_cuda(&producer)?;
    let c_mem = obj.import_cuda(&consumer)?;
    let mut signaler = sync.import_cuda_signaler(&producer)?;
    let waiter = sync.import_cuda_waiter(&consumer)?;
    let (ps, cs) = (Stream::new(&producer)?, Stream::new(&consumer)?);
    let mut cx = CpuWaitContext::new(&syncs)?;

    let counter = if source == FenceSource::Built {
        // The semaphore learns where the primitive stands from its first
        // signal's fence.
        let fence = signaler.signal(&ps)?;
        let start = fence
            .extract()?
            .ok_or("the first CUDA signal gave a cleared fence")?;
        assert!(fence.wait(&mut cx, Timeout::After(Duration::from_secs(5)))?);
        println!("first signal: id {} value {}", start.id, start.value);
        let counter = signaler.counter().ok_or("no counter learned")?.clone();
        assert_eq!(counter.current_value(), start.value);
        Some(counter)
    } else {
        None
    };

    let planes = if image {
        obj.image_planes()?
    } else {
        Vec::new()
    };
    let (p_arr, c_arr) = if image {
        (Some(p_mem.map_plane(0)?), Some(c_mem.map_plane(0)?))
    } else {
        (None, None)
    };
    let (p_buf, c_buf) = if !image {
        (Some(p_mem.map_whole()?), Some(c_mem.map_whole()?))
    } else {
        (None, None)
    };
    for k in 1..=FRAMES {
        // Built: the consumer queues its wait before the producer signals.
        let value = counter.as_ref().map(|c| c.value_of_signal(k + 1));
        if let Some(value) = value {
            let expected = sync.fence_for_value(value)?;
            waiter.wait(&cs, &expected)?;
        }
        let data: Vec<u8> = (0..4096u64).map(|i| (i * 13 + k) as u8).collect();
        match (&p_buf, &p_arr) {
            (Some(p), _) => p.copy_from_host(0, &data)?,
            (_, Some(arr)) => {
                let row = planes[0].width as usize * 4;
                let mut px: Vec<u8> = (0..row * 64).map(|i| (i as u64 * 3 + k) as u8).collect();
                array_copy(&producer, arr.level(0)?, px.as_mut_ptr(), true, row, 64)?;
            }
            _ => unreachable!(),
        }
        let fence = signaler.signal(&ps)?;
        match value {
            Some(value) => {
                assert_eq!(fence.extract()?.map(|f| f.value), Some(value), "frame {k}")
            }
            // Received: the consumer waits on the fence the producer made.
            None => waiter.wait(&cs, &fence.dup()?)?,
        }
        assert!(fence.wait(&mut cx, Timeout::After(Duration::from_secs(5)))?);
        cs.synchronize()?;
        match (&c_buf, &c_arr) {
            (Some(c), _) => {
                let mut seen = vec![0u8; data.len()];
                c.copy_to_host(0, &mut seen)?;
                assert_eq!(seen, data, "frame {k}");
            }
            (_, Some(arr)) => {
                let row = planes[0].width as usize * 4;
                let want: Vec<u8> = (0..row * 64).map(|i| (i as u64 * 3 + k) as u8).collect();
                let mut got = vec![0u8; want.len()];
                array_copy(&consumer, arr.level(0)?, got.as_mut_ptr(), false, row, 64)?;
                assert_eq!(got, want, "frame {k}");
            }
            _ => unreachable!(),
        }
    }
    ps.synchronize()?;
    drop((p_arr, c_arr, p_buf, c_buf));
    assert!(backend.take_drop_errors().is_empty());
    Ok(())
}

#[test]
#[ignore = "needs a Jetson (NvSci + CUDA); run with --ignored on hardware"]
fn hw_sample_flow_raw_buffer() {
    flow(false).unwrap();
}

#[test]
#[ignore = "needs a Jetson (NvSci + CUDA); run with --ignored on hardware"]
fn hw_sample_flow_image_plane() {
    flow(true).unwrap();
}

#[test]
#[ignore = "needs a Jetson (NvSci + CUDA); run with --ignored on hardware"]
fn hw_conflicts_and_cuda_attributes() {
    let backend = backend();
    let ctx = Context::create(Arc::clone(&backend), 0, 0).unwrap();
    let syncs = SyncModule::open(&backend).unwrap();
    let s1 = syncs.cuda_signaler_attrs(&ctx).unwrap();
    let s2 = syncs.cuda_signaler_attrs(&ctx).unwrap();
    let err = syncs.reconcile(&[&s1, &s2]).unwrap_err();
    println!("two signallers: {err}");
    assert!(s1
        .get(NvSciSyncAttrKey::NvSciSyncAttrKey_RequiredPerm)
        .unwrap()
        .is_some());
    let bufs = BufModule::open(&backend).unwrap();
    let gpu = GpuId(backend.device(0).unwrap().uuid().unwrap());
    let raw = bufs.attr_list(&buf_attrs(gpu, false).unwrap()).unwrap();
    let img = bufs.attr_list(&buf_attrs(gpu, true).unwrap()).unwrap();
    let err = bufs.reconcile(&[&raw, &img]).unwrap_err();
    println!("raw vs image: {err}");
    assert!(
        matches!(err.error, tegra_interop_driver::Error::NvSci { .. }),
        "{err}"
    );
    // What the real library puts in the conflict list is not known yet.
    println!("conflict keys: {:?} (Types expected)", err.conflicts);
    let _ = NvSciBufAttrKey::NvSciBufGeneralAttrKey_Types;
}

mod two_process;

/// The BSP's endpoint pair for the two-process flow: `producer,consumer`
/// names from `/etc/nvsciipc.cfg` (an `INTER_PROCESS` line), in
/// `TEGRA_INTEROP_IPC_ENDPOINTS`; the child's role in `..._ROLE`.
const ENDPOINTS_ENV: &str = "TEGRA_INTEROP_IPC_ENDPOINTS";
const ROLE_ENV: &str = "TEGRA_INTEROP_IPC_ROLE";

fn endpoint_pair() -> (String, String) {
    let pair = std::env::var(ENDPOINTS_ENV).unwrap_or_else(|_| {
        panic!("set {ENDPOINTS_ENV}=<producer endpoint>,<consumer endpoint> (an INTER_PROCESS pair of /etc/nvsciipc.cfg)")
    });
    let (p, c) = pair
        .split_once(',')
        .unwrap_or_else(|| panic!("{ENDPOINTS_ENV}: expected two names separated by a comma"));
    (p.trim().to_owned(), c.trim().to_owned())
}

/// The cross-process flow on the BSP's NvSciIpc: this process produces
/// (CUDA signals), a second process started from this binary consumes (GPU
/// and CPU waits), connected only by the endpoint pair named in
/// `TEGRA_INTEROP_IPC_ENDPOINTS`. The same roles run on the simulator in
/// `nvsci_ipc.rs`. Not yet run on hardware.
#[test]
#[ignore = "needs a Jetson (NvSci + CUDA) and TEGRA_INTEROP_IPC_ENDPOINTS; run with --ignored on hardware"]
fn hw_two_process_flow() {
    let (producer_ep, _) = endpoint_pair();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "hw_two_process_child",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(ROLE_ENV, "consumer")
        .spawn()
        .unwrap();
    let produced = two_process::producer(&backend(), &producer_ep, 0);
    let status = child.wait().unwrap();
    produced.unwrap();
    assert!(status.success(), "the consumer process failed: {status}");
}

/// The consumer half of `hw_two_process_flow`, which starts it.
#[test]
#[ignore = "the child process of hw_two_process_flow, which starts it"]
fn hw_two_process_child() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("consumer") {
        // Run directly by `--ignored`: only hw_two_process_flow's child works.
        println!("hw_two_process_child: not started by hw_two_process_flow, nothing to do");
        return;
    }
    let (_, consumer_ep) = endpoint_pair();
    two_process::consumer(&backend(), &consumer_ep, 0).unwrap();
}
