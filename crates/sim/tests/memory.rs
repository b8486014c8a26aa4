//! External memory over memfd, allocations, copies and mipmapped arrays.
//!
//! Every test holds `serial()`: one of them closes the simulator's own fd
//! behind its back and needs the number to stay free until the destroy.
#![allow(
    clippy::unwrap_used,
    clippy::field_reassign_with_default,
    clippy::redundant_closure_call
)]
mod common;
use common::*;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, RawFd};

/// Fresh exported memory of `size` bytes: its fd, tracked (the caller owns
/// it until an import takes it), and the exporter's mapping.
fn exported_tracked(size: usize) -> (Tracked, export::ExportedMemory) {
    let (fd, mem) = export::memory(size).unwrap();
    (Tracked::new(fd), mem)
}

#[test]
fn bytes_are_shared_both_ways() {
    let _g = serial();
    let c = Cu::new();
    let ctx = c.ctx();
    let (fd, mem) = export::memory(4096).unwrap();
    mem.write(100, b"from the exporter").unwrap();
    let m = c.import_mem(fd, 4096);
    let (r, p) = c.map(m, 0, 4096);
    assert_eq!(r, SUCCESS);
    assert_eq!(&c.dtoh(p + 100, 17), b"from the exporter");
    c.htod(p + 2000, b"from CUDA");
    let mut back = [0u8; 9];
    mem.read(2000, &mut back).unwrap();
    assert_eq!(&back, b"from CUDA");
    assert_eq!(cu!(c.t, cuMemsetD8(p + 10, 0xab, 4)), SUCCESS);
    assert_eq!(&mem.to_vec()[10..14], &[0xab; 4]);

    let l = c.sim.ledger();
    assert_eq!((l.live_memories, l.live_mappings, l.open_fds), (1, 1, 1));
    assert_eq!(cu!(c.t, cuMemFree(p)), SUCCESS);
    assert_eq!(cu!(c.t, cuDestroyExternalMemory(m)), SUCCESS);
    assert_eq!(cu!(c.t, cuCtxDestroy(ctx)), SUCCESS);
    assert!(c.sim.ledger().is_clean(), "{}", c.sim.ledger());
    assert!(c.sim.diagnostics().is_empty());
}

#[test]
fn successful_import_closes_the_fd_failed_opaque_import_too() {
    let _g = serial();
    let c = Cu::ready();
    // A failed OPAQUE_FD import closes the fd once the parameters were
    // valid (measured: UNKNOWN for a file that is not a GPU allocation);
    // a parameter error (bad flags) keeps it (measured: INVALID_VALUE,
    // fd open).
    let (tracked, _mem) = exported_tracked(4096);
    let mut d = CUDA_EXTERNAL_MEMORY_HANDLE_DESC::default();
    d.type_ = CUexternalMemoryHandleType(1);
    d.handle.fd = tracked.raw;
    d.size = 4096;
    d.flags = 2;
    let mut m: CUexternalMemory = std::ptr::null_mut();
    assert_eq!(cu!(c.t, cuImportExternalMemory(&mut m, &d)), INVALID_VALUE);
    assert!(tracked.still_open());
    tracked.close();
    let null = Tracked::new(std::fs::File::open("/dev/null").unwrap().into());
    assert_eq!(c.import_mem_raw(1, null.raw, 4096).0, UNKNOWN);
    assert!(!null.still_open());
    // A successful one closes it too (the driver took it), as measured.
    let (tracked, _mem) = exported_tracked(4096);
    let (r, m) = c.import_mem_raw(1, tracked.raw, 4096);
    assert_eq!(r, SUCCESS);
    assert!(!tracked.still_open());
    assert_eq!(c.sim.ledger().open_fds, 1);
    assert_eq!(cu!(c.t, cuDestroyExternalMemory(m)), SUCCESS);
    assert_eq!(c.sim.ledger().open_fds, 0);
    // The only diagnostic: /dev/null is not exported memory.
    let d = c.sim.diagnostics();
    assert!(d.len() == 1 && d[0].kind == DiagnosticKind::Misuse, "{d:?}");
    // The ledger saw: the caller's fd closed (failure), a duplicate made,
    // the caller's fd closed (success), the duplicate closed (destroy).
    let actions: Vec<FdAction> = c.sim.fd_events().iter().map(|e| e.action).collect();
    assert!(matches!(
        actions.as_slice(),
        [
            FdAction::ClosedCallers,
            FdAction::Duplicated { .. },
            FdAction::ClosedCallers,
            FdAction::ClosedOwn
        ]
    ));
}

