//! Every row of the H200 fd-import probe (`crates/sim/measurements/
//! fd_import_probe.c`, output `fd_import_probe.h200.txt`, 2026-11-23),
//! replayed against the simulator's C entry points: the code AND what
//! became of the fd (still open and the same file by st_dev/st_ino, or
//! closed by the import).
//!
//! "Closed" is checked two ways, because tests run in parallel threads and a
//! closed number can be reused at once by another test: the number no longer
//! names the same file, and the simulator's fd ledger recorded closing the
//! caller's fd under that number.
#![allow(clippy::unwrap_used, clippy::field_reassign_with_default)]
mod common;
use common::*;
use std::cell::Cell;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const OPAQUE_FD: u32 = 1;
const OPAQUE_WIN32: u32 = 2;
const DMABUF_FD: u32 = 9;
const SEM_TIMELINE_FD: u32 = 9;
const DEDICATED: u32 = 1;

/// The fd kinds of the probe.
#[derive(Clone, Copy, Debug)]
enum Kind {
    DevNull,
    Memfd,
    File,
    Pipe,
    Socket,
}

const ALL: [Kind; 5] = [
    Kind::DevNull,
    Kind::Memfd,
    Kind::File,
    Kind::Pipe,
    Kind::Socket,
];

/// An fd made like the probe's `open_kind`, plus whatever must stay alive
/// with it (the other end of a pipe or socket).
struct Made {
    fd: Tracked,
    _keep: Vec<OwnedFd>,
    /// Length of the simulator's fd ledger before the import under test.
    mark: Cell<usize>,
}

impl Made {
    fn of(fd: OwnedFd) -> Made {
        Made {
            fd: Tracked::new(fd),
            _keep: Vec::new(),
            mark: Cell::new(0),
        }
    }
}

fn make(kind: Kind) -> Made {
    match kind {
        Kind::DevNull => Made {
            fd: Tracked::new(
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/null")
                    .unwrap()
                    .into(),
            ),
            _keep: Vec::new(),
            mark: Cell::new(0),
        },
        Kind::Memfd => {
            // An arbitrary memfd (not memory the simulator's exporter made).
            // SAFETY: the name is a NUL-terminated literal.
            let raw = unsafe { libc::memfd_create(c"p".as_ptr(), libc::MFD_CLOEXEC) };
            assert!(raw >= 0);
            // SAFETY: a fresh descriptor nobody else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            // SAFETY: resizing our own memfd.
            assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 1 << 20) }, 0);
            Made {
                fd: Tracked::new(fd),
                _keep: Vec::new(),
                mark: Cell::new(0),
            }
        }
        Kind::File => {
            let path = std::env::temp_dir().join(format!(
                "tegra-interop-sim-probe-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .unwrap();
            std::fs::remove_file(&path).unwrap();
            f.set_len(1 << 20).unwrap();
            Made {
                fd: Tracked::new(f.into()),
                _keep: Vec::new(),
                mark: Cell::new(0),
            }
        }
        Kind::Pipe => {
            let mut ends = [-1; 2];
            // SAFETY: `ends` is an array of two ints.
            let rc = unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) };
            assert_eq!(rc, 0);
            // SAFETY: two fresh descriptors nobody else owns.
            let (r, w) = unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
            Made {
                fd: Tracked::new(r),
                _keep: vec![w],
                mark: Cell::new(0),
            }
        }
        Kind::Socket => {
            let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
            Made {
                fd: Tracked::new(a.into()),
                _keep: vec![b.into()],
                mark: Cell::new(0),
            }
        }
    }
}

/// How many times the simulator recorded closing the caller's fd `raw`
/// since ledger entry `since`.
fn closed_callers(c: &Cu, raw: i32, since: usize) -> usize {
    c.sim
        .fd_events()
        .iter()
        .skip(since)
        .filter(|e| e.fd == raw && e.action == FdAction::ClosedCallers)
        .count()
}

/// The probe's `open-same`: the number is open and still names the same
/// file, and the simulator did not close it. Then the test closes it.
fn assert_open_same(c: &Cu, m: Made, what: &str) {
    assert!(m.fd.still_open(), "{what}: fd not open-same");
    assert_eq!(
        closed_callers(c, m.fd.raw, m.mark.get()),
        0,
        "{what}: closed by the sim"
    );
    m.fd.close();
}

