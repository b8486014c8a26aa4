//! `extern "C"` trampolines of the NvSci entry points, one set per
//! simulator slot (the same scheme as the CUDA part: a const-generic
//! function per slot forwards to a non-generic one taking the slot).
//!
//! Every entry point is counted, logged and subject to failure injection
//! through the simulator's `Instance::enter` (an injected code is returned
//! as the `NvSciError` of the same number; after `Sim::shutdown` every call
//! answers `NvSciError_NotInitialized`). Entry points without a return
//! value (`*Free`, `*Close`, `FenceClear`, `NvSciIpcDeinit`) cannot fail:
//! an injected failure aimed at one of them is consumed and ignored.
//! Panics are caught (`NvSciError_Unknown` plus an `Internal` diagnostic).

use std::ffi::{c_char, c_void};
use std::io::Write as _;
use std::panic::AssertUnwindSafe;

use tegra_interop_driver::table::{NvSciBufApi, NvSciIpcApi, NvSciSyncApi};
use tegra_interop_sys::nvsci::*;

use super::{buf, entry_code, err, ipc, sync, NvSciRelease};
use crate::instance::Call;
use crate::slots::SLOTS;
use crate::DiagnosticKind;

fn run_ret(
    slot: usize,
    symbol: &'static str,
    f: &mut dyn FnMut(&Call<'_>) -> NvSciError,
) -> NvSciError {
    let Some(inst) = crate::slots::get(slot) else {
        let _ = writeln!(
            std::io::stderr(),
            "tegra-interop-sim: {symbol} called through the table of a simulator that was dropped"
        );
        return err::NOT_INITIALIZED;
    };
    let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let index = match inst.enter(symbol) {
            Ok(i) => i,
            Err(code) => return entry_code(inst.is_shut(), code),
        };
        f(&Call {
            inst: &inst,
            index: Some(index),
            symbol,
        })
    }));
    run.unwrap_or_else(|_| {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
            inst.diag(
                None,
                symbol,
                DiagnosticKind::Internal,
                "the simulator panicked (bug in the simulator)".into(),
            );
        }));
        err::UNKNOWN
    })
}

fn run_void(slot: usize, symbol: &'static str, f: &mut dyn FnMut(&Call<'_>)) {
    let Some(inst) = crate::slots::get(slot) else {
        return;
    };
    let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let index = match inst.enter(symbol) {
            Ok(i) => Some(i),
            // Shut down: everything is gone already.
            Err(_) if inst.is_shut() => return,
            // An injected failure: a void call cannot report it.
            Err(_) => None,
        };
        f(&Call {
            inst: &inst,
            index,
            symbol,
        });
    }));
    if run.is_err() {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
            inst.diag(
                None,
                symbol,
                DiagnosticKind::Internal,
                "the simulator panicked (bug in the simulator)".into(),
            );
        }));
    }
}

macro_rules! slot_array {
    ($f:ident) => {
        [
            $f::<0>, $f::<1>, $f::<2>, $f::<3>, $f::<4>, $f::<5>, $f::<6>, $f::<7>, $f::<8>,
            $f::<9>, $f::<10>, $f::<11>, $f::<12>, $f::<13>, $f::<14>, $f::<15>, $f::<16>,
            $f::<17>, $f::<18>, $f::<19>, $f::<20>, $f::<21>, $f::<22>, $f::<23>, $f::<24>,
            $f::<25>, $f::<26>, $f::<27>, $f::<28>, $f::<29>, $f::<30>, $f::<31>, $f::<32>,
            $f::<33>, $f::<34>, $f::<35>, $f::<36>, $f::<37>, $f::<38>, $f::<39>, $f::<40>,
            $f::<41>, $f::<42>, $f::<43>, $f::<44>, $f::<45>, $f::<46>, $f::<47>, $f::<48>,
            $f::<49>, $f::<50>, $f::<51>, $f::<52>, $f::<53>, $f::<54>, $f::<55>, $f::<56>,
            $f::<57>, $f::<58>, $f::<59>, $f::<60>, $f::<61>, $f::<62>, $f::<63>,
        ]
    };
}

