//! Host functions in stream order (`cuLaunchHostFunc`).
//!
//! A host function is CPU code that the driver runs on one of its own
//! threads once all work queued on the stream before it has finished; work
//! queued after it waits until it returns. It is how a pipeline without a
//! GPU kernel (the simulator, a CPU fallback) can still do its processing
//! asynchronously and in stream order, between a semaphore wait and a
//! semaphore signal.

use std::ffi::c_void;
use std::panic::AssertUnwindSafe;

use crate::context::Stream;
use crate::{check, entry, Error};

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

impl Stream<'_> {
    /// Queues `f` on this stream (`cuLaunchHostFunc`): the driver calls it
    /// on one of its threads after all work queued before it, and holds
    /// back work queued after it until `f` returns.
    ///
    /// `f` must not call the CUDA API (the driver may refuse with
    /// `NOT_PERMITTED` or deadlock) and must not wait for work that is not
    /// queued before it on this stream. A panic in `f` is caught and
    /// dropped. If the stream's work is thrown away before `f` runs (for
    /// example a simulator torn down with work pending), `f` is leaked, not
    /// dropped.
    ///
    /// # Errors
    /// [`Error::NotSupported`] when the driver lacks `cuLaunchHostFunc`;
    /// [`Error::Driver`] when the call fails (then `f` is dropped unrun).
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use tegra_interop_driver::{Context, Stream};
    /// use tegra_interop_sim::Sim;
    ///
    /// let sim = Sim::new()?;
    /// let ctx = Context::new(sim.backend(), 0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let (tx, rx) = mpsc::channel();
    /// stream.launch_host_fn(move || tx.send(42).unwrap())?;
    /// stream.synchronize()?;
    /// assert_eq!(rx.try_recv()?, 42);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn launch_host_fn<F>(&self, f: F) -> Result<(), Error>
    where
        F: FnOnce() + Send + 'static,
    {
        let ctx = self.context();
        ctx.bind()?;
        let launch = entry!(ctx.api(), cuLaunchHostFunc);
        let boxed: Box<HostFn> = Box::new(Box::new(f));
        let user = Box::into_raw(boxed);
        // SAFETY: the stream is live in the current context; `run_host_fn`
        // matches the `CUhostFn` signature and takes ownership of `user`,
        // which stays valid until it is called.
        let result = check("cuLaunchHostFunc", unsafe {
            launch(self.as_raw(), Some(run_host_fn), user.cast())
        });
        if result.is_err() {
            // SAFETY: the launch failed, so the driver will never call
            // `run_host_fn`: the box is still ours, reclaimed once.
            drop(unsafe { Box::from_raw(user) });
        }
        result
    }
}
