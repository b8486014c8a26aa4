//! The NvSci flow over the simulator claiming each NvSci release of the
//! fact sheet's version table (`NvSciRelease::ALL`): the driver reads the
//! libraries' versions when a module opens, refuses keys and entry points
//! the loaded version lacks before calling anything, and the deterministic
//! fence flow runs at every release: the waiter builds its fences with
//! `FenceUpdateFence` where the library has it, and receives them from the
//! signaller where it does not (NvSciSync 2.0 and the 2.4 flavour).
//!
//! The two-process flow at every release is in `nvsci_ipc.rs`.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::sync::Arc;

use tegra_interop_core::nvsci::{
    BufAttr, BufAttrSet, ColorFormat, GpuCache, GpuId, ScanType, SyncAttr, SyncAttrSet,
};
use tegra_interop_core::sys::nvsci::{
    NvSciBufAttrValAccessPerm, NvSciBufAttrValImageLayoutType, NvSciBufType,
    NvSciSyncAttrValPrimitiveType,
};
use tegra_interop_driver::nvsci::{
    BufModule, FenceSource, LibVersion, NvSciIpc, SyncModule, VersionSource,
};
use tegra_interop_driver::{Context, Error, Stream};
use tegra_interop_sim::{NvSciRelease, Sim, SimConfig};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

const SIZE: u64 = 1 << 14;
const FRAMES: u64 = 3;

fn sim_for(release: NvSciRelease) -> Sim {
    let mut cfg = SimConfig::tegra();
    cfg.nvsci_release = release;
    // Quiet: keys a release lacks are asked for on purpose.
    Sim::with_config(cfg.with_diagnostic_echo(false)).unwrap()
}

/// What the fact sheet says each release offers a waiter.
fn expected_source(release: NvSciRelease) -> FenceSource {
    match release {
        NvSciRelease::V5_2_6 | NvSciRelease::JetsonSync2_4 => FenceSource::Received,
        _ => FenceSource::Built,
    }
}

fn has_deterministic_key(release: NvSciRelease) -> bool {
    release.sync_version() >= (2, 3)
}

fn raw_attrs(gpu: GpuId, gpu_cache: bool) -> BufAttrSet<8> {
    let mut a = BufAttrSet::new();
    a.set(BufAttr::types(&[NvSciBufType::NvSciBufType_RawBuffer]).unwrap())
        .unwrap();
    a.set(BufAttr::RawSize(SIZE)).unwrap();
    a.set(BufAttr::NeedCpuAccess(true)).unwrap();
    a.set(BufAttr::RequiredPerm(
        NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite,
    ))
    .unwrap();
    a.set(BufAttr::gpu_ids(&[gpu]).unwrap()).unwrap();
    if gpu_cache {
        a.set(BufAttr::gpu_cache(&[GpuCache::new(gpu, true)]).unwrap())
            .unwrap();
    }
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
    a.set(BufAttr::ScanType(ScanType::PROGRESSIVE)).unwrap();
    a.set(BufAttr::PlaneCount(1)).unwrap();
    a.set(BufAttr::plane_color_formats(&[ColorFormat::A8B8G8R8]).unwrap())
        .unwrap();
    a.set(BufAttr::plane_widths(&[32]).unwrap()).unwrap();
    a.set(BufAttr::plane_heights(&[8]).unwrap()).unwrap();
    a.set(BufAttr::NeedCpuAccess(true)).unwrap();
    a.set(BufAttr::RequiredPerm(
        NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite,
    ))
    .unwrap();
    a.set(BufAttr::gpu_ids(&[gpu]).unwrap()).unwrap();
    a
}

/// `r` is a refusal for lacking version `needed`, made without any call.
fn assert_refused<T: std::fmt::Debug>(
    sim: &Sim,
    r: impl FnOnce() -> Result<T, Error>,
    needed: &str,
) {
    let before = sim.calls();
    assert_refusal(r(), needed);
    assert_eq!(sim.calls(), before, "the refusal called the library");
}

