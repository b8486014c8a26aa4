//! The driver against tiny hand-made function tables: missing entries,
//! driver codes, DEINITIALIZED at teardown, fd ownership on failure.
//!
//! These need no simulator: each fake entry point returns a fixed answer.
//!
//! The fd table and the fd-audit counters are process-wide, so every test of
//! this binary holds one lock: a number one test's fake driver closes cannot
//! be reused by another test's open before the audit looks at it (CI once
//! saw exactly that under qemu, counted correctly as `reused`, which made the
//! test's expectation of `gone` fail).
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use tegra_interop_core::{CuResult, SignalParams, ValidationError};
use tegra_interop_driver::table::CudaApi;
use tegra_interop_driver::{
    Backend, Context, Error, ExternalMemory, ExternalSemaphore, FunctionTable, Stream,
};
use tegra_interop_sys::cuda::{
    CUcontext, CUdevice, CUexternalMemory, CUexternalSemaphore, CUresult, CUstream,
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC, CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC,
    CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS,
};

const OK: CUresult = CUresult(0);

static FD_TABLE: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    FD_TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

unsafe extern "C" fn device_get(out: *mut CUdevice, ordinal: i32) -> CUresult {
    // SAFETY: the driver code passes a valid out-pointer.
    unsafe { *out = ordinal };
    OK
}
unsafe extern "C" fn retain(out: *mut CUcontext, _dev: CUdevice) -> CUresult {
    // SAFETY: valid out-pointer; the fake context is a non-null dangling address never dereferenced.
    unsafe { *out = 0x1000 as CUcontext };
    OK
}
unsafe extern "C" fn ok_device(_dev: CUdevice) -> CUresult {
    OK
}
unsafe extern "C" fn set_current(_ctx: CUcontext) -> CUresult {
    OK
}
unsafe extern "C" fn stream_create(out: *mut CUstream, _flags: u32) -> CUresult {
    // SAFETY: valid out-pointer; the fake stream is never dereferenced.
    unsafe { *out = 0x2000 as CUstream };
    OK
}
unsafe extern "C" fn ok_stream(_s: CUstream) -> CUresult {
    OK
}
unsafe extern "C" fn import_sem(
    out: *mut CUexternalSemaphore,
    _desc: *const CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC,
) -> CUresult {
    // SAFETY: valid out-pointer; the fake handle is never dereferenced.
    unsafe { *out = 0x3000 as CUexternalSemaphore };
    OK
}
static DEINIT_DESTROYS: AtomicUsize = AtomicUsize::new(0);
unsafe extern "C" fn destroy_sem_deinitialized(_s: CUexternalSemaphore) -> CUresult {
    DEINIT_DESTROYS.fetch_add(1, Ordering::SeqCst);
    CUresult(4) // CUDA_ERROR_DEINITIALIZED
}
unsafe extern "C" fn release_deinitialized(_dev: CUdevice) -> CUresult {
    CUresult(4)
}
unsafe extern "C" fn import_mem_fails(
    _out: *mut CUexternalMemory,
    _desc: *const CUDA_EXTERNAL_MEMORY_HANDLE_DESC,
) -> CUresult {
    CUresult(999)
}
/// Like the real driver after a failed OPAQUE_FD memory import (measured on
/// the H200): closes the fd it was given, answers UNKNOWN.
unsafe extern "C" fn import_mem_fails_closing(
    _out: *mut CUexternalMemory,
    desc: *const CUDA_EXTERNAL_MEMORY_HANDLE_DESC,
) -> CUresult {
    // SAFETY: the driver passes a valid descriptor of an fd kind.
    let fd = unsafe { (*desc).handle.fd };
    // SAFETY: the fd was handed to this "driver"; closing it is what the
    // real driver does.
    unsafe { libc::close(fd) };
    CUresult(999)
}
static REUSED_NUMBER: AtomicI32 = AtomicI32::new(-1);
/// Closes the fd it was given and, at once, another file takes the number
/// (as another thread opening a file would).
unsafe extern "C" fn import_mem_fails_number_reused(
    _out: *mut CUexternalMemory,
    desc: *const CUDA_EXTERNAL_MEMORY_HANDLE_DESC,
) -> CUresult {
    // SAFETY: the driver passes a valid descriptor of an fd kind.
    let fd = unsafe { (*desc).handle.fd };
    let other = std::fs::File::open("/dev/zero").unwrap();
    // SAFETY: dup2 closes `fd` (handed to this "driver") and puts /dev/zero
    // on its number; the test closes that one itself.
    assert_eq!(unsafe { libc::dup2(other.as_raw_fd(), fd) }, fd);
    REUSED_NUMBER.store(fd, Ordering::SeqCst);
    CUresult(999)
}
unsafe extern "C" fn signal_fails(
    _sems: *const CUexternalSemaphore,
    _params: *const CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS,
    _n: u32,
    _stream: CUstream,
) -> CUresult {
    CUresult(1) // INVALID_VALUE
}
unsafe extern "C" fn destroy_sem_ok(_s: CUexternalSemaphore) -> CUresult {
    OK
}
unsafe extern "C" fn destroy_sem_fails(_s: CUexternalSemaphore) -> CUresult {
    CUresult(400)
}

