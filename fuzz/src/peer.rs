//! The peer-message and import paths of the simulator and the driver's
//! receive side, fed by a hostile peer (`peer_messages`).
//!
//! Two simulators (two processes' libraries) get a real endpoint pair. An
//! honest producer (simulator A, through the driver) and consumer
//! (simulator B) run the documented sequence, but every message between
//! them passes through the fuzzer first: the consumer's unreconciled list,
//! the reconciled list and the object descriptor may be patched, replaced
//! by arbitrary bytes, or given extra keys (private ones included); the
//! producer may export the object many times (a flood) and write arbitrary
//! frames. Properties: nothing panics or crashes (an import the simulator
//! accepted is read to its last byte, which faults if the import mapped
//! more than the memory holds); every refusal is a typed error; after
//! everything is dropped both simulators' ledgers are clean and the
//! process has exactly the simulator fds (memfds, sockets, epoll) it had
//! before.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use tegra_interop_core::nvsci::{BufAttr, BufAttrSet};
use tegra_interop_core::sys::nvsci::{NvSciBufAttrValAccessPerm as Perm, NvSciBufType};
use tegra_interop_driver::nvsci::{BufModule, BufPerm, IpcEndpoint, IpcError, Timeout};
use tegra_interop_sim::nvsci::{forge, IpcConfigFile};
use tegra_interop_sim::{FunctionTable, Sim, SimConfig};

/// How one message is tampered with on its way.
#[derive(Arbitrary, Debug)]
enum Tamper {
    Keep,
    /// Overwrite bytes at an offset (wrapped into the message).
    Patch(Vec<(u16, Vec<u8>)>),
    /// Replace the message by these bytes.
    Replace(Vec<u8>),
    /// Set an attribute key (any key, private ones included) in every part.
    Key(u32, Vec<u8>),
    /// Set the RawBuffer size (a list) or the claimed size (a descriptor).
    Size(u64),
}

