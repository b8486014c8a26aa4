//! NvSci objects and fences shared between two real processes on the
//! simulator, connected only by an NvSciIpc endpoint pair of a BSP-style
//! configuration file: the test binary starts itself a second time (the
//! ignored test `child_role`, selected with `--exact`; the file's path and
//! the role come in environment variables). The two simulators are
//! separate; everything crosses the way the real libraries require: the
//! waiter's unreconciled lists go to the signaller, the reconciled lists and
//! the objects come back, fences follow (or, with deterministic fences, only
//! the object). A child that dies at any message leaves the parent with a
//! typed error and clean ledgers.
//!
//! The pair runs once per NvSci release the simulator can claim
//! (`NvSciRelease::ALL`, passed to the child in `TEGRA_INTEROP_NVSCI_IPC_RELEASE`):
//! the consumer builds each frame's fence with `FenceUpdateFence` and queues
//! its wait before the producer signals where the library has it, and waits
//! on the fence the producer sends where it does not (NvSciSync 2.0, the
//! 2.4 flavour).
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::io::Read as _;
use std::process::Command;
use std::time::Duration;

use tegra_interop_core::NvSciError;
use tegra_interop_driver::nvsci::IpcError;
use tegra_interop_sim::nvsci::IpcConfigFile;
use tegra_interop_sim::{NvSciRelease, Sim, SimConfig};

mod two_process;
use two_process::{role_of, Res, MESSAGES};

/// `<role>,<release index>,<die at message n (0: never)>,<config path>`.
const CHILD_ENV: &str = "TEGRA_INTEROP_NVSCI_IPC_CHILD";

/// Runs a role in a fresh simulator; its result, then the ledgers checked
/// clean (on success and on failure alike).
fn run_role(name: &str, release: NvSciRelease, cfg: &std::path::Path, die_at: u32) -> Res {
    let sim = Sim::with_config(
        SimConfig::tegra()
            .with_nvsci_release(release)
            .with_nvsciipc_config(cfg),
    )?;
    let endpoint = if name == "producer" {
        "producer"
    } else {
        "consumer"
    };
    let result = role_of(name)(&sim.backend(), endpoint, die_at);
    assert!(sim.ledger().is_clean(), "{name}: {}", sim.ledger());
    assert!(
        sim.nvsci_ledger().is_clean(),
        "{name}: {}",
        sim.nvsci_ledger()
    );
    if result.is_ok() {
        assert!(
            sim.diagnostics().is_empty(),
            "{name}: {:#?}",
            sim.diagnostics()
        );
    }
    result
}

fn config() -> IpcConfigFile {
    IpcConfigFile::inter_process(&[("producer", "consumer", 8, 1024)]).unwrap()
}

/// Starts this binary as `child` (`die_at` 0: never dies).
fn spawn(child: &str, index: usize, die_at: u32, cfg: &IpcConfigFile) -> std::process::Child {
    child_command(std::env::current_exe().unwrap())
        .args([
            "child_role",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            CHILD_ENV,
            format!("{child},{index},{die_at},{}", cfg.path().display()),
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn output(child: &mut std::process::Child) -> (std::process::ExitStatus, String) {
    let status = child.wait().unwrap();
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    (status, out)
}

#[test]
#[cfg_attr(
    miri,
    ignore = "starts a child process and passes fds over SOCK_SEQPACKET with SCM_RIGHTS; Miri has none of these"
)]
fn two_processes_share_frames_and_fences_at_every_release() {
    for (index, release) in NvSciRelease::ALL.into_iter().enumerate() {
        two_processes(index, release);
    }
}

fn two_processes(index: usize, release: NvSciRelease) {
    let cfg = config();
    let mut child = spawn("consumer", index, 0, &cfg);
    let produced = run_role("producer", release, cfg.path(), 0);
    let (status, out) = output(&mut child);
    if let Err(e) = produced {
        panic!("producer at {release}: {e}\nthe consumer: {status}\n{out}");
    }
    assert!(
        status.success(),
        "the consumer process failed at {release}: {status}\n{out}"
    );
    let source = match release {
        NvSciRelease::V5_2_6 | NvSciRelease::JetsonSync2_4 => "received",
        _ => "built",
    };
    assert!(
        out.contains(&format!("fences {source}")),
        "{release}: {out}"
    );
    // The child really ran the consumer (and did not filter itself out).
    // (Its own output may come between the test's name and "ok".)
    assert!(out.contains("test child_role ... "), "{out}");
    assert!(out.contains("test result: ok. 1 passed"), "{out}");
}

/// Either side killed at each of its messages: the other side gets a typed
/// error (the connection reset, or no answer), never a hang or a panic, and
/// its ledgers end at zero.
#[test]
#[cfg_attr(
    miri,
    ignore = "starts a child process and passes fds over SOCK_SEQPACKET with SCM_RIGHTS; Miri has none of these"
)]
fn a_peer_killed_at_any_message_gives_a_typed_error_and_no_leak() {
    let index = NvSciRelease::ALL
        .iter()
        .position(|r| *r == NvSciRelease::V6_0_10)
        .unwrap();
    for (child, parent) in [("consumer", "producer"), ("producer", "consumer-late")] {
        for die_at in 1..=MESSAGES {
            let cfg = config();
            let mut proc = spawn(child, index, die_at, &cfg);
            let err = run_role(parent, NvSciRelease::V6_0_10, cfg.path(), 0)
                .expect_err("the peer died: the parent must fail");
            // The connection reset, seen by the endpoint or (for an object
            // export after the peer went) by the library.
            let typed = err.downcast_ref::<IpcError>();
            assert!(
                matches!(
                    typed,
                    Some(IpcError::ConnectionReset { .. })
                        // The fence came, its signal never ran.
                        | Some(IpcError::Timeout { .. })
                        | Some(IpcError::Driver(tegra_interop_driver::Error::NvSci {
                            code: NvSciError::CONNECTION_RESET,
                            ..
                        }))
                ),
                "{child} died at message {die_at}; {parent} got: {err}"
            );
            let (status, _) = output(&mut proc);
            assert!(status.success(), "{child} exits quietly at {die_at}");
        }
    }
}

