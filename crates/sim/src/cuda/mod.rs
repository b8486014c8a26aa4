//! The CUDA entry points, as functions of one simulator, split by topic.
//!
//! Each function here gets the [`Call`] being served (simulator, call index,
//! symbol) plus the C arguments, and returns the `CUresult`. Each body carries
//! the C name of its entry point: the generated trampolines (`crate::trampolines`)
//! find it by that name in this module. Codes follow what the real driver
//! answered in the project's measurements (an H200 and an H100, listed with
//! their dates in the crate README) or, where not measured, the header
//! documentation; where the real driver would crash,
//! the simulator returns an error and records a diagnostic instead (the
//! choices are listed in the crate README).

#![allow(non_snake_case)]

mod context;
mod copy3d;
mod device;
mod dmabuf;
pub(crate) mod egl;
pub(crate) mod egl_stream;
mod events;
mod external_memory;
mod host;
mod memory;
mod modules;
mod semaphores;
mod streams;

pub(crate) use self::context::*;
pub(crate) use self::copy3d::*;
pub(crate) use self::device::*;
pub(crate) use self::dmabuf::*;
pub(crate) use self::egl::*;
pub(crate) use self::egl_stream::*;
pub(crate) use self::events::*;
pub(crate) use self::external_memory::*;
pub(crate) use self::host::*;
pub(crate) use self::memory::*;
pub(crate) use self::modules::*;
pub(crate) use self::semaphores::*;
pub(crate) use self::streams::*;

#[allow(unused_imports)]
use core::ffi::CStr;
use core::ffi::{c_char, c_int, c_uint, c_void};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tegra_interop_sys::cuda::*;
use tegra_interop_sys::nvsci::NvSciSyncFence;

use crate::cmem::{CArr, CIn, CMut, CPtr, Handle, HostCallback, Plain};
use crate::codes::{self, *};
use crate::fds::{checked_close, file_id, with_handed, FileId, Site, TrackedFd};
use crate::fence::{self, FenceContent, SimFence};
use crate::instance::*;
use crate::shm::{self, FdInfo, Region, SemaphoreKind, SharedSemaphore, WaitEnd};
use crate::stream::{StreamCore, Worker};
use crate::DiagnosticKind as D;

type R<T = ()> = Result<T, CUresult>;

pub(super) fn done(r: R) -> CUresult {
    match r {
        Ok(()) => SUCCESS,
        Err(e) => e,
    }
}

/// Writes `v` to a caller out-pointer, refusing NULL.
pub(super) fn put<T: Plain>(p: CMut<T>, v: T) -> R {
    p.write(v).then_some(()).ok_or(INVALID_VALUE)
}

/// Reads a caller in-pointer, refusing NULL.
pub(super) fn get<T: Plain>(p: CPtr<T>) -> R<T> {
    p.read().ok_or(INVALID_VALUE)
}

pub(super) fn init(st: &State) -> R {
    if st.initialized {
        Ok(())
    } else {
        Err(NOT_INITIALIZED)
    }
}

pub(super) fn device(c: &Call, dev: CUdevice) -> R<usize> {
    usize::try_from(dev)
        .ok()
        .filter(|d| *d < c.inst.config.devices)
        .ok_or(INVALID_DEVICE)
}

/// The current context of this thread, which must be live.
pub(super) fn current_ctx(c: &Call, st: &State) -> R<u64> {
    let cur = c.inst.current();
    if cur == 0 {
        return Err(INVALID_CONTEXT);
    }
    if st.contexts.contains_key(&cur) {
        return Ok(cur);
    }
    if st.gone.contains_key(&cur) {
        c.diag(
            D::UseAfterContextLoss,
            format!("the current context {cur:#x} was destroyed; call cuCtxSetCurrent with a live context"),
        );
        return Err(CONTEXT_IS_DESTROYED);
    }
    // An inactive primary context (never retained, or released to zero).
    Err(INVALID_CONTEXT)
}

/// Reports a handle that is not live and returns the code to give back.
pub(super) fn not_live(
    c: &Call,
    st: &State,
    what: &str,
    h: u64,
    destroying: bool,
    code: CUresult,
) -> CUresult {
    match st.gone.get(&h) {
        Some(GoneWhy::Destroyed) if destroying => {
            c.diag(
                D::DoubleDestroy,
                format!("{what} {h:#x} destroyed twice (the real driver crashes here)"),
            );
            code
        }
        Some(GoneWhy::Destroyed) => {
            c.diag(
                D::UseAfterDestroy,
                format!("{what} {h:#x} used after it was destroyed"),
            );
            code
        }
        Some(why) => {
            let crash = if destroying {
                " (the real driver crashes here)"
            } else {
                ""
            };
            c.diag(
                D::UseAfterContextLoss,
                format!("{what} {h:#x} used, but {}{crash}", why.describe()),
            );
            if destroying {
                CONTEXT_IS_DESTROYED
            } else {
                code
            }
        }
        None => {
            c.diag(
                D::UnknownHandle,
                format!("{what} handle {h:#x} is unknown to this simulator (foreign, corrupt or never created)"),
            );
            code
        }
    }
}

// ---------------------------------------------------------------- errors

/// `cuGetErrorName`'s lookup (not counted, shared by all slots).
pub(crate) fn error_name(code: CUresult, out: CMut<*const c_char>) -> CUresult {
    let n = codes::name(code.0);
    let r = put(out, n.map_or(core::ptr::null(), |s| s.as_ptr()));
    match (r, n) {
        (Err(e), _) => e,
        (Ok(()), None) => INVALID_VALUE,
        (Ok(()), Some(_)) => SUCCESS,
    }
}

/// `cuGetErrorString`'s lookup (not counted, shared by all slots).
pub(crate) fn error_string(code: CUresult, out: CMut<*const c_char>) -> CUresult {
    let n = codes::description(code.0);
    let r = put(out, n.map_or(core::ptr::null(), |s| s.as_ptr()));
    match (r, n) {
        (Err(e), _) => e,
        (Ok(()), None) => INVALID_VALUE,
        (Ok(()), Some(_)) => SUCCESS,
    }
}

/// How long stream synchronisation waits before it reports a hang.
pub(crate) const DEFAULT_HANG_TIMEOUT: Duration = Duration::from_secs(30);
