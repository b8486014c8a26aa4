//! Devices, contexts, streams and error names, called through the raw table.
#![allow(
    clippy::unwrap_used,
    clippy::field_reassign_with_default,
    clippy::redundant_closure_call
)]
mod common;
use common::*;
use std::ffi::CStr;

#[test]
fn init_is_required_and_version_is_not() {
    let c = Cu::new();
    let mut n = 0;
    assert_eq!(cu!(c.t, cuDeviceGetCount(&mut n)), NOT_INITIALIZED);
    let mut v = 0;
    assert_eq!(cu!(c.t, cuDriverGetVersion(&mut v)), SUCCESS);
    assert_eq!(v, 12090);
    assert_eq!(
        cu!(c.t, cuDriverGetVersion(std::ptr::null_mut())),
        INVALID_VALUE
    );
    assert_eq!(cu!(c.t, cuInit(1)), INVALID_VALUE);
    assert_eq!(cu!(c.t, cuInit(0)), SUCCESS);
    assert_eq!(cu!(c.t, cuDeviceGetCount(&mut n)), SUCCESS);
    assert_eq!(n, 1);
}

#[test]
fn devices_attributes_names_uuids() {
    let c = Cu::with(SimConfig::default().with_devices(2));
    assert_eq!(cu!(c.t, cuInit(0)), SUCCESS);
    let mut d = -1;
    assert_eq!(cu!(c.t, cuDeviceGet(&mut d, 1)), SUCCESS);
    assert_eq!(d, 1);
    assert_eq!(cu!(c.t, cuDeviceGet(&mut d, 2)), INVALID_DEVICE);
    let attr = |a: u32, dev: i32| {
        let mut v = -1;
        let r = cu!(
            c.t,
            cuDeviceGetAttribute(&mut v, CUdevice_attribute(a), dev)
        );
        (r, v)
    };
    assert_eq!(attr(18, 0), (SUCCESS, 0));
    assert_eq!(attr(114, 0), (SUCCESS, 1));
    assert_eq!(attr(124, 1), (SUCCESS, 1));
    assert_eq!(attr(10, 0), (SUCCESS, 32));
    assert_eq!(attr(18, 5).0, INVALID_DEVICE);
    assert_eq!(attr(100_000, 0).0, INVALID_VALUE);

    let mut u0 = CUuuid::default();
    let mut u1 = CUuuid::default();
    let mut again = CUuuid::default();
    assert_eq!(cu!(c.t, cuDeviceGetUuid_v2(&mut u0, 0)), SUCCESS);
    assert_eq!(cu!(c.t, cuDeviceGetUuid_v2(&mut u1, 1)), SUCCESS);
    assert_eq!(cu!(c.t, cuDeviceGetUuid_v2(&mut again, 0)), SUCCESS);
    assert_ne!(u0, u1);
    assert_eq!(u0, again);

    let mut name = [0 as std::ffi::c_char; 64];
    assert_eq!(cu!(c.t, cuDeviceGetName(name.as_mut_ptr(), 64, 0)), SUCCESS);
    // SAFETY: the simulator NUL-terminates within the 64 bytes.
    let s = unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_str()
        .unwrap()
        .to_owned();
    assert!(s.contains("discrete"), "{s}");
    let mut tiny = [7 as std::ffi::c_char; 4];
    assert_eq!(cu!(c.t, cuDeviceGetName(tiny.as_mut_ptr(), 4, 0)), SUCCESS);
    assert_eq!(tiny[3], 0);
    assert_eq!(
        cu!(c.t, cuDeviceGetName(tiny.as_mut_ptr(), 0, 0)),
        INVALID_VALUE
    );
}

#[test]
fn tegra_config_reports_integrated() {
    let c = Cu::with(SimConfig::tegra());
    assert_eq!(cu!(c.t, cuInit(0)), SUCCESS);
    let mut v = 0;
    assert_eq!(
        cu!(c.t, cuDeviceGetAttribute(&mut v, CUdevice_attribute(18), 0)),
        SUCCESS
    );
    assert_eq!(v, 1);
}

#[test]
fn contexts_are_current_per_thread() {
    let c = Cu::new();
    let ctx = c.ctx();
    let mut cur: CUcontext = std::ptr::null_mut();
    assert_eq!(cu!(c.t, cuCtxGetCurrent(&mut cur)), SUCCESS);
    assert_eq!(cur, ctx);
    let mut dev = -1;
    assert_eq!(cu!(c.t, cuCtxGetDevice(&mut dev)), SUCCESS);
    assert_eq!(dev, 0);

    let t = c.t;
    let ctx_addr = ctx as usize;
    std::thread::spawn(move || {
        let mut cur: CUcontext = std::ptr::null_mut();
        assert_eq!(cu!(t, cuCtxGetCurrent(&mut cur)), SUCCESS);
        assert!(cur.is_null(), "a new thread has no current context");
        let mut s: CUstream = std::ptr::null_mut();
        assert_eq!(cu!(t, cuStreamCreate(&mut s, 0)), INVALID_CONTEXT);
        assert_eq!(cu!(t, cuCtxSetCurrent(ctx_addr as CUcontext)), SUCCESS);
        assert_eq!(cu!(t, cuCtxGetCurrent(&mut cur)), SUCCESS);
        assert_eq!(cur as usize, ctx_addr);
        assert_eq!(cu!(t, cuCtxSetCurrent(std::ptr::null_mut())), SUCCESS);
    })
    .join()
    .unwrap();

    assert_eq!(c.sim.ledger().live_contexts, 1);
    assert_eq!(cu!(c.t, cuCtxDestroy(ctx)), SUCCESS);
    assert_eq!(cu!(c.t, cuCtxGetCurrent(&mut cur)), SUCCESS);
    assert!(cur.is_null());
    assert_eq!(cu!(c.t, cuCtxSynchronize()), INVALID_CONTEXT);
    assert!(c.sim.ledger().is_clean());

    // Destroying it again is a bug the real driver may crash on.
    assert_eq!(cu!(c.t, cuCtxDestroy(ctx)), INVALID_CONTEXT);
    assert!(c.has_diag(DiagnosticKind::DoubleDestroy));
}

