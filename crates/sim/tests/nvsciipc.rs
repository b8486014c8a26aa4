//! NvSciIpc as the simulator models it, through the C entry points: the
//! BSP configuration file, the endpoint life cycle of nvsciipc.h, frames,
//! events, resets, real processes, and the codes the header names.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::ffi::{c_void, CString};
use std::process::Command;
use std::time::{Duration, Instant};

use tegra_interop_sim::nvsci::IpcConfigFile;
use tegra_interop_sim::{DiagnosticKind, FunctionTable, Sim, SimConfig};
use tegra_interop_sys::nvsci::{NvSciError, NvSciIpcEndpointInfo};

#[macro_use]
mod nvsci_common;

const OK: u32 = 0;
const NOT_SUPPORTED: u32 = 0x11;
const NOT_PERMITTED: u32 = 0x21;
const INVALID_STATE: u32 = 0x22;
const NOT_INITIALIZED: u32 = 0x24;
const INSUFFICIENT_MEMORY: u32 = 0x30;
const BAD_PARAMETER: u32 = 0x100;
const BUSY: u32 = 0x202;
const NO_SUCH_ENTRY: u32 = 0x1100;
const CONNECTION_RESET: u32 = 0x1200;

const READ: u32 = 0x1;
const WRITE: u32 = 0x2;
const CONN_EST: u32 = 0x4;
const CONN_RESET: u32 = 0x8;
const WRITE_EMPTY: u32 = 0x10;

fn sim(cfg: &IpcConfigFile) -> (Sim, FunctionTable) {
    // Quiet: misuse is provoked on purpose; the tests read the diagnostics.
    let sim = Sim::with_config(
        SimConfig::tegra()
            .with_nvsciipc_config(cfg.path())
            .with_diagnostic_echo(false),
    )
    .unwrap();
    let t = sim.table();
    (sim, t)
}

fn init(t: &FunctionTable) -> u32 {
    call!(t.nvsciipc, NvSciIpcInit()).0
}

fn open(t: &FunctionTable, name: &str) -> Result<u64, u32> {
    let c = CString::new(name).unwrap();
    let mut h = 0u64;
    match call!(t.nvsciipc, NvSciIpcOpenEndpoint(c.as_ptr(), &mut h)).0 {
        OK => Ok(h),
        e => Err(e),
    }
}

fn event_fd(t: &FunctionTable, h: u64) -> i32 {
    let mut fd = -1;
    assert_eq!(call!(t.nvsciipc, NvSciIpcGetLinuxEventFd(h, &mut fd)).0, OK);
    fd
}

fn reset(t: &FunctionTable, h: u64) -> u32 {
    call!(t.nvsciipc, NvSciIpcResetEndpointSafe(h)).0
}

fn events(t: &FunctionTable, h: u64) -> Result<u32, u32> {
    let mut ev = 0u32;
    match call!(t.nvsciipc, NvSciIpcGetEventSafe(h, &mut ev)).0 {
        OK => Ok(ev),
        e => Err(e),
    }
}

fn write(t: &FunctionTable, h: u64, data: &[u8]) -> u32 {
    let mut n = 0u32;
    let r = call!(
        t.nvsciipc,
        NvSciIpcWriteSafe(h, data.as_ptr().cast(), data.len() as u32, &mut n)
    )
    .0;
    if r == OK {
        assert_eq!(n as usize, data.len());
    }
    r
}

fn read(t: &FunctionTable, h: u64, size: u32) -> Result<Vec<u8>, u32> {
    let mut buf = vec![0xeeu8; size as usize];
    let mut n = 0u32;
    match call!(
        t.nvsciipc,
        NvSciIpcReadSafe(h, buf.as_mut_ptr().cast::<c_void>(), size, &mut n)
    )
    .0
    {
        OK => {
            buf.truncate(n as usize);
            Ok(buf)
        }
        e => Err(e),
    }
}

fn poll_fd(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

/// Polls the event fd and GetEventSafe until `want` bits were all seen.
fn wait_for(t: &FunctionTable, h: u64, want: u32) -> u32 {
    let fd = event_fd(t, h);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = 0;
    while seen & want != want {
        seen |= events(t, h).unwrap();
        if seen & want == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "events {seen:#x}, waiting for {want:#x}"
        );
        poll_fd(fd, 50);
    }
    seen
}

/// Opens `name`, asks for its event fd and resets it (the init sequence).
fn ready(t: &FunctionTable, name: &str) -> u64 {
    let h = open(t, name).unwrap();
    event_fd(t, h);
    assert_eq!(reset(t, h), OK);
    h
}

