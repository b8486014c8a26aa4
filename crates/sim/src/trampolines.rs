//! The `extern "C"` entry points of the simulator, generated from the lists
//! of `tegra-interop-sys` (`cuda_entry_points!` and the NvSci ones): nothing
//! here names an entry point by hand except the few the simulator does not
//! provide (the `*_not_provided!` filters below).
//!
//! A C function pointer cannot carry state, so every entry point exists once
//! per slot as a const-generic trampoline (`cuda::cuInit::<3>` serves the
//! simulator in slot 3). Each forwards to a non-generic function taking the
//! slot (`by_slot`), which finds the simulator, counts and logs the call,
//! applies failure injection, catches panics and calls the body: the
//! function of the same C name in [`crate::cuda`] (CUDA) or
//! `crate::nvsci::bodies` (NvSci), through `crate::abi` where arguments pair
//! up (an array and its length).
//!
//! Each C argument reaches the body converted by [`FromC`]: integers and
//! enums unchanged, pointers as the `crate::cmem` wrappers (`CMut`, `CPtr`),
//! which the bodies use through safe methods. The bodies are safe `fn`s.
//!
//! # Safety
//! This module defines the `unsafe extern "C" fn`s: each has the C contract
//! of the entry point of the same name (the caller owes it), and wraps its
//! arguments with `FromC::into_body`, whose promise is exactly that contract
//! for the duration of the call.

#![allow(unsafe_code)]

use core::ffi::c_char;

use tegra_interop_sys::cuda::CUresult;
use tegra_interop_sys::table::{CudaApi, NvSciBufApi, NvSciIpcApi, NvSciSyncApi, NvrtcApi};

use crate::cmem::FromC;
use crate::instance::Call;
use crate::slots::SLOTS;

/// `[f::<0>, ..., f::<63>]`: one function per slot.
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

/// One entry point's non-generic half: finds the slot's simulator through
/// `run_ret` / `run_void` (in scope where this expands) and calls `bodies::$field`.
/// `wrap`: the arguments reach the (safe) body converted by `FromC`.
macro_rules! by_slot {
    (wrap ret $field:ident ($($a:ident: $t:ty),*) -> $r:ty) => {
        /// # Safety
        /// The C contract of the entry point of the same name.
        pub(super) unsafe fn $field(slot: usize, $($a: $t),*) -> $r {
            run_ret(slot, stringify!($field), &mut |c: &Call<'_>| {
                // SAFETY: the arguments come straight from the C caller, who
                // owes the entry point's C contract for this call.
                bodies::$field(c, $(unsafe { FromC::into_body($a) }),*)
            })
        }
    };
    (wrap void $field:ident ($($a:ident: $t:ty),*) -> $r:ty) => {
        /// # Safety
        /// The C contract of the entry point of the same name.
        pub(super) unsafe fn $field(slot: usize, $($a: $t),*) {
            run_void(slot, stringify!($field), &mut |c: &Call<'_>| {
                // SAFETY: as for the entry points with a result.
                bodies::$field(c, $(unsafe { FromC::into_body($a) }),*)
            })
        }
    };
}

/// One entry point's `extern "C"` half, generic over the slot.
macro_rules! trampoline {
    ($kind:ident $field:ident ($($a:ident: $t:ty),*) -> $r:ty) => {
        /// # Safety
        /// The C contract of the entry point of the same name.
        pub(crate) unsafe extern "C" fn $field<const S: usize>($($a: $t),*) -> $r {
            // SAFETY: same contract, forwarded unchanged.
            unsafe { by_slot::$field(S, $($a),*) }
        }
    };
}

/// The callback of the generated lists: trampolines for every entry point
/// the filter lets through, the table of one slot, and the 64 tables.
macro_rules! trampolines_of {
    (
        [$filter:ident $mode:ident] $api:ident $library:literal
        $( $field:ident { symbol: $sym:expr, pfn: $pfn:ty, $kind:ident: $safety:ident fn($($a:ident: $t:ty),*) -> $r:ty } )*
    ) => {
        mod by_slot {
            use super::*;
            $( $filter! { $field => by_slot! { $mode $kind $field ($($a: $t),*) -> $r } } )*
        }
        $( $filter! { $field => trampoline! { $kind $field ($($a: $t),*) -> $r } } )*

        /// The table of slot `S`: every entry point the simulator provides.
        fn table<const S: usize>() -> $api {
            let mut table = $api::empty();
            $( $filter! { $field => { table.$field = Some($field::<S>); } } )*
            table
        }

        /// The tables of all slots.
        pub(crate) static TABLES: [fn() -> $api; SLOTS] = slot_array!(table);
    };
}

/// CUDA entry points without a per-slot trampoline: the pure lookups, served
/// by one shared function (`crate::slots`), not counted.
/// EGL syncs (`cuEventCreateFromEGLSync`) are not simulated yet (issue 14):
/// that table entry stays `None`, as with a driver built without it, and the
/// driver answers `NotSupported` naming the symbol. (EGL images and
/// EGLStreams are simulated.)
macro_rules! cuda_not_provided {
    (cuGetErrorName => $($x:tt)*) => {};
    (cuGetErrorString => $($x:tt)*) => {};
    (cuEventCreateFromEGLSync => $($x:tt)*) => {};
    ($field:ident => $($x:tt)*) => { $($x)* };
}