#[test]
fn not_a_gpu_allocation_opaque_fd_is_unknown_and_closed() {
    let _g = serial();
    // Measured: /dev/null, a pipe, a socket, a memfd and a regular file that
    // are not GPU allocations, as OPAQUE_FD -> UNKNOWN, fd closed. Only
    // memory from `export::memory` is an allocation to the simulator.
    let c = Cu::ready();
    let null: std::os::fd::OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    for fd in [null, a.into(), b.into(), memfd(c"mine", 4096)] {
        let t = Tracked::new(fd);
        assert_eq!(c.import_mem_raw(1, t.raw, 4096).0, UNKNOWN);
        assert!(!t.still_open());
    }
}

#[test]
fn injected_opaque_fd_import_failure_closes_the_fd() {
    let _g = serial();
    let c = Cu::ready();
    let (t, _mem) = exported_tracked(4096);
    c.sim.fail_symbol("cuImportExternalMemory", 0, 2);
    assert_eq!(c.import_mem_raw(1, t.raw, 4096).0, 2);
    assert!(!t.still_open());
    assert_eq!(c.sim.injected_failures(), 1);
    assert!(c.sim.ledger().is_clean() || c.sim.ledger().live_memories == 0);
}

#[test]
fn import_codes_match_the_measurements() {
    let _g = serial();
    let c = Cu::ready();
    // fd -1: UNKNOWN, exactly like the real driver.
    assert_eq!(c.import_mem_raw(1, -1, 4096).0, UNKNOWN);
    // Windows kinds on Linux (measured for OPAQUE_WIN32, the others chosen
    // alike), zero size, NULL NvSciBuf object.
    for kind in 2..=7 {
        let (t, _m) = exported_tracked(64);
        assert_eq!(
            c.import_mem_raw(kind, t.raw, 64).0,
            NOT_SUPPORTED,
            "kind {kind}"
        );
        t.close();
    }
    let (t, _m) = exported_tracked(64);
    // Zero size on OPAQUE_FD: a parameter error, and the fd is kept
    // (measured).
    assert_eq!(c.import_mem_raw(1, t.raw, 0).0, INVALID_VALUE);
    t.close();
    let mut d = CUDA_EXTERNAL_MEMORY_HANDLE_DESC::default();
    d.type_ = CUexternalMemoryHandleType(8);
    d.size = 64;
    let mut m: CUexternalMemory = std::ptr::null_mut();
    assert_eq!(cu!(c.t, cuImportExternalMemory(&mut m, &d)), INVALID_VALUE);
    assert_eq!(
        cu!(c.t, cuImportExternalMemory(&mut m, std::ptr::null())),
        INVALID_VALUE
    );
    assert!(c.sim.ledger().live_memories == 0);
}

#[test]
fn dmabuf_import_is_not_supported_by_default_and_keeps_the_fd() {
    let _g = serial();
    // Measured on the H200: DMABUF_FD -> NOT_SUPPORTED, fd left open.
    let c = Cu::ready();
    let (t, _mem) = exported_tracked(256);
    assert_eq!(c.import_mem_raw(9, t.raw, 256).0, NOT_SUPPORTED);
    assert!(t.still_open());
    // Injected failures of a DMABUF_FD import leave it too.
    c.sim.fail_at(c.sim.calls(), 999);
    assert_eq!(c.import_mem_raw(9, t.raw, 256).0, UNKNOWN);
    assert!(t.still_open());
    t.close();
    assert!(c.sim.fd_events().is_empty());
}

