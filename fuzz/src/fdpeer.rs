//! The fd two-process mode's channel fed by a hostile peer (part of
//! `peer_messages`): the input's bytes cross a real Unix socket pair as they
//! are (any lengths, any kinds), the first carrying as many memfds as the
//! input's first byte says (0..=40, beyond the channel's limit of 2), and a typed message is decoded straight from the input
//! too. Properties: nothing panics or hangs (every receive is bounded); a
//! body that decodes re-encodes to the same bytes; every refusal is a typed
//! error; a memory message's fd is checked against its declared size
//! (fstat) before anything else; once everything is dropped the process has
//! exactly the fds it had before.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use tegra_interop_pipeline::multicast::process::McMsg;
use tegra_interop_pipeline::transport::fdpass::{
    check_memory_fd, open_fds, Channel, FdError, FdMsg, FdSize, Limits,
};

fn memfd(len: u64) -> OwnedFd {
    let fd = rustix::fs::memfd_create("fdpeer", rustix::fs::MemfdFlags::CLOEXEC).expect("memfd");
    rustix::fs::ftruncate(&fd, len).expect("ftruncate");
    fd
}

/// The fd part of `peer_messages`.
pub fn fd_peer(data: &[u8]) {
    if let Ok(m) = FdMsg::decode(data) {
        assert_eq!(m.encode(), data, "{m:?} does not re-encode to its bytes");
    }
    // The multicast-over-processes messages (`multicast::process`) too.
    if let Ok(m) = McMsg::decode(data) {
        assert_eq!(m.encode(), data, "{m:?} does not re-encode to its bytes");
    }
    let before = open_fds().expect("/proc/self/fd");
    exchange(data);
    assert_eq!(open_fds().expect("/proc/self/fd"), before, "an fd left open");
}

fn exchange(data: &[u8]) {
    let limits = Limits::new(Duration::from_secs(5));
    let (mut tx, mut rx) = Channel::pair(limits).expect("a socket pair");
    let count = data.first().map_or(0, |&b| usize::from(b % 41));
    let fds: Vec<OwnedFd> = (0..count).map(|i| memfd(64 << (i % 4))).collect();
    let bytes = data.to_vec();
    let peer = std::thread::spawn(move || {
        let b: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        // The receiver may give up first (a broken channel): a failed send
        // is part of the game.
        let _ = tx.send_raw(&bytes, &b, "the receiver to take the input");
    });
    for _ in 0..=data.len() {
        match rx.recv_msg(&|| "the next message".into()) {
            Ok((FdMsg::Memory { size, .. }, fds)) => {
                match check_memory_fd(fds[0].as_fd(), size, 1, 1 << 32) {
                    Ok(FdSize::Known(actual)) => assert!(size <= actual),
                    Ok(FdSize::Opaque) => panic!("a memfd reported as opaque"),
                    Err(FdError::SizeExceedsFd { .. } | FdError::SizeOutOfRange { .. }) => {}
                    Err(e) => panic!("an unexpected error checking a memfd: {e}"),
                }
            }
            Ok(_) => {}
            Err(FdError::Closed { .. } | FdError::Broken(_) | FdError::Truncated { .. }) => break,
            Err(FdError::Timeout { .. }) => panic!("the receiver waited though the peer closed"),
            Err(_) => {}
        }
    }
    peer.join().expect("the peer thread");
}
