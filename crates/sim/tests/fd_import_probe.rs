//! Every row of the H200 fd-import probe (`crates/sim/measurements/
//! fd_import_probe.c`, output `fd_import_probe.h200.txt`, 2026-11-23),
//! replayed against the simulator's C entry points: the code AND what
//! became of the fd (still open and the same file by st_dev/st_ino, or
//! closed by the import).
//!
//! "Closed" is checked two ways, because tests run in parallel threads and a
//! closed number can be reused at once by another test: the number no longer
//! names the same open file description (a sibling test's fresh open of
//! /dev/null is the same file, but not the same description; see
//! `Tracked`), and the simulator's fd ledger recorded closing the caller's
//! fd under that number.
#![allow(clippy::unwrap_used, clippy::field_reassign_with_default)]
mod common;
use common::*;
use std::cell::Cell;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};

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
        Made::keeping(fd, Vec::new())
    }

    /// `fd`, with `keep` held open alongside it.
    fn keeping(fd: OwnedFd, keep: Vec<OwnedFd>) -> Made {
        Made {
            fd: Tracked::new(fd),
            _keep: keep,
            mark: Cell::new(0),
        }
    }
}

fn make(kind: Kind) -> Made {
    match kind {
        Kind::DevNull => Made::of(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
                .unwrap()
                .into(),
        ),
        // An arbitrary memfd (not memory the simulator's exporter made).
        Kind::Memfd => Made::of(memfd(c"p", 1 << 20)),
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
            Made::of(f.into())
        }
        Kind::Pipe => {
            let mut ends = [-1; 2];
            // SAFETY: `ends` is an array of two ints.
            let rc = unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) };
            assert_eq!(rc, 0);
            // SAFETY: two fresh descriptors nobody else owns.
            let (r, w) = unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
            Made::keeping(r, vec![w])
        }
        Kind::Socket => {
            let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
            Made::keeping(a.into(), vec![b.into()])
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

/// The probe's `closed`: the import closed it (exactly once).
fn assert_closed(c: &Cu, m: &Made, what: &str) {
    assert!(!m.fd.still_open(), "{what}: fd still open");
    assert_eq!(
        closed_callers(c, m.fd.raw, m.mark.get()),
        1,
        "{what}: not closed by the sim"
    );
}

/// What an import left of the caller's fd, in the probe's words.
#[derive(Clone, Copy, Debug)]
enum Fate {
    OpenSame,
    Closed,
}

/// One row of the probe: `row` imports the fd of `m` and gives `want`, and
/// the fd then is as `fate` says ([`assert_open_same`], [`assert_closed`]).
fn expect_row(c: &Cu, m: Made, what: &str, want: u32, fate: Fate, row: impl FnOnce(&Made) -> u32) {
    assert_eq!(row(&m), want, "{what}");
    match fate {
        Fate::OpenSame => assert_open_same(c, m, what),
        Fate::Closed => assert_closed(c, &m, what),
    }
}

/// [`expect_row`] for a fresh fd of each of `kinds`.
fn each_kind(c: &Cu, kinds: &[Kind], want: u32, fate: Fate, row: impl Fn(&Made) -> u32) {
    for &kind in kinds {
        expect_row(c, make(kind), &format!("{kind:?}"), want, fate, &row);
    }
}

/// [`expect_row`] for a fresh /dev/null fd per handle type of `types`, which
/// `row` imports as that type and which stays open.
fn each_type(
    c: &Cu,
    types: impl IntoIterator<Item = u32>,
    want: u32,
    row: impl Fn(u32, &Made) -> u32,
) {
    for ty in types {
        let m = make(Kind::DevNull);
        expect_row(c, m, &format!("type {ty}"), want, Fate::OpenSame, |m| {
            row(ty, m)
        });
    }
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

/// cuImportExternalMemory with `d`: (code, handle).
fn import_mem(c: &Cu, d: &CUDA_EXTERNAL_MEMORY_HANDLE_DESC) -> (u32, CUexternalMemory) {
    let mut out: CUexternalMemory = std::ptr::null_mut();
    let r = cu!(c.t, cuImportExternalMemory(&mut out, d));
    (r, out)
}

/// One memory row: the fd of `m` imported with these descriptor fields, an
/// import that must fail without writing a handle; its code.
fn mem_row(c: &Cu, kind: u32, m: &Made, size: u64, flags: u32, reserved: bool) -> u32 {
    m.mark.set(c.sim.fd_events().len());
    let (r, out) = import_mem(c, &mem_desc(kind, m.fd.raw, size, flags, reserved));
    assert!(out.is_null(), "a failed import wrote a handle");
    r
}

/// One semaphore row, like [`mem_row`].
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
    let c = Cu::ready();
    each_kind(&c, &ALL, UNKNOWN, Fate::Closed, |m| {
        mem_row(&c, OPAQUE_FD, m, 4096, 0, false)
    });
    clean(&c);
}

const DEVNULL_AND_MEMFD: [Kind; 2] = [Kind::DevNull, Kind::Memfd];

/// [`each_kind`] on /dev/null and a memfd, then the same row on memory the
/// simulator exported: each gives `want` and keeps the fd.
fn keeps_fd_even_when_exported(c: &Cu, want: u32, row: impl Fn(&Made) -> u32 + Copy) {
    each_kind(c, &DEVNULL_AND_MEMFD, want, Fate::OpenSame, row);
    let (fd, _mem) = export::memory(4096).unwrap();
    expect_row(c, Made::of(fd), "exported", want, Fate::OpenSame, row);
}

#[test]
fn mem_opaque_fd_size_0_is_invalid_value_and_keeps_the_fd() {
    // Kept for any fd, the simulator's own exported memory included.
    let c = Cu::ready();
    keeps_fd_even_when_exported(&c, INVALID_VALUE, |m| {
        mem_row(&c, OPAQUE_FD, m, 0, 0, false)
    });
    clean(&c);
}

#[test]
fn mem_opaque_fd_unknown_flag_is_invalid_value_and_keeps_the_fd() {
    let c = Cu::ready();
    each_kind(&c, &DEVNULL_AND_MEMFD, INVALID_VALUE, Fate::OpenSame, |m| {
        mem_row(&c, OPAQUE_FD, m, 4096, 2, false)
    });
    clean(&c);
}

#[test]
fn mem_opaque_fd_dedicated_flag_is_valid_so_devnull_is_unknown_and_closed() {
    let c = Cu::ready();
    expect_row(
        &c,
        make(Kind::DevNull),
        "devnull",
        UNKNOWN,
        Fate::Closed,
        |m| mem_row(&c, OPAQUE_FD, m, 4096, DEDICATED, false),
    );
    // And the flag is accepted with real exported memory.
    let (fd, _mem) = export::memory(4096).unwrap();
    let d = mem_desc(OPAQUE_FD, fd.into_raw_fd(), 4096, DEDICATED, false);
    let (r, out) = import_mem(&c, &d);
    assert_eq!(r, SUCCESS);
    assert_eq!(cu!(c.t, cuDestroyExternalMemory(out)), SUCCESS);
    clean(&c);
}

#[test]
fn mem_opaque_fd_reserved_word_is_invalid_value_and_keeps_the_fd() {
    let c = Cu::ready();
    each_kind(&c, &DEVNULL_AND_MEMFD, INVALID_VALUE, Fate::OpenSame, |m| {
        mem_row(&c, OPAQUE_FD, m, 4096, 0, true)
    });
    clean(&c);
}

#[test]
fn mem_type_0_and_unknown_type_42_are_invalid_value_and_keep_the_fd() {
    let c = Cu::ready();
    each_type(&c, [0, 42], INVALID_VALUE, |ty, m| {
        mem_row(&c, ty, m, 4096, 0, false)
    });
    clean(&c);
}

#[test]
fn mem_opaque_win32_is_not_supported_and_leaves_the_fd() {
    // Measured for OPAQUE_WIN32 with an fd in the union; the KMT and D3D
    // kinds (3..=7) are chosen the same.
    let c = Cu::ready();
    each_type(&c, OPAQUE_WIN32..=7, NOT_SUPPORTED, |ty, m| {
        mem_row(&c, ty, m, 4096, 0, false)
    });
    clean(&c);
}

#[test]
fn mem_dmabuf_fd_valid_is_not_supported_parameter_errors_invalid_value_fd_kept() {
    let c = Cu::ready();
    let rows = [
        ("dmabuf 4096", 4096, false, NOT_SUPPORTED),
        ("dmabuf size 0", 0, false, INVALID_VALUE),
        ("dmabuf reserved", 4096, true, INVALID_VALUE),
    ];
    for (what, size, reserved, want) in rows {
        expect_row(&c, make(Kind::Memfd), what, want, Fate::OpenSame, |m| {
            mem_row(&c, DMABUF_FD, m, size, 0, reserved)
        });
    }
    clean(&c);
}

#[test]
fn mem_opaque_fd_huge_size_of_a_memfd_is_unknown_and_closed() {
    let c = Cu::ready();
    expect_row(
        &c,
        make(Kind::Memfd),
        "memfd 1<<50",
        UNKNOWN,
        Fate::Closed,
        |m| mem_row(&c, OPAQUE_FD, m, 1 << 50, 0, false),
    );
    clean(&c);
}

#[test]
fn mem_opaque_fd_without_a_current_context_is_invalid_context_and_keeps_the_fd() {
    let c = Cu::ready();
    assert_eq!(cu!(c.t, cuCtxSetCurrent(std::ptr::null_mut())), SUCCESS);
    // Exported memory too: the context is checked before the fd.
    keeps_fd_even_when_exported(&c, INVALID_CONTEXT, |m| {
        mem_row(&c, OPAQUE_FD, m, 4096, 0, false)
    });
    clean(&c);
}

#[test]
fn mem_opaque_fd_of_a_closed_fd_number_is_unknown() {
    let c = Cu::ready();
    // A number far above what the test process uses (the probe used 900).
    let raw = 900;
    assert!(file_id(raw).is_none(), "fd 900 is open in the test process");
    let d = mem_desc(OPAQUE_FD, raw, 4096, 0, false);
    assert_eq!(import_mem(&c, &d).0, UNKNOWN);
    assert!(file_id(raw).is_none());
    // Nothing was open, so nothing was closed.
    assert_eq!(closed_callers(&c, raw, 0), 0);
    clean(&c);
}

// ------------------------------------------------------------ semaphore rows

#[test]
fn sem_opaque_fd_without_a_current_context_is_invalid_context_and_keeps_the_fd() {
    let c = Cu::ready();
    assert_eq!(cu!(c.t, cuCtxSetCurrent(std::ptr::null_mut())), SUCCESS);
    expect_row(
        &c,
        make(Kind::DevNull),
        "devnull",
        INVALID_CONTEXT,
        Fate::OpenSame,
        |m| sem_row(&c, OPAQUE_FD, m, 0, false),
    );
    clean(&c);
}

#[test]
fn sem_opaque_and_timeline_fd_of_any_non_semaphore_fd_are_unknown_and_keep_the_fd() {
    let c = Cu::ready();
    for sem_kind in [OPAQUE_FD, SEM_TIMELINE_FD] {
        for kind in ALL {
            let what = format!("type {sem_kind} {kind:?}");
            expect_row(&c, make(kind), &what, UNKNOWN, Fate::OpenSame, |m| {
                sem_row(&c, sem_kind, m, 0, false)
            });
        }
    }
    clean(&c);
}

#[test]
fn sem_bad_flags_reserved_or_kind_are_invalid_value_and_keep_the_fd() {
    let c = Cu::ready();
    let rows: [(&str, u32, u32, bool); 4] = [
        ("flags=1", OPAQUE_FD, 1, false),
        ("reserved!=0", OPAQUE_FD, 0, true),
        ("type 0", 0, 0, false),
        ("type 42", 42, 0, false),
    ];
    for (what, kind, flags, reserved) in rows {
        expect_row(
            &c,
            make(Kind::DevNull),
            what,
            INVALID_VALUE,
            Fate::OpenSame,
            |m| sem_row(&c, kind, m, flags, reserved),
        );
    }
    clean(&c);
}

#[test]
fn sem_windows_kinds_are_not_supported_and_leave_the_fd() {
    // Chosen like the measured OPAQUE_WIN32 memory import.
    let c = Cu::ready();
    each_type(&c, [2, 3, 4, 5, 7, 8, 10], NOT_SUPPORTED, |ty, m| {
        sem_row(&c, ty, m, 0, false)
    });
    clean(&c);
}

// ------------------------------------------------------------ what a GPU allocation is

#[test]
fn only_the_exporters_memfd_is_a_gpu_allocation() {
    let c = Cu::ready();
    let row = |m: &Made| mem_row(&c, OPAQUE_FD, m, 4096, 0, false);
    // A memfd carrying the exporter's name but made by hand (not sealed the
    // exporter's way) is refused like any other memfd.
    let fd = memfd(c"tegra-interop-sim:exported-gpu-memory", 4096);
    expect_row(
        &c,
        Made::of(fd),
        "look-alike memfd",
        UNKNOWN,
        Fate::Closed,
        row,
    );
    // An exported semaphore is not memory either.
    let (fd, _sem) = export::binary_semaphore().unwrap();
    expect_row(
        &c,
        Made::of(fd),
        "semaphore as memory",
        UNKNOWN,
        Fate::Closed,
        row,
    );
    // The exporter's memory, also under another number (a dup), is.
    let (fd, _mem) = export::memory(4096).unwrap();
    let again = fd.try_clone().unwrap();
    drop(fd);
    let m = Made::of(again);
    let (r, out) = import_mem(&c, &mem_desc(OPAQUE_FD, m.fd.raw, 4096, 0, false));
    assert_eq!(r, SUCCESS);
    assert_eq!(cu!(c.t, cuDestroyExternalMemory(out)), SUCCESS);
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

#[test]
fn an_exported_memory_fd_received_over_a_socket_is_still_recognised() {
    // SCM_RIGHTS gives the receiver a new number on the same open file (as
    // across processes); recognition reads the memfd name, not a number.
    let c = Cu::ready();
    let (fd, mem) = export::memory(4096).unwrap();
    mem.fill(7);
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    send_fd(a.as_raw_fd(), fd.as_raw_fd());
    drop(fd);
    let got = recv_fd(b.as_raw_fd());
    let m = Made::of(got);
    let (r, out) = import_mem(&c, &mem_desc(OPAQUE_FD, m.fd.raw, 4096, 0, false));
    assert_eq!(r, SUCCESS);
    assert!(!m.fd.still_open());
    let (r, p) = c.map(out, 0, 4096);
    assert_eq!(r, SUCCESS);
    assert_eq!(c.dtoh(p, 16), vec![7u8; 16]);
    assert_eq!(cu!(c.t, cuMemFree(p)), SUCCESS);
    assert_eq!(cu!(c.t, cuDestroyExternalMemory(out)), SUCCESS);
    clean(&c);
}

/// Runs `f` on a message of one data byte with control space for one fd
/// (its buffers live for the call).
fn with_one_fd_message<R>(f: impl FnOnce(&mut libc::msghdr) -> R) -> R {
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
    f(&mut msg)
}

fn send_fd(sock: i32, fd: i32) {
    with_one_fd_message(|msg| {
        // SAFETY: msg_control points at enough bytes for one fd.
        unsafe {
            let cm = libc::CMSG_FIRSTHDR(msg);
            (*cm).cmsg_level = libc::SOL_SOCKET;
            (*cm).cmsg_type = libc::SCM_RIGHTS;
            (*cm).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<i32>(), fd);
        }
        // SAFETY: a valid message on our own socket.
        assert_eq!(unsafe { libc::sendmsg(sock, msg, 0) }, 1);
    });
}

fn recv_fd(sock: i32) -> OwnedFd {
    let fd = with_one_fd_message(|msg| {
        // SAFETY: the message's buffers live for the call.
        let n = unsafe { libc::recvmsg(sock, msg, libc::MSG_CMSG_CLOEXEC) };
        assert_eq!(n, 1);
        // SAFETY: one SCM_RIGHTS message with one fd was received.
        unsafe {
            let cm = libc::CMSG_FIRSTHDR(msg);
            assert!(!cm.is_null());
            std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast::<i32>())
        }
    });
    // SAFETY: the kernel installed a new descriptor for us.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

// ------------------------------------------------------------ injected failures

#[test]
fn injected_opaque_fd_memory_failures_close_only_for_import_stage_codes() {
    // Chosen from the measurement: codes that only ever came from the
    // parameter checks (or come before them) keep the fd; any other code
    // models a failure of the import itself and closes it.
    let c = Cu::ready();
    for (code, fate) in [
        (INVALID_VALUE, Fate::OpenSame),
        (INVALID_CONTEXT, Fate::OpenSame),
        (NOT_INITIALIZED, Fate::OpenSame),
        (DEINITIALIZED, Fate::OpenSame),
        (UNKNOWN, Fate::Closed),
        (2, Fate::Closed),   // OUT_OF_MEMORY
        (304, Fate::Closed), // OPERATING_SYSTEM
        (NOT_SUPPORTED, Fate::Closed),
    ] {
        let (fd, _mem) = export::memory(4096).unwrap();
        c.sim.fail_at(c.sim.calls(), code);
        expect_row(
            &c,
            Made::of(fd),
            &format!("injected {code}"),
            code,
            fate,
            |m| mem_row(&c, OPAQUE_FD, m, 4096, 0, false),
        );
    }
    // Semaphore imports keep the fd whatever the injected code.
    for code in [INVALID_VALUE, UNKNOWN, 2] {
        let (fd, _sem) = export::binary_semaphore().unwrap();
        c.sim.fail_at(c.sim.calls(), code);
        let what = format!("sem injected {code}");
        expect_row(&c, Made::of(fd), &what, code, Fate::OpenSame, |m| {
            sem_row(&c, OPAQUE_FD, m, 0, false)
        });
    }
    clean(&c);
}

/// The "closed" check must not be fooled by another thread opening the same
/// path onto the number an import just closed: same file (device, inode),
/// but a new open file description. This is the reuse CI met under qemu.
#[test]
fn a_number_reopened_on_the_same_path_is_not_still_open() {
    let open_null = || -> OwnedFd { std::fs::File::open("/dev/null").unwrap().into() };
    let tracked = Tracked::new(open_null());
    assert!(tracked.still_open());
    let other = open_null();
    assert_eq!(
        same_description(tracked.raw, other.as_raw_fd()),
        Some(false),
        "kcmp(KCMP_FILE) must be available: the fd-ownership tests rely on it"
    );
    // dup2 closes the tracked number and opens the other /dev/null on it.
    // SAFETY: both numbers are this test's own; the tracked one is given up.
    let rc = unsafe { libc::dup2(other.as_raw_fd(), tracked.raw) };
    assert_eq!(rc, tracked.raw);
    assert_eq!(file_id(tracked.raw), Some(tracked.id), "same file");
    assert!(
        !tracked.still_open(),
        "a new description on the same number"
    );
    // SAFETY: the number now holds this test's duplicate of `other`.
    drop(unsafe { OwnedFd::from_raw_fd(tracked.raw) });
}
