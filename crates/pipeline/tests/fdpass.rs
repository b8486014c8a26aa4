//! The fd channel against a hostile peer: forged sizes, fd floods, a peer
//! of another uid, truncated and oversized messages. Each must give a typed
//! error, leave the receiver working (this test process) and leave the fd
//! ledger (`/proc/self/fd`) where it was.
//!
//! The peer is the other end of a socket pair driven through the channel's
//! raw send ([`Channel::send_raw`]), which writes any bytes with any fds.
//! The ledger counts the whole process, so the tests take one lock and run
//! one at a time.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)]

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tegra_interop_pipeline::transport::fdpass::{
    check_memory_fd, open_fds, Channel, FdError, FdMsg, FdSize, Limits, HARD_MAX_FDS,
};

static LEDGER: Mutex<()> = Mutex::new(());

/// Runs `f` with the ledger lock and checks the fd count is back where it
/// was once everything `f` made is dropped.
fn ledgered(f: impl FnOnce()) {
    let _one = LEDGER.lock().unwrap_or_else(|e| e.into_inner());
    let before = open_fds().unwrap();
    f();
    assert_eq!(open_fds().unwrap(), before, "fds left behind");
}

fn limits() -> Limits {
    Limits::new(Duration::from_secs(2))
}

/// A memfd of `len` bytes.
fn memfd(len: u64) -> OwnedFd {
    let fd = rustix::fs::memfd_create("fdpass-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&fd, len).unwrap();
    fd
}

/// A length-prefixed frame of `body` (what `Channel::send` writes).
fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

/// The receiver still works: a good message comes through.
fn still_works(tx: &mut Channel, rx: &mut Channel) {
    tx.send_msg(&FdMsg::End, &[]).unwrap();
    assert_eq!(rx.recv_msg(&|| "the end".into()).unwrap().0, FdMsg::End);
}

#[test]
fn a_memory_fd_crosses_and_its_size_is_checked() {
    ledgered(|| {
        let (mut tx, mut rx) = Channel::pair(limits()).unwrap();
        assert_eq!(rx.peer().uid, rustix::process::getuid().as_raw());
        let fd = memfd(8192);
        let m = FdMsg::Memory {
            slot: 0,
            size: 8192,
            dedicated: false,
        };
        tx.send_msg(&m, &[fd.as_fd()]).unwrap();
        let (got, fds) = rx.recv_msg(&|| "slot 0's memory".into()).unwrap();
        assert_eq!((got, fds.len()), (m, 1));
        let size = check_memory_fd(fds[0].as_fd(), 8192, 4096, 1 << 20).unwrap();
        assert_eq!(size, FdSize::Known(8192));
    });
}

#[test]
fn a_forged_size_over_a_small_memfd_is_refused_before_import() {
    ledgered(|| {
        let (mut tx, mut rx) = Channel::pair(limits()).unwrap();
        let small = memfd(4096);
        let forged = FdMsg::Memory {
            slot: 0,
            size: 1 << 30,
            dedicated: false,
        };
        tx.send_msg(&forged, &[small.as_fd()]).unwrap();
        let (_, fds) = rx.recv_msg(&|| "slot 0's memory".into()).unwrap();
        let e = check_memory_fd(fds[0].as_fd(), 1 << 30, 4096, 1 << 31).unwrap_err();
        assert!(
            matches!(
                e,
                FdError::SizeExceedsFd {
                    declared: 0x4000_0000,
                    actual: 4096
                }
            ),
            "{e}"
        );
        // Outside what the receiver accepts at all: refused before fstat.
        let e = check_memory_fd(fds[0].as_fd(), 1 << 40, 4096, 1 << 31).unwrap_err();
        assert!(matches!(e, FdError::SizeOutOfRange { .. }), "{e}");
        drop(fds);
        still_works(&mut tx, &mut rx);
    });
}

#[test]
fn an_fd_flood_in_one_message_is_refused_and_every_fd_closed() {
    ledgered(|| {
        let (mut tx, mut rx) = Channel::pair(limits()).unwrap();
        // Within the receive buffer but over the limit: the message is read
        // whole, refused, its fds closed; the channel goes on.
        let many: Vec<OwnedFd> = (0..HARD_MAX_FDS).map(|_| memfd(64)).collect();
        let b: Vec<BorrowedFd<'_>> = many.iter().map(|f| f.as_fd()).collect();
        tx.send_raw(&frame(&FdMsg::End.encode()), &b, "flood")
            .unwrap();
        let e = rx.recv(&|| "a message".into()).unwrap_err();
        assert!(
            matches!(
                e,
                FdError::TooManyFds {
                    received: 16,
                    max: 2,
                    truncated: false
                }
            ),
            "{e}"
        );
        still_works(&mut tx, &mut rx);
        // Far over the limit, within the kernel's per-message maximum: the
        // receive buffer holds them all, so every one is owned here and
        // closed; the channel goes on.
        let more: Vec<OwnedFd> = (0..200).map(|_| memfd(64)).collect();
        let b: Vec<BorrowedFd<'_>> = more.iter().map(|f| f.as_fd()).collect();
        tx.send_raw(&frame(&FdMsg::End.encode()), &b, "flood")
            .unwrap();
        let e = rx.recv(&|| "a message".into()).unwrap_err();
        assert!(
            matches!(
                e,
                FdError::TooManyFds {
                    received: 200,
                    max: 2,
                    truncated: false
                }
            ),
            "{e}"
        );
        still_works(&mut tx, &mut rx);
    });
}

/// Whether this runs under the cross test runner (qemu-user).
fn emulated() -> bool {
    std::env::var("TEGRA_INTEROP_TEST_RUNNER").is_ok_and(|r| !r.trim().is_empty())
}

/// A receive buffer smaller than the flood: the kernel cuts the control
/// data (MSG_CTRUNC) and drops the fds that did not fit; the channel
/// reports it and breaks. Under qemu-user the emulator receives into a
/// larger buffer of its own and does not close what it cuts (its fds stay
/// open in this process), so the ledger is checked natively only.
#[test]
fn a_flood_beyond_the_receive_buffer_is_detected_by_msg_ctrunc() {
    let _one = LEDGER.lock().unwrap_or_else(|e| e.into_inner());
    let before = open_fds().unwrap();
    {
        let small = Limits {
            fd_buffer: 4,
            ..limits()
        };
        let (mut tx, mut rx) = Channel::pair(small).unwrap();
        let more: Vec<OwnedFd> = (0..100).map(|_| memfd(64)).collect();
        let b: Vec<BorrowedFd<'_>> = more.iter().map(|f| f.as_fd()).collect();
        tx.send_raw(&frame(&FdMsg::End.encode()), &b, "flood")
            .unwrap();
        let e = rx.recv(&|| "a message".into()).unwrap_err();
        assert!(
            matches!(
                e,
                FdError::TooManyFds {
                    truncated: true,
                    ..
                }
            ),
            "{e}"
        );
        let e = rx.recv(&|| "a message".into()).unwrap_err();
        assert!(matches!(e, FdError::Broken(_)), "{e}");
    }
    if !emulated() {
        assert_eq!(open_fds().unwrap(), before, "fds left behind");
    }
}

#[test]
fn an_fd_flood_of_many_messages_is_refused_message_by_message() {
    ledgered(|| {
        let (mut tx, mut rx) = Channel::pair(limits()).unwrap();
        let fd = memfd(64);
        let peer = std::thread::spawn(move || {
            for _ in 0..500 {
                // `end` carries no fds: each one with an fd is refused.
                tx.send_raw(&frame(&FdMsg::End.encode()), &[fd.as_fd()], "flood")
                    .unwrap();
            }
            tx
        });
        for _ in 0..500 {
            let e = rx.recv_msg(&|| "a message".into()).unwrap_err();
            assert!(
                matches!(
                    e,
                    FdError::WrongFdCount {
                        kind: "end",
                        want: 0,
                        got: 1
                    }
                ),
                "{e}"
            );
        }
        let mut tx = peer.join().unwrap();
        still_works(&mut tx, &mut rx);
    });
}

#[test]
fn fds_inside_a_body_are_refused_and_closed() {
    ledgered(|| {
        let (mut tx, mut rx) = Channel::pair(limits()).unwrap();
        let fd = memfd(64);
        let body = FdMsg::End.encode();
        tx.send_raw(&(body.len() as u32).to_le_bytes(), &[], "header")
            .unwrap();
        tx.send_raw(&body, &[fd.as_fd()], "body").unwrap();
        let e = rx.recv(&|| "a message".into()).unwrap_err();
        assert!(matches!(e, FdError::StrayFds { count: 1 }), "{e}");
    });
}

/// The kernel's check with the expected uid given: a test cannot change
/// its own uid, so it expects one the peer (this process) does not have.
/// `wrong_uid_of_a_real_peer_process` runs a real peer under another uid
/// where the tests run as root.
#[test]
fn a_peer_of_another_uid_is_refused_naming_both() {
    ledgered(|| {
        let (a, _b) = UnixStream::pair().unwrap();
        let ours = rustix::process::getuid().as_raw();
        let other = ours.wrapping_add(1);
        let e = Channel::with_expected_uid(a, limits(), other).unwrap_err();
        assert!(
            matches!(e, FdError::WrongUid { ours: o, peer: p } if o == other && p == ours),
            "{e}"
        );
        assert!(e.to_string().contains(&format!("uid {ours}")), "{e}");
    });
}

const PEER_PATH: &str = "TEGRA_INTEROP_FDPASS_PEER";

/// The peer process of `wrong_uid_of_a_real_peer_process`: connects to the
/// socket named in the environment and waits for the other side to close.
#[test]
#[ignore = "the peer process of wrong_uid_of_a_real_peer_process (run by it)"]
fn peer_process() {
    let path = std::env::var(PEER_PATH).unwrap();
    let mut s = UnixStream::connect(path).unwrap();
    let mut b = [0u8; 1];
    let _ = std::io::Read::read(&mut s, &mut b);
}

#[test]
#[ignore = "needs root: starts a peer process under uid 65534"]
fn wrong_uid_of_a_real_peer_process() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = std::env::temp_dir().join(format!("fdpass-uid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = dir.join("sock");
    let listener = UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "peer_process", "--ignored", "--nocapture"])
        .env(PEER_PATH, &path)
        .uid(65534)
        .gid(65534)
        .spawn()
        .unwrap();
    let e = Channel::accept(&listener, limits()).unwrap_err();
    let ours = rustix::process::getuid().as_raw();
    assert!(
        matches!(e, FdError::WrongUid { ours: o, peer: 65534 } if o == ours),
        "{e}"
    );
    child.wait().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_oversized_message_is_refused_unread_and_breaks_the_channel() {
    ledgered(|| {
        let (mut tx, mut rx) = Channel::pair(limits()).unwrap();
        let fd = memfd(64);
        let header = (1u32 << 30).to_le_bytes();
        tx.send_raw(&header, &[fd.as_fd()], "header").unwrap();
        let e = rx.recv(&|| "a message".into()).unwrap_err();
        assert!(
            matches!(
                e,
                FdError::MessageTooLarge {
                    declared: 0x4000_0000,
                    max: 4096
                }
            ),
            "{e}"
        );
        let e = rx.recv(&|| "a message".into()).unwrap_err();
        assert!(matches!(e, FdError::Broken(_)), "{e}");
        // This side refuses to send oversized bodies too.
        let e = tx.send(&vec![0; 5000], &[]).unwrap_err();
        assert!(matches!(e, FdError::MessageTooLarge { .. }), "{e}");
    });
}

#[test]
fn a_truncated_message_is_refused() {
    ledgered(|| {
        let (mut tx, mut rx) = Channel::pair(limits()).unwrap();
        let fd = memfd(64);
        let mut f = frame(&[7u8; 100]);
        f.truncate(30);
        tx.send_raw(&f, &[fd.as_fd()], "part").unwrap();
        drop(tx);
        let e = rx.recv(&|| "a message".into()).unwrap_err();
        assert!(
            matches!(
                e,
                FdError::Truncated {
                    expected: 104,
                    got: 30
                }
            ),
            "{e}"
        );
        // A malformed body in a whole frame: refused, the channel goes on.
        let (mut tx, mut rx) = Channel::pair(limits()).unwrap();
        tx.send(&[42, 1, 2], &[]).unwrap();
        let e = rx.recv_msg(&|| "a message".into()).unwrap_err();
        assert!(matches!(e, FdError::BadMessage(_)), "{e}");
        still_works(&mut tx, &mut rx);
    });
}

#[test]
fn a_silent_peer_times_out_naming_the_wait_and_a_gone_one_is_closed() {
    ledgered(|| {
        let limits = Limits::new(Duration::from_millis(300));
        let (tx, mut rx) = Channel::pair(limits).unwrap();
        let start = Instant::now();
        let e = rx.recv(&|| "frame 7 to be written".into()).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(3));
        assert!(
            matches!(&e, FdError::Timeout { waiting_for, .. } if waiting_for == "frame 7 to be written"),
            "{e}"
        );
        drop(tx);
        let e = rx.recv(&|| "its figures".into()).unwrap_err();
        assert!(matches!(e, FdError::Closed { .. }), "{e}");
        // A peer that reads nothing: sends stop at the limit.
        let (mut tx, _rx) = Channel::pair(limits).unwrap();
        let big = vec![0u8; 4000];
        let start = Instant::now();
        let e = loop {
            if let Err(e) = tx.send(&big, &[]) {
                break e;
            }
        };
        assert!(start.elapsed() < Duration::from_secs(3));
        assert!(matches!(e, FdError::Timeout { .. }), "{e}");
    });
}

#[test]
fn a_memory_fd_fstat_cannot_size_is_bounded_by_the_receiver_alone() {
    ledgered(|| {
        // A socket stands for a driver's opaque handle: not a regular file.
        let (a, _b) = UnixStream::pair().unwrap();
        let size = check_memory_fd(a.as_fd(), 8192, 4096, 1 << 21).unwrap();
        assert_eq!(size, FdSize::Opaque);
        let e = check_memory_fd(a.as_fd(), (1 << 21) + 1, 4096, 1 << 21).unwrap_err();
        assert!(
            matches!(
                e,
                FdError::SizeOutOfRange {
                    declared: 0x20_0001,
                    least: 4096,
                    most: 0x20_0000
                }
            ),
            "{e}"
        );
        let e = check_memory_fd(a.as_fd(), 100, 4096, 1 << 21).unwrap_err();
        assert!(matches!(e, FdError::SizeOutOfRange { .. }), "{e}");
    });
}
