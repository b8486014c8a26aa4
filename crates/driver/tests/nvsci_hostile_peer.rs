//! The driver's receive side against a hostile peer, over a real simulated
//! NvSciIpc endpoint pair (two simulators: two processes' libraries): a
//! peer that rewrites what it sends (a buffer descriptor claiming 1 MiB over
//! a 4 KiB object, a list carrying the private topology keys), or floods
//! the connection with legal exports or frames. Each ends in a typed
//! [`IpcError`] on the side that was wronged, that side alive (it answers
//! on the same connection afterwards), the simulators' ledgers clean and
//! the process's fds (`/proc/self/fd`) back where they were.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tegra_interop_core::nvsci::{BufAttr, BufAttrSet};
use tegra_interop_core::sys::nvsci::{
    NvSciBufAttrValAccessPerm as Perm, NvSciBufType, NvSciError as RawError,
    PFN_NvSciIpcGetEventSafe as RawGetEvent,
};
use tegra_interop_core::NvSciError;
use tegra_interop_driver::nvsci::{BufModule, BufPerm, IpcEndpoint, IpcError, NvSciIpc, Timeout};
use tegra_interop_driver::{Backend, Error};
use tegra_interop_sim::nvsci::{forge, IpcConfigFile};
use tegra_interop_sim::{Sim, SimConfig};

const NFRAMES: u32 = 8;
const RAW_SIZE_KEY: u32 = 0x10000;
const SHORT: Duration = Duration::from_millis(300);

/// Every test here counts the process's open fds: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Two simulators with connected endpoints "p" (the first) and "c".
struct Pair {
    p: NvSciIpc,
    c: NvSciIpc,
    bp: Arc<Backend>,
    bc: Arc<Backend>,
    sp: Sim,
    sc: Sim,
    _cfg: IpcConfigFile,
}

fn pair() -> Pair {
    pair_of(NFRAMES, 1024)
}

/// [`pair`] over a pair of `nframes` frames of `frame_size` bytes.
fn pair_of(nframes: u32, frame_size: u32) -> Pair {
    let cfg = IpcConfigFile::inter_process(&[("p", "c", nframes, frame_size)]).unwrap();
    // Quiet: forged descriptors are refused on purpose; the tests read the
    // diagnostics.
    let mk = || {
        Sim::with_config(
            SimConfig::tegra()
                .with_nvsciipc_config(cfg.path())
                .with_diagnostic_echo(false),
        )
        .unwrap()
    };
    let (sp, sc) = (mk(), mk());
    let (bp, bc) = (sp.backend(), sc.backend());
    let (p, c) = std::thread::scope(|s| {
        let p = s.spawn(|| NvSciIpc::open(&bp, "p", Duration::from_secs(10)).unwrap());
        let c = NvSciIpc::open(&bc, "c", Duration::from_secs(10)).unwrap();
        (p.join().unwrap(), c)
    });
    Pair {
        p,
        c,
        bp,
        bc,
        sp,
        sc,
        _cfg: cfg,
    }
}

impl Pair {
    /// Closes everything; both simulators' ledgers must be clean.
    /// An NvSciBuf module on each side (producer, consumer).
    fn buf_modules(&self) -> (BufModule, BufModule) {
        (
            BufModule::open(&self.bp).unwrap(),
            BufModule::open(&self.bc).unwrap(),
        )
    }

    fn finish(self) {
        let Pair {
            p,
            c,
            bp,
            bc,
            sp,
            sc,
            _cfg,
        } = self;
        drop((p, c, bp, bc));
        for sim in [&sp, &sc] {
            assert!(sim.ledger().is_clean(), "{}", sim.ledger());
            assert!(sim.nvsci_ledger().is_clean(), "{}", sim.nvsci_ledger());
        }
    }
}

fn raw(size: u64, perm: Perm) -> BufAttrSet<4> {
    let mut a = BufAttrSet::new();
    a.set(BufAttr::types(&[NvSciBufType::NvSciBufType_RawBuffer]).unwrap())
        .unwrap();
    a.set(BufAttr::RawSize(size)).unwrap();
    a.set(BufAttr::NeedCpuAccess(true)).unwrap();
    a.set(BufAttr::RequiredPerm(perm)).unwrap();
    a
}

/// A peer's endpoint that rewrites its `n`-th outgoing message with
/// `rewrite` (index, bytes -> bytes), or swallows every outgoing message.
struct Hostile<'a> {
    inner: &'a mut NvSciIpc,
    sent: usize,
    rewrite: &'a dyn Fn(usize, Vec<u8>) -> Vec<u8>,
    swallow: bool,
}