/// Both ends of `a`/`b` established, in two simulators (two "processes").
fn established(cfg: &IpcConfigFile) -> [(Sim, FunctionTable, u64); 2] {
    let (sa, ta) = sim(cfg);
    let (sb, tb) = sim(cfg);
    assert_eq!(init(&ta), OK);
    assert_eq!(init(&tb), OK);
    let ha = ready(&ta, "a");
    let hb = ready(&tb, "b");
    assert_eq!(
        wait_for(&ta, ha, CONN_EST) & (WRITE | WRITE_EMPTY),
        WRITE | WRITE_EMPTY
    );
    wait_for(&tb, hb, CONN_EST);
    [(sa, ta, ha), (sb, tb, hb)]
}

fn pair(nframes: u32, frame_size: u32) -> IpcConfigFile {
    IpcConfigFile::inter_process(&[("a", "b", nframes, frame_size)]).unwrap()
}

#[test]
fn init_reads_the_configuration_file() {
    // A file that was there when the simulator was made (it is checked
    // then) and is gone at NvSciIpcInit.
    let gone = IpcConfigFile::with_text("INTER_PROCESS a b 4 64\n").unwrap();
    let missing = Sim::with_config(
        SimConfig::tegra()
            .with_nvsciipc_config(gone.path())
            .with_diagnostic_echo(false),
    )
    .unwrap();
    std::fs::remove_file(gone.path()).unwrap();
    let t = missing.table();
    assert_eq!(init(&t), NOT_PERMITTED);
    assert_eq!(open(&t, "a"), Err(NOT_INITIALIZED));
    let d = missing.take_diagnostics();
    assert!(
        d.iter()
            .any(|d| d.message.contains("cannot read the NvSciIpc configuration")),
        "{d:?}"
    );

    // A file rewritten malformed between the simulator's making and Init.
    let bad = IpcConfigFile::with_text("INTER_PROCESS a b 16 64\n").unwrap();
    let (_s, t) = sim(&bad);
    std::fs::write(bad.path(), "INTER_PROCESS a b 16\n").unwrap();
    assert_eq!(init(&t), NOT_PERMITTED);

    let cfg = IpcConfigFile::with_text("INTER_PROCESS a b 4 64\nINTER_VM vm0 3 0\n").unwrap();
    let (s, t) = sim(&cfg);
    assert_eq!(open(&t, "a"), Err(NOT_INITIALIZED), "open before init");
    assert_eq!(init(&t), OK);
    assert_eq!(open(&t, "nope"), Err(NO_SUCH_ENTRY));
    assert_eq!(open(&t, "vm0"), Err(NOT_SUPPORTED));
    let long = "x".repeat(64);
    assert_eq!(open(&t, &long), Err(BAD_PARAMETER));
    let h = open(&t, "a").unwrap();
    let mut info = NvSciIpcEndpointInfo::default();
    assert_eq!(
        call!(t.nvsciipc, NvSciIpcGetEndpointInfo(h, &mut info)).0,
        OK
    );
    assert_eq!((info.nframes, info.frame_size), (4, 64));
    assert_eq!(call!(t.nvsciipc, NvSciIpcCloseEndpointSafe(h, false)).0, OK);
    assert_eq!(
        call!(t.nvsciipc, NvSciIpcCloseEndpointSafe(h, false)).0,
        BAD_PARAMETER
    );
    call!(t.nvsciipc, NvSciIpcDeinit());
    assert!(s.nvsci_ledger().is_clean(), "{}", s.nvsci_ledger());
}

#[test]
fn init_twice_is_refused_because_no_reference_count_is_promised() {
    let cfg = pair(4, 64);
    let (s, t) = sim(&cfg);
    assert_eq!(init(&t), OK);
    assert_eq!(init(&t), INVALID_STATE);
    assert!(s
        .take_diagnostics()
        .iter()
        .any(|d| d.message.contains("no reference count")));
    call!(t.nvsciipc, NvSciIpcDeinit());
    assert_eq!(init(&t), OK, "init again after deinit");
    call!(t.nvsciipc, NvSciIpcDeinit());
}