fn base() -> CudaApi {
    let mut cuda = CudaApi::empty();
    cuda.cuDeviceGet = Some(device_get);
    cuda.cuDevicePrimaryCtxRetain = Some(retain);
    cuda.cuDevicePrimaryCtxRelease = Some(ok_device);
    cuda.cuCtxSetCurrent = Some(set_current);
    cuda.cuStreamCreate = Some(stream_create);
    cuda.cuStreamDestroy = Some(ok_stream);
    cuda.cuStreamSynchronize = Some(ok_stream);
    cuda.cuImportExternalSemaphore = Some(import_sem);
    cuda.cuDestroyExternalSemaphore = Some(destroy_sem_ok);
    cuda
}

fn backend(cuda: CudaApi) -> std::sync::Arc<Backend> {
    // SAFETY: the entries above have their PFN_ types' signatures, write
    // only the one value their out-pointer names, hand out made-up handles
    // they never dereference, and, on a failed import, at most close or
    // replace the fd they were handed (the failure modes the real driver is
    // allowed); they keep no state that threads could race on.
    unsafe {
        Backend::from_table(
            "handmade",
            FunctionTable {
                cuda,
                ..FunctionTable::empty()
            },
        )
    }
}

fn some_fd() -> OwnedFd {
    std::fs::File::open("/dev/null").unwrap().into()
}

#[test]
fn a_missing_entry_is_not_supported_naming_symbol_and_library() {
    let _g = serial();
    let backend = backend(CudaApi::empty());
    let err = Context::primary(backend.clone(), 0).unwrap_err();
    assert_eq!(err, Error::not_supported("cuDeviceGet", "libcuda.so.1"));
    assert!(err.to_string().contains("cuDeviceGet"));
    assert!(err.to_string().contains("libcuda.so.1"));
    assert_eq!(
        backend.driver_version().unwrap_err(),
        Error::not_supported("cuDriverGetVersion", "libcuda.so.1")
    );
    assert_eq!(backend.table().cuda.present().count(), 0);
}

#[test]
fn nvsci_entries_are_named_with_their_library() {
    let _g = serial();
    assert_eq!(
        tegra_interop_driver::table::library_of("NvSciSyncObjAlloc"),
        "libnvscisync.so.1"
    );
    assert_eq!(
        tegra_interop_driver::table::library_of("NvSciBufObjAlloc"),
        "libnvscibuf.so.1"
    );
}