#[test]
fn primary_context_retain_release_reset() {
    let c = Cu::new();
    assert_eq!(cu!(c.t, cuInit(0)), SUCCESS);
    let mut p1: CUcontext = std::ptr::null_mut();
    let mut p2: CUcontext = std::ptr::null_mut();
    assert_eq!(cu!(c.t, cuDevicePrimaryCtxRetain(&mut p1, 0)), SUCCESS);
    assert_eq!(cu!(c.t, cuDevicePrimaryCtxRetain(&mut p2, 0)), SUCCESS);
    assert_eq!(p1, p2, "one primary context per device");
    assert_eq!(c.sim.ledger().primary_context_refs, 2);
    assert_eq!(cu!(c.t, cuCtxSetCurrent(p1)), SUCCESS);
    let s = c.stream();
    assert_eq!(cu!(c.t, cuDevicePrimaryCtxReset(0)), SUCCESS);
    // The reset took the stream along.
    assert_eq!(c.query(s), INVALID_HANDLE);
    assert!(c.has_diag(DiagnosticKind::UseAfterContextLoss));
    assert_eq!(cu!(c.t, cuStreamDestroy(s)), CONTEXT_IS_DESTROYED);
    assert_eq!(cu!(c.t, cuDevicePrimaryCtxRelease(0)), SUCCESS);
    assert_eq!(cu!(c.t, cuDevicePrimaryCtxRelease(0)), SUCCESS);
    assert!(c.sim.ledger().is_clean(), "{}", c.sim.ledger());
    // Inactive now: using it as current fails.
    assert_eq!(cu!(c.t, cuCtxSynchronize()), INVALID_CONTEXT);
    assert_eq!(cu!(c.t, cuDevicePrimaryCtxRelease(0)), INVALID_CONTEXT);
    assert_eq!(cu!(c.t, cuCtxDestroy(p1)), INVALID_CONTEXT);
}

#[test]
fn streams_report_their_context_and_destroy_twice_is_caught() {
    let c = Cu::new();
    let ctx = c.ctx();
    let s = c.stream();
    let mut got: CUcontext = std::ptr::null_mut();
    assert_eq!(cu!(c.t, cuStreamGetCtx(s, &mut got)), SUCCESS);
    assert_eq!(got, ctx);
    assert_eq!(
        cu!(c.t, cuStreamGetCtx(std::ptr::null_mut(), &mut got)),
        SUCCESS
    );
    assert_eq!(got, ctx);
    let mut bad: CUstream = std::ptr::null_mut();
    assert_eq!(cu!(c.t, cuStreamCreate(&mut bad, 4)), INVALID_VALUE);
    assert_eq!(c.query(s), SUCCESS);
    assert_eq!(c.sync(s), SUCCESS);
    assert_eq!(cu!(c.t, cuStreamDestroy(s)), SUCCESS);
    assert_eq!(cu!(c.t, cuStreamDestroy(s)), INVALID_HANDLE);
    assert!(c.has_diag(DiagnosticKind::DoubleDestroy));
    assert_eq!(cu!(c.t, cuCtxDestroy(ctx)), SUCCESS);
    assert!(c.sim.ledger().is_clean());
}

#[test]
fn error_names_and_strings() {
    let c = Cu::new();
    let name = |code: u32| {
        let mut p: *const std::ffi::c_char = std::ptr::null();
        let r = cu!(c.t, cuGetErrorName(CUresult(code), &mut p));
        // SAFETY: on success the simulator gives a static C string.
        (
            r,
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned()),
        )
    };
    assert_eq!(
        name(1),
        (SUCCESS, Some("CUDA_ERROR_INVALID_VALUE".to_owned()))
    );
    assert_eq!(
        name(4),
        (SUCCESS, Some("CUDA_ERROR_DEINITIALIZED".to_owned()))
    );
    assert_eq!(name(999), (SUCCESS, Some("CUDA_ERROR_UNKNOWN".to_owned())));
    assert_eq!(name(12345), (INVALID_VALUE, None));
    let mut p: *const std::ffi::c_char = std::ptr::null();
    assert_eq!(cu!(c.t, cuGetErrorString(CUresult(600), &mut p)), SUCCESS);
    // SAFETY: static C string from the simulator.
    let text = unsafe { CStr::from_ptr(p) };
    assert_eq!(text.to_str().unwrap(), "device not ready");
    // Lookups are not counted as calls.
    assert_eq!(c.sim.calls(), 0);
}

#[test]
fn nvsci_attributes_without_nvsci_match_the_discrete_gpu() {
    let c = Cu::new();
    assert_eq!(cu!(c.t, cuInit(0)), SUCCESS);
    assert_eq!(
        cu!(
            c.t,
            cuDeviceGetNvSciSyncAttributes(std::ptr::null_mut(), 0, 1)
        ),
        INVALID_HANDLE
    );
    let mut fake = [0u8; 16];
    assert_eq!(
        cu!(
            c.t,
            cuDeviceGetNvSciSyncAttributes(fake.as_mut_ptr().cast(), 0, 1)
        ),
        NOT_SUPPORTED
    );
}