/// A fresh fd of each of `kinds`, imported by `row`, gives `want` and stays open and
/// unchanged (the probe's `open-same`).
fn each_kind_keeps_fd(c: &Cu, kinds: &[Kind], want: u32, row: impl Fn(&Made) -> u32) {
    for &kind in kinds {
        let m = make(kind);
        assert_eq!(row(&m), want, "{kind:?}");
        assert_open_same(c, m, &format!("{kind:?}"));
    }
}

/// The probe's `closed`: the import closed it (exactly once).
fn assert_closed(c: &Cu, m: &Made, what: &str) {
    assert!(!m.fd.still_open(), "{what}: fd still open");
    assert_eq!(
        closed_callers(c, m.fd.raw, m.mark.get()),
        1,
        "{what}: not closed by the sim"
    );
}

fn mem_desc(
    kind: u32,
    fd: i32,
    size: u64,
    flags: u32,
    reserved: bool,
) -> CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
    let mut d = CUDA_EXTERNAL_MEMORY_HANDLE_DESC::default();
    d.type_ = CUexternalMemoryHandleType(kind);
    d.handle.fd = fd;
    d.size = size;
    d.flags = flags;
    if reserved {
        d.reserved[3] = 1;
    }
    d
}

/// One memory row: a fresh simulator with a current context (unless
/// `no_ctx`), one import; returns the code.
fn mem_row(c: &Cu, kind: u32, m: &Made, size: u64, flags: u32, reserved: bool) -> u32 {
    m.mark.set(c.sim.fd_events().len());
    let d = mem_desc(kind, m.fd.raw, size, flags, reserved);
    let mut out: CUexternalMemory = std::ptr::null_mut();
    let r = cu!(c.t, cuImportExternalMemory(&mut out, &d));
    assert!(out.is_null(), "a failed import wrote a handle");
    r
}

fn sem_row(c: &Cu, kind: u32, m: &Made, flags: u32, reserved: bool) -> u32 {
    m.mark.set(c.sim.fd_events().len());
    let mut d = CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC::default();
    d.type_ = CUexternalSemaphoreHandleType(kind);
    d.handle.fd = m.fd.raw;
    d.flags = flags;
    if reserved {
        d.reserved[2] = 1;
    }
    let mut out: CUexternalSemaphore = std::ptr::null_mut();
    let r = cu!(c.t, cuImportExternalSemaphore(&mut out, &d));
    assert!(out.is_null(), "a failed import wrote a handle");
    r
}

fn ctx_cu() -> Cu {
    let c = Cu::new();
    let _ = c.ctx();
    c
}

fn clean(c: &Cu) {
    let l = c.sim.ledger();
    assert_eq!(
        (l.live_memories, l.live_semaphores, l.open_fds),
        (0, 0, 0),
        "{l}"
    );
}

// ------------------------------------------------------------ memory rows

#[test]
fn mem_opaque_fd_size_4096_of_any_non_gpu_fd_is_unknown_and_closed() {
    // devnull, memfd, file, pipe, socket: 999, closed. The memfd and the
    // regular file were accepted as allocations by the simulator before.
    let c = ctx_cu();
    for kind in ALL {
        let m = make(kind);
        assert_eq!(
            mem_row(&c, OPAQUE_FD, &m, 4096, 0, false),
            UNKNOWN,
            "{kind:?}"
        );
        assert_closed(&c, &m, &format!("{kind:?}"));
    }
    clean(&c);
}

#[test]
fn mem_opaque_fd_size_0_is_invalid_value_and_keeps_the_fd() {
    let c = ctx_cu();
    each_kind_keeps_fd(&c, &[Kind::DevNull, Kind::Memfd], INVALID_VALUE, |m| {
        mem_row(&c, OPAQUE_FD, m, 0, 0, false)
    });
    // The same for the simulator's own exported memory.
    let (fd, _mem) = export::memory(4096).unwrap();
    let m = Made::of(fd);
    assert_eq!(mem_row(&c, OPAQUE_FD, &m, 0, 0, false), INVALID_VALUE);
    assert_open_same(&c, m, "exported");
    clean(&c);
}

#[test]
fn mem_opaque_fd_unknown_flag_is_invalid_value_and_keeps_the_fd() {
    let c = ctx_cu();
    each_kind_keeps_fd(&c, &[Kind::DevNull, Kind::Memfd], INVALID_VALUE, |m| {
        mem_row(&c, OPAQUE_FD, m, 4096, 2, false)
    });
    clean(&c);
}