macro_rules! nvsci_api {
    ($api:ident, $maker:ident, $tables:ident, $by:ident, $tr:ident;
     $( $kind:ident $field:ident => $md:ident :: $imp:ident ( $($arg:ident : $ty:ty),* ); )*) => {
        #[allow(non_snake_case, unused_unsafe, clippy::missing_safety_doc, clippy::too_many_arguments)]
        mod $by {
            use super::*;
            $( nvsci_api!(@by $kind $field $md::$imp ($($arg : $ty),*)); )*
        }
        #[allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]
        mod $tr {
            use super::*;
            $( nvsci_api!(@tr $kind $field $by ($($arg : $ty),*)); )*
        }
        #[allow(clippy::needless_update)]
        fn $maker<const S: usize>() -> $api {
            $api {
                $( $field: Some($tr::$field::<S>), )*
                ..$api::empty()
            }
        }
        static $tables: [fn() -> $api; SLOTS] = slot_array!($maker);
    };
    (@by ret $field:ident $md:ident :: $imp:ident ($($arg:ident : $ty:ty),*)) => {
        /// # Safety
        /// The C contract of the entry point of the same name.
        pub(super) unsafe fn $field(slot: usize, $($arg: $ty),*) -> NvSciError {
            run_ret(slot, stringify!($field), &mut |c: &Call<'_>| {
                // SAFETY: the arguments come straight from the C caller, who
                // owes the entry point's C contract.
                unsafe { $md::$imp(c, $($arg),*) }
            })
        }
    };
    (@by void $field:ident $md:ident :: $imp:ident ($($arg:ident : $ty:ty),*)) => {
        /// # Safety
        /// The C contract of the entry point of the same name.
        pub(super) unsafe fn $field(slot: usize, $($arg: $ty),*) {
            run_void(slot, stringify!($field), &mut |c: &Call<'_>| {
                // SAFETY: as for the entry points with a result.
                unsafe { $md::$imp(c, $($arg),*) }
            })
        }
    };
    (@tr ret $field:ident $by:ident ($($arg:ident : $ty:ty),*)) => {
        /// # Safety
        /// The C contract of the entry point of the same name.
        pub(super) unsafe extern "C" fn $field<const S: usize>($($arg: $ty),*) -> NvSciError {
            // SAFETY: same contract, forwarded unchanged.
            unsafe { super::$by::$field(S, $($arg),*) }
        }
    };
    (@tr void $field:ident $by:ident ($($arg:ident : $ty:ty),*)) => {
        /// # Safety
        /// The C contract of the entry point of the same name.
        pub(super) unsafe extern "C" fn $field<const S: usize>($($arg: $ty),*) {
            // SAFETY: same contract, forwarded unchanged.
            unsafe { super::$by::$field(S, $($arg),*) }
        }
    };
}

