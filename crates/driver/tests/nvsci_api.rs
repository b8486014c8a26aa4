//! The safe NvSci API on the simulator: reconciliation (and the conflict
//! keys it reports), permissions, fences, CPU waits, typed errors.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::sync::Arc;
use std::time::{Duration, Instant};

use tegra_interop_core::nvsci::{BufAttr, BufAttrSet, SyncAttr, SyncAttrSet};
use tegra_interop_core::sys::nvsci::{
    NvSciBufAttrKey, NvSciBufAttrValAccessPerm, NvSciBufType, NvSciSyncAccessPerm, NvSciSyncAttrKey,
};
use tegra_interop_core::NvSciError;
use tegra_interop_driver::nvsci::{
    BufModule, BufPerm, CpuWaitContext, Fence, NvSciIpc, SyncAttrList, SyncModule, SyncPerm,
    Timeout,
};
use tegra_interop_driver::{Context, Error};
use tegra_interop_sim::{Sim, SimConfig};

fn tegra() -> Sim {
    // Quiet: refused reconciliations and exports are provoked on purpose.
    Sim::with_config(SimConfig::tegra().with_diagnostic_echo(false)).unwrap()
}

fn raw(size: u64, ty: NvSciBufType) -> BufAttrSet<4> {
    let mut a = BufAttrSet::new();
    a.set(BufAttr::types(&[ty]).unwrap()).unwrap();
    a.set(BufAttr::RawSize(size)).unwrap();
    a.set(BufAttr::NeedCpuAccess(true)).unwrap();
    a.set(BufAttr::RequiredPerm(
        NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite,
    ))
    .unwrap();
    a
}

fn cpu(perm: NvSciSyncAccessPerm) -> SyncAttrSet<3> {
    let mut a = SyncAttrSet::new();
    a.set(SyncAttr::NeedCpuAccess(true)).unwrap();
    a.set(SyncAttr::RequiredPerm(perm)).unwrap();
    a.set(SyncAttr::RequireDeterministicFences(true)).unwrap();
    a
}

fn cpu_list(m: &SyncModule, perm: NvSciSyncAccessPerm) -> SyncAttrList {
    m.attr_list(&cpu(perm)).unwrap()
}

/// A simulator whose NvSciIpc configuration has one endpoint pair, "a" and
/// "b" (the configuration file is removed when the first value drops).
fn sim_with_endpoint_pair() -> (tegra_interop_sim::nvsci::IpcConfigFile, Sim) {
    let cfg =
        tegra_interop_sim::nvsci::IpcConfigFile::inter_process(&[("a", "b", 8, 1024)]).unwrap();
    // Quiet: refused exports and imports are provoked on purpose.
    let sim = Sim::with_config(
        SimConfig::tegra()
            .with_nvsciipc_config(cfg.path())
            .with_diagnostic_echo(false),
    )
    .unwrap();
    (cfg, sim)
}

/// Opens "a" and "b" on two threads (each open waits for its peer).
fn open_pair(backend: &Arc<tegra_interop_driver::Backend>) -> (NvSciIpc, NvSciIpc) {
    let open = |name: &'static str| {
        let backend = Arc::clone(backend);
        std::thread::spawn(move || NvSciIpc::open(&backend, name, Duration::from_secs(10)))
    };
    let (ta, tb) = (open("a"), open("b"));
    (ta.join().unwrap().unwrap(), tb.join().unwrap().unwrap())
}

fn clean(sim: &Sim) {
    assert!(sim.ledger().is_clean(), "{}", sim.ledger());
    assert!(sim.nvsci_ledger().is_clean(), "{}", sim.nvsci_ledger());
}

#[test]
fn absent_libraries_are_a_typed_not_supported() {
    let sim = Sim::new().unwrap(); // a discrete GPU: no NvSci
    let err = BufModule::open(&sim.backend()).unwrap_err();
    assert_eq!(
        err,
        Error::NotSupported {
            symbol: "NvSciBufModuleOpen",
            library: "libnvscibuf.so.1",
            reason: None, // a simulator's table has no loader
        }
    );
    let err = SyncModule::open(&sim.backend()).unwrap_err();
    assert!(matches!(
        err,
        Error::NotSupported {
            library: "libnvscisync.so.1",
            ..
        }
    ));
}