#[test]
fn an_endpoint_open_anywhere_is_busy() {
    let cfg = pair(4, 64);
    let (_s, t) = sim(&cfg);
    assert_eq!(init(&t), OK);
    let h = open(&t, "a").unwrap();
    assert_eq!(open(&t, "a"), Err(BUSY), "same process");
    let (_s2, t2) = sim(&cfg);
    assert_eq!(init(&t2), OK);
    assert_eq!(open(&t2, "a"), Err(BUSY), "another simulator (process)");
    assert_eq!(call!(t.nvsciipc, NvSciIpcCloseEndpointSafe(h, false)).0, OK);
    let h2 = open(&t2, "a").expect("free again once closed");
    assert_eq!(
        call!(t2.nvsciipc, NvSciIpcCloseEndpointSafe(h2, false)).0,
        OK
    );
    // A different file has endpoints of its own.
    let other = pair(4, 64);
    let (_s3, t3) = sim(&other);
    assert_eq!(init(&t3), OK);
    assert!(open(&t3, "a").is_ok());
}

#[test]
fn the_life_cycle_preconditions_are_enforced() {
    let cfg = pair(4, 64);
    let (_s, t) = sim(&cfg);
    assert_eq!(init(&t), OK);
    let h = open(&t, "a").unwrap();
    assert_eq!(reset(&t, h), INVALID_STATE, "reset before GetLinuxEventFd");
    assert_eq!(events(&t, h), Err(INVALID_STATE), "events before reset");
    assert_eq!(write(&t, h, b"x"), INVALID_STATE, "write before reset");
    assert_eq!(read(&t, h, 8), Err(INVALID_STATE), "read before reset");
    event_fd(&t, h);
    assert_eq!(reset(&t, h), OK);
    assert_eq!(
        reset(&t, h),
        INVALID_STATE,
        "a second reset before the connection"
    );
    // No peer yet: nothing established, frames refused with ConnectionReset.
    assert_eq!(events(&t, h), Ok(0));
    assert_eq!(write(&t, h, b"x"), CONNECTION_RESET);
    assert_eq!(read(&t, h, 8), Err(CONNECTION_RESET));
    assert_eq!(call!(t.nvsciipc, NvSciIpcCloseEndpointSafe(h, false)).0, OK);
    call!(t.nvsciipc, NvSciIpcDeinit());
}

#[test]
fn frames_have_the_configured_size_and_count() {
    let cfg = pair(2, 16);
    let [(sa, ta, a), (sb, tb, b)] = established(&cfg);
    // Status events repeat while they hold; CONN_EST came once.
    assert_eq!(events(&ta, a), Ok(WRITE | WRITE_EMPTY));
    assert_eq!(read(&tb, b, 16), Err(INSUFFICIENT_MEMORY), "empty channel");
    assert_eq!(write(&ta, a, &[]), BAD_PARAMETER, "size 0");
    assert_eq!(
        write(&ta, a, &[0u8; 17]),
        BAD_PARAMETER,
        "larger than a frame"
    );
    assert_eq!(write(&ta, a, b"abc"), OK);
    assert_eq!(events(&ta, a), Ok(WRITE), "one frame in flight: not empty");
    assert_eq!(write(&ta, a, b"defg"), OK);
    assert_eq!(
        write(&ta, a, b"h"),
        INSUFFICIENT_MEMORY,
        "nframes unread: full"
    );
    assert_eq!(events(&ta, a), Ok(0));
    assert_eq!(wait_for(&tb, b, READ) & READ, READ);
    assert_eq!(read(&tb, b, 17), Err(BAD_PARAMETER), "larger than a frame");
    // A whole frame: the rest of a short write is zero-filled.
    let mut want = b"abc".to_vec();
    want.resize(16, 0);
    assert_eq!(read(&tb, b, 16), Ok(want));
    // A short read discards the trailing bytes.
    assert_eq!(read(&tb, b, 2), Ok(b"de".to_vec()));
    assert_eq!(read(&tb, b, 16), Err(INSUFFICIENT_MEMORY));
    assert_eq!(wait_for(&ta, a, WRITE_EMPTY) & WRITE, WRITE);
    assert_eq!(write(&ta, a, b"again"), OK);
    for (s, t, h) in [(&sa, &ta, a), (&sb, &tb, b)] {
        assert_eq!(call!(t.nvsciipc, NvSciIpcCloseEndpointSafe(h, false)).0, OK);
        call!(t.nvsciipc, NvSciIpcDeinit());
        assert!(s.nvsci_ledger().is_clean(), "{}", s.nvsci_ledger());
    }
}

