//! `Backend::real()` on whatever machine runs the tests.
//!
//! CI has no NVIDIA driver: there the real backend must report "CUDA driver
//! not found" as a typed error, not panic. On a machine with a driver the
//! same test checks that loading works (or fails with a typed driver error).
#![allow(clippy::unwrap_used)] // tests may unwrap

use tegra_interop_driver::{Backend, BackendKind, Error};

/// What the system loader says about libcuda.so.1, independently of us.
fn probe() -> Result<(), String> {
    // SAFETY: loading the system's CUDA driver library runs its
    // initialisers, which are meant to run in any process.
    unsafe { libloading::Library::new("libcuda.so.1") }
        .map(drop)
        .map_err(|e| e.to_string())
}

#[test]
fn real_backend_reports_a_missing_driver_as_a_typed_error() {
    match probe() {
        Err(loader_message) => {
            let err = Backend::real().unwrap_err();
            assert_eq!(
                err,
                Error::DriverNotFound {
                    library: "libcuda.so.1",
                    message: loader_message.clone(),
                }
            );
            assert_eq!(
                err.to_string(),
                format!("CUDA driver not found (libcuda.so.1: {loader_message})")
            );
            // It is a std error and carries no driver code.
            let dyn_err: &dyn std::error::Error = &err;
            assert!(dyn_err.source().is_none());
            assert_eq!(err.code(), None);
        }
        Ok(()) => match Backend::real() {
            Ok(backend) => {
                assert_eq!(backend.kind(), BackendKind::Real);
                assert!(backend.table().cuda.cuInit.is_some());
            }
            Err(e) => assert!(
                matches!(e, Error::Driver { call: "cuInit", .. }),
                "unexpected error from Backend::real(): {e}"
            ),
        },
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver"]
fn real_backend_loads_and_queries_device_0() {
    let backend = Backend::real().unwrap();
    assert!(backend.device_count().unwrap() >= 1);
    assert!(backend.driver_version().unwrap() >= 11020);
    let device = backend.device(0).unwrap();
    assert!(!device.name().unwrap().is_empty());
    assert_ne!(device.uuid().unwrap(), [0; 16]);
    // Present on every driver new enough for external semaphores.
    assert!(backend.table().cuda.cuImportExternalSemaphore.is_some());
    // Both answers are fine; the query must not fail.
    device.supports_timeline_semaphore_interop().unwrap();
    device.is_integrated().unwrap();
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver"]
fn real_contexts_and_streams() {
    use tegra_interop_driver::{Context, Stream};
    let backend = Backend::real().unwrap();

    // Through cudarc (the default for the real backend).
    let ctx = Context::new(backend.clone(), 0).unwrap();
    assert!(ctx.cudarc().is_some());
    assert!(ctx.is_primary());
    let stream = Stream::new(&ctx).unwrap();
    assert!(stream.is_idle().unwrap());
    stream.synchronize().unwrap();
    ctx.synchronize().unwrap();

    // A cudarc stream of this context is accepted, one of another is not.
    let cudarc_ctx = ctx.cudarc().unwrap().clone();
    let theirs = cudarc_ctx.new_stream().unwrap();
    let wrapped = Stream::from_cudarc(&ctx, theirs).unwrap();
    wrapped.synchronize().unwrap();

    // Through the table: a retained primary context and a created one.
    let primary = Context::primary(backend.clone(), 0).unwrap();
    assert_eq!(
        primary.as_raw(),
        ctx.as_raw(),
        "one primary context per device"
    );
    let created = Context::create(backend.clone(), 0, 0).unwrap();
    assert_ne!(created.as_raw(), ctx.as_raw());
    let own = Stream::new(&created).unwrap();
    own.synchronize().unwrap();
    let foreign = cudarc_ctx.new_stream().unwrap();
    assert!(matches!(
        Stream::from_cudarc(&created, foreign),
        Err(Error::Unsupported { .. }) | Err(Error::ForeignStream { .. })
    ));

    drop(wrapped);
    own.destroy().unwrap();
    stream.destroy().unwrap();
    created.destroy().unwrap();
    primary.destroy().unwrap();
    ctx.destroy().unwrap();
    assert_eq!(backend.take_drop_errors(), vec![]);
}