#[test]
fn buffer_reconciliation_needs_equal_sizes_and_reports_type_conflicts() {
    let sim = tegra();
    {
        let m = BufModule::open(&sim.backend()).unwrap();
        let a = m
            .attr_list(&raw(1000, NvSciBufType::NvSciBufType_RawBuffer))
            .unwrap();
        let same = m
            .attr_list(&raw(1000, NvSciBufType::NvSciBufType_RawBuffer))
            .unwrap();
        let r = m.reconcile(&[&a, &same]).unwrap();
        assert!(r.is_reconciled());
        assert_eq!(
            r.get(NvSciBufAttrKey::NvSciBufRawBufferAttrKey_Size)
                .unwrap(),
            Some(BufAttr::RawSize(1000))
        );
        // Input-only keys are not in reconciled lists, output-only keys not
        // in unreconciled ones: refused without asking the library.
        let calls = sim.calls();
        assert!(matches!(
            r.get(NvSciBufAttrKey::NvSciBufGeneralAttrKey_RequiredPerm),
            Err(Error::Unsupported { .. })
        ));
        assert!(matches!(
            a.get(NvSciBufAttrKey::NvSciBufGeneralAttrKey_ActualPerm),
            Err(Error::Unsupported { .. })
        ));
        assert_eq!(sim.calls(), calls);
        let obj = r.alloc().unwrap();
        assert_eq!(obj.size().unwrap(), 1000);
        assert_eq!(obj.actual_perm().unwrap(), BufPerm::ReadWrite);

        // Different sizes do not reconcile (the library takes no maximum).
        let larger = m
            .attr_list(&raw(3000, NvSciBufType::NvSciBufType_RawBuffer))
            .unwrap();
        let err = m.reconcile(&[&a, &larger]).unwrap_err();
        assert!(matches!(err.error, Error::NvSci { .. }), "{err}");
        assert_eq!(
            err.conflicts,
            vec![NvSciBufAttrKey::NvSciBufRawBufferAttrKey_Size]
        );

        // A raw buffer and an image do not mix (only Image + Tensor may).
        let mut image = BufAttrSet::<1>::new();
        image
            .set(BufAttr::types(&[NvSciBufType::NvSciBufType_Image]).unwrap())
            .unwrap();
        let img = m.attr_list(&image).unwrap();
        let err = m.reconcile(&[&a, &img]).unwrap_err();
        assert!(matches!(
            err.error,
            Error::NvSci {
                code: NvSciError::RECONCILIATION_FAILED,
                ..
            }
        ));
        assert_eq!(
            err.conflicts,
            vec![NvSciBufAttrKey::NvSciBufGeneralAttrKey_Types]
        );
        assert!(err.to_string().contains("conflict"), "{err}");
        // An unreconciled list cannot allocate.
        assert!(matches!(a.alloc(), Err(Error::Unsupported { .. })));
    }
    clean(&sim);
}

#[test]
fn buffer_dups_and_reduced_permissions() {
    let sim = tegra();
    {
        let m = BufModule::open(&sim.backend()).unwrap();
        let a = m
            .attr_list(&raw(4096, NvSciBufType::NvSciBufType_RawBuffer))
            .unwrap();
        let obj = m.reconcile_and_alloc(&[&a]).unwrap();
        let dup = obj.dup().unwrap();
        let ro = obj.dup_with_reduced_perm(BufPerm::ReadOnly).unwrap();
        assert_eq!(ro.actual_perm().unwrap(), BufPerm::ReadOnly);
        assert_eq!(dup.actual_perm().unwrap(), BufPerm::ReadWrite);
        // Raising the permission of a read-only handle is refused.
        assert!(ro.dup_with_reduced_perm(BufPerm::ReadWrite).is_err());
        // A read-only handle has no writable CPU pointer, but a const one.
        assert!(ro.cpu_ptr().is_err());
        let p = obj.cpu_ptr().unwrap();
        // SAFETY: (test) 4096 bytes mapped, nobody else touches them now.
        unsafe { p.as_ptr().write_bytes(0x5a, 16) };
        let q = ro.const_cpu_ptr().unwrap();
        // SAFETY: (test) the same bytes through the read-only handle.
        assert_eq!(unsafe { q.as_ptr().read() }, 0x5a);
        obj.flush_cpu_cache_range(0, 16).unwrap();
        drop(obj);
        // Handles are independent: the dup still works after the original is gone.
        assert_eq!(dup.size().unwrap(), 4096);
    }
    clean(&sim);
}