#[test]
fn the_event_fd_wakes_the_reader() {
    let cfg = pair(4, 64);
    let [(_sa, ta, a), (_sb, tb, b)] = established(&cfg);
    let fd = event_fd(&tb, b);
    assert_eq!(events(&tb, b).unwrap() & READ, 0);
    assert!(!poll_fd(fd, 20), "nothing arrived yet");
    assert_eq!(write(&ta, a, b"ping"), OK);
    assert!(poll_fd(fd, 5000), "the write must wake the peer's event fd");
    assert_eq!(events(&tb, b).unwrap() & READ, READ);
}

#[test]
fn a_closed_peer_resets_the_connection() {
    let cfg = pair(4, 64);
    let [(_sa, ta, a), (sb, tb, b)] = established(&cfg);
    assert_eq!(write(&ta, a, b"last"), OK);
    assert_eq!(
        call!(ta.nvsciipc, NvSciIpcCloseEndpointSafe(a, false)).0,
        OK
    );
    // Frames that arrived stay readable until the reset is reported.
    let mut last = b"last".to_vec();
    last.resize(64, 0);
    assert_eq!(read(&tb, b, 64), Ok(last));
    // The close reaches the peer at once unless a process forked by a test
    // running beside this one holds a copy of the socket until its exec.
    let ev = wait_for(&tb, b, CONN_RESET);
    assert_eq!(ev & READ, 0);
    assert_eq!(events(&tb, b), Ok(0), "CONN_RESET is reported once");
    assert_eq!(write(&tb, b, b"x"), CONNECTION_RESET);
    assert_eq!(read(&tb, b, 8), Err(CONNECTION_RESET));
    // A reset is an event, not a misuse: no diagnostic.
    assert!(sb.take_diagnostics().is_empty());
}

#[test]
fn the_de_init_reset_notifies_the_peer() {
    let cfg = pair(4, 64);
    let [(_sa, ta, a), (_sb, tb, b)] = established(&cfg);
    assert_eq!(
        reset(&ta, a),
        OK,
        "the de-init reset of an established endpoint"
    );
    assert_eq!(
        events(&ta, a),
        Err(INVALID_STATE),
        "no events after the de-init reset"
    );
    assert_eq!(write(&ta, a, b"x"), CONNECTION_RESET);
    wait_for(&tb, b, CONN_RESET);
    assert_eq!(write(&tb, b, b"x"), CONNECTION_RESET);
}

#[test]
fn deinit_with_endpoints_open_breaks_them() {
    let cfg = IpcConfigFile::inter_process(&[("a", "b", 4, 64), ("c", "d", 4, 64)]).unwrap();
    let (s, t) = sim(&cfg);
    assert_eq!(init(&t), OK);
    let a = open(&t, "a").unwrap();
    let c = open(&t, "c").unwrap();
    assert_eq!(call!(t.nvsciipc, NvSciIpcCloseEndpointSafe(a, false)).0, OK);
    // Deinit while "c" is open: the mistake of a per-channel Init/Deinit.
    call!(t.nvsciipc, NvSciIpcDeinit());
    let mut fd = 0;
    assert_eq!(
        call!(t.nvsciipc, NvSciIpcGetLinuxEventFd(c, &mut fd)).0,
        NOT_INITIALIZED
    );
    assert!(s
        .take_diagnostics()
        .iter()
        .any(|d| d.kind == DiagnosticKind::Misuse && d.message.contains("still open")));
    assert_eq!(s.nvsci_ledger().open_endpoints, 1, "the leak stays visible");
}

/// The child side of the two-process tests (`CHILD_ENV` names what to do).
const CHILD_ENV: &str = "TEGRA_SIM_NVSCIIPC_CHILD";

#[test]
#[ignore = "the child process of the two-process tests; they run it"]
fn child_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (mode, path) = spec.split_once(':').unwrap();
    let sim = Sim::with_config(SimConfig::tegra().with_nvsciipc_config(path)).unwrap();
    let t = sim.table();
    assert_eq!(init(&t), OK);
    let h = ready(&t, "b");
    wait_for(&t, h, CONN_EST);
    match mode {
        // Echo each frame back with every byte incremented, until "stop".
        "echo" => loop {
            wait_for(&t, h, READ);
            let f = read(&t, h, 32).unwrap();
            if f.starts_with(b"stop") {
                break;
            }
            let back: Vec<u8> = f.iter().map(|b| b.wrapping_add(1)).collect();
            wait_for(&t, h, WRITE);
            assert_eq!(write(&t, h, &back), OK);
        },
        // Send one frame, wait for the answer, then die without closing
        // anything.
        "die" => {
            assert_eq!(write(&t, h, b"bye"), OK);
            wait_for(&t, h, READ);
            assert_eq!(read(&t, h, 2), Ok(b"ok".to_vec()));
            std::process::exit(0);
        }
        other => panic!("unknown mode {other}"),
    }
    assert_eq!(call!(t.nvsciipc, NvSciIpcCloseEndpointSafe(h, false)).0, OK);
    call!(t.nvsciipc, NvSciIpcDeinit());
}

