//! C-level behaviour of the simulated NvSci entry points.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::ffi::c_void;
use std::ptr;

use tegra_interop_sim::FunctionTable;
use tegra_interop_sim::{DiagnosticKind, Sim, SimConfig};
use tegra_interop_sys::nvsci::*;

#[macro_use]
mod nvsci_common;
use nvsci_common::*;

const BAD_PARAMETER: u32 = 0x100;
const NOT_INITIALIZED: u32 = 0x24;
const UNSUPPORTED_CONFIG: u32 = 0x2000001;

fn setup() -> (Sim, FunctionTable) {
    setup_with_config(SimConfig::tegra())
}

fn sync_list(t: &FunctionTable, m: NvSciSyncModule) -> NvSciSyncAttrList {
    let mut l = ptr::null_mut();
    assert_eq!(call!(t.nvscisync, NvSciSyncAttrListCreate(m, &mut l)).0, 0);
    l
}

fn set_perm(t: &FunctionTable, l: NvSciSyncAttrList, perm: u64) -> u32 {
    let pair = NvSciSyncAttrKeyValuePair {
        attrKey: NvSciSyncAttrKey::NvSciSyncAttrKey_RequiredPerm,
        value: (&perm as *const u64).cast(),
        len: 8,
    };
    call!(t.nvscisync, NvSciSyncAttrListSetAttrs(l, &pair, 1)).0
}

fn get_u64(t: &FunctionTable, l: NvSciSyncAttrList, key: NvSciSyncAttrKey) -> Option<u64> {
    let mut pair = NvSciSyncAttrKeyValuePair {
        attrKey: key,
        value: ptr::null(),
        len: 0,
    };
    assert_eq!(
        call!(t.nvscisync, NvSciSyncAttrListGetAttrs(l, &mut pair, 1)).0,
        0
    );
    let bytes = value_copy(pair.value, pair.len)?;
    let mut b = [0u8; 8];
    b[..bytes.len().min(8)].copy_from_slice(&bytes[..bytes.len().min(8)]);
    Some(u64::from_ne_bytes(b))
}

#[test]
fn without_nvsci_the_tables_are_empty() {
    let sim = Sim::new().unwrap();
    let t = sim.table();
    assert!(t.nvscibuf.NvSciBufModuleOpen.is_none());
    assert!(t.nvscisync.NvSciSyncModuleOpen.is_none());
    assert!(t.nvsciipc.NvSciIpcInit.is_none());
    let (_, t) = setup();
    assert!(t.nvscisync.NvSciSyncFenceWait.is_some());
    // GetTimestamp exists (it answers ClearedFence / BadParameter: the
    // simulator reconciles no timestamps).
    assert!(t.nvscisync.NvSciSyncFenceGetTimestamp.is_some());
}

#[test]
fn cuda_fills_a_fresh_sync_list_and_refuses_a_used_one() {
    let (sim, t) = setup();
    let mut m = ptr::null_mut();
    assert_eq!(call!(t.nvscisync, NvSciSyncModuleOpen(&mut m)).0, 0);
    let l = sync_list(&t, m);
    // No flag: INVALID_VALUE.
    assert_eq!(
        call!(t.cuda, cuDeviceGetNvSciSyncAttributes(l.cast(), 0, 0)).0,
        1
    );
    assert_eq!(
        call!(t.cuda, cuDeviceGetNvSciSyncAttributes(l.cast(), 0, 1)).0,
        0
    );
    assert_eq!(
        get_u64(&t, l, NvSciSyncAttrKey::NvSciSyncAttrKey_RequiredPerm),
        Some(2)
    );
    // Syncpoint (1) on the integrated GPU.
    assert_eq!(
        get_u64(&t, l, NvSciSyncAttrKey::NvSciSyncAttrKey_PrimitiveInfo).map(|v| v as u32),
        Some(1)
    );
    assert!(get_u64(&t, l, NvSciSyncAttrKey::NvSciSyncAttrKey_GpuId).is_some());
    // RequiredPerm already set: INVALID_VALUE.
    assert_eq!(
        call!(t.cuda, cuDeviceGetNvSciSyncAttributes(l.cast(), 0, 2)).0,
        1
    );
    let w = sync_list(&t, m);
    assert_eq!(set_perm(&t, w, 1), 0);
    assert_eq!(
        call!(t.cuda, cuDeviceGetNvSciSyncAttributes(w.cast(), 0, 2)).0,
        1
    );
    // A key twice, an output key, or Auto: BadParameter.
    assert_eq!(set_perm(&t, w, 1), BAD_PARAMETER);
    let fresh = sync_list(&t, m);
    assert_eq!(set_perm(&t, fresh, 1 << 63), BAD_PARAMETER);
    let actual = 3u64;
    let pair = NvSciSyncAttrKeyValuePair {
        attrKey: NvSciSyncAttrKey::NvSciSyncAttrKey_ActualPerm,
        value: (&actual as *const u64).cast(),
        len: 8,
    };
    assert_eq!(
        call!(t.nvscisync, NvSciSyncAttrListSetAttrs(fresh, &pair, 1)).0,
        BAD_PARAMETER
    );

    // Two signallers: UnsupportedConfig, reported in the conflict list.
    let s2 = sync_list(&t, m);
    assert_eq!(set_perm(&t, s2, 2), 0);
    let lists = [l, s2, w];
    let (mut out, mut conflict) = (ptr::null_mut(), ptr::null_mut());
    assert_eq!(
        call!(
            t.nvscisync,
            NvSciSyncAttrListReconcile(lists.as_ptr(), 3, &mut out, &mut conflict)
        )
        .0,
        UNSUPPORTED_CONFIG
    );
    assert!(out.is_null() && !conflict.is_null());
    assert!(get_u64(
        &t,
        conflict,
        NvSciSyncAttrKey::NvSciSyncAttrKey_RequiredPerm
    )
    .is_some());
    assert!(get_u64(
        &t,
        conflict,
        NvSciSyncAttrKey::NvSciSyncAttrKey_PrimitiveInfo
    )
    .is_none());
    // One signaller, one waiter: reconciled; ActualPerm is the union.
    let ok = [l, w];
    let mut no_conflict = ptr::null_mut();
    assert_eq!(
        call!(
            t.nvscisync,
            NvSciSyncAttrListReconcile(ok.as_ptr(), 2, &mut out, &mut no_conflict)
        )
        .0,
        0
    );
    assert_eq!(
        get_u64(&t, out, NvSciSyncAttrKey::NvSciSyncAttrKey_ActualPerm),
        Some(3)
    );
    assert_eq!(
        get_u64(
            &t,
            out,
            NvSciSyncAttrKey::NvSciSyncAttrKey_MaxPrimitiveValue
        ),
        Some(u64::from(u32::MAX))
    );
    // Reconciled lists are read-only.
    assert_eq!(set_perm(&t, out, 1), BAD_PARAMETER);

    for list in [l, w, fresh, s2, conflict, out] {
        call!(t.nvscisync, NvSciSyncAttrListFree(list));
    }
    assert!(sim.nvsci_ledger().modules == 1);
    call!(t.nvscisync, NvSciSyncModuleClose(m));
    assert!(sim.nvsci_ledger().is_clean(), "{}", sim.nvsci_ledger());
    // Freeing a list twice is reported.
    call!(t.nvscisync, NvSciSyncAttrListFree(l));
    assert!(sim
        .take_diagnostics()
        .iter()
        .any(|d| d.kind == DiagnosticKind::DoubleDestroy));
}