#[test]
fn sync_reconciliation_needs_exactly_one_signaler_and_a_waiter() {
    let sim = tegra();
    let backend = sim.backend();
    {
        let ctx = Context::create(Arc::clone(&backend), 0, 0).unwrap();
        let m = SyncModule::open(&backend).unwrap();
        let s1 = m.cuda_signaler_attrs(&ctx).unwrap();
        let s2 = cpu_list(&m, NvSciSyncAccessPerm::NvSciSyncAccessPerm_SignalOnly);
        let w = m.cuda_waiter_attrs(&ctx).unwrap();
        let err = m.reconcile(&[&s1, &s2, &w]).unwrap_err();
        // The library's answer to a wrong set of roles: UnsupportedConfig.
        assert!(
            matches!(
                err.error,
                Error::NvSci {
                    code: NvSciError::UNSUPPORTED_CONFIG,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(
            err.conflicts,
            vec![NvSciSyncAttrKey::NvSciSyncAttrKey_RequiredPerm]
        );
        let err = m.reconcile(&[&s1]).unwrap_err();
        assert_eq!(
            err.conflicts,
            vec![NvSciSyncAttrKey::NvSciSyncAttrKey_RequiredPerm]
        );
        let ok = m.reconcile(&[&s1, &w]).unwrap();
        let obj = ok.alloc().unwrap();
        assert_eq!(obj.actual_perm().unwrap(), SyncPerm::WaitSignal);
        // CUDA on a Tegra-like GPU picks syncpoints: 32-bit values.
        assert_eq!(
            obj.width().unwrap(),
            tegra_interop_core::PrimitiveWidth::U32
        );
        // No RequireDeterministicFences: no counter.
        assert!(!obj.is_deterministic().unwrap());
        // A list that already has RequiredPerm cannot take CUDA's attributes.
        let mut again = cpu_list(&m, NvSciSyncAccessPerm::NvSciSyncAccessPerm_WaitOnly);
        let e = again
            .add_cuda_attributes(&ctx, tegra_interop_core::NvSciSyncAttrFlags::WAIT)
            .unwrap_err();
        assert_eq!(e.code(), Some(tegra_interop_core::CuResult::INVALID_VALUE));
        // No flag at all is refused before the driver.
        let mut fresh = m.empty_attr_list().unwrap();
        assert!(matches!(
            fresh.add_cuda_attributes(&ctx, tegra_interop_core::NvSciSyncAttrFlags::empty()),
            Err(Error::Validation(_))
        ));
        // CUDA's list carries RequiredPerm, PrimitiveInfo and GpuId.
        assert!(matches!(
            w.get(NvSciSyncAttrKey::NvSciSyncAttrKey_RequiredPerm)
                .unwrap(),
            Some(SyncAttr::RequiredPerm(
                NvSciSyncAccessPerm::NvSciSyncAccessPerm_WaitOnly
            ))
        ));
        assert!(w
            .get(NvSciSyncAttrKey::NvSciSyncAttrKey_GpuId)
            .unwrap()
            .is_some());
        assert!(w
            .get(NvSciSyncAttrKey::NvSciSyncAttrKey_PrimitiveInfo)
            .unwrap()
            .is_some());
    }
    clean(&sim);
}

#[test]
fn fences_cpu_signal_and_cpu_wait_with_timeouts() {
    let sim = tegra();
    {
        let m = SyncModule::open(&sim.backend()).unwrap();
        let s = cpu_list(&m, NvSciSyncAccessPerm::NvSciSyncAccessPerm_SignalOnly);
        let w = cpu_list(&m, NvSciSyncAccessPerm::NvSciSyncAccessPerm_WaitOnly);
        let obj = m.reconcile_and_alloc(&[&s, &w]).unwrap();
        let mut cx = CpuWaitContext::new(&m).unwrap();

        let cleared = Fence::new(&m);
        assert!(cleared.is_cleared());
        assert_eq!(cleared.extract().unwrap(), None);
        assert!(cleared.wait(&mut cx, Timeout::Infinite).unwrap());

        // The counter is learned from the first fence (the library's fence
        // of the next CPU signal), never assumed.
        let first = obj.generate_fence().unwrap();
        assert_eq!(first.extract().unwrap().map(|v| v.value), Some(1));
        let counter = obj.counter_from_fence(1, &first).unwrap();
        assert_eq!(counter.initial_value(), 0);
        assert!(obj.counter_from_fence(1, &cleared).is_err());
        let second = obj.fence_for_value(counter.value_of_signal(2)).unwrap();
        let start = Instant::now();
        assert!(!second.wait(&mut cx, Duration::from_millis(30)).unwrap());
        assert!(start.elapsed() >= Duration::from_millis(25));

        let copy = first.dup().unwrap();
        obj.cpu_signal().unwrap();
        assert!(copy.wait(&mut cx, Timeout::Infinite).unwrap());
        assert!(!second.wait(&mut cx, Duration::ZERO).unwrap());

        // A signal from another thread wakes a waiter blocked with an
        // infinite timeout.
        std::thread::scope(|t| {
            t.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                let f = obj.generate_fence().unwrap();
                obj.cpu_signal().unwrap();
                drop(f);
            });
            assert!(second.wait(&mut cx, Timeout::Infinite).unwrap());
        });

        let mut f = second.dup().unwrap();
        f.clear();
        assert!(f.is_cleared());
        f.update(&obj, 0, 7).unwrap();
        assert_eq!(f.extract().unwrap().map(|v| (v.id, v.value)), Some((0, 7)));
    }
    clean(&sim);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "opens NvSciIpc endpoints: SOCK_SEQPACKET sockets, which Miri does not support"
)]
fn wait_only_objects_cannot_become_signalling_semaphores() {
    // Two endpoints of one simulator, to import a wait-only handle.
    let (_cfg, sim) = sim_with_endpoint_pair();
    let backend = sim.backend();
    {
        let (mut ea, mut eb) = open_pair(&backend);

        let ctx = Context::create(Arc::clone(&backend), 0, 0).unwrap();
        let m = SyncModule::open(&backend).unwrap();
        let s = m.cuda_signaler_attrs(&ctx).unwrap();
        // The waiter's list travels to the signaller first (the topology rule).
        let mine = m.cuda_waiter_attrs(&ctx).unwrap();
        m.send_unreconciled(&[&mine], &mut eb).unwrap();
        let w = m.receive_unreconciled(&mut ea).unwrap();
        let obj = m.reconcile_and_alloc(&[&s, &w]).unwrap();
        obj.send(Some(SyncPerm::WaitOnly), &mut ea).unwrap();
        let imported = m
            .receive_obj(
                &mut eb,
                &[&mine],
                SyncPerm::WaitOnly,
                Timeout::After(Duration::from_secs(5)),
            )
            .unwrap();
        assert_eq!(imported.actual_perm().unwrap(), SyncPerm::WaitOnly);
        let err = imported.import_cuda_signaler(&ctx).unwrap_err();
        assert!(matches!(err, Error::Unsupported { .. }), "{err}");
        let waiter = imported.import_cuda_waiter(&ctx).unwrap();
        drop(waiter);

        // Asking for more than was granted is refused on import.
        obj.send(Some(SyncPerm::WaitOnly), &mut ea).unwrap();
        let e = m
            .receive_obj(
                &mut eb,
                &[&mine],
                SyncPerm::WaitSignal,
                Timeout::After(Duration::from_secs(5)),
            )
            .unwrap_err();
        assert!(
            matches!(
                &e,
                tegra_interop_driver::nvsci::IpcError::Driver(Error::NvSci {
                    code: NvSciError::ACCESS_DENIED,
                    ..
                })
            ),
            "{e}"
        );
    }
    clean(&sim);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "opens NvSciIpc endpoints: SOCK_SEQPACKET sockets, which Miri does not support"
)]
fn objects_go_back_only_the_way_a_peer_list_came() {
    // Two endpoints of one simulator; neither side sends a list first.
    let (_cfg, sim) = sim_with_endpoint_pair();
    let backend = sim.backend();
    {
        let (mut ea, _eb) = open_pair(&backend);
        let refused = |e: tegra_interop_driver::nvsci::IpcError, call: &str, code: NvSciError| {
            assert!(
                matches!(
                    &e,
                    tegra_interop_driver::nvsci::IpcError::Driver(Error::NvSci { call: c, code: k })
                        if *c == call && *k == code
                ),
                "expected {call} -> {code}, got {e}"
            );
        };

        // A buffer reconciled from local lists only: NotPermitted (nvscibuf.h).
        let bufs = BufModule::open(&backend).unwrap();
        let attrs = raw(4096, NvSciBufType::NvSciBufType_RawBuffer);
        let buf = bufs
            .reconcile_and_alloc(&[
                &bufs.attr_list(&attrs).unwrap(),
                &bufs.attr_list(&attrs).unwrap(),
            ])
            .unwrap();
        let e = buf.send(None, &mut ea).unwrap_err();
        refused(e, "NvSciBufObjIpcExport", NvSciError::NOT_PERMITTED);

        // A sync object reconciled locally: BadParameter (nvscisync.h 6.0.5+).
        let syncs = SyncModule::open(&backend).unwrap();
        let obj = syncs
            .reconcile_and_alloc(&[
                &cpu_list(&syncs, NvSciSyncAccessPerm::NvSciSyncAccessPerm_SignalOnly),
                &cpu_list(&syncs, NvSciSyncAccessPerm::NvSciSyncAccessPerm_WaitOnly),
            ])
            .unwrap();
        let e = obj.send(None, &mut ea).unwrap_err();
        refused(e, "NvSciSyncObjIpcExport", NvSciError::BAD_PARAMETER);
    }
    clean(&sim);
}
