//! `cuMemGetHandleForAddressRange` (dma-buf export), at the C level: it
//! works where the device says it can export (attribute 124, as measured on
//! the H200), hands out a real fd the caller owns, and refuses what was not
//! measured.
#![allow(clippy::unwrap_used, clippy::field_reassign_with_default)]

mod common;

use std::os::fd::{FromRawFd, OwnedFd};

use common::*;

const DMA_BUF: CUmemRangeHandleType = CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD;

fn page() -> usize {
    // SAFETY: plain sysconf query.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap()
}

fn alloc(cu: &Cu, len: usize) -> CUdeviceptr {
    let mut p: CUdeviceptr = 0;
    assert_eq!(cu!(cu.t, cuMemAlloc(&mut p, len)), SUCCESS);
    p
}

fn export(cu: &Cu, p: CUdeviceptr, len: usize, ty: CUmemRangeHandleType, flags: u64) -> (u32, i32) {
    let mut fd: i32 = -1;
    let code = cu!(
        cu.t,
        cuMemGetHandleForAddressRange((&mut fd as *mut i32).cast(), p, len, ty, flags)
    );
    (code, fd)
}

#[test]
fn export_gives_a_real_fd_with_the_bytes_and_the_caller_owns_it() {
    let cu = Cu::new();
    let ctx = cu.ctx();
    let len = 2 * page();
    let p = alloc(&cu, len);
    let pattern: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    assert_eq!(
        cu!(cu.t, cuMemcpyHtoD(p, pattern.as_ptr().cast(), len)),
        SUCCESS
    );

    let attr = {
        let mut v = 0;
        let a = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED;
        assert_eq!(cu!(cu.t, cuDeviceGetAttribute(&mut v, a, 0)), SUCCESS);
        v
    };
    assert_eq!(attr, 1, "the default simulator is the measured H200");

    let (code, fd) = export(&cu, p, len, DMA_BUF, 0);
    assert_eq!(code, SUCCESS);
    assert!(fd >= 0);
    // SAFETY: a successful export hands us a new descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(fd);
    assert_eq!(file.metadata().unwrap().len(), len as u64);
    let mut seen = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut seen).unwrap();
    assert_eq!(seen, pattern);
    // The simulator does not hold the fd: its ledger has no fd for it.
    assert_eq!(cu.sim.ledger().open_fds, 0, "{}", cu.sim.ledger());
    drop(file);

    // A second export of the same range is another fd.
    let (code, a) = export(&cu, p, page(), DMA_BUF, 0);
    assert_eq!(code, SUCCESS);
    let (code, b) = export(&cu, p, page(), DMA_BUF, 0);
    assert_eq!(code, SUCCESS);
    assert_ne!(a, b);
    // SAFETY: both are new descriptors we own.
    drop(unsafe { (OwnedFd::from_raw_fd(a), OwnedFd::from_raw_fd(b)) });

    assert_eq!(cu!(cu.t, cuMemFree(p)), SUCCESS);
    assert_eq!(cu!(cu.t, cuCtxDestroy(ctx)), SUCCESS);
    assert!(cu.sim.ledger().is_clean(), "{}", cu.sim.ledger());
    assert!(
        cu.sim.diagnostics().is_empty(),
        "{:?}",
        cu.sim.diagnostics()
    );
}

#[test]
fn what_was_not_measured_is_refused() {
    let cu = Cu::new();
    let ctx = cu.ctx();
    let len = 2 * page();
    let p = alloc(&cu, len);
    let cases: [(&str, CUdeviceptr, usize, CUmemRangeHandleType, u64, u32); 7] = [
        ("zero length", p, 0, DMA_BUF, 0, INVALID_VALUE),
        ("not whole pages", p, 100, DMA_BUF, 0, INVALID_VALUE),
        ("past the allocation", p, 2 * len, DMA_BUF, 0, INVALID_VALUE),
        (
            "not the allocation's start",
            p + page() as u64,
            page(),
            DMA_BUF,
            0,
            INVALID_VALUE,
        ),
        ("unknown pointer", 0x1000, page(), DMA_BUF, 0, INVALID_VALUE),
        ("flags", p, len, DMA_BUF, 1, INVALID_VALUE),
        (
            "handle type",
            p,
            len,
            CUmemRangeHandleType(7),
            0,
            INVALID_VALUE,
        ),
    ];
    for (what, ptr, n, ty, flags, want) in cases {
        let (code, fd) = export(&cu, ptr, n, ty, flags);
        assert_eq!(code, want, "{what}");
        assert_eq!(fd, -1, "{what}: no fd on failure");
    }
    // Each refusal says why.
    assert_eq!(cu.sim.diagnostics().len(), cases.len());
    // NULL out-pointer.
    assert_eq!(
        cu!(
            cu.t,
            cuMemGetHandleForAddressRange(std::ptr::null_mut(), p, len, DMA_BUF, 0)
        ),
        INVALID_VALUE
    );
    assert_eq!(cu!(cu.t, cuMemFree(p)), SUCCESS);
    assert_eq!(cu!(cu.t, cuCtxDestroy(ctx)), SUCCESS);

    // Without a current context.
    let (code, _) = export(&cu, p, len, DMA_BUF, 0);
    assert_eq!(code, INVALID_CONTEXT);
}

#[test]
fn a_device_without_dma_buf_support_does_not_export() {
    let mut cfg = SimConfig::default();
    cfg.dmabuf_supported = false;
    let cu = Cu::with(cfg);
    let ctx = cu.ctx();
    let p = alloc(&cu, page());
    let (code, fd) = export(&cu, p, page(), DMA_BUF, 0);
    assert_eq!(code, NOT_SUPPORTED);
    assert_eq!(fd, -1);
    assert_eq!(cu!(cu.t, cuMemFree(p)), SUCCESS);
    assert_eq!(cu!(cu.t, cuCtxDestroy(ctx)), SUCCESS);
}
