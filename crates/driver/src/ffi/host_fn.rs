//! `cuLaunchHostFunc` with a Rust closure.
//!
//! # Safety
//!
//! The closure is boxed and leaked to the driver as the host function's
//! user pointer; [`run_host_fn`] reclaims it when the driver calls it,
//! which the table contract (`Backend::from_table`, point 5) says happens
//! exactly once after a successful launch and never after a failed one: so
//! the box is freed exactly once, by whichever side owns it.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::panic::AssertUnwindSafe;

use tegra_interop_sys::cuda::CUstream;

use super::{call, Bind};
use crate::{Context, Error};

/// What the driver calls: the boxed closure, moved out exactly once.
type HostFn = Box<dyn FnOnce() + Send + 'static>;

/// The C entry point the driver calls with the leaked `Box<HostFn>`.
unsafe extern "C" fn run_host_fn(user: *mut c_void) {
    // SAFETY: `user` is the `Box<HostFn>` leaked by `launch_host_fn`, and
    // the driver calls a host function exactly once.
    let f = unsafe { Box::from_raw(user.cast::<HostFn>()) };
    // Unwinding into the driver's thread is not allowed: a panicking
    // closure is stopped here (its panic message is printed by the hook).
    let _ = std::panic::catch_unwind(AssertUnwindSafe(f));
}

/// `cuLaunchHostFunc` with a Rust closure: the closure is boxed and leaked
/// to the driver, which calls [`run_host_fn`] once; if the launch fails the
/// box is reclaimed here and `f` dropped unrun.
pub(crate) fn launch_host_fn(
    ctx: &Context,
    stream: CUstream,
    f: Box<dyn FnOnce() + Send + 'static>,
) -> Result<(), Error> {
    let boxed: Box<HostFn> = Box::new(f);
    let user = Box::into_raw(boxed);
    // SAFETY: `user` is the leaked box `run_host_fn` reclaims; the driver calls it once after a
    // successful launch, never after a failed one (the table contract).
    let result =
        unsafe { call::cuLaunchHostFunc(Bind(ctx), stream, Some(run_host_fn), user.cast()) };
    if result.is_err() {
        // SAFETY: the launch failed (or was not made), so the driver will
        // never call `run_host_fn`: the box is still ours, reclaimed once.
        drop(unsafe { Box::from_raw(user) });
    }
    result
}
