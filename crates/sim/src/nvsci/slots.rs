//! How an NvSci call reaches its simulator: the generated trampolines
//! ([`crate::trampolines`]) call [`run_ret`] / [`run_void`] with their slot.
//!
//! Every entry point is counted, logged and subject to failure injection
//! through the simulator's `Instance::enter` (an injected code is returned
//! as the `NvSciError` of the same number; after `Sim::shutdown` every call
//! answers `NvSciError_NotInitialized`). Entry points without a return
//! value (`*Free`, `*Close`, `FenceClear`, `NvSciIpcDeinit`) cannot fail:
//! an injected failure aimed at one of them is consumed and ignored.
//! Panics are caught (`NvSciError_Unknown` plus an `Internal` diagnostic).

#![deny(unsafe_code)]

use std::io::Write as _;
use std::panic::AssertUnwindSafe;

use tegra_interop_sys::nvsci::NvSciError;
use tegra_interop_sys::table::{NvSciBufApi, NvSciIpcApi, NvSciSyncApi};

use super::{entry_code, err, NvSciRelease};
use crate::instance::Call;
use crate::DiagnosticKind;

/// Serves one NvSci call with a result for the simulator in `slot`.
pub(crate) fn run_ret(
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

/// Serves one NvSci call without a result (an injected failure is consumed).
pub(crate) fn run_void(slot: usize, symbol: &'static str, f: &mut dyn FnMut(&Call<'_>)) {
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

/// The NvSciBuf part of the table for `slot`.
pub(crate) fn buf_table(slot: usize) -> NvSciBufApi {
    crate::trampolines::nvscibuf_table(slot)
}

/// The NvSciSync part of the table for `slot` as `release` has it:
/// `NvSciSyncFenceExtractFence` / `NvSciSyncFenceUpdateFence` are absent
/// (None) where that release lacks them.
pub(crate) fn sync_table(slot: usize, release: NvSciRelease) -> NvSciSyncApi {
    let mut t = crate::trampolines::nvscisync_table(slot);
    if !release.has_fence_extract_update() {
        t.NvSciSyncFenceExtractFence = None;
        t.NvSciSyncFenceUpdateFence = None;
    }
    t
}

/// The NvSciIpc part of the table for `slot` as `release` has it: the
/// `*Safe` calls and `NvSciIpcCheckVersionCompatibility` are absent (None)
/// where that release lacks them.
pub(crate) fn ipc_table(slot: usize, release: NvSciRelease) -> NvSciIpcApi {
    let mut t = crate::trampolines::nvsciipc_table(slot);
    if release.ipc_version().is_none() {
        t.NvSciIpcCheckVersionCompatibility = None;
    }
    if !release.has_ipc_safe_calls() {
        t.NvSciIpcCloseEndpointSafe = None;
        t.NvSciIpcResetEndpointSafe = None;
        t.NvSciIpcGetEventSafe = None;
        t.NvSciIpcReadSafe = None;
        t.NvSciIpcWriteSafe = None;
    }
    t
}