#[test]
fn mem_opaque_fd_dedicated_flag_is_valid_so_devnull_is_unknown_and_closed() {
    let c = ctx_cu();
    let m = make(Kind::DevNull);
    assert_eq!(mem_row(&c, OPAQUE_FD, &m, 4096, DEDICATED, false), UNKNOWN);
    assert_closed(&c, &m, "devnull");
    // And the flag is accepted with real exported memory.
    let (fd, _mem) = export::memory(4096).unwrap();
    let d = mem_desc(
        OPAQUE_FD,
        std::os::fd::IntoRawFd::into_raw_fd(fd),
        4096,
        DEDICATED,
        false,
    );
    let mut out: CUexternalMemory = std::ptr::null_mut();
    assert_eq!(cu!(c.t, cuImportExternalMemory(&mut out, &d)), SUCCESS);
    assert_eq!(cu!(c.t, cuDestroyExternalMemory(out)), SUCCESS);
    clean(&c);
}

#[test]
fn mem_opaque_fd_reserved_word_is_invalid_value_and_keeps_the_fd() {
    let c = ctx_cu();
    each_kind_keeps_fd(&c, &[Kind::DevNull, Kind::Memfd], INVALID_VALUE, |m| {
        mem_row(&c, OPAQUE_FD, m, 4096, 0, true)
    });
    clean(&c);
}

#[test]
fn mem_type_0_and_unknown_type_42_are_invalid_value_and_keep_the_fd() {
    let c = ctx_cu();
    for kind in [0, 42] {
        let m = make(Kind::DevNull);
        assert_eq!(
            mem_row(&c, kind, &m, 4096, 0, false),
            INVALID_VALUE,
            "type {kind}"
        );
        assert_open_same(&c, m, &format!("type {kind}"));
    }
    clean(&c);
}

#[test]
fn mem_opaque_win32_is_not_supported_and_leaves_the_fd() {
    // Measured for OPAQUE_WIN32 with an fd in the union; the KMT and D3D
    // kinds (3..=7) are chosen the same.
    let c = ctx_cu();
    for kind in OPAQUE_WIN32..=7 {
        let m = make(Kind::DevNull);
        assert_eq!(
            mem_row(&c, kind, &m, 4096, 0, false),
            NOT_SUPPORTED,
            "type {kind}"
        );
        assert_open_same(&c, m, &format!("type {kind}"));
    }
    clean(&c);
}

#[test]
fn mem_dmabuf_fd_valid_is_not_supported_parameter_errors_invalid_value_fd_kept() {
    let c = ctx_cu();
    let m = make(Kind::Memfd);
    assert_eq!(mem_row(&c, DMABUF_FD, &m, 4096, 0, false), NOT_SUPPORTED);
    assert_open_same(&c, m, "dmabuf 4096");
    let m = make(Kind::Memfd);
    assert_eq!(mem_row(&c, DMABUF_FD, &m, 0, 0, false), INVALID_VALUE);
    assert_open_same(&c, m, "dmabuf size 0");
    let m = make(Kind::Memfd);
    assert_eq!(mem_row(&c, DMABUF_FD, &m, 4096, 0, true), INVALID_VALUE);
    assert_open_same(&c, m, "dmabuf reserved");
    clean(&c);
}

#[test]
fn mem_opaque_fd_huge_size_of_a_memfd_is_unknown_and_closed() {
    let c = ctx_cu();
    let m = make(Kind::Memfd);
    assert_eq!(mem_row(&c, OPAQUE_FD, &m, 1 << 50, 0, false), UNKNOWN);
    assert_closed(&c, &m, "memfd 1<<50");
    clean(&c);
}

#[test]
fn mem_opaque_fd_without_a_current_context_is_invalid_context_and_keeps_the_fd() {
    let c = ctx_cu();
    assert_eq!(cu!(c.t, cuCtxSetCurrent(std::ptr::null_mut())), SUCCESS);
    each_kind_keeps_fd(&c, &[Kind::DevNull, Kind::Memfd], INVALID_CONTEXT, |m| {
        mem_row(&c, OPAQUE_FD, m, 4096, 0, false)
    });
    // Exported memory too: the context is checked before the fd.
    let (fd, _mem) = export::memory(4096).unwrap();
    let m = Made::of(fd);
    assert_eq!(mem_row(&c, OPAQUE_FD, &m, 4096, 0, false), INVALID_CONTEXT);
    assert_open_same(&c, m, "exported");
    clean(&c);
}