/// `got` is a refusal for lacking version `needed`.
fn assert_refusal<T: std::fmt::Debug>(got: Result<T, Error>, needed: &str) {
    assert!(
        matches!(&got, Err(Error::NotInLibraryVersion { needed: n, .. }) if n.starts_with(needed)),
        "expected a refusal naming {needed}, got {got:?}"
    );
    let message = got.unwrap_err().to_string();
    assert!(message.contains(needed), "{message}");
}

/// The flow of NVIDIA's sample at `release`; returns how the waiter got its
/// fences.
fn flow(sim: &Sim, release: NvSciRelease) -> Res<FenceSource> {
    let backend = sim.backend();
    let producer = Context::create(Arc::clone(&backend), 0, 0)?;
    let consumer = Context::create(Arc::clone(&backend), 0, 0)?;
    let bufs = BufModule::open(&backend)?;
    let syncs = SyncModule::open(&backend)?;
    let gpu = GpuId(backend.device(0)?.uuid()?);
    let gpu_cache = release.buf_version() >= (2, 8);

    // Equal sizes in every list; the image with ScanType and RGBA8.
    let raw = bufs.reconcile_and_alloc(&[
        &bufs.attr_list(&raw_attrs(gpu, gpu_cache))?,
        &bufs.attr_list(&raw_attrs(gpu, gpu_cache))?,
    ])?;
    assert_eq!(raw.size()?, SIZE);
    let image = bufs.reconcile_and_alloc(&[
        &bufs.attr_list(&image_attrs(gpu))?,
        &bufs.attr_list(&image_attrs(gpu))?,
    ])?;
    assert_eq!(image.image_planes()?[0].bits_per_pixel, 32);

    let mut sig = syncs.cuda_signaler_attrs(&producer)?;
    if has_deterministic_key(release) {
        let mut det = SyncAttrSet::<1>::new();
        det.set(SyncAttr::RequireDeterministicFences(true))?;
        sig.set(&det)?;
    }
    let wait = syncs.cuda_waiter_attrs(&consumer)?;
    let sync = syncs.reconcile_and_alloc(&[&sig, &wait])?;

    let (p_mem, c_mem) = (raw.import_cuda(&producer)?, raw.import_cuda(&consumer)?);
    let (p_buf, c_buf) = (p_mem.map_whole()?, c_mem.map_whole()?);
    let mut signaler = sync.import_cuda_signaler(&producer)?;
    let waiter = sync.import_cuda_waiter(&consumer)?;
    let (ps, cs) = (Stream::new(&producer)?, Stream::new(&consumer)?);

    let source = syncs.fence_source();
    match source {
        FenceSource::Built => {
            // Signal 1's fence is received; it teaches the signaller its
            // counter. From then on the waiter builds the fence of the k-th
            // signal and queues its wait before anything is signalled.
            for k in 1..=FRAMES {
                let expected = match signaler.counter() {
                    Some(counter) => {
                        let expected = sync.fence_for_value(counter.value_of_signal(k))?;
                        waiter.wait(&cs, &expected)?;
                        assert!(!cs.is_idle()?, "frame {k}: the wait completed early");
                        Some(expected)
                    }
                    None => None,
                };
                assert_eq!(
                    expected.is_none(),
                    k == 1,
                    "frame {k}: counter learned once"
                );
                p_buf.copy_from_host(0, &[k as u8; 64])?;
                let fence = signaler.signal(&ps)?;
                match expected {
                    Some(expected) => assert_eq!(fence.extract()?, expected.extract()?),
                    None => waiter.wait(&cs, &fence)?,
                }
                cs.synchronize()?;
                let mut seen = [0u8; 64];
                c_buf.copy_to_host(0, &mut seen)?;
                assert_eq!(seen, [k as u8; 64], "frame {k}");
            }
        }
        FenceSource::Received => {
            // Building fences is refused before any call, so is reading
            // one back; the waiter waits on the fence the signaller made.
            assert_refused(sim, || sync.fence_for_value(1), "2.3");
            if has_deterministic_key(release) {
                // The 2.4 flavour: deterministic, but the primitive's width
                // is not readable (no MaxPrimitiveValue, no PrimitiveInfo);
                // the keys it has (RequireDeterministicFences) are read.
                assert_refusal(sync.width(), "2.");
            }
            for k in 1..=FRAMES {
                p_buf.copy_from_host(0, &[k as u8; 64])?;
                let fence = signaler.signal(&ps)?;
                assert!(signaler.counter().is_none(), "fences cannot be read back");
                assert!(!fence.is_cleared(), "frame {k}: the signal made no fence");
                assert_refused(sim, || fence.extract(), "2.3");
                let received = fence.dup()?;
                waiter.wait(&cs, &received)?;
                cs.synchronize()?;
                let mut seen = [0u8; 64];
                c_buf.copy_to_host(0, &mut seen)?;
                assert_eq!(seen, [k as u8; 64], "frame {k}");
            }
        }
    }
    ps.synchronize()?;
    Ok(source)
}