#[test]
fn dmabuf_import_opt_in_works() {
    let _g = serial();
    let mut cfg = SimConfig::default();
    cfg.dmabuf_import = true;
    let c = Cu::with(cfg);
    let _ctx = c.ctx();
    let (fd, mem) = export::memory(256).unwrap();
    mem.fill(9);
    let (r, m) = c.import_mem_raw(9, fd.into_raw_fd(), 256);
    assert_eq!(r, SUCCESS);
    let (r, p) = c.map(m, 0, 256);
    assert_eq!(r, SUCCESS);
    assert_eq!(c.dtoh(p, 256), vec![9u8; 256]);
}

/// Exported memory imported into `c`: (handle, the number of the duplicate
/// the simulator holds, the exporter's mapping).
fn imported_with_dup(c: &Cu) -> (CUexternalMemory, RawFd, export::ExportedMemory) {
    let (fd, mem) = export::memory(4096).unwrap();
    let m = c.import_mem(fd, 4096);
    let dup = c
        .sim
        .fd_events()
        .iter()
        .find_map(|e| match e.action {
            FdAction::Duplicated { .. } => Some(e.fd),
            _ => None,
        })
        .unwrap();
    (m, dup, mem)
}

#[test]
fn a_double_close_of_a_held_fd_is_reported() {
    let _g = serial();
    // Someone closes the simulator's own duplicate behind its back (what a
    // caller does that closes a number it no longer owns): on destroy the
    // simulator finds it closed, does not close it again, and says so.
    let c = Cu::ready();
    let (m, dup, _mem) = imported_with_dup(&c);
    // SAFETY: deliberately closing the simulator's descriptor (the bug).
    unsafe { libc::close(dup) };
    assert_eq!(cu!(c.t, cuDestroyExternalMemory(m)), SUCCESS);
    let d = c.sim.diagnostics();
    assert!(
        d.iter().any(|d| d.kind == DiagnosticKind::DoubleClose),
        "{d:?}"
    );
    assert!(c
        .sim
        .fd_events()
        .iter()
        .any(|e| e.fd == dup && e.action == FdAction::FoundClosed));
}

#[test]
fn a_reused_held_fd_number_is_reported_as_foreign_and_left_open() {
    let _g = serial();
    let c = Cu::ready();
    let (m, dup, _mem) = imported_with_dup(&c);
    // Close it and put another file on the same number.
    let other: std::os::fd::OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    // SAFETY: deliberately replacing the simulator's descriptor (the bug);
    // dup2 closes `dup` and makes it refer to /dev/null.
    assert_eq!(unsafe { libc::dup2(other.as_raw_fd(), dup) }, dup);
    let stranger = Tracked::new(
        // SAFETY: `dup` is now our own /dev/null descriptor.
        unsafe { std::os::fd::OwnedFd::from_raw_fd(dup) },
    );
    assert_eq!(cu!(c.t, cuDestroyExternalMemory(m)), SUCCESS);
    assert!(stranger.still_open(), "the simulator closed a foreign fd");
    stranger.close();
    let d = c.sim.diagnostics();
    assert!(
        d.iter().any(|d| d.kind == DiagnosticKind::ForeignFd),
        "{d:?}"
    );
}