#[test]
fn mem_opaque_fd_of_a_closed_fd_number_is_unknown() {
    let c = ctx_cu();
    // A number far above what the test process uses (the probe used 900).
    let raw = 900;
    assert!(file_id(raw).is_none(), "fd 900 is open in the test process");
    let d = mem_desc(OPAQUE_FD, raw, 4096, 0, false);
    let mut out: CUexternalMemory = std::ptr::null_mut();
    assert_eq!(cu!(c.t, cuImportExternalMemory(&mut out, &d)), UNKNOWN);
    assert!(file_id(raw).is_none());
    // Nothing was open, so nothing was closed.
    assert_eq!(closed_callers(&c, raw, 0), 0);
    clean(&c);
}

// ------------------------------------------------------------ semaphore rows

#[test]
fn sem_opaque_fd_without_a_current_context_is_invalid_context_and_keeps_the_fd() {
    let c = ctx_cu();
    assert_eq!(cu!(c.t, cuCtxSetCurrent(std::ptr::null_mut())), SUCCESS);
    let m = make(Kind::DevNull);
    assert_eq!(sem_row(&c, OPAQUE_FD, &m, 0, false), INVALID_CONTEXT);
    assert_open_same(&c, m, "devnull");
    clean(&c);
}

#[test]
fn sem_opaque_and_timeline_fd_of_any_non_semaphore_fd_are_unknown_and_keep_the_fd() {
    let c = ctx_cu();
    for sem_kind in [OPAQUE_FD, SEM_TIMELINE_FD] {
        for kind in ALL {
            let m = make(kind);
            let what = format!("type {sem_kind} {kind:?}");
            assert_eq!(sem_row(&c, sem_kind, &m, 0, false), UNKNOWN, "{what}");
            assert_open_same(&c, m, &what);
        }
    }
    clean(&c);
}

#[test]
fn sem_bad_flags_reserved_or_kind_are_invalid_value_and_keep_the_fd() {
    let c = ctx_cu();
    let rows: [(&str, u32, u32, bool); 4] = [
        ("flags=1", OPAQUE_FD, 1, false),
        ("reserved!=0", OPAQUE_FD, 0, true),
        ("type 0", 0, 0, false),
        ("type 42", 42, 0, false),
    ];
    for (what, kind, flags, reserved) in rows {
        let m = make(Kind::DevNull);
        assert_eq!(
            sem_row(&c, kind, &m, flags, reserved),
            INVALID_VALUE,
            "{what}"
        );
        assert_open_same(&c, m, what);
    }
    clean(&c);
}

#[test]
fn sem_windows_kinds_are_not_supported_and_leave_the_fd() {
    // Chosen like the measured OPAQUE_WIN32 memory import.
    let c = ctx_cu();
    for kind in [2, 3, 4, 5, 7, 8, 10] {
        let m = make(Kind::DevNull);
        assert_eq!(
            sem_row(&c, kind, &m, 0, false),
            NOT_SUPPORTED,
            "type {kind}"
        );
        assert_open_same(&c, m, &format!("type {kind}"));
    }
    clean(&c);
}

// ------------------------------------------------------------ what a GPU allocation is

#[test]
fn only_the_exporters_memfd_is_a_gpu_allocation() {
    let c = ctx_cu();
    // A memfd carrying the exporter's name but made by hand (not sealed the
    // exporter's way) is refused like any other memfd.
    // SAFETY: the name is a NUL-terminated literal.
    let raw = unsafe {
        libc::memfd_create(
            c"tegra-interop-sim:exported-gpu-memory".as_ptr(),
            libc::MFD_CLOEXEC,
        )
    };
    assert!(raw >= 0);
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: resizing our own memfd.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) }, 0);
    let m = Made::of(fd);
    assert_eq!(mem_row(&c, OPAQUE_FD, &m, 4096, 0, false), UNKNOWN);
    assert_closed(&c, &m, "look-alike memfd");
    // An exported semaphore is not memory either.
    let (fd, _sem) = export::binary_semaphore().unwrap();
    let m = Made::of(fd);
    assert_eq!(mem_row(&c, OPAQUE_FD, &m, 4096, 0, false), UNKNOWN);
    assert_closed(&c, &m, "semaphore as memory");
    // The exporter's memory, also under another number (a dup), is.
    let (fd, _mem) = export::memory(4096).unwrap();
    let again = fd.try_clone().unwrap();
    drop(fd);
    let m = Made::of(again);
    assert_eq!(mem_row_ok(&c, &m), SUCCESS);
    assert!(!m.fd.still_open());
    assert!(
        c.sim
            .diagnostics()
            .iter()
            .filter(|d| d.kind == DiagnosticKind::Misuse)
            .count()
            == 2
    );
}