fn assert_clean(sim: &Sim, release: NvSciRelease) {
    assert!(sim.ledger().is_clean(), "{release}: {}", sim.ledger());
    assert!(
        sim.nvsci_ledger().is_clean(),
        "{release}: {}",
        sim.nvsci_ledger()
    );
    assert!(
        sim.diagnostics().is_empty(),
        "{release}: {:#?}",
        sim.diagnostics()
    );
}

#[test]
fn the_versions_are_read_when_a_module_opens() {
    for release in NvSciRelease::ALL {
        let sim = sim_for(release);
        let backend = sim.backend();
        let bufs = BufModule::open(&backend).unwrap();
        let syncs = SyncModule::open(&backend).unwrap();
        let (bm, bn) = release.buf_version();
        let (sm, sn) = release.sync_version();
        assert_eq!(bufs.version().version, LibVersion::new(bm, bn), "{release}");
        assert_eq!(
            syncs.version().version,
            LibVersion::new(sm, sn),
            "{release}"
        );
        assert_eq!(bufs.version().source, VersionSource::Probed);
        assert_eq!(syncs.version().source, VersionSource::Probed);
        assert_eq!(syncs.fence_source(), expected_source(release), "{release}");
    }
}

#[test]
fn the_flow_runs_at_every_release() {
    for release in NvSciRelease::ALL {
        let sim = sim_for(release);
        let source = flow(&sim, release).unwrap_or_else(|e| panic!("{release}: {e}"));
        assert_eq!(source, expected_source(release), "{release}");
        assert_clean(&sim, release);
    }
}

#[test]
fn keys_and_calls_the_library_lacks_are_refused_before_any_call() {
    for release in NvSciRelease::ALL {
        let sim = sim_for(release);
        let backend = sim.backend();
        let syncs = SyncModule::open(&backend).unwrap();
        let bufs = BufModule::open(&backend).unwrap();
        let gpu = GpuId([3; 16]);

        let mut det = SyncAttrSet::<1>::new();
        det.set(SyncAttr::RequireDeterministicFences(true)).unwrap();
        let mut list = syncs.empty_attr_list().unwrap();
        if has_deterministic_key(release) {
            list.set(&det).unwrap();
        } else {
            assert_refused(&sim, || list.set(&det), "2.3");
        }

        let mut prim = SyncAttrSet::<1>::new();
        prim.set(
            SyncAttr::primitive_info(&[
                NvSciSyncAttrValPrimitiveType::NvSciSyncAttrValPrimitiveType_Syncpoint,
            ])
            .unwrap(),
        )
        .unwrap();
        let mut list = syncs.empty_attr_list().unwrap();
        if release.sync_version() >= (2, 5) {
            list.set(&prim).unwrap();
            assert!(list
                .get(tegra_interop_core::sys::nvsci::NvSciSyncAttrKey::NvSciSyncAttrKey_PrimitiveInfo)
                .unwrap()
                .is_some());
        } else {
            assert_refused(&sim, || list.set(&prim), "2.5");
            assert_refused(
                &sim,
                || {
                    list.get(
                        tegra_interop_core::sys::nvsci::NvSciSyncAttrKey::NvSciSyncAttrKey_PrimitiveInfo,
                    )
                },
                "2.5",
            );
        }

        let mut cache = BufAttrSet::<3>::new();
        cache
            .set(BufAttr::types(&[NvSciBufType::NvSciBufType_RawBuffer]).unwrap())
            .unwrap();
        cache.set(BufAttr::gpu_ids(&[gpu]).unwrap()).unwrap();
        cache
            .set(BufAttr::gpu_cache(&[GpuCache::new(gpu, false)]).unwrap())
            .unwrap();
        let mut list = bufs.empty_attr_list().unwrap();
        if release.buf_version() >= (2, 8) {
            list.set(&cache).unwrap();
        } else {
            assert_refused(&sim, || list.set(&cache), "2.8");
        }
    }
}