fn spawn_child(mode: &str, cfg: &IpcConfigFile) -> std::process::Child {
    // Under a cross test runner without binfmt (`TEGRA_INTEROP_TEST_RUNNER`,
    // e.g. qemu-aarch64) the child goes through it too.
    let exe = std::env::current_exe().unwrap();
    let mut command = match std::env::var("TEGRA_INTEROP_TEST_RUNNER") {
        Ok(r) if !r.trim().is_empty() => {
            let mut words = r.split_whitespace();
            let mut c = Command::new(words.next().unwrap());
            c.args(words).arg(exe);
            c
        }
        _ => Command::new(exe),
    };
    command
        .args([
            "--exact",
            "child_process",
            "--include-ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, format!("{mode}:{}", cfg.path().display()))
        .spawn()
        .unwrap()
}

#[test]
fn frames_cross_real_processes() {
    let cfg = pair(4, 32);
    let (s, t) = sim(&cfg);
    assert_eq!(init(&t), OK);
    let a = ready(&t, "a");
    let mut child = spawn_child("echo", &cfg);
    wait_for(&t, a, CONN_EST);
    for i in 0..50u8 {
        let msg = [i; 32];
        wait_for(&t, a, WRITE);
        assert_eq!(write(&t, a, &msg), OK);
        wait_for(&t, a, READ);
        assert_eq!(read(&t, a, 32), Ok(vec![i.wrapping_add(1); 32]));
    }
    wait_for(&t, a, WRITE);
    assert_eq!(write(&t, a, b"stop"), OK);
    assert!(child.wait().unwrap().success());
    wait_for(&t, a, CONN_RESET);
    assert_eq!(call!(t.nvsciipc, NvSciIpcCloseEndpointSafe(a, false)).0, OK);
    call!(t.nvsciipc, NvSciIpcDeinit());
    assert!(s.nvsci_ledger().is_clean(), "{}", s.nvsci_ledger());
}

#[test]
fn a_peer_process_that_dies_resets_the_connection() {
    let cfg = pair(4, 32);
    let (_s, t) = sim(&cfg);
    assert_eq!(init(&t), OK);
    let a = ready(&t, "a");
    let mut child = spawn_child("die", &cfg);
    wait_for(&t, a, CONN_EST | READ);
    assert_eq!(read(&t, a, 3), Ok(b"bye".to_vec()));
    assert_eq!(write(&t, a, b"ok"), OK);
    assert!(child.wait().unwrap().success());
    assert_eq!(wait_for(&t, a, CONN_RESET) & READ, 0);
    assert_eq!(write(&t, a, b"x"), CONNECTION_RESET);
    assert_eq!(call!(t.nvsciipc, NvSciIpcCloseEndpointSafe(a, false)).0, OK);
    call!(t.nvsciipc, NvSciIpcDeinit());
}

#[test]
fn unknown_handles_are_bad_parameters() {
    let cfg = pair(4, 64);
    let (_s, t) = sim(&cfg);
    assert_eq!(init(&t), OK);
    let mut info = NvSciIpcEndpointInfo::default();
    let r: NvSciError = call!(t.nvsciipc, NvSciIpcGetEndpointInfo(0x1234, &mut info));
    assert_eq!(r.0, BAD_PARAMETER);
    assert_eq!(reset(&t, 0x1234), BAD_PARAMETER);
    call!(t.nvsciipc, NvSciIpcDeinit());
}

/// Issue 31: with frames the simulator's socket cannot hold `nframes` of
/// (64 x 65536, 16 x 65536, 32 x 24576) and a peer that reads nothing,
/// GetEventSafe reported WRITE while WriteSafe answered InsufficientMemory,
/// and a sender that trusted WRITE spun forever. nvsciipc.h: WRITE is a
/// FIFO status event, reported as long as the write FIFO has a free frame;
/// WriteSafe answers InsufficientMemory when it is full. So WRITE is
/// reported exactly when a write succeeds, and comes back once the peer
/// reads.
#[test]
fn write_is_reported_exactly_while_the_write_channel_has_room() {
    for (nframes, frame_size) in [(64, 65536), (16, 65536), (32, 24576)] {
        let cfg = pair(nframes, frame_size);
        let [(sa, ta, a), (sb, tb, b)] = established(&cfg);
        let frame = vec![7u8; frame_size as usize];
        let mut sent = 0;
        loop {
            let ev = events(&ta, a).unwrap();
            let r = write(&ta, a, &frame);
            assert_eq!(
                ev & WRITE != 0,
                r == OK,
                "{nframes}x{frame_size}, frame {sent}: events {ev:#x}, write {r:#x}"
            );
            if r != OK {
                assert_eq!(r, INSUFFICIENT_MEMORY);
                break;
            }
            sent += 1;
            assert!(sent <= nframes, "more than nframes frames in flight");
        }
        assert!(sent >= 1);
        assert_eq!(events(&ta, a).unwrap() & WRITE, 0, "full: no WRITE");
        // The peer reads one frame: room again, and WRITE says so.
        wait_for(&tb, b, READ);
        assert_eq!(read(&tb, b, frame_size).unwrap().len(), frame.len());
        assert_eq!(wait_for(&ta, a, WRITE) & WRITE, WRITE);
        assert_eq!(write(&ta, a, &frame), OK);
        for (s, t, h) in [(&sa, &ta, a), (&sb, &tb, b)] {
            assert_eq!(call!(t.nvsciipc, NvSciIpcCloseEndpointSafe(h, false)).0, OK);
            call!(t.nvsciipc, NvSciIpcDeinit());
            assert!(s.nvsci_ledger().is_clean(), "{}", s.nvsci_ledger());
        }
    }
}

/// The simulator refuses a configuration it cannot use when it is made,
/// with a typed error naming the file and the reason.
fn refused(path: &std::path::Path) -> String {
    let t0 = Instant::now();
    let r = Sim::with_config(
        SimConfig::tegra()
            .with_nvsciipc_config(path)
            .with_diagnostic_echo(false),
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let e = r
        .err()
        .unwrap_or_else(|| panic!("{} was accepted", path.display()));
    let text = e.to_string();
    assert!(
        matches!(e, tegra_interop_sim::SimError::IpcConfig(_)),
        "{text}"
    );
    assert!(text.contains(&path.display().to_string()), "{text}");
    text
}

/// Issue 31: `frame_size` 2^32-1 was taken (a 5-frame two-process run took
/// 6 min and 16.8 GB); the values are bounded, each refusal naming the
/// field and the bound.
#[test]
fn configuration_values_are_bounded() {
    for (line, field) in [
        ("INTER_PROCESS a b 16 4294967295", "frame_size"),
        ("INTER_PROCESS a b 4294967295 64", "nframes"),
        ("INTER_PROCESS a b 128 65536", "nframes x frame_size"),
    ] {
        let cfg = IpcConfigFile::with_text(&format!("{line}\n")).unwrap();
        let text = refused(cfg.path());
        assert!(text.contains(field), "{line}: {text}");
        assert!(text.contains("at most"), "{line}: {text}");
    }
    // The largest accepted values still work.
    let cfg = IpcConfigFile::with_text("INTER_PROCESS a b 64 65536\n").unwrap();
    let (_s, t) = sim(&cfg);
    assert_eq!(init(&t), OK);
    call!(t.nvsciipc, NvSciIpcDeinit());
}

/// Issue 31: `/dev/zero` as the configuration was read until memory ran
/// out, and a FIFO blocked both processes forever. Only a regular file of
/// bounded size is read; anything else is a typed error at once, naming
/// the file and the reason (not a bare NotPermitted).
#[test]
fn only_a_bounded_regular_file_is_read_as_the_configuration() {
    let text = refused(std::path::Path::new("/dev/zero"));
    assert!(text.contains("not a regular file"), "{text}");
    let dir = std::env::temp_dir().join(format!("ti-nvsciipc-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("nvsciipc.cfg");
    let c = CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path alive for the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let text = refused(&fifo);
    assert!(text.contains("not a regular file"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
    let huge = IpcConfigFile::with_text(&"# padding\n".repeat(200_000)).unwrap();
    let text = refused(huge.path());
    assert!(text.contains("larger than"), "{text}");
    let missing = refused(std::path::Path::new(
        "/nonexistent/tegra-interop/nvsciipc.cfg",
    ));
    assert!(missing.contains("cannot"), "{missing}");
}