fn mem_row_ok(c: &Cu, m: &Made) -> u32 {
    let d = mem_desc(OPAQUE_FD, m.fd.raw, 4096, 0, false);
    let mut out: CUexternalMemory = std::ptr::null_mut();
    let r = cu!(c.t, cuImportExternalMemory(&mut out, &d));
    if r == SUCCESS {
        assert_eq!(cu!(c.t, cuDestroyExternalMemory(out)), SUCCESS);
    }
    r
}

#[test]
fn an_exported_memory_fd_received_over_a_socket_is_still_recognised() {
    // SCM_RIGHTS gives the receiver a new number on the same open file (as
    // across processes); recognition reads the memfd name, not a number.
    let c = ctx_cu();
    let (fd, mem) = export::memory(4096).unwrap();
    mem.fill(7);
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    send_fd(a.as_raw_fd(), fd.as_raw_fd());
    drop(fd);
    let got = recv_fd(b.as_raw_fd());
    let m = Made::of(got);
    let d = mem_desc(OPAQUE_FD, m.fd.raw, 4096, 0, false);
    let mut out: CUexternalMemory = std::ptr::null_mut();
    assert_eq!(cu!(c.t, cuImportExternalMemory(&mut out, &d)), SUCCESS);
    assert!(!m.fd.still_open());
    let (r, p) = c.map(out, 0, 4096);
    assert_eq!(r, SUCCESS);
    assert_eq!(c.dtoh(p, 16), vec![7u8; 16]);
    assert_eq!(cu!(c.t, cuMemFree(p)), SUCCESS);
    assert_eq!(cu!(c.t, cuDestroyExternalMemory(out)), SUCCESS);
    clean(&c);
}

fn send_fd(sock: i32, fd: i32) {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: all-zero is a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points at `space` bytes, enough for one fd.
    unsafe {
        let cm = libc::CMSG_FIRSTHDR(&msg);
        (*cm).cmsg_level = libc::SOL_SOCKET;
        (*cm).cmsg_type = libc::SCM_RIGHTS;
        (*cm).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<i32>(), fd);
    }
    // SAFETY: a valid message on our own socket.
    assert_eq!(unsafe { libc::sendmsg(sock, &msg, 0) }, 1);
}

fn recv_fd(sock: i32) -> OwnedFd {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: all-zero is a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: buffers live for the call.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    assert_eq!(n, 1);
    // SAFETY: one SCM_RIGHTS message with one fd was received.
    let fd = unsafe {
        let cm = libc::CMSG_FIRSTHDR(&msg);
        assert!(!cm.is_null());
        std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast::<i32>())
    };
    // SAFETY: the kernel installed a new descriptor for us.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

// ------------------------------------------------------------ injected failures

#[test]
fn injected_opaque_fd_memory_failures_close_only_for_import_stage_codes() {
    // Chosen from the measurement: codes that only ever came from the
    // parameter checks (or come before them) keep the fd; any other code
    // models a failure of the import itself and closes it.
    let c = ctx_cu();
    for (code, closes) in [
        (INVALID_VALUE, false),
        (INVALID_CONTEXT, false),
        (NOT_INITIALIZED, false),
        (DEINITIALIZED, false),
        (UNKNOWN, true),
        (2, true),   // OUT_OF_MEMORY
        (304, true), // OPERATING_SYSTEM
        (NOT_SUPPORTED, true),
    ] {
        let (fd, _mem) = export::memory(4096).unwrap();
        let m = Made::of(fd);
        c.sim.fail_at(c.sim.calls(), code);
        assert_eq!(mem_row(&c, OPAQUE_FD, &m, 4096, 0, false), code);
        if closes {
            assert_closed(&c, &m, &format!("injected {code}"));
        } else {
            assert_open_same(&c, m, &format!("injected {code}"));
        }
    }
    // Semaphore imports keep the fd whatever the injected code.
    for code in [INVALID_VALUE, UNKNOWN, 2] {
        let (fd, _sem) = export::binary_semaphore().unwrap();
        let m = Made::of(fd);
        c.sim.fail_at(c.sim.calls(), code);
        assert_eq!(sem_row(&c, OPAQUE_FD, &m, 0, false), code);
        assert_open_same(&c, m, &format!("sem injected {code}"));
    }
    clean(&c);
}
