//! `--role consumer`: one consumer process of `--consumer-processes`
//! ([`super::fd_multicast`]), started by the producer with its end of a
//! Unix socket pair on stdin. It runs
//! [`crate::multicast::process::serve`]: imports the slots' memory and
//! fences it is sent (checked against its own options and `fstat` first),
//! verifies every frame it is given with the check-and-invert kernel on its
//! own device copy (the simulator's Rust twin with `--backend sim-fd`, the
//! real driver's NVRTC kernel with `--backend gpu`), answers each frame and
//! ends with its figures (the frames it verified, the fds it still had
//! open beyond those it started with). It prints nothing on stdout.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use tegra_interop::driver::{Backend, Context};

use super::error::ProcessError;
use super::Settings;
use crate::app::cli::{BackendChoice, Options};
use crate::consumer::CheckInvert;
use crate::multicast::process::{serve, Expect};
use crate::transport::fdpass::{Channel, Limits};

/// This process's CUDA: the simulator (with the kernels' twins) for
/// `sim-fd`, the real driver for `gpu`. The simulator is kept alive with
/// the backend.
fn cuda(backend: BackendChoice) -> Result<(Arc<Backend>, Option<crate::sim::Sim>), ProcessError> {
    if backend == BackendChoice::SimFd {
        let sim = crate::sim::Sim::new()
            .map_err(|e| ProcessError::Options(format!("the simulator: {e}")))?;
        crate::consumer::twin::register(&sim);
        return Ok((sim.backend(), Some(sim)));
    }
    let real = Backend::real().map_err(|source| ProcessError::Driver {
        what: "the CUDA driver",
        source,
    })?;
    Ok((real, None))
}

/// Runs the consumer process over the socket on stdin.
///
/// # Errors
/// The producer's typed errors (it ended, it broke the protocol, a hello
/// that differs from these options), CUDA's errors.
pub(super) fn run(opts: &Options) -> Result<(), ProcessError> {
    let settings = Settings::new(opts);
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| ProcessError::Io {
            what: "duplicating stdin (the socket of --role consumer)",
            source,
        })?;
    let ch = Channel::new(UnixStream::from(fd), Limits::new(settings.limit)).map_err(|e| {
        ProcessError::Options(format!(
            "--role consumer takes its connected Unix socket on stdin: {e}"
        ))
    })?;
    let (backend, _sim) = cuda(settings.backend)?;
    let ctx = Context::new(backend, 0).map_err(|source| ProcessError::Driver {
        what: "a CUDA context",
        source,
    })?;
    let expect = Expect {
        slots: settings.ring,
        geometry: settings.geometry,
    };
    serve(&ctx, ch, &expect, CheckInvert::boxed())
        .map_err(|e| ProcessError::Consumer(format!("consumer process: {e}")))?;
    Ok(())
}
