//! Result codes, names, Display, conversions and hints.
#![allow(clippy::unwrap_used)] // tests unwrap on purpose

use std::collections::HashSet;

use tegra_interop_core::sys;
use tegra_interop_core::{CuResult, NvSciError, ValidationError};

#[test]
fn facts_values_are_named() {
    let expected = [
        (CuResult::SUCCESS, 0, "CUDA_SUCCESS"),
        (CuResult::INVALID_VALUE, 1, "CUDA_ERROR_INVALID_VALUE"),
        (CuResult::OUT_OF_MEMORY, 2, "CUDA_ERROR_OUT_OF_MEMORY"),
        (CuResult::NOT_INITIALIZED, 3, "CUDA_ERROR_NOT_INITIALIZED"),
        (CuResult::DEINITIALIZED, 4, "CUDA_ERROR_DEINITIALIZED"),
        (CuResult::INVALID_CONTEXT, 201, "CUDA_ERROR_INVALID_CONTEXT"),
        (
            CuResult::OPERATING_SYSTEM,
            304,
            "CUDA_ERROR_OPERATING_SYSTEM",
        ),
        (CuResult::INVALID_HANDLE, 400, "CUDA_ERROR_INVALID_HANDLE"),
        (CuResult::NOT_READY, 600, "CUDA_ERROR_NOT_READY"),
        (
            CuResult::CONTEXT_IS_DESTROYED,
            709,
            "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        ),
        (CuResult::NOT_PERMITTED, 800, "CUDA_ERROR_NOT_PERMITTED"),
        (CuResult::NOT_SUPPORTED, 801, "CUDA_ERROR_NOT_SUPPORTED"),
        (CuResult::TIMEOUT, 909, "CUDA_ERROR_TIMEOUT"),
        (CuResult::UNKNOWN, 999, "CUDA_ERROR_UNKNOWN"),
    ];
    for (code, value, name) in expected {
        assert_eq!(code.0, value);
        assert_eq!(code.name(), Some(name));
        assert_eq!(code.to_string(), format!("{name} ({value})"));
    }
    let nv = [
        (NvSciError::SUCCESS, 0, "NvSciError_Success"),
        (NvSciError::NOT_SUPPORTED, 0x11, "NvSciError_NotSupported"),
        (NvSciError::ACCESS_DENIED, 0x20, "NvSciError_AccessDenied"),
        (
            NvSciError::NOT_INITIALIZED,
            0x24,
            "NvSciError_NotInitialized",
        ),
        (
            NvSciError::INSUFFICIENT_MEMORY,
            0x30,
            "NvSciError_InsufficientMemory",
        ),
        (NvSciError::BAD_PARAMETER, 0x100, "NvSciError_BadParameter"),
        (
            NvSciError::VALUE_OUT_OF_RANGE,
            0x107,
            "NvSciError_ValueOutOfRange",
        ),
        (NvSciError::TIMEOUT, 0x200, "NvSciError_Timeout"),
        (
            NvSciError::INTERRUPTED_CALL,
            0x203,
            "NvSciError_InterruptedCall",
        ),
        (
            NvSciError::RECONCILIATION_FAILED,
            0x10100,
            "NvSciError_ReconciliationFailed",
        ),
        (
            NvSciError::ATTR_LIST_VALIDATION_FAILED,
            0x10101,
            "NvSciError_AttrListValidationFailed",
        ),
        (
            NvSciError::UNSUPPORTED_CONFIG,
            0x2000001,
            "NvSciError_UnsupportedConfig",
        ),
        (
            NvSciError::CLEARED_FENCE,
            0x2000002,
            "NvSciError_ClearedFence",
        ),
    ];
    for (code, value, name) in nv {
        assert_eq!(code.0, value);
        assert_eq!(code.name(), Some(name));
    }
    // Every value the project's NvSci header names (incl. NvSciIpc's NoSuchEntry, ConnectionReset).
    assert_eq!(NvSciError::ALL_NAMED.len(), 34);
}

#[test]
fn named_values_are_distinct_and_named() {
    let mut seen = HashSet::new();
    for code in CuResult::ALL_NAMED {
        assert!(seen.insert(code.0), "duplicate {}", code.0);
        assert!(code.name().is_some());
    }
    let mut seen = HashSet::new();
    for code in NvSciError::ALL_NAMED {
        assert!(seen.insert(code.0));
        assert!(code.name().is_some());
    }
}

#[test]
fn unknown_values_are_kept_and_printed_as_numbers() {
    assert_eq!(CuResult(1234).name(), None);
    assert_eq!(CuResult(1234).to_string(), "CUresult(1234)");
    assert_eq!(NvSciError(0x777).to_string(), "NvSciError(1911)");
    assert_eq!(CuResult(1234).ok(), Err(CuResult(1234)));
}

#[test]
fn converts_to_and_from_sys() {
    let raw = sys::cuda::CUresult::CUDA_ERROR_INVALID_HANDLE;
    let ours: CuResult = raw.into();
    assert_eq!(ours, CuResult::INVALID_HANDLE);
    let back: sys::cuda::CUresult = ours.into();
    assert_eq!(back, raw);
    let raw = sys::nvsci::NvSciError::NvSciError_BadParameter;
    let ours = NvSciError::from(raw);
    assert_eq!(ours, NvSciError::BAD_PARAMETER);
    assert_eq!(sys::nvsci::NvSciError::from(ours), raw);
    // Every value the sys enum names is named here with the same C name.
    for code in CuResult::ALL_NAMED {
        assert!(code.name().unwrap().starts_with("CUDA_"));
    }
}

/// Seed scenario "invalid sync object": a semaphore used after destroy or with another
/// context. The driver reports INVALID_VALUE (measured) or INVALID_HANDLE for it.
#[test]
fn hint_for_stale_or_foreign_semaphore() {
    for call in [
        "cuSignalExternalSemaphoresAsync",
        "cuWaitExternalSemaphoresAsync_ptsz",
    ] {
        for code in [CuResult::INVALID_VALUE, CuResult::INVALID_HANDLE] {
            let hint = code.hint_for(call).unwrap();
            assert!(hint.cause.contains("destroyed"), "{hint}");
            assert!(hint.cause.contains("another CUDA context"), "{hint}");
            assert!(hint.fix.contains("context it was imported in"), "{hint}");
        }
    }
    // Outside semaphore calls INVALID_VALUE keeps its general hint.
    let general = CuResult::INVALID_VALUE
        .hint_for("cuImportExternalMemory")
        .unwrap();
    assert!(general.cause.contains("buffer flags"));
}

/// Seed scenario "driver not ready": a call after the driver shut down.
#[test]
fn hint_for_driver_shut_down() {
    for code in [CuResult::DEINITIALIZED, CuResult::NOT_INITIALIZED] {
        assert!(code.is_driver_shut_down());
        let hint = code.hint().unwrap();
        assert!(hint.cause.contains("shut"), "{hint}");
        assert!(hint.fix.contains("Drop"), "{hint}");
        assert_eq!(code.hint_for("cuDestroyExternalSemaphore"), Some(hint));
    }
    assert!(!CuResult::INVALID_VALUE.is_driver_shut_down());
}

#[test]
fn hint_for_negative_fd() {
    let hint = CuResult::UNKNOWN.hint().unwrap();
    assert!(hint.cause.contains("-1"));
    assert!(CuResult(1234).hint().is_none());
    assert!(NvSciError::NOT_SUPPORTED
        .hint()
        .unwrap()
        .cause
        .contains("Tegra"));
    assert!(NvSciError(0x777).hint().is_none());
}

#[test]
fn errors_are_std_errors() {
    fn is_error<E: std::error::Error + Send + Sync + 'static>(_: &E) {}
    is_error(&CuResult::INVALID_VALUE);
    is_error(&NvSciError::BAD_PARAMETER);
    is_error(&ValidationError::ZeroSize);
    let boxed: Box<dyn std::error::Error> = Box::new(ValidationError::NegativeFd { fd: -1 });
    assert!(boxed.to_string().contains("-1"));
}

/// EGL calls get their own hints: UNKNOWN from an EGLStream call (measured
/// causes on an H200/H100), mapping codes from a graphics call (cudaEGL.h:
/// a registration stays mapped).
#[test]
fn hints_for_egl_calls() {
    let stream = CuResult::UNKNOWN
        .hint_for("cuEGLStreamProducerReturnFrame")
        .unwrap();
    assert!(stream.cause.contains("consumer"), "{stream}");
    assert!(
        stream.fix.contains("connect the consumer first"),
        "{stream}"
    );
    // Elsewhere UNKNOWN keeps its fd hint.
    assert!(CuResult::UNKNOWN
        .hint_for("cuImportExternalMemory")
        .unwrap()
        .cause
        .contains("-1"));
    for code in [CuResult::ALREADY_MAPPED, CuResult::NOT_MAPPED] {
        let hint = code
            .hint_for("cuGraphicsResourceGetMappedEglFrame")
            .unwrap();
        assert!(
            hint.cause
                .contains("mapped for as long as it is registered"),
            "{hint}"
        );
        assert!(hint.fix.contains("unregister"), "{hint}");
    }
    assert!(CuResult::NOT_MAPPED.hint_for("cuMemcpyHtoD").is_none());
}
