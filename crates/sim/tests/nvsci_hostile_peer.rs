//! A hostile peer on a real endpoint pair: what a process at the other end
//! can send without going through the library (forged descriptor bytes,
//! floods of legal exports and frames), each answered with a typed code,
//! the receiver alive and no fd left behind (`/proc/self/fd` before and
//! after). The two simulators stand for the two processes; the endpoints
//! are the simulator's real sockets.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::ffi::c_void;
use std::ptr;
use std::sync::{Mutex, MutexGuard};

use tegra_interop_sim::nvsci::{forge, IpcConfigFile};
use tegra_interop_sim::{DiagnosticKind, FunctionTable, Sim, SimConfig};
use tegra_interop_sys::nvsci::*;

#[macro_use]
mod nvsci_common;
#[macro_use]
mod nvsci_rules;
use nvsci_rules::*;

const INSUFFICIENT_MEMORY: u32 = 0x30;
const NFRAMES: u32 = 16;
const EV_CONN_RESET: u32 = 0x8;

/// Every test of this binary counts the process's open fds: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Open fds of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

struct Peer {
    sim: Sim,
    t: FunctionTable,
    ep: u64,
}

/// Two simulators (two processes) and an established endpoint pair.
struct Peers {
    a: Peer,
    b: Peer,
    _cfg: IpcConfigFile,
}

fn peers() -> Peers {
    let cfg = IpcConfigFile::inter_process(&[("a", "b", NFRAMES, 4096)]).unwrap();
    let mk =
        || nvsci_common::setup_with_config(SimConfig::tegra().with_nvsciipc_config(cfg.path()));
    let (sa, ta) = mk();
    let (sb, tb) = mk();
    let (ea, eb) = nvsci_common::connect_endpoints(&ta, &tb, "a", "b");
    Peers {
        a: Peer {
            sim: sa,
            t: ta,
            ep: ea,
        },
        b: Peer {
            sim: sb,
            t: tb,
            ep: eb,
        },
        _cfg: cfg,
    }
}

/// Events of an endpoint now.
fn events(p: &Peer) -> u32 {
    let mut ev = 0u32;
    assert_eq!(
        call!(p.t.nvsciipc, NvSciIpcGetEventSafe(p.ep, &mut ev)).0,
        OK
    );
    ev
}

/// A raw buffer list of `size` bytes with CPU access, requiring `perm`.
fn raw_list(t: &FunctionTable, m: NvSciBufModule, size: u64, perm: u32) -> NvSciBufAttrList {
    SciBuf::list_of(
        t,
        m,
        &[
            (B_TYPES, u32b(&[1])),
            (B_RAW_SIZE, u64b(&[size])),
            (B_NEED_CPU, vec![1]),
            (B_REQ_PERM, u32b(&[perm])),
        ],
    )
}

/// An attribute-list descriptor's bytes, freed with `free` after copying.
fn take_desc(
    t: &FunctionTable,
    export: impl FnOnce(*mut *mut c_void, *mut usize) -> NvSciError,
) -> Vec<u8> {
    let (mut desc, mut len) = (ptr::null_mut::<c_void>(), 0usize);
    assert_eq!(export(&mut desc, &mut len).0, OK);
    // SAFETY: the library handed out `len` bytes at `desc`.
    let bytes = unsafe { std::slice::from_raw_parts(desc.cast::<u8>(), len) }.to_vec();
    call!(t.nvscibuf, NvSciBufAttrListFreeDesc(desc));
    bytes
}

fn export_unreconciled(p: &Peer, l: NvSciBufAttrList) -> Vec<u8> {
    let lists = [l];
    take_desc(&p.t, |d, n| {
        call!(
            p.t.nvscibuf,
            NvSciBufAttrListIpcExportUnreconciled(lists.as_ptr(), 1, p.ep, d, n)
        )
    })
}

fn export_reconciled(p: &Peer, l: NvSciBufAttrList) -> Vec<u8> {
    take_desc(&p.t, |d, n| {
        call!(
            p.t.nvscibuf,
            NvSciBufAttrListIpcExportReconciled(l, p.ep, d, n)
        )
    })
}

/// ImportUnreconciled of `desc` into `m` over `p`'s endpoint: (code, list).
fn import_unreconciled(p: &Peer, m: NvSciBufModule, desc: &[u8]) -> (u32, NvSciBufAttrList) {
    let mut l = ptr::null_mut();
    let r = call!(
        p.t.nvscibuf,
        NvSciBufAttrListIpcImportUnreconciled(m, p.ep, desc.as_ptr().cast(), desc.len(), &mut l)
    );
    (r.0, l)
}

