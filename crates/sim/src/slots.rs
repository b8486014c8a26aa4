//! Instance slots: how C functions without a handle argument find their
//! simulator.
//!
//! A C function pointer cannot carry state, so every entry point exists once
//! per slot as a const-generic `extern "C"` trampoline (generated in
//! [`crate::trampolines`]: `cuInit::<3>` serves the simulator in slot 3). [`crate::Sim::new`] claims a free slot and
//! [`crate::Sim::table`] hands out the trampolines of that slot; dropping the
//! `Sim` frees the slot. Slots are handed out round-robin, so a freed slot is
//! reused as late as possible; a call through a table whose `Sim` is gone
//! (and whose slot is still free) returns `CUDA_ERROR_DEINITIALIZED`.
//!
//! Every trampoline catches panics, so nothing unwinds into C.

#![deny(unsafe_code)]

use std::io::Write as _;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use tegra_interop_sys::cuda::*;
use tegra_interop_sys::table::CudaApi;

use crate::codes::{DEINITIALIZED, UNKNOWN};
use crate::instance::{Call, Instance};
use crate::DiagnosticKind;

/// How many simulators can be alive at once.
pub const SLOTS: usize = 64;

static REGISTRY: [RwLock<Option<Arc<Instance>>>; SLOTS] = [const { RwLock::new(None) }; SLOTS];
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Puts `inst` into a free slot.
pub(crate) fn claim(inst: &Arc<Instance>) -> Option<usize> {
    let start = NEXT.load(Ordering::Relaxed);
    for i in 0..SLOTS {
        let idx = (start + i) % SLOTS;
        let mut w = REGISTRY[idx].write().unwrap_or_else(|e| e.into_inner());
        if w.is_none() {
            *w = Some(Arc::clone(inst));
            NEXT.store(idx + 1, Ordering::Relaxed);
            return Some(idx);
        }
    }
    None
}

/// Frees a slot.
pub(crate) fn release(slot: usize) {
    if let Some(s) = REGISTRY.get(slot) {
        *s.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

pub(crate) fn get(slot: usize) -> Option<Arc<Instance>> {
    REGISTRY
        .get(slot)?
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// The CUDA part of the table for `slot`: the generated trampolines plus
/// the shared, uncounted lookups.
pub(crate) fn cuda_table(slot: usize) -> CudaApi {
    CudaApi {
        cuGetErrorName: Some(crate::trampolines::cu_get_error_name),
        cuGetErrorString: Some(crate::trampolines::cu_get_error_string),
        ..crate::trampolines::cuda_table(slot)
    }
}

/// Serves one CUDA call for the simulator in `slot` (the generated
/// trampolines call it): counts, logs, injects failures, catches panics.
pub(crate) fn dispatch(
    slot: usize,
    symbol: &'static str,
    f: &mut dyn FnMut(&Call<'_>) -> CUresult,
) -> CUresult {
    let Some(inst) = get(slot) else {
        let _ = writeln!(
            std::io::stderr(),
            "tegra-interop-sim: {symbol} called through the table of a simulator that was dropped"
        );
        return DEINITIALIZED;
    };
    let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let index = match inst.enter(symbol) {
            Ok(i) => i,
            Err(code) => return code,
        };
        f(&Call {
            inst: &inst,
            index: Some(index),
            symbol,
        })
    }));
    match run {
        Ok(code) => code,
        Err(_) => {
            let inner = std::panic::catch_unwind(AssertUnwindSafe(|| {
                inst.diag(
                    None,
                    symbol,
                    DiagnosticKind::Internal,
                    "the simulator panicked (bug in the simulator)".into(),
                );
            }));
            drop(inner);
            UNKNOWN
        }
    }
}