nvsci_api! { NvSciBufApi, buf_api, BUF_TABLES, buf_by_slot, buf_tramp;
    ret NvSciBufModuleOpen => buf::module_open(out: *mut NvSciBufModule);
    void NvSciBufModuleClose => buf::module_close(m: NvSciBufModule);
    ret NvSciBufAttrListCreate => buf::attr_list_create(m: NvSciBufModule, out: *mut NvSciBufAttrList);
    void NvSciBufAttrListFree => buf::attr_list_free(l: NvSciBufAttrList);
    ret NvSciBufAttrListSetAttrs => buf::attr_list_set_attrs(l: NvSciBufAttrList, p: *mut NvSciBufAttrKeyValuePair, n: usize);
    ret NvSciBufAttrListGetAttrs => buf::attr_list_get_attrs(l: NvSciBufAttrList, p: *mut NvSciBufAttrKeyValuePair, n: usize);
    ret NvSciBufAttrListReconcile => buf::attr_list_reconcile(ls: *const NvSciBufAttrList, n: usize, out: *mut NvSciBufAttrList, conflict: *mut NvSciBufAttrList);
    ret NvSciBufAttrListReconcileAndObjAlloc => buf::attr_list_reconcile_and_obj_alloc(ls: *const NvSciBufAttrList, n: usize, obj: *mut NvSciBufObj, conflict: *mut NvSciBufAttrList);
    ret NvSciBufObjAlloc => buf::obj_alloc(l: NvSciBufAttrList, obj: *mut NvSciBufObj);
    ret NvSciBufObjDup => buf::obj_dup(o: NvSciBufObj, out: *mut NvSciBufObj);
    ret NvSciBufObjDupWithReducePerm => buf::obj_dup_with_reduce_perm(o: NvSciBufObj, p: NvSciBufAttrValAccessPerm, out: *mut NvSciBufObj);
    void NvSciBufObjFree => buf::obj_free(o: NvSciBufObj);
    ret NvSciBufObjGetAttrList => buf::obj_get_attr_list(o: NvSciBufObj, out: *mut NvSciBufAttrList);
    ret NvSciBufObjGetCpuPtr => buf::obj_get_cpu_ptr(o: NvSciBufObj, out: *mut *mut c_void);
    ret NvSciBufObjGetConstCpuPtr => buf::obj_get_const_cpu_ptr(o: NvSciBufObj, out: *mut *const c_void);
    ret NvSciBufObjFlushCpuCacheRange => buf::obj_flush_cpu_cache_range(o: NvSciBufObj, off: u64, len: u64);
    ret NvSciBufObjIpcExport => ipc::buf_obj_export(o: NvSciBufObj, p: NvSciBufAttrValAccessPerm, ep: NvSciIpcEndpoint, d: *mut NvSciBufObjIpcExportDescriptor);
    ret NvSciBufObjIpcImport => ipc::buf_obj_import(ep: NvSciIpcEndpoint, d: *const NvSciBufObjIpcExportDescriptor, l: NvSciBufAttrList, p: NvSciBufAttrValAccessPerm, t: i64, out: *mut NvSciBufObj);
    ret NvSciBufAttrListIpcExportUnreconciled => ipc::attr_list_export_unreconciled(ls: *const NvSciBufAttrList, n: usize, ep: NvSciIpcEndpoint, d: *mut *mut c_void, len: *mut usize);
    ret NvSciBufAttrListIpcExportReconciled => ipc::attr_list_export_reconciled(l: NvSciBufAttrList, ep: NvSciIpcEndpoint, d: *mut *mut c_void, len: *mut usize);
    ret NvSciBufAttrListIpcImportUnreconciled => ipc::attr_list_import_unreconciled(m: NvSciBufModule, ep: NvSciIpcEndpoint, d: *const c_void, len: usize, out: *mut NvSciBufAttrList);
    ret NvSciBufAttrListIpcImportReconciled => ipc::attr_list_import_reconciled(m: NvSciBufModule, ep: NvSciIpcEndpoint, d: *const c_void, len: usize, ls: *const NvSciBufAttrList, n: usize, out: *mut NvSciBufAttrList);
    void NvSciBufAttrListFreeDesc => ipc::attr_list_free_desc(d: *mut c_void);
    ret NvSciBufCheckVersionCompatibility => buf::check_version(major: u32, minor: u32, out: *mut bool);
}