/// ImportReconciled of `desc` checked against `own`: (code, list).
fn import_reconciled(p: &Peer, desc: &[u8], own: &[NvSciBufAttrList]) -> (u32, NvSciBufAttrList) {
    let m = SciBuf::module(&p.t);
    let mut l = ptr::null_mut();
    let r = call!(
        p.t.nvscibuf,
        NvSciBufAttrListIpcImportReconciled(
            m,
            p.ep,
            desc.as_ptr().cast(),
            desc.len(),
            own.as_ptr(),
            own.len(),
            &mut l
        )
    );
    (r.0, l)
}

fn obj_export(p: &Peer, o: NvSciBufObj) -> (u32, NvSciBufObjIpcExportDescriptor) {
    let mut d = NvSciBufObjIpcExportDescriptor::default();
    let perm = NvSciBufAttrValAccessPerm(READONLY);
    let r = call!(p.t.nvscibuf, NvSciBufObjIpcExport(o, perm, p.ep, &mut d)).0;
    (r, d)
}

fn obj_import(
    p: &Peer,
    d: &NvSciBufObjIpcExportDescriptor,
    l: NvSciBufAttrList,
) -> (u32, NvSciBufObj) {
    let mut o = ptr::null_mut();
    let perm = NvSciBufAttrValAccessPerm(READONLY);
    let r = call!(
        p.t.nvscibuf,
        NvSciBufObjIpcImport(p.ep, d, l, perm, 0, &mut o)
    )
    .0;
    (r, o)
}

/// b's list of `size` bytes goes to a, a reconciles it with its own list of
/// the same size and allocates: (b's own list, a's reconciled list, a's object).
fn shared(p: &Peers, size: u64) -> (NvSciBufAttrList, NvSciBufAttrList, NvSciBufObj) {
    let mb = SciBuf::module(&p.b.t);
    let lb = raw_list(&p.b.t, mb, size, READONLY);
    let ma = SciBuf::module(&p.a.t);
    let (r, theirs) = import_unreconciled(&p.a, ma, &export_unreconciled(&p.b, lb));
    assert_eq!(r, OK);
    let la = raw_list(&p.a.t, ma, size, READWRITE);
    let rec = SciBuf::reconciled(&p.a.t, &[la, theirs]);
    (lb, rec, SciBuf::alloc(&p.a.t, rec))
}

fn has_misuse(sim: &Sim, needle: &str) -> bool {
    sim.diagnostics()
        .iter()
        .any(|d| d.kind == DiagnosticKind::Misuse && d.message.contains(needle))
}

/// The SIGBUS of issue 23: a peer exports a 4 KiB object legally, then
/// sends a descriptor (and a reconciled list) claiming 1 MiB. The import
/// checks the fd that came with it and refuses; the fd is closed; the
/// connection and the receiver go on (a later honest export of the same
/// object imports, and its last byte reads).
#[test]
fn an_oversized_buffer_descriptor_is_refused_and_its_fd_released() {
    let _lock = serial();
    let baseline = open_fds();
    let p = peers();
    const BIG: u64 = 1 << 20;
    const REAL: u64 = 4096;
    // b asks for 1 MiB; the hostile a rewrites b's list to 4 KiB before
    // importing it (public keys: the library cannot tell), so the topology
    // is legal and a allocates 4 KiB.
    let mb = SciBuf::module(&p.b.t);
    let lb = raw_list(&p.b.t, mb, BIG, READONLY);
    let forged =
        forge::with_key(&export_unreconciled(&p.b, lb), B_RAW_SIZE, &u64b(&[REAL])).unwrap();
    let ma = SciBuf::module(&p.a.t);
    let (r, theirs) = import_unreconciled(&p.a, ma, &forged);
    assert_eq!(r, OK);
    let la = raw_list(&p.a.t, ma, REAL, READWRITE);
    let rec = SciBuf::reconciled(&p.a.t, &[la, theirs]);
    let o = SciBuf::alloc(&p.a.t, rec);
    // The reconciled list and the descriptor both claim 1 MiB.
    let list = forge::with_key(&export_reconciled(&p.a, rec), B_RAW_SIZE, &u64b(&[BIG])).unwrap();
    let (r, lb_rec) = import_reconciled(&p.b, &list, &[lb]);
    assert_eq!(r, OK, "the forged list satisfies b's own 1 MiB list");
    let before = open_fds();
    let (r, d) = obj_export(&p.a, o);
    assert_eq!(r, OK);
    assert_eq!(forge::buf_desc_size(&d), REAL);
    let lie = forge::buf_desc_with_size(&d, BIG);
    let (r, _) = obj_import(&p.b, &lie, lb_rec);
    assert_eq!(r, BAD_PARAMETER);
    assert!(
        has_misuse(&p.b.sim, "holds 4096"),
        "{:#?}",
        p.b.sim.diagnostics()
    );
    assert_eq!(open_fds(), before, "the refused object's fd is closed");
    // The receiver is alive and the connection stands: an honest export of
    // the same object imports, and reads to its last byte.
    assert_eq!(events(&p.b) & EV_CONN_RESET, 0);
    let honest = export_reconciled(&p.a, rec);
    let (r, lb_real) = import_reconciled(&p.b, &honest, &[]);
    assert_eq!(r, OK);
    let (r, d) = obj_export(&p.a, o);
    assert_eq!(r, OK);
    let (r, ob) = obj_import(&p.b, &d, lb_real);
    assert_eq!(r, OK);
    let mut cp: *const c_void = ptr::null();
    assert_eq!(
        call!(p.b.t.nvscibuf, NvSciBufObjGetConstCpuPtr(ob, &mut cp)).0,
        OK
    );
    // SAFETY: the object holds REAL bytes at `cp`.
    let last = unsafe { cp.cast::<u8>().add(REAL as usize - 1).read_volatile() };
    assert_eq!(last, 0);
    drop(p);
    assert_eq!(
        open_fds(),
        baseline,
        "everything closed with the simulators"
    );
}

