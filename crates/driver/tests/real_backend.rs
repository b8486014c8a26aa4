//! `Backend::real()` on whatever machine runs the tests.
//!
//! CI has no NVIDIA driver: there the real backend must report "CUDA driver
//! not found" as a typed error, not panic. On a machine with a driver the
//! same test checks that loading works (or fails with a typed driver error).
#![allow(clippy::unwrap_used)] // tests may unwrap

use tegra_interop_driver::{Backend, BackendKind, Error};

/// What the system loader says about libcuda.so.1, independently of us:
/// `dlerror()`'s text, which libloading keeps in its error's source.
fn probe() -> Result<(), String> {
    // SAFETY: loading the system's CUDA driver library runs its
    // initialisers, which are meant to run in any process.
    unsafe { libloading::Library::new("libcuda.so.1") }
        .map(drop)
        .map_err(|e| {
            let source = std::error::Error::source(&e).map(ToString::to_string);
            source.unwrap_or_else(|| e.to_string())
        })
}

#[test]
fn real_backend_reports_a_missing_driver_as_a_typed_error() {
    match probe() {
        Err(dlerror) => {
            let err = Backend::real().unwrap_err();
            // The loader's reason, without the soname it starts with (the
            // message names the library once).
            let reason = dlerror
                .strip_prefix("libcuda.so.1: ")
                .unwrap_or(&dlerror)
                .to_string();
            assert_eq!(
                err,
                Error::DriverNotFound {
                    library: "libcuda.so.1",
                    message: reason.clone(),
                }
            );
            let shown = err.to_string();
            assert_eq!(
                shown,
                format!("CUDA driver not found (libcuda.so.1: {reason})")
            );
            // glibc's words for a library that is not there; never
            // libloading's bare "dlopen failed".
            assert!(!shown.contains("dlopen failed"), "{shown}");
            // Where glibc's loader simply finds no such file (CI), the
            // whole line is known.
            if cfg!(target_env = "gnu") && dlerror.ends_with("No such file or directory") {
                assert_eq!(
                    shown,
                    "CUDA driver not found (libcuda.so.1: cannot open shared object file: \
                     No such file or directory)"
                );
            }
            // It is a std error and carries no driver code.
            let dyn_err: &dyn std::error::Error = &err;
            assert!(dyn_err.source().is_none());
            assert_eq!(err.code(), None);
        }
        Ok(()) => match Backend::real() {
            Ok(backend) => {
                assert_eq!(backend.kind(), BackendKind::Real);
                assert!(backend.table().cuda.cuInit.is_some());
                // The loader's notes: one per library (CUDA, the three NvSci
                // libraries, NVRTC), libcuda loaded.
                let notes = backend.loader_notes();
                assert_eq!(notes.len(), 5, "{notes:?}");
                assert_eq!(notes[0].library, "libcuda.so.1");
                assert_eq!(notes[0].load_error, None);
                assert!(notes[4].library.contains("libnvrtc"), "{notes:?}");
            }
            Err(e) => assert!(
                matches!(e, Error::Driver { call: "cuInit", .. }),
                "unexpected error from Backend::real(): {e}"
            ),
        },
    }
}

/// A library that loads but lacks a symbol, and one that does not load:
/// the table keeps the loader's reasons and the `NotSupported` error shows
/// them. Uses the C library (present on every Linux) as the "library".
#[test]
fn missing_symbols_and_libraries_keep_the_loaders_reason() {
    use tegra_interop_driver::table::{CudaApi, NvSciSyncApi, Resolve as _};
    use tegra_interop_driver::{Context, FunctionTable};

    // SAFETY: the C library is already loaded in this process; opening it
    // again runs no initialiser.
    let libc = unsafe { libloading::Library::new("libc.so.6") }.unwrap();
    // SAFETY: no entry is ever called: libc exports none of these names
    // (checked below), so every entry stays `None`.
    let cuda = unsafe { CudaApi::resolve(&libc) };
    assert_eq!(cuda.present().count(), 0);
    let notes = cuda.loader.unwrap();
    assert_eq!(notes.library, "libcuda.so.1");
    assert_eq!(notes.load_error, None);
    assert_eq!(notes.missing.len(), cuda.missing().count());
    let reason = cuda.missing_reason("cuDeviceGet").unwrap();
    // dlsym's message: the file searched and the symbol.
    assert!(reason.contains("undefined symbol: cuDeviceGet"), "{reason}");
    assert!(reason.contains("libc.so.6"), "{reason}");

    // SAFETY: every entry is `None` (checked above for CUDA; the NvSciSync
    // part did not load), so nothing is ever called.
    let backend = unsafe {
        Backend::from_table(
            "libc",
            FunctionTable {
                cuda,
                nvscisync: NvSciSyncApi::not_loaded(
                    "libnvscisync.so.1: cannot open shared object file: No such file or directory"
                        .into(),
                ),
                ..FunctionTable::empty()
            },
        )
    };
    let err = Context::primary(backend.clone(), 0).unwrap_err();
    let shown = err.to_string();
    assert!(
        matches!(err, Error::NotSupported { symbol: "cuDeviceGet", library: "libcuda.so.1", reason: Some(r) } if r.contains("undefined symbol: cuDeviceGet")),
        "{shown}"
    );
    assert!(shown.contains("searched libcuda.so.1"), "{shown}");
    assert!(shown.contains("undefined symbol: cuDeviceGet"), "{shown}");
    assert_eq!(backend.loader_notes().len(), 2);

    // Loading the same library again reuses the kept notes.
    // SAFETY: as above.
    let again = unsafe { CudaApi::resolve(&libc) };
    assert!(std::ptr::eq(again.loader.unwrap(), notes));

    // A library that did not load: every entry's error carries the reason.
    let err = tegra_interop_driver::nvsci::SyncModule::open(&backend).unwrap_err();
    let shown = err.to_string();
    assert!(
        shown.contains("libnvscisync.so.1") && shown.contains("cannot open shared object file"),
        "{shown}"
    );
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

#[cfg(feature = "cudarc")]
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