#[test]
fn mapping_rules_match_the_measurements() {
    let _g = serial();
    let c = Cu::ready();
    let (fd, mem) = export::memory(8192).unwrap();
    let pattern: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    mem.write(0, &pattern).unwrap();
    let m = c.import_mem(fd, 8192);
    // flags != 0
    let d = CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
        offset: 0,
        size: 16,
        flags: 1,
        ..Default::default()
    };
    let mut p: CUdeviceptr = 0;
    assert_eq!(
        cu!(c.t, cuExternalMemoryGetMappedBuffer(&mut p, m, &d)),
        INVALID_VALUE
    );
    // past the end
    assert_eq!(c.map(m, 8192 - 16, 32).0, INVALID_VALUE);
    assert_eq!(c.map(m, u64::MAX, 2).0, INVALID_VALUE);
    // offset 1 is fine and addresses byte 1
    let (r, p1) = c.map(m, 1, 4000);
    assert_eq!(r, SUCCESS);
    assert_eq!(c.dtoh(p1, 8), pattern[1..9].to_vec());
    // Two mappings of the same range are different addresses, same bytes.
    let (_, a) = c.map(m, 4096, 64);
    let (_, b) = c.map(m, 4096, 64);
    assert_ne!(a, b);
    c.htod(a, &[1, 2, 3]);
    assert_eq!(c.dtoh(b, 3), vec![1, 2, 3]);
    // Destroying the memory does not free the mappings.
    assert_eq!(cu!(c.t, cuDestroyExternalMemory(m)), SUCCESS);
    assert_eq!(c.dtoh(p1, 8), pattern[1..9].to_vec());
    assert_eq!(c.sim.ledger().live_mappings, 3);
    for q in [p1, a, b] {
        assert_eq!(cu!(c.t, cuMemFree(q)), SUCCESS);
    }
    assert_eq!(c.sim.ledger().live_mappings, 0);
    // Freed: copies and a second free are caught.
    let mut out = [0u8; 4];
    assert_eq!(
        cu!(c.t, cuMemcpyDtoH(out.as_mut_ptr().cast(), a, 4)),
        INVALID_VALUE
    );
    assert_eq!(cu!(c.t, cuMemFree(a)), INVALID_VALUE);
    assert!(c.has_diag(DiagnosticKind::DoubleDestroy));
    // Mapping through a destroyed memory handle.
    assert_eq!(c.map(m, 0, 16).0, INVALID_VALUE);
    assert!(c.has_diag(DiagnosticKind::UseAfterDestroy));
    // Double destroy of the memory.
    assert_eq!(cu!(c.t, cuDestroyExternalMemory(m)), INVALID_VALUE);
}

#[test]
fn oversized_import_succeeds_with_a_diagnostic_and_never_crashes() {
    let _g = serial();
    let c = Cu::ready();
    let (fd, mem) = export::memory(4096).unwrap();
    mem.fill(0x5a);
    // 4x the real size: the real driver says SUCCESS.
    let m = c.import_mem(fd, 4 * 4096);
    assert!(c.has_diag(DiagnosticKind::ImportSizeMismatch));
    let (r, p) = c.map(m, 0, 4 * 4096);
    assert_eq!(r, SUCCESS);
    let all = c.dtoh(p, 4 * 4096);
    assert_eq!(&all[..4096], &[0x5a; 4096][..]);
    assert!(
        all[4096..].iter().all(|b| *b == 0),
        "the tail is private zero memory"
    );
    // Writing past the real size does not crash and is not shared.
    c.htod(p + 3 * 4096, &[1; 64]);
    assert_eq!(mem.to_vec(), vec![0x5a; 4096]);
    assert_eq!(cu!(c.t, cuMemFree(p)), SUCCESS);
    assert_eq!(cu!(c.t, cuDestroyExternalMemory(m)), SUCCESS);
}

#[test]
fn alloc_copy_memset_and_bounds() {
    let _g = serial();
    let c = Cu::new();
    let ctx = c.ctx();
    let mut p: CUdeviceptr = 0;
    assert_eq!(cu!(c.t, cuMemAlloc(&mut p, 0)), INVALID_VALUE);
    assert_eq!(cu!(c.t, cuMemAlloc(&mut p, 100)), SUCCESS);
    assert_eq!(cu!(c.t, cuMemsetD8(p, 7, 100)), SUCCESS);
    assert_eq!(c.dtoh(p, 100), vec![7; 100]);
    c.htod(p + 50, &[1, 2]);
    assert_eq!(c.dtoh(p + 49, 4), vec![7, 1, 2, 7]);
    let mut out = [0u8; 8];
    assert_eq!(
        cu!(c.t, cuMemcpyDtoH(out.as_mut_ptr().cast(), p + 96, 8)),
        INVALID_VALUE
    );
    assert!(c.has_diag(DiagnosticKind::OutOfBounds));
    assert_eq!(
        cu!(c.t, cuMemcpyDtoH(out.as_mut_ptr().cast(), 0x1234, 8)),
        INVALID_VALUE
    );
    assert_eq!(c.sim.ledger().live_allocations, 1);
    assert_eq!(cu!(c.t, cuMemFree(p)), SUCCESS);
    assert_eq!(cu!(c.t, cuCtxDestroy(ctx)), SUCCESS);
    assert!(c.sim.ledger().is_clean());
}