/// 3000 legal re-exports of one object to a receiver that imports none:
/// the first `nframes` go, the rest answer InsufficientMemory (no room),
/// the connection stands, and the receiver holds exactly `nframes` fds for
/// them. One import makes room for one more export.
#[test]
fn an_export_flood_gets_back_pressure_and_the_receiver_holds_at_most_nframes_fds() {
    let _lock = serial();
    let baseline = open_fds();
    let p = peers();
    let (_, rec, o) = shared(&p, 4096);
    let before = open_fds();
    let mut sent = Vec::new();
    let mut refused = 0;
    for _ in 0..3000 {
        match obj_export(&p.a, o) {
            (OK, d) => sent.push(d),
            (INSUFFICIENT_MEMORY, _) => refused += 1,
            (r, _) => panic!("export answered {r:#x}"),
        }
    }
    assert_eq!(sent.len(), NFRAMES as usize);
    assert_eq!(refused, 3000 - NFRAMES as usize);
    // Both ends still connected; b has taken everything in.
    assert_eq!(events(&p.b) & EV_CONN_RESET, 0);
    assert_eq!(events(&p.a) & EV_CONN_RESET, 0);
    assert_eq!(open_fds() - before, NFRAMES as usize);
    // One import: room for exactly one more export.
    let (r, lb) = import_reconciled(&p.b, &export_reconciled(&p.a, rec), &[]);
    assert_eq!(r, OK);
    let (r, ob) = obj_import(&p.b, &sent[0], lb);
    assert_eq!(r, OK);
    assert_eq!(obj_export(&p.a, o).0, OK);
    assert_eq!(obj_export(&p.a, o).0, INSUFFICIENT_MEMORY);
    call!(p.b.t.nvscibuf, NvSciBufObjFree(ob));
    assert!(
        p.a.sim.diagnostics().is_empty(),
        "{:#?}",
        p.a.sim.diagnostics()
    );
    drop(p);
    assert_eq!(open_fds(), baseline);
}

/// A burst of frames and exports at once: each beyond the bounds answers
/// InsufficientMemory, nothing drops the connection, the receiver queues
/// at most `nframes` frames, and once it reads them the sender may write
/// again.
#[test]
fn a_message_flood_never_drops_the_connection() {
    let _lock = serial();
    let baseline = open_fds();
    let p = peers();
    let (_, _, o) = shared(&p, 4096);
    let frame = [7u8; 64];
    let (mut written, mut exported) = (0, 0);
    for _ in 0..1000 {
        let mut n = 0u32;
        match call!(
            p.a.t.nvsciipc,
            NvSciIpcWriteSafe(p.a.ep, frame.as_ptr().cast(), 64, &mut n)
        )
        .0
        {
            OK => written += 1,
            INSUFFICIENT_MEMORY => {}
            r => panic!("write answered {r:#x}"),
        }
        match obj_export(&p.a, o).0 {
            OK => exported += 1,
            INSUFFICIENT_MEMORY => {}
            r => panic!("export answered {r:#x}"),
        }
    }
    assert_eq!((written, exported), (NFRAMES, NFRAMES));
    assert_eq!(events(&p.a) & EV_CONN_RESET, 0);
    let mut buf = [0u8; 4096];
    let read = |buf: &mut [u8; 4096]| {
        let mut n = 0u32;
        call!(
            p.b.t.nvsciipc,
            NvSciIpcReadSafe(p.b.ep, buf.as_mut_ptr().cast(), 4096, &mut n)
        )
        .0
    };
    for _ in 0..NFRAMES {
        assert_eq!(read(&mut buf), OK);
        assert_eq!(buf[..64], frame);
    }
    assert_eq!(
        read(&mut buf),
        INSUFFICIENT_MEMORY,
        "nothing beyond nframes"
    );
    let mut n = 0u32;
    assert_eq!(
        call!(
            p.a.t.nvsciipc,
            NvSciIpcWriteSafe(p.a.ep, frame.as_ptr().cast(), 64, &mut n)
        )
        .0,
        OK
    );
    assert_eq!(events(&p.b) & EV_CONN_RESET, 0);
    drop(p);
    assert_eq!(open_fds(), baseline);
}