// SAFETY: `handle` forwards to the wrapped `NvSciIpc`, which keeps its
// endpoint open for as long as this value lives (it borrows it).
unsafe impl IpcEndpoint for Hostile<'_> {
    fn handle(&self) -> u64 {
        self.inner.handle()
    }
    fn send(&mut self, message: &[u8]) -> Result<(), IpcError> {
        let n = self.sent;
        self.sent += 1;
        if self.swallow {
            return Ok(());
        }
        self.inner.send(&(self.rewrite)(n, message.to_vec()))
    }
    fn recv(&mut self) -> Result<Vec<u8>, IpcError> {
        self.inner.recv()
    }
}

fn nvsci_code(e: &IpcError) -> Option<(&'static str, NvSciError)> {
    match e {
        IpcError::Driver(Error::NvSci { call, code }) => Some((call, *code)),
        _ => None,
    }
}

/// The receiver answers on the same connection: it is alive.
fn still_talking(from: &mut NvSciIpc, to: &mut NvSciIpc) {
    from.send(b"still here").unwrap();
    assert_eq!(to.recv().unwrap(), b"still here");
}

/// Issue 23's SIGBUS: the producer legally exports a 4 KiB object, then
/// rewrites the reconciled list and the descriptor it sends to claim 1 MiB.
/// The consumer's `receive_obj` is refused by the import (BadParameter),
/// nothing of the object stays open.
#[test]
fn an_oversized_buffer_descriptor_is_a_typed_error_and_leaks_nothing() {
    let _lock = serial();
    let baseline = open_fds();
    let mut pr = pair();
    const BIG: u64 = 1 << 20;
    let (bufs_p, bufs_c) = pr.buf_modules();
    let mine = bufs_c
        .attr_list(&raw(BIG, Perm::NvSciBufAccessPerm_Readonly))
        .unwrap();
    bufs_c.send_unreconciled(&[&mine], &mut pr.c).unwrap();
    // The hostile producer shrinks the consumer's request before importing
    // it, so its 4 KiB object is legally in the consumer's topology.
    let asked = pr.p.recv().unwrap();
    let shrunk = forge::with_key(&asked, RAW_SIZE_KEY, &4096u64.to_ne_bytes()).unwrap();
    let theirs = {
        let mut relay = Relay(Some(shrunk), &mut pr.p);
        bufs_p.receive_unreconciled(&mut relay).unwrap()
    };
    let own = bufs_p
        .attr_list(&raw(4096, Perm::NvSciBufAccessPerm_ReadWrite))
        .unwrap();
    let obj = bufs_p.reconcile_and_alloc(&[&own, &theirs]).unwrap();
    let lie = |n: usize, bytes: Vec<u8>| match n {
        0 => forge::with_key(&bytes, RAW_SIZE_KEY, &BIG.to_ne_bytes()).unwrap(),
        _ => {
            let mut b = bytes;
            b[16..24].copy_from_slice(&BIG.to_ne_bytes());
            b
        }
    };
    let mut hostile = Hostile {
        inner: &mut pr.p,
        sent: 0,
        rewrite: &lie,
        swallow: false,
    };
    obj.send(Some(BufPerm::ReadOnly), &mut hostile).unwrap();
    let err = bufs_c
        .receive_obj(
            &mut pr.c,
            &[&mine],
            BufPerm::ReadOnly,
            Timeout::After(SHORT),
        )
        .expect_err("a descriptor claiming more than its memory");
    assert_eq!(
        nvsci_code(&err),
        Some(("NvSciBufObjIpcImport", NvSciError::BAD_PARAMETER)),
        "{err}"
    );
    still_talking(&mut pr.c, &mut pr.p);
    drop((obj, own, theirs, mine, bufs_p, bufs_c));
    pr.finish();
    assert_eq!(open_fds(), baseline);
}

/// An endpoint that hands out one given message first, then the real ones.
struct Relay<'a>(Option<Vec<u8>>, &'a mut NvSciIpc);

// SAFETY: as for `Hostile`: the borrowed `NvSciIpc`'s own endpoint.
unsafe impl IpcEndpoint for Relay<'_> {
    fn handle(&self) -> u64 {
        self.1.handle()
    }
    fn send(&mut self, message: &[u8]) -> Result<(), IpcError> {
        self.1.send(message)
    }
    fn recv(&mut self) -> Result<Vec<u8>, IpcError> {
        match self.0.take() {
            Some(m) => Ok(m),
            None => self.1.recv(),
        }
    }
}