#[test]
fn a_module_stays_open_while_its_objects_live_and_shutdown_frees_everything() {
    let (sim, t) = setup();
    let mut m = ptr::null_mut();
    assert_eq!(call!(t.nvscibuf, NvSciBufModuleOpen(&mut m)).0, 0);
    let mut l = ptr::null_mut();
    assert_eq!(call!(t.nvscibuf, NvSciBufAttrListCreate(m, &mut l)).0, 0);
    let ty = 1u32;
    let size = 8192u64;
    let mut pairs = [
        NvSciBufAttrKeyValuePair {
            key: NvSciBufAttrKey::NvSciBufGeneralAttrKey_Types,
            value: (&ty as *const u32).cast(),
            len: 4,
        },
        NvSciBufAttrKeyValuePair {
            key: NvSciBufAttrKey::NvSciBufRawBufferAttrKey_Size,
            value: (&size as *const u64).cast(),
            len: 8,
        },
    ];
    assert_eq!(
        call!(
            t.nvscibuf,
            NvSciBufAttrListSetAttrs(l, pairs.as_mut_ptr(), 2)
        )
        .0,
        0
    );
    let mut obj = ptr::null_mut();
    let mut conflict = ptr::null_mut();
    let one = [l];
    assert_eq!(
        call!(
            t.nvscibuf,
            NvSciBufAttrListReconcileAndObjAlloc(one.as_ptr(), 1, &mut obj, &mut conflict)
        )
        .0,
        0
    );
    call!(t.nvscibuf, NvSciBufAttrListFree(l));
    call!(t.nvscibuf, NvSciBufModuleClose(m));
    // Closed by the application, kept for the object.
    assert_eq!(sim.nvsci_ledger().modules, 1);
    assert_eq!(sim.nvsci_ledger().buf_objects, 1);
    // Creating a list on a closed module is refused.
    let mut l2 = ptr::null_mut();
    assert_eq!(
        call!(t.nvscibuf, NvSciBufAttrListCreate(m, &mut l2)).0,
        BAD_PARAMETER
    );
    let _ = sim.take_diagnostics();

    sim.shutdown();
    assert!(sim.nvsci_ledger().is_clean());
    let mut again: *mut c_void = ptr::null_mut();
    assert_eq!(
        call!(t.nvscibuf, NvSciBufObjGetCpuPtr(obj, &mut again)).0,
        NOT_INITIALIZED
    );
}

#[test]
fn injected_failures_return_nvsci_codes_and_do_nothing() {
    let (sim, t) = setup();
    sim.fail_symbol("NvSciSyncModuleOpen", 0, 0x30);
    let mut m = ptr::null_mut();
    assert_eq!(call!(t.nvscisync, NvSciSyncModuleOpen(&mut m)).0, 0x30);
    assert!(m.is_null());
    assert!(sim.nvsci_ledger().is_clean());
    assert_eq!(call!(t.nvscisync, NvSciSyncModuleOpen(&mut m)).0, 0);
    call!(t.nvscisync, NvSciSyncModuleClose(m));
    assert!(sim.call_log().contains(&"NvSciSyncModuleClose"));
}