/// The keys export strips (the IPC topology) may not come from a peer: an
/// unreconciled or reconciled list descriptor carrying one is refused with
/// BadParameter; the same descriptor without it imports.
#[test]
fn forged_private_keys_are_refused_on_import() {
    let _lock = serial();
    let baseline = open_fds();
    let p = peers();
    let mb = SciBuf::module(&p.b.t);
    let lb = raw_list(&p.b.t, mb, 4096, READONLY);
    let honest = export_unreconciled(&p.b, lb);
    let ma = SciBuf::module(&p.a.t);
    for key in [
        forge::FIRST_PRIVATE_KEY,
        forge::FIRST_PRIVATE_KEY + 1,
        u32::MAX,
    ] {
        // (endpoint, permission) records, the shape of the topology key.
        let forged = forge::with_key(&honest, key, &u64b(&[p.a.ep, 3])).unwrap();
        assert_eq!(
            import_unreconciled(&p.a, ma, &forged).0,
            BAD_PARAMETER,
            "{key:#x}"
        );
    }
    assert!(has_misuse(&p.a.sim, "private key"));
    let (r, theirs) = import_unreconciled(&p.a, ma, &honest);
    assert_eq!(r, OK);
    let la = raw_list(&p.a.t, ma, 4096, READWRITE);
    let rec = SciBuf::reconciled(&p.a.t, &[la, theirs]);
    let honest = export_reconciled(&p.a, rec);
    let forged =
        forge::with_key(&honest, forge::FIRST_PRIVATE_KEY + 1, &u64b(&[p.b.ep, 3])).unwrap();
    assert_eq!(import_reconciled(&p.b, &forged, &[lb]).0, BAD_PARAMETER);
    assert_eq!(import_reconciled(&p.b, &honest, &[lb]).0, OK);
    assert_eq!(events(&p.b) & EV_CONN_RESET, 0);
    drop(p);
    assert_eq!(open_fds(), baseline);
}

/// Issue 31: a 1 MiB unreconciled-list descriptor of 262,142 empty parts
/// was accepted (146 MB of lists at the importer) and refused only at
/// reconcile. The parse bounds what a descriptor may hold (parts, keys in a
/// part, bytes of a value): each over-sized shape is refused at import with
/// BadParameter and a diagnostic naming the bound, for both import calls;
/// the honest descriptor still imports.
#[test]
fn oversized_list_descriptors_are_refused_at_parse() {
    use std::collections::BTreeMap;
    let _lock = serial();
    let baseline = open_fds();
    let p = peers();
    let mb = SciBuf::module(&p.b.t);
    let lb = raw_list(&p.b.t, mb, 4096, READONLY);
    let honest = export_unreconciled(&p.b, lb);
    let part = forge::list_parts(&honest).unwrap().remove(0);
    let empty_parts = forge::list_desc(&vec![BTreeMap::new(); 262_142]);
    assert_eq!(empty_parts.len(), 1 << 20, "the probe's 1 MiB descriptor");
    let many_keys: BTreeMap<u32, Vec<u8>> = (0x4000_0000..0x4000_0000 + 10_000)
        .map(|k| (k, Vec::new()))
        .collect();
    let mut big_value = part.clone();
    big_value.insert(B_GPU_ID, vec![0u8; 512 << 10]);
    let ma = SciBuf::module(&p.a.t);
    for (what, desc) in [
        ("parts", empty_parts),
        ("parts", forge::list_desc(&vec![part.clone(); 1000])),
        ("keys", forge::list_desc(&[many_keys])),
        ("bytes", forge::list_desc(&[big_value])),
    ] {
        assert_eq!(
            import_unreconciled(&p.a, ma, &desc).0,
            BAD_PARAMETER,
            "{what}"
        );
        assert_eq!(
            import_reconciled(&p.a, &desc, &[]).0,
            BAD_PARAMETER,
            "{what}"
        );
        assert!(
            has_misuse(&p.a.sim, what),
            "{what}: {:#?}",
            p.a.sim.diagnostics()
        );
        p.a.sim.take_diagnostics();
    }
    assert_eq!(import_unreconciled(&p.a, ma, &honest).0, OK);
    drop(p);
    assert_eq!(open_fds(), baseline);
}