/// The topology keys export strips, put back by the sending peer: the
/// receiver's `receive_unreconciled` is refused (BadParameter).
#[test]
fn forged_private_keys_are_a_typed_error() {
    let _lock = serial();
    let baseline = open_fds();
    let mut pr = pair();
    let (bufs_p, bufs_c) = pr.buf_modules();
    let mine = bufs_c
        .attr_list(&raw(4096, Perm::NvSciBufAccessPerm_Readonly))
        .unwrap();
    let forge_topology = |_: usize, bytes: Vec<u8>| {
        let record: Vec<u8> = [1u64, 3].iter().flat_map(|w| w.to_ne_bytes()).collect();
        forge::with_key(&bytes, forge::FIRST_PRIVATE_KEY + 1, &record).unwrap()
    };
    let mut hostile = Hostile {
        inner: &mut pr.c,
        sent: 0,
        rewrite: &forge_topology,
        swallow: false,
    };
    bufs_c.send_unreconciled(&[&mine], &mut hostile).unwrap();
    let err = bufs_p
        .receive_unreconciled(&mut pr.p)
        .expect_err("a forged private key");
    assert_eq!(
        nvsci_code(&err),
        Some((
            "NvSciBufAttrListIpcImportUnreconciled",
            NvSciError::BAD_PARAMETER
        )),
        "{err}"
    );
    still_talking(&mut pr.p, &mut pr.c);
    // The same list, honestly sent, imports.
    bufs_c.send_unreconciled(&[&mine], &mut pr.c).unwrap();
    let theirs = bufs_p.receive_unreconciled(&mut pr.p).unwrap();
    drop((theirs, mine, bufs_p, bufs_c));
    pr.finish();
    assert_eq!(open_fds(), baseline);
}

/// Legal exports of one object to a consumer that imports none (the
/// descriptors are never even sent): after `nframes` the export answers
/// InsufficientMemory, a typed error; the consumer holds exactly `nframes`
/// fds for them, and the connection stands.
#[test]
fn an_export_flood_is_bounded_by_nframes_with_a_typed_error() {
    let _lock = serial();
    let baseline = open_fds();
    let mut pr = pair();
    let (bufs_p, bufs_c) = pr.buf_modules();
    let mine = bufs_c
        .attr_list(&raw(4096, Perm::NvSciBufAccessPerm_Readonly))
        .unwrap();
    bufs_c.send_unreconciled(&[&mine], &mut pr.c).unwrap();
    let theirs = bufs_p.receive_unreconciled(&mut pr.p).unwrap();
    let own = bufs_p
        .attr_list(&raw(4096, Perm::NvSciBufAccessPerm_ReadWrite))
        .unwrap();
    let obj = bufs_p.reconcile_and_alloc(&[&own, &theirs]).unwrap();
    let before = open_fds();
    let keep = |_: usize, b: Vec<u8>| b;
    let mut hole = Hostile {
        inner: &mut pr.p,
        sent: 0,
        rewrite: &keep,
        swallow: true,
    };
    let mut ok = 0;
    let mut last = None;
    for _ in 0..1000 {
        match obj.send(Some(BufPerm::ReadOnly), &mut hole) {
            Ok(()) => ok += 1,
            Err(e) => last = Some(e),
        }
    }
    assert_eq!(ok, NFRAMES);
    let err = last.unwrap();
    assert_eq!(
        nvsci_code(&err),
        Some(("NvSciBufObjIpcExport", NvSciError::INSUFFICIENT_MEMORY)),
        "{err}"
    );
    // The consumer takes in what came (its next message follows them).
    still_talking(&mut pr.p, &mut pr.c);
    assert_eq!(open_fds() - before, NFRAMES as usize);
    still_talking(&mut pr.c, &mut pr.p);
    drop((obj, own, theirs, mine, bufs_p, bufs_c));
    pr.finish();
    assert_eq!(open_fds(), baseline);
}