/// The hazard `consumer_late` avoids, shown: a GPU wait queued ahead on a
/// deterministic fence stays pending for good when the signalling process
/// dies before the signal (the simulator keeps it as pending work; a real
/// stream would stay blocked and a context teardown would wait for it).
#[test]
#[cfg_attr(
    miri,
    ignore = "starts a child process and passes fds over SOCK_SEQPACKET with SCM_RIGHTS; Miri has none of these"
)]
fn a_wait_queued_ahead_stays_pending_when_the_signaller_dies() {
    let index = NvSciRelease::ALL
        .iter()
        .position(|r| *r == NvSciRelease::V6_0_10)
        .unwrap();
    let cfg = config();
    // The producer dies at its 10th message, before it reads "ready 2": the
    // consumer learned the counter from frame 1's fence and queued frame 2's
    // wait ahead, before sending "ready 2".
    let mut proc = spawn("producer", index, 10, &cfg);
    let sim = Sim::with_config(
        SimConfig::tegra()
            .with_nvsciipc_config(cfg.path())
            .with_hang_timeout(Duration::from_millis(300))
            // Quiet: the teardown's wait for the never-signalled wait
            // (the pending work checked below) reports a Hang on purpose.
            .with_diagnostic_echo(false),
    )
    .unwrap();
    let err = two_process::consumer(&sim.backend(), "consumer", 0).expect_err("the producer died");
    assert!(
        matches!(
            err.downcast_ref::<IpcError>(),
            Some(IpcError::ConnectionReset { .. })
        ),
        "{err}"
    );
    assert_eq!(sim.ledger().pending_work, 1, "{}", sim.ledger());
    assert!(output(&mut proc).0.success());
}

/// The child half of the tests above, started with `child_role --exact
/// --ignored` and its role, release, death and configuration in
/// `TEGRA_INTEROP_NVSCI_IPC_CHILD`. Run on its own it has no peer and fails.
#[test]
#[ignore = "the child process of the two-process tests, which start it"]
fn child_role() {
    let spec = std::env::var(CHILD_ENV).expect("started by a two-process test");
    let mut f = spec.splitn(4, ',');
    let role = f.next().unwrap().to_owned();
    let release = NvSciRelease::ALL[f.next().unwrap().parse::<usize>().unwrap()];
    let die_at: u32 = f.next().unwrap().parse().unwrap();
    let cfg = std::path::PathBuf::from(f.next().unwrap());
    run_role(&role, release, &cfg, die_at).unwrap_or_else(|e| panic!("{role} at {release}: {e}"));
}
/// A command that starts `exe`; under a cross test runner without binfmt
/// (`TEGRA_INTEROP_TEST_RUNNER`, e.g. `qemu-aarch64`, set by
/// targets/aarch64-unknown-linux-gnu.toml) the child goes through it too.
fn child_command(exe: impl AsRef<std::ffi::OsStr>) -> Command {
    match std::env::var("TEGRA_INTEROP_TEST_RUNNER") {
        Ok(runner) if !runner.trim().is_empty() => {
            let mut words = runner.split_whitespace();
            let mut command = Command::new(words.next().unwrap_or_default());
            command.args(words).arg(exe);
            command
        }
        _ => Command::new(exe),
    }
}