#[test]
fn teardown_after_driver_shutdown_counts_as_already_gone() {
    let _g = serial();
    // Seed scenario error-driver-not-ready: the process is exiting, the
    // driver's exit handlers already ran, every destroy answers
    // DEINITIALIZED. Drop must neither panic nor record an error, and an
    // explicit destroy() reports success.
    let mut cuda = base();
    cuda.cuDestroyExternalSemaphore = Some(destroy_sem_deinitialized);
    cuda.cuDevicePrimaryCtxRelease = Some(release_deinitialized);
    let backend = backend(cuda);
    let before = DEINIT_DESTROYS.load(Ordering::SeqCst);
    {
        let ctx = Context::primary(backend.clone(), 0).unwrap();
        let a = ExternalSemaphore::binary_fd(&ctx, some_fd()).unwrap();
        let b = ExternalSemaphore::binary_fd(&ctx, some_fd()).unwrap();
        a.destroy().unwrap();
        drop(b);
    }
    assert_eq!(DEINIT_DESTROYS.load(Ordering::SeqCst) - before, 2);
    assert!(backend.take_drop_errors().is_empty());
}

#[test]
fn other_drop_failures_are_recorded_not_panicked() {
    let _g = serial();
    let mut cuda = base();
    cuda.cuDestroyExternalSemaphore = Some(destroy_sem_fails);
    let backend = backend(cuda);
    let ctx = Context::primary(backend.clone(), 0).unwrap();
    let sem = ExternalSemaphore::binary_fd(&ctx, some_fd()).unwrap();
    drop(sem);
    let errors = backend.take_drop_errors();
    assert_eq!(
        errors,
        vec![Error::Driver {
            call: "cuDestroyExternalSemaphore",
            code: CuResult::INVALID_HANDLE
        }]
    );
    let sem = ExternalSemaphore::binary_fd(&ctx, some_fd()).unwrap();
    assert_eq!(
        sem.destroy().unwrap_err().code(),
        Some(CuResult::INVALID_HANDLE)
    );
}

#[test]
fn a_failed_import_hands_the_fd_back_open() {
    let _g = serial();
    let mut cuda = base();
    cuda.cuImportExternalMemory = Some(import_mem_fails);
    let backend = backend(cuda);
    let ctx = Context::primary(backend, 0).unwrap();
    let fd = some_fd();
    let raw = fd.as_raw_fd();
    let err = ExternalMemory::opaque_fd(&ctx, fd, 4096).unwrap_err();
    assert_eq!(
        err.error,
        Error::Driver {
            call: "cuImportExternalMemory",
            code: CuResult::UNKNOWN
        }
    );
    // The message carries the project's hint for this code.
    assert!(err.to_string().contains("fd"), "{err}");
    let (_, fd) = err.into_parts();
    assert_eq!(fd.as_raw_fd(), raw);
    fd.try_clone().expect("the fd is still open");
}

#[test]
fn a_driver_that_closes_the_fd_on_failure_does_not_close_the_callers() {
    let _g = serial();
    let mut cuda = base();
    cuda.cuImportExternalMemory = Some(import_mem_fails_closing);
    let ctx = Context::primary(backend(cuda), 0).unwrap();
    let fd = some_fd();
    let raw = fd.as_raw_fd();
    let before = tegra_interop_driver::error::fd_audit();
    let err = ExternalMemory::opaque_fd(&ctx, fd, 4096).unwrap_err();
    assert!(err.to_string().contains("returned to the caller"), "{err}");
    let (_, fd) = err.into_parts();
    assert_eq!(fd.as_raw_fd(), raw);
    // Still open (an OwnedFd of a closed number would abort on drop).
    fd.try_clone().expect("the caller's fd is still open");
    let after = tegra_interop_driver::error::fd_audit();
    assert_eq!(after.gone, before.gone + 1, "{before:?} -> {after:?}");
    assert_eq!(
        (after.closed, after.reused, after.unproven),
        (before.closed, before.reused, before.unproven),
        "{before:?} -> {after:?}"
    );
}