/// Messages to a consumer that reads none: once `nframes` frames wait, the
/// sender's `send` gives a typed Timeout (the write channel stays full);
/// the consumer then reads every message that went, and the connection
/// stands.
#[test]
fn a_message_flood_is_back_pressure_and_a_typed_timeout() {
    let _lock = serial();
    let baseline = open_fds();
    let mut pr = pair();
    pr.p.set_timeout(SHORT);
    let mut sent = 0u32;
    let err = loop {
        match pr.p.send(&sent.to_ne_bytes()) {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent <= 1000, "no back-pressure");
    };
    assert!(matches!(err, IpcError::Timeout { .. }), "{err}");
    assert_eq!(sent, NFRAMES);
    for k in 0..sent {
        assert_eq!(pr.c.recv().unwrap(), k.to_ne_bytes());
    }
    still_talking(&mut pr.c, &mut pr.p);
    pr.finish();
    assert_eq!(open_fds(), baseline);
}

/// Issue 31: a peer that reads nothing, over pairs whose frames the
/// simulator's socket holds fewer than `nframes` of (16 x 65536, 64 x 65536,
/// 32 x 24576): a `send` with a 3 s timeout was still spinning at 20 s (the
/// library reported WRITE while WriteSafe answered "full", and the retry
/// loop never looked at its deadline). Now the send gives up within its
/// limit with a typed Timeout that says it waited for room in the write
/// channel; the consumer then reads every message that went.
#[test]
fn a_send_to_a_silent_peer_times_out_within_its_limit() {
    let _lock = serial();
    for (nframes, frame_size) in [(16, 65536), (64, 65536), (32, 24576)] {
        let mut pr = pair_of(nframes, frame_size);
        let mut p = pr.p;
        p.set_timeout(SHORT);
        let message = vec![0x5au8; 4 * frame_size as usize];
        let (tx, rx) = std::sync::mpsc::channel();
        // In a thread of its own: before the fix the send never returned.
        std::thread::spawn(move || {
            let mut sent = 0u32;
            let (err, took) = loop {
                let t0 = Instant::now();
                match p.send(&message) {
                    Ok(()) => sent += 1,
                    Err(e) => break (e, t0.elapsed()),
                }
                if sent > 10 * nframes {
                    panic!("no back-pressure");
                }
            };
            let _ = tx.send((p, sent, err, took));
        });
        let (p, sent, err, took) = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{nframes}x{frame_size}: the send was still going at 20 s"));
        assert!(
            matches!(err, IpcError::Timeout { .. }),
            "{nframes}x{frame_size}: {err}"
        );
        assert!(
            err.to_string().contains("room in the write channel"),
            "{nframes}x{frame_size}: {err}"
        );
        assert!(
            took < SHORT + Duration::from_secs(3),
            "{nframes}x{frame_size}: the failing send took {took:?}"
        );
        pr.p = p;
        pr.c.set_timeout(Duration::from_secs(10));
        for _ in 0..sent {
            assert_eq!(pr.c.recv().unwrap().len(), 4 * frame_size as usize);
        }
        pr.finish();
    }
}

/// Issue 31: a buffer descriptor naming an object that was never sent (the
/// peer rewrote its transfer id) made the import wait the simulator's 30 s,
/// whatever the caller's `Timeout`. The import now waits at most the
/// caller's limit, then answers a typed error; the receiver goes on and
/// nothing leaks.
#[test]
fn an_object_never_sent_is_waited_for_only_the_callers_timeout() {
    let _lock = serial();
    let baseline = open_fds();
    let mut pr = pair();
    let (bufs_p, bufs_c) = pr.buf_modules();
    let mine = bufs_c
        .attr_list(&raw(4096, Perm::NvSciBufAccessPerm_Readonly))
        .unwrap();
    bufs_c.send_unreconciled(&[&mine], &mut pr.c).unwrap();
    let theirs = bufs_p.receive_unreconciled(&mut pr.p).unwrap();
    let own = bufs_p
        .attr_list(&raw(4096, Perm::NvSciBufAccessPerm_ReadWrite))
        .unwrap();
    let obj = bufs_p.reconcile_and_alloc(&[&own, &theirs]).unwrap();
    // The descriptor (the second message) names another transfer id.
    let other_id = |n: usize, bytes: Vec<u8>| match n {
        0 => bytes,
        _ => {
            let mut b = bytes;
            let id = u64::from_ne_bytes(b[8..16].try_into().unwrap());
            b[8..16].copy_from_slice(&(id ^ 0x5a5a_5a5a).to_ne_bytes());
            b
        }
    };
    let mut hostile = Hostile {
        inner: &mut pr.p,
        sent: 0,
        rewrite: &other_id,
        swallow: false,
    };
    obj.send(Some(BufPerm::ReadOnly), &mut hostile).unwrap();
    let t0 = Instant::now();
    let err = bufs_c
        .receive_obj(
            &mut pr.c,
            &[&mine],
            BufPerm::ReadOnly,
            Timeout::After(SHORT),
        )
        .expect_err("a descriptor of an object never sent");
    let took = t0.elapsed();
    assert!(took < SHORT + Duration::from_secs(3), "{took:?}: {err}");
    assert_eq!(
        nvsci_code(&err).map(|(call, _)| call),
        Some("NvSciBufObjIpcImport"),
        "{err}"
    );
    still_talking(&mut pr.c, &mut pr.p);
    drop((obj, own, theirs, mine, bufs_p, bufs_c));
    pr.finish();
    assert_eq!(open_fds(), baseline);
}