#[test]
fn context_destroy_takes_mappings_along() {
    let _g = serial();
    let c = Cu::new();
    let ctx = c.ctx();
    let (fd, _mem) = export::memory(4096).unwrap();
    let m = c.import_mem(fd, 4096);
    let (_, p) = c.map(m, 0, 4096);
    assert_eq!(cu!(c.t, cuCtxDestroy(ctx)), SUCCESS);
    assert!(c.sim.ledger().is_clean(), "{}", c.sim.ledger());
    // Freeing / destroying afterwards crashes the real driver; here it is caught.
    let _ctx2 = c.ctx();
    assert_eq!(cu!(c.t, cuMemFree(p)), CONTEXT_IS_DESTROYED);
    assert_eq!(cu!(c.t, cuDestroyExternalMemory(m)), CONTEXT_IS_DESTROYED);
    let crash: Vec<_> = c
        .sim
        .diagnostics()
        .into_iter()
        .filter(|d| d.kind.real_driver_would_crash())
        .collect();
    assert_eq!(crash.len(), 2, "{crash:?}");
}

fn array_desc(w: usize, h: usize, levels: u32) -> CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC {
    let mut d = CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC::default();
    d.arrayDesc.Width = w;
    d.arrayDesc.Height = h;
    d.arrayDesc.Format = CUarray_format(1);
    d.arrayDesc.NumChannels = 4;
    d.numLevels = levels;
    d
}

/// cuExternalMemoryGetMappedMipmappedArray of `m` with `d`: (code, array).
fn mipmapped(
    c: &Cu,
    m: CUexternalMemory,
    d: &CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC,
) -> (u32, CUmipmappedArray) {
    let mut mip: CUmipmappedArray = std::ptr::null_mut();
    let r = cu!(c.t, cuExternalMemoryGetMappedMipmappedArray(&mut mip, m, d));
    (r, mip)
}