#[test]
fn a_reused_duplicate_number_is_left_alone() {
    let _g = serial();
    let mut cuda = base();
    cuda.cuImportExternalMemory = Some(import_mem_fails_number_reused);
    let ctx = Context::primary(backend(cuda), 0).unwrap();
    let fd = some_fd();
    let before = tegra_interop_driver::error::fd_audit();
    let err = ExternalMemory::opaque_fd(&ctx, fd, 4096).unwrap_err();
    err.fd.try_clone().expect("the caller's fd is still open");
    let after = tegra_interop_driver::error::fd_audit();
    if cfg!(miri) {
        // No kcmp under Miri: it cannot be proven ours, so it is left.
        assert!(after.unproven > before.unproven, "{before:?} -> {after:?}");
    } else {
        assert!(after.reused > before.reused, "{before:?} -> {after:?}");
    }
    // The file now on the number was not closed by the import.
    let number = REUSED_NUMBER.load(Ordering::SeqCst);
    // SAFETY: `number` is the /dev/zero descriptor the fake driver made; this
    // test owns it now.
    let stranger = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(number) };
    stranger
        .try_clone()
        .expect("the reused number must not be closed");
}

#[test]
fn a_missing_import_entry_also_hands_the_fd_back() {
    let _g = serial();
    let backend = backend(base());
    let ctx = Context::primary(backend, 0).unwrap();
    let err = ExternalMemory::opaque_fd(&ctx, some_fd(), 4096).unwrap_err();
    assert_eq!(
        err.error,
        Error::not_supported("cuImportExternalMemory", "libcuda.so.1")
    );
    err.fd.try_clone().unwrap();
}

#[test]
fn validation_refusals_come_before_the_driver() {
    let _g = serial();
    let backend = backend(base());
    let ctx = Context::primary(backend, 0).unwrap();
    // No cuImportExternalMemory in this table: a refusal must come first.
    let err = ExternalMemory::opaque_fd(&ctx, some_fd(), 0).unwrap_err();
    assert_eq!(err.error, Error::Validation(ValidationError::ZeroSize));
}

#[test]
fn a_failed_signal_does_not_advance_the_timeline() {
    let _g = serial();
    let mut cuda = base();
    cuda.cuSignalExternalSemaphoresAsync = Some(signal_fails);
    let backend = backend(cuda);
    let ctx = Context::primary(backend, 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut sem = ExternalSemaphore::timeline_fd(&ctx, some_fd()).unwrap();
    let err = stream
        .signal(&mut sem, SignalParams::timeline(5))
        .unwrap_err();
    assert_eq!(err.code(), Some(CuResult::INVALID_VALUE));
    // The project's hint for a semaphore call explains the usual cause.
    assert!(err.to_string().contains("context"), "{err}");
    assert_eq!(sem.last_timeline_value(), Some(0));
    // 5 is still available: nothing was consumed by the failed enqueue.
    let err = stream
        .signal(&mut sem, SignalParams::timeline(5))
        .unwrap_err();
    assert_eq!(err.code(), Some(CuResult::INVALID_VALUE));
}

#[test]
fn a_missing_signal_entry_leaves_the_tracker_alone() {
    let _g = serial();
    let backend = backend(base());
    let ctx = Context::primary(backend, 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut sem = ExternalSemaphore::timeline_fd(&ctx, some_fd()).unwrap();
    let err = stream
        .signal(&mut sem, SignalParams::timeline(1))
        .unwrap_err();
    assert_eq!(
        err,
        Error::not_supported("cuSignalExternalSemaphoresAsync", "libcuda.so.1")
    );
    assert_eq!(sem.last_timeline_value(), Some(0));
}

#[test]
fn context_ids_are_unique_and_named_in_messages() {
    let _g = serial();
    let backend = backend(base());
    let a = Context::primary(backend.clone(), 0).unwrap();
    let b = Context::primary(backend, 0).unwrap();
    assert_ne!(a.id(), b.id());
    assert_eq!(
        a.id().to_string(),
        format!("context #{} (device 0)", a.id().id)
    );
}