/// The simulator's `NvSciIpcGetEventSafe`, called by [`always_write`].
static GET_EVENT: Mutex<RawGetEvent> = Mutex::new(None);

/// A library that reports WRITE whatever its write channel holds (the
/// simulator did, before issue 31): the simulator's answer, WRITE added.
unsafe extern "C" fn always_write(h: u64, events: *mut u32) -> RawError {
    let Some(f) = *GET_EVENT.lock().unwrap_or_else(|e| e.into_inner()) else {
        return RawError(1);
    };
    // SAFETY: the caller's arguments, forwarded to the simulator's entry
    // point of the same signature.
    let r = unsafe { f(h, events) };
    if r.0 == 0 && !events.is_null() {
        // SAFETY: a non-null out-pointer the caller gave for one u32.
        unsafe { *events |= 0x2 };
    }
    r
}

/// Issue 31, the driver's half: `transfer` retried a full channel without
/// looking at its deadline, so a library that reports WRITE on a full write
/// channel made `send` spin forever. Over such a library (the simulator
/// with WRITE always added) a send to a peer that reads nothing now ends
/// within its limit with a typed Timeout saying what it waited for.
#[test]
fn a_library_reporting_write_on_a_full_channel_cannot_make_send_spin() {
    let _lock = serial();
    let cfg = IpcConfigFile::inter_process(&[("p", "c", NFRAMES, 1024)]).unwrap();
    let mk = || {
        Sim::with_config(
            SimConfig::tegra()
                .with_nvsciipc_config(cfg.path())
                .with_diagnostic_echo(false),
        )
        .unwrap()
    };
    let (sp, sc) = (mk(), mk());
    let mut table = sp.table();
    *GET_EVENT.lock().unwrap() = table.nvsciipc.NvSciIpcGetEventSafe;
    table.nvsciipc.NvSciIpcGetEventSafe = Some(always_write);
    // SAFETY: the simulator's table keeps `from_table`'s contract (see its
    // README); the one entry replaced forwards to the simulator's and only
    // adds an event bit. `sp` outlives every use of the backend.
    let bp = unsafe { Backend::from_table("sim reporting WRITE always", table) };
    let bc = sc.backend();
    let (mut p, c) = std::thread::scope(|s| {
        let p = s.spawn(|| NvSciIpc::open(&bp, "p", Duration::from_secs(10)).unwrap());
        let c = NvSciIpc::open(&bc, "c", Duration::from_secs(10)).unwrap();
        (p.join().unwrap(), c)
    });
    p.set_timeout(SHORT);
    let (tx, rx) = std::sync::mpsc::channel();
    // In a thread of its own: before the fix the send never returned.
    std::thread::spawn(move || {
        let mut sent = 0u32;
        let (err, took) = loop {
            let t0 = Instant::now();
            match p.send(&sent.to_ne_bytes()) {
                Ok(()) => sent += 1,
                Err(e) => break (e, t0.elapsed()),
            }
            assert!(sent <= 1000, "no back-pressure");
        };
        let _ = tx.send((p, sent, err, took));
    });
    let (p, sent, err, took) = rx
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("the send was still going at 20 s"));
    assert!(matches!(err, IpcError::Timeout { .. }), "{err}");
    assert!(
        err.to_string().contains("room in the write channel"),
        "{err}"
    );
    assert!(took < SHORT + Duration::from_secs(3), "{took:?}");
    assert_eq!(sent, NFRAMES);
    drop((p, c, bp, bc));
    for sim in [&sp, &sc] {
        assert!(sim.nvsci_ledger().is_clean(), "{}", sim.nvsci_ledger());
    }
}