#[test]
fn mipmapped_array_levels_and_memcpy3d() {
    let _g = serial();
    let c = Cu::new();
    let ctx = c.ctx();
    let (w, h) = (64usize, 32usize);
    // Level 0: 64*32*4, level 1: 32*16*4.
    let total = w * h * 4 + (w / 2) * (h / 2) * 4;
    let (fd, mem) = export::memory(total).unwrap();
    let m = c.import_mem(fd, total as u64);
    let too_many = array_desc(w, h, 8);
    assert_eq!(mipmapped(&c, m, &too_many).0, INVALID_VALUE);
    let big = array_desc(w * 2, h, 1);
    assert_eq!(mipmapped(&c, m, &big).0, INVALID_VALUE);
    let (r, mip) = mipmapped(&c, m, &array_desc(w, h, 2));
    assert_eq!(r, SUCCESS);
    let mut l0: CUarray = std::ptr::null_mut();
    let mut l1: CUarray = std::ptr::null_mut();
    assert_eq!(cu!(c.t, cuMipmappedArrayGetLevel(&mut l0, mip, 0)), SUCCESS);
    assert_eq!(cu!(c.t, cuMipmappedArrayGetLevel(&mut l1, mip, 1)), SUCCESS);
    assert_eq!(
        cu!(c.t, cuMipmappedArrayGetLevel(&mut l1, mip, 2)),
        INVALID_VALUE
    );

    // Host -> level 1 (a 32x16 RGBA8 image), then read it back.
    let img: Vec<u8> = (0..(32 * 16 * 4)).map(|i| (i % 253) as u8).collect();
    let mut cp = CUDA_MEMCPY3D::default();
    cp.srcMemoryType = CUmemorytype(1);
    cp.srcHost = img.as_ptr().cast();
    cp.srcPitch = 32 * 4;
    cp.dstMemoryType = CUmemorytype(3);
    cp.dstArray = l1;
    cp.WidthInBytes = 32 * 4;
    cp.Height = 16;
    cp.Depth = 1;
    assert_eq!(cu!(c.t, cuMemcpy3D(&cp)), SUCCESS);
    // Linear layout: level 1 starts after level 0 in the shared memory.
    let shared = mem.to_vec();
    assert_eq!(&shared[w * h * 4..], &img[..]);
    // Array -> host, a 4x2 sub-rectangle at (x=8 bytes, y=3).
    let mut out = vec![0u8; 4 * 2];
    let mut back = CUDA_MEMCPY3D::default();
    back.srcMemoryType = CUmemorytype(3);
    back.srcArray = l1;
    back.srcXInBytes = 8;
    back.srcY = 3;
    back.dstMemoryType = CUmemorytype(1);
    back.dstHost = out.as_mut_ptr().cast();
    back.dstPitch = 4;
    back.WidthInBytes = 4;
    back.Height = 2;
    back.Depth = 1;
    assert_eq!(cu!(c.t, cuMemcpy3D(&back)), SUCCESS);
    assert_eq!(&out[..4], &img[3 * 128 + 8..3 * 128 + 12]);
    assert_eq!(&out[4..], &img[4 * 128 + 8..4 * 128 + 12]);
    // Out of the level's bounds.
    back.srcY = 15;
    assert_eq!(cu!(c.t, cuMemcpy3D(&back)), INVALID_VALUE);

    assert_eq!(cu!(c.t, cuDestroyExternalMemory(m)), SUCCESS);
    assert_eq!(
        c.sim.ledger().live_mappings,
        1,
        "the array outlives the memory handle"
    );
    assert_eq!(cu!(c.t, cuMipmappedArrayDestroy(mip)), SUCCESS);
    assert_eq!(cu!(c.t, cuMipmappedArrayDestroy(mip)), INVALID_HANDLE);
    assert!(c.has_diag(DiagnosticKind::DoubleDestroy));
    assert_eq!(
        cu!(c.t, cuMemcpy3D(&cp)),
        INVALID_HANDLE,
        "level of a destroyed array"
    );
    assert_eq!(cu!(c.t, cuCtxDestroy(ctx)), SUCCESS);
    assert!(c.sim.ledger().is_clean());
}

#[test]
fn nvscibuf_objects_import_and_need_one_level() {
    let _g = serial();
    let c = Cu::with(SimConfig::tegra());
    let _ctx = c.ctx();
    let (obj, mem) = c.sim.create_buf_object(4096).unwrap();
    mem.write(0, b"nvsci").unwrap();
    let mut d = CUDA_EXTERNAL_MEMORY_HANDLE_DESC::default();
    d.type_ = CUexternalMemoryHandleType(8);
    d.handle.nvSciBufObject = obj.as_ptr();
    d.size = 4096;
    let mut m: CUexternalMemory = std::ptr::null_mut();
    assert_eq!(cu!(c.t, cuImportExternalMemory(&mut m, &d)), SUCCESS);
    let (_, p) = c.map(m, 0, 4096);
    assert_eq!(c.dtoh(p, 5), b"nvsci".to_vec());
    assert_eq!(mipmapped(&c, m, &array_desc(16, 16, 2)).0, INVALID_VALUE);
    let (r, mip) = mipmapped(&c, m, &array_desc(16, 16, 1));
    assert_eq!(r, SUCCESS);
    assert_eq!(cu!(c.t, cuMipmappedArrayDestroy(mip)), SUCCESS);
    assert_eq!(cu!(c.t, cuMemFree(p)), SUCCESS);
    assert_eq!(cu!(c.t, cuDestroyExternalMemory(m)), SUCCESS);
}