#[test]
fn refusals_leak_nothing() {
    for release in NvSciRelease::ALL {
        let sim = sim_for(release);
        {
            let backend = sim.backend();
            let syncs = SyncModule::open(&backend).unwrap();
            let mut list = syncs.empty_attr_list().unwrap();
            let mut prim = SyncAttrSet::<1>::new();
            prim.set(SyncAttr::gpu_ids(&[GpuId([1; 16])]).unwrap())
                .unwrap();
            let _ = list.set(&prim);
        }
        assert_clean(&sim, release);
    }
}

#[test]
fn nvsciipc_version_compatibility_is_asked_where_the_library_has_it() {
    for release in NvSciRelease::ALL {
        let sim = sim_for(release);
        let backend = sim.backend();
        let check = |v: LibVersion| NvSciIpc::check_version_compatibility(&backend, v);
        let Some((major, minor)) = release.ipc_version() else {
            // DRIVE OS 5.2.6 (and the 2.4 flavour, whose NvSciIpc is not
            // known): no such call. Refused before calling anything.
            assert_refused(&sim, || check(LibVersion::new(1, 0)), "1.0");
            let err = check(NvSciIpc::DECLARED_VERSION).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::NotInLibraryVersion {
                        item: "NvSciIpcCheckVersionCompatibility",
                        library: "NvSciIpc",
                        loaded: LibVersion::UNVERSIONED,
                        ..
                    }
                ),
                "{release}: {err:?}"
            );
            assert!(err.to_string().contains("unversioned"), "{err}");
            continue;
        };
        // The library answers (one call each): same major, minor up to its own.
        let before = sim.calls();
        assert!(check(LibVersion::new(major, minor)).unwrap(), "{release}");
        assert!(check(LibVersion::new(major, 0)).unwrap(), "{release}");
        assert!(
            !check(LibVersion::new(major, minor + 1)).unwrap(),
            "{release}"
        );
        assert!(!check(LibVersion::new(major + 1, 0)).unwrap(), "{release}");
        assert_eq!(sim.calls(), before + 4, "{release}");
        // These bindings follow NvSciIpc 1.4 (DRIVE OS 6.0.8.1 / 6.0.10).
        assert_eq!(NvSciIpc::DECLARED_VERSION, LibVersion::new(1, 4));
        assert_eq!(
            check(NvSciIpc::DECLARED_VERSION).unwrap(),
            release == NvSciRelease::V6_0_10,
            "{release}"
        );
    }
    // No NvSci at all (a discrete GPU): the missing symbol, typed.
    let sim = Sim::new().unwrap();
    let err = NvSciIpc::check_version_compatibility(&sim.backend(), NvSciIpc::DECLARED_VERSION)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotSupported {
                symbol: "NvSciIpcCheckVersionCompatibility",
                ..
            }
        ),
        "{err:?}"
    );
}