nvsci_api! { NvSciSyncApi, sync_api, SYNC_TABLES, sync_by_slot, sync_tramp;
    ret NvSciSyncModuleOpen => sync::module_open(out: *mut NvSciSyncModule);
    void NvSciSyncModuleClose => sync::module_close(m: NvSciSyncModule);
    ret NvSciSyncCpuWaitContextAlloc => sync::cpu_wait_context_alloc(m: NvSciSyncModule, out: *mut NvSciSyncCpuWaitContext);
    void NvSciSyncCpuWaitContextFree => sync::cpu_wait_context_free(w: NvSciSyncCpuWaitContext);
    ret NvSciSyncAttrListCreate => sync::attr_list_create(m: NvSciSyncModule, out: *mut NvSciSyncAttrList);
    void NvSciSyncAttrListFree => sync::attr_list_free(l: NvSciSyncAttrList);
    ret NvSciSyncAttrListSetAttrs => sync::attr_list_set_attrs(l: NvSciSyncAttrList, p: *const NvSciSyncAttrKeyValuePair, n: usize);
    ret NvSciSyncAttrListGetAttrs => sync::attr_list_get_attrs(l: NvSciSyncAttrList, p: *mut NvSciSyncAttrKeyValuePair, n: usize);
    ret NvSciSyncAttrListReconcile => sync::attr_list_reconcile(ls: *const NvSciSyncAttrList, n: usize, out: *mut NvSciSyncAttrList, conflict: *mut NvSciSyncAttrList);
    ret NvSciSyncAttrListReconcileAndObjAlloc => sync::attr_list_reconcile_and_obj_alloc(ls: *const NvSciSyncAttrList, n: usize, obj: *mut NvSciSyncObj, conflict: *mut NvSciSyncAttrList);
    ret NvSciSyncObjAlloc => sync::obj_alloc(l: NvSciSyncAttrList, obj: *mut NvSciSyncObj);
    ret NvSciSyncObjDup => sync::obj_dup(o: NvSciSyncObj, out: *mut NvSciSyncObj);
    void NvSciSyncObjFree => sync::obj_free(o: NvSciSyncObj);
    ret NvSciSyncObjGetAttrList => sync::obj_get_attr_list(o: NvSciSyncObj, out: *mut NvSciSyncAttrList);
    ret NvSciSyncObjIpcExport => ipc::sync_obj_export(o: NvSciSyncObj, p: NvSciSyncAccessPerm, ep: NvSciIpcEndpoint, d: *mut NvSciSyncObjIpcExportDescriptor);
    ret NvSciSyncObjIpcImport => ipc::sync_obj_import(ep: NvSciIpcEndpoint, d: *const NvSciSyncObjIpcExportDescriptor, l: NvSciSyncAttrList, p: NvSciSyncAccessPerm, t: i64, out: *mut NvSciSyncObj);
    ret NvSciSyncIpcExportFence => ipc::export_fence(f: *const NvSciSyncFence, ep: NvSciIpcEndpoint, d: *mut NvSciSyncFenceIpcExportDescriptor);
    ret NvSciSyncIpcImportFence => ipc::import_fence(o: NvSciSyncObj, d: *const NvSciSyncFenceIpcExportDescriptor, f: *mut NvSciSyncFence);
    ret NvSciSyncObjGenerateFence => sync::obj_generate_fence(o: NvSciSyncObj, f: *mut NvSciSyncFence);
    ret NvSciSyncObjSignal => sync::obj_signal(o: NvSciSyncObj);
    ret NvSciSyncFenceWait => sync::fence_wait(f: *const NvSciSyncFence, w: NvSciSyncCpuWaitContext, t: i64);
    ret NvSciSyncFenceDup => sync::fence_dup(src: *const NvSciSyncFence, dst: *mut NvSciSyncFence);
    void NvSciSyncFenceClear => sync::fence_clear(f: *mut NvSciSyncFence);
    ret NvSciSyncFenceExtractFence => sync::fence_extract(f: *const NvSciSyncFence, id: *mut u64, v: *mut u64);
    ret NvSciSyncFenceUpdateFence => sync::fence_update(o: NvSciSyncObj, id: u64, v: u64, f: *mut NvSciSyncFence);
    ret NvSciSyncFenceGetTimestamp => sync::fence_get_timestamp(f: *const NvSciSyncFence, us: *mut u64);
    ret NvSciSyncCheckVersionCompatibility => sync::check_version(major: u32, minor: u32, out: *mut bool);
}

nvsci_api! { NvSciIpcApi, ipc_api, IPC_TABLES, ipc_by_slot, ipc_tramp;
    ret NvSciIpcInit => ipc::init();
    void NvSciIpcDeinit => ipc::deinit();
    ret NvSciIpcOpenEndpoint => ipc::open_endpoint(name: *const c_char, out: *mut NvSciIpcEndpoint);
    void NvSciIpcCloseEndpoint => ipc::close_endpoint(ep: NvSciIpcEndpoint);
}

/// The NvSciBuf part of the table for `slot`.
pub(crate) fn buf_table(slot: usize) -> NvSciBufApi {
    BUF_TABLES
        .get(slot)
        .map_or_else(NvSciBufApi::empty, |f| f())
}

/// The NvSciSync part of the table for `slot` as `release` has it:
/// `NvSciSyncFenceExtractFence` / `NvSciSyncFenceUpdateFence` are absent
/// (None) where that release lacks them.
pub(crate) fn sync_table(slot: usize, release: NvSciRelease) -> NvSciSyncApi {
    let mut t = SYNC_TABLES
        .get(slot)
        .map_or_else(NvSciSyncApi::empty, |f| f());
    if !release.has_fence_extract_update() {
        t.NvSciSyncFenceExtractFence = None;
        t.NvSciSyncFenceUpdateFence = None;
    }
    t
}

/// The NvSciIpc part of the table for `slot`.
pub(crate) fn ipc_table(slot: usize) -> NvSciIpcApi {
    IPC_TABLES
        .get(slot)
        .map_or_else(NvSciIpcApi::empty, |f| f())
}