/// NvSci (buf, sync, ipc): the simulator provides every declared entry point.
macro_rules! all_provided {
    ($field:ident => $($x:tt)*) => { $($x)* };
}

/// CUDA.
#[allow(non_snake_case, unused_unsafe, clippy::too_many_arguments)]
pub(crate) mod cuda {
    use super::*;
    use crate::abi::cuda as bodies;
    use crate::slots::dispatch as run_ret;
    tegra_interop_sys::cuda_entry_points!(trampolines_of cuda_not_provided wrap);
}

/// NvSciBuf.
#[allow(non_snake_case, unused_unsafe, clippy::too_many_arguments)]
pub(crate) mod nvscibuf {
    use super::*;
    use crate::abi::nvsci as bodies;
    use crate::nvsci::{run_ret, run_void};
    tegra_interop_sys::nvscibuf_entry_points!(trampolines_of all_provided wrap);
}

/// NvSciSync.
#[allow(non_snake_case, unused_unsafe, clippy::too_many_arguments)]
pub(crate) mod nvscisync {
    use super::*;
    use crate::abi::nvsci as bodies;
    use crate::nvsci::{run_ret, run_void};
    tegra_interop_sys::nvscisync_entry_points!(trampolines_of all_provided wrap);
}

/// NvSciIpc.
#[allow(non_snake_case, unused_unsafe, clippy::too_many_arguments)]
pub(crate) mod nvsciipc {
    use super::*;
    use crate::abi::nvsci as bodies;
    use crate::nvsci::{run_ret, run_void};
    tegra_interop_sys::nvsciipc_entry_points!(trampolines_of all_provided wrap);
}

/// NVRTC.
#[allow(non_snake_case, unused_unsafe, clippy::too_many_arguments)]
pub(crate) mod nvrtc {
    use super::*;
    use crate::abi::nvrtc as bodies;
    use crate::nvrtc::run_ret;
    tegra_interop_sys::nvrtc_entry_points!(trampolines_of all_provided wrap);
}

/// The NVRTC part of the table for `slot`.
pub(crate) fn nvrtc_table(slot: usize) -> NvrtcApi {
    nvrtc::TABLES
        .get(slot)
        .map_or_else(NvrtcApi::empty, |f| f())
}

/// The CUDA part of the table for `slot` (without the shared lookups).
pub(crate) fn cuda_table(slot: usize) -> CudaApi {
    cuda::TABLES.get(slot).map_or_else(CudaApi::empty, |f| f())
}

/// Clears every entry of `table` whose symbol a driver reporting
/// `driver_version` does not export (introduced later, after
/// `tegra_interop_sys::versions`): the outcome a real older `libcuda.so.1`
/// gives the loader (no symbol, so the entry stays `None`). Returns the
/// cleared entries' names.
pub(crate) fn without_newer(table: &mut CudaApi, driver_version: i32) -> Vec<&'static str> {
    macro_rules! clear_newer {
        (
            [$t:ident $v:ident $gone:ident] $api:ident $library:literal
            $( $field:ident { $($rest:tt)* } )*
        ) => {
            $(
                if tegra_interop_sys::versions::since(stringify!($field)).is_some_and(|s| s > $v)
                    && $t.$field.take().is_some()
                {
                    $gone.push(stringify!($field));
                }
            )*
        };
    }
    let mut gone = Vec::new();
    tegra_interop_sys::cuda_entry_points!(clear_newer table driver_version gone);
    gone
}

/// The NvSciBuf part of the table for `slot`.
pub(crate) fn nvscibuf_table(slot: usize) -> NvSciBufApi {
    nvscibuf::TABLES
        .get(slot)
        .map_or_else(NvSciBufApi::empty, |f| f())
}

/// The NvSciSync part of the table for `slot`.
pub(crate) fn nvscisync_table(slot: usize) -> NvSciSyncApi {
    nvscisync::TABLES
        .get(slot)
        .map_or_else(NvSciSyncApi::empty, |f| f())
}

/// The NvSciIpc part of the table for `slot`.
pub(crate) fn nvsciipc_table(slot: usize) -> NvSciIpcApi {
    nvsciipc::TABLES
        .get(slot)
        .map_or_else(NvSciIpcApi::empty, |f| f())
}

/// `cuGetErrorName`: a pure lookup, shared by all slots and not counted.
pub(crate) unsafe extern "C" fn cu_get_error_name(
    code: CUresult,
    out: *mut *const c_char,
) -> CUresult {
    // SAFETY: the C contract of cuGetErrorName: `out` is NULL or writable.
    let out = unsafe { FromC::into_body(out) };
    // The lookup cannot panic, but the boundary is guarded anyway.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        crate::cuda::error_name(code, out)
    }))
    .unwrap_or(crate::codes::UNKNOWN)
}

/// `cuGetErrorString`: a pure lookup, shared by all slots and not counted.
pub(crate) unsafe extern "C" fn cu_get_error_string(
    code: CUresult,
    out: *mut *const c_char,
) -> CUresult {
    // SAFETY: as for `cu_get_error_name`.
    let out = unsafe { FromC::into_body(out) };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        crate::cuda::error_string(code, out)
    }))
    .unwrap_or(crate::codes::UNKNOWN)
}