impl Tamper {
    fn apply(&self, msg: Vec<u8>, descriptor: bool) -> Vec<u8> {
        match self {
            Tamper::Keep => msg,
            Tamper::Patch(ps) => {
                let mut m = msg;
                for (at, bytes) in ps {
                    if m.is_empty() {
                        break;
                    }
                    let at = usize::from(*at) % m.len();
                    for (d, s) in m[at..].iter_mut().zip(bytes) {
                        *d = *s;
                    }
                }
                m
            }
            Tamper::Replace(b) => b.clone(),
            Tamper::Key(k, v) => forge::with_key(&msg, *k, v).unwrap_or(msg),
            Tamper::Size(s) if descriptor => {
                let mut m = msg;
                if let Some(w) = m.get_mut(16..24) {
                    w.copy_from_slice(&s.to_ne_bytes());
                }
                m
            }
            Tamper::Size(s) => forge::with_key(&msg, 0x10000, &s.to_ne_bytes()).unwrap_or(msg),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Script {
    /// The lie told consistently: the reconciled list and the descriptor
    /// both claim this many pages (issue 23's SIGBUS, when it exceeds the
    /// object).
    claim: Option<u8>,
    /// The sizes the consumer and the producer ask for (in pages, 1..=4).
    consumer_pages: u8,
    producer_pages: u8,
    unreconciled: Tamper,
    list: Tamper,
    descriptor: Tamper,
    /// Exports of the object before the one the consumer receives.
    extra_exports: u8,
    /// Whether the consumer checks the reconciled list against its own.
    check_own: bool,
    /// Frames the producer writes (then the consumer reads them).
    frames: Vec<Vec<u8>>,
}

/// An endpoint whose sends are captured and whose receives come from a
/// queue: the messages travel through the fuzzer, the handle is real.
struct Scripted {
    handle: u64,
    out: Vec<Vec<u8>>,
    inbox: std::collections::VecDeque<Vec<u8>>,
}

// SAFETY: `handle` is an endpoint the harness opened with
// `NvSciIpcOpenEndpoint` through the same simulator table as the modules used
// with it, and it stays open (never reset) until `flow` has returned and every
// `Scripted` is gone.
unsafe impl IpcEndpoint for Scripted {
    fn handle(&self) -> u64 {
        self.handle
    }
    fn send(&mut self, message: &[u8]) -> std::result::Result<(), IpcError> {
        self.out.push(message.to_vec());
        Ok(())
    }
    fn recv(&mut self) -> std::result::Result<Vec<u8>, IpcError> {
        self.inbox
            .pop_front()
            .ok_or(IpcError::Malformed("no message (the script ran out)"))
    }
}

/// The fds of this process that a simulator could have left open (its
/// memfds, sockets and epoll fds), by what they are: files other threads
/// open meanwhile (a test harness reading the corpus) do not count.
fn sim_fds() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut v: Vec<String> = dir
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|t| t.to_string_lossy().into_owned())
        .filter(|t| {
            t.starts_with("/memfd:tegra-interop-sim")
                || t.starts_with("socket:")
                || t == "anon_inode:[eventpoll]"
        })
        .collect();
    v.sort();
    v
}

/// Opens `name` through the raw table and resets it: the endpoint handle.
fn open(t: &FunctionTable, name: &std::ffi::CStr) -> u64 {
    let ipc = &t.nvsciipc;
    let mut h = 0u64;
    let mut fd = -1i32;
    // SAFETY: the simulator's own entry points, with valid out-pointers and
    // a NUL-terminated name.
    unsafe {
        assert_eq!(ipc.NvSciIpcInit.expect("NvSciIpcInit")().0, 0);
        assert_eq!(
            ipc.NvSciIpcOpenEndpoint.expect("open")(name.as_ptr(), &mut h).0,
            0
        );
        assert_eq!(ipc.NvSciIpcGetLinuxEventFd.expect("fd")(h, &mut fd).0, 0);
        assert_eq!(ipc.NvSciIpcResetEndpointSafe.expect("reset")(h).0, 0);
    }
    h
}

fn events(t: &FunctionTable, h: u64) -> u32 {
    let mut ev = 0u32;
    // SAFETY: an open endpoint of this simulator; a valid out-pointer.
    let r = unsafe { t.nvsciipc.NvSciIpcGetEventSafe.expect("events")(h, &mut ev) };
    assert_eq!(r.0, 0, "GetEventSafe");
    ev
}

fn raw(pages: u8, perm: Perm) -> BufAttrSet<4> {
    let mut a = BufAttrSet::new();
    let size = 4096 * u64::from(pages % 4 + 1);
    let _ = a.set(BufAttr::types(&[NvSciBufType::NvSciBufType_RawBuffer]).expect("one type"));
    let _ = a.set(BufAttr::RawSize(size));
    let _ = a.set(BufAttr::NeedCpuAccess(true));
    let _ = a.set(BufAttr::RequiredPerm(perm));
    a
}

/// The hostile-peer property (see the module doc).
pub fn peer_messages(data: &[u8]) {
    // The fd two-process mode's channel takes the same bytes first.
    crate::fd_peer(data);
    let mut u = Unstructured::new(data);
    let Ok(script) = Script::arbitrary(&mut u) else {
        return;
    };
    let before = sim_fds();
    run(&script);
    assert_eq!(sim_fds(), before, "an fd left open by {script:?}");
}

fn run(s: &Script) {
    let cfg = IpcConfigFile::inter_process(&[("p", "c", 8, 512)]).expect("config file");
    let mk = || {
        Sim::with_config(
            SimConfig::tegra()
                .with_nvsciipc_config(cfg.path())
                .with_hang_timeout(Duration::from_millis(2)),
        )
        .expect("a simulator")
    };
    let (sp, sc) = (mk(), mk());
    {
        let (tp, tc) = (sp.table(), sc.table());
        let (hp, hc) = (open(&tp, c"p"), open(&tc, c"c"));
        let deadline = Instant::now() + Duration::from_secs(5);
        let (mut ep, mut ec) = (0, 0);
        while (ep & ec & 0x4) == 0 {
            ep |= events(&tp, hp);
            ec |= events(&tc, hc);
            assert!(Instant::now() < deadline, "no connection");
        }
        flow(s, &sp.backend(), &sc.backend(), (&tp, hp), (&tc, hc));
        // SAFETY: endpoints this run opened, closed once.
        unsafe {
            for (t, h) in [(&tp, hp), (&tc, hc)] {
                t.nvsciipc.NvSciIpcCloseEndpointSafe.expect("close")(h, false);
                t.nvsciipc.NvSciIpcDeinit.expect("deinit")();
            }
        }
    }
    for sim in [&sp, &sc] {
        assert!(sim.ledger().is_clean(), "{}", sim.ledger());
        assert!(sim.nvsci_ledger().is_clean(), "{}", sim.nvsci_ledger());
    }
}

fn flow(
    s: &Script,
    bp: &Arc<tegra_interop_driver::Backend>,
    bc: &Arc<tegra_interop_driver::Backend>,
    (tp, hp): (&FunctionTable, u64),
    (tc, hc): (&FunctionTable, u64),
) {
    let (Ok(bufs_p), Ok(bufs_c)) = (BufModule::open(bp), BufModule::open(bc)) else {
        panic!("modules");
    };
    let mut to_p = Scripted {
        handle: hp,
        out: Vec::new(),
        inbox: Default::default(),
    };
    let mut to_c = Scripted {
        handle: hc,
        out: Vec::new(),
        inbox: Default::default(),
    };
    let Ok(mine) = bufs_c.attr_list(&raw(s.consumer_pages, Perm::NvSciBufAccessPerm_Readonly))
    else {
        return;
    };
    if bufs_c.send_unreconciled(&[&mine], &mut to_c).is_err() {
        return;
    }
    to_p.inbox
        .extend(to_c.out.drain(..).map(|m| s.unreconciled.apply(m, false)));
    // A refusal of the peer's list is fine; the producer stops there.
    let Ok(theirs) = bufs_p.receive_unreconciled(&mut to_p) else {
        return;
    };
    let Ok(own) = bufs_p.attr_list(&raw(s.producer_pages, Perm::NvSciBufAccessPerm_ReadWrite))
    else {
        return;
    };
    let Ok(obj) = bufs_p.reconcile_and_alloc(&[&own, &theirs]) else {
        return;
    };
    for _ in 0..s.extra_exports % 24 {
        // Back-pressure after `nframes` is a typed error, never a panic.
        let _ = obj.send(Some(BufPerm::ReadOnly), &mut to_p);
    }
    to_p.out.clear();
    if obj.send(Some(BufPerm::ReadOnly), &mut to_p).is_err() {
        return;
    }
    let mut msgs = to_p.out.drain(..);
    let (Some(list), Some(desc)) = (msgs.next(), msgs.next()) else {
        panic!("BufObj::send sends a list and a descriptor");
    };
    let (mut list, mut desc) = (s.list.apply(list, false), s.descriptor.apply(desc, true));
    if let Some(pages) = s.claim {
        let lie = Tamper::Size(4096 * (u64::from(pages) + 1));
        list = lie.apply(list, false);
        desc = lie.apply(desc, true);
    }
    to_c.inbox.push_back(list);
    to_c.inbox.push_back(desc);
    let own_lists: &[&_] = if s.check_own { &[&mine] } else { &[] };
    let got = bufs_c.receive_obj(
        &mut to_c,
        own_lists,
        BufPerm::ReadOnly,
        Timeout::After(Duration::from_millis(2)),
    );
    if let Ok(o) = got {
        // Accepted: every byte it claims must be there. (A forged list may
        // leave the size or the CPU access unanswerable: typed errors.)
        if let (Ok(size), Ok(p)) = (o.size(), o.const_cpu_ptr()) {
            for at in [0, size / 2, size.saturating_sub(1)] {
                // SAFETY: the library says the object holds `size` readable
                // bytes at `p`; a lie faults here, which is the finding.
                let _ = unsafe { p.as_ptr().add(at as usize).read_volatile() };
            }
        }
    }
    // Frames of any content from the producer; the consumer takes them.
    let ipc_p = &tp.nvsciipc;
    let ipc_c = &tc.nvsciipc;
    for f in s.frames.iter().take(32) {
        let mut n = 0u32;
        let len = f.len().min(512) as u32;
        // SAFETY: `f` holds at least `len` bytes; valid out-pointer.
        let _ =
            unsafe { ipc_p.NvSciIpcWriteSafe.expect("write")(hp, f.as_ptr().cast(), len, &mut n) };
    }
    let mut buf = [0u8; 512];
    for _ in 0..40 {
        let mut n = 0u32;
        // SAFETY: a 512-byte buffer, the frame size; valid out-pointer.
        let r = unsafe {
            ipc_c.NvSciIpcReadSafe.expect("read")(hc, buf.as_mut_ptr().cast(), 512, &mut n)
        };
        if r.0 != 0 {
            break;
        }
    }
}
