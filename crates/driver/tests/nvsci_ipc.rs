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
use std::sync::Arc;
use std::time::Duration;

use tegra_interop_core::nvsci::{BufAttr, BufAttrSet, GpuId, SyncAttr, SyncAttrSet};
use tegra_interop_core::sys::nvsci::{NvSciBufAttrValAccessPerm, NvSciBufType};
use tegra_interop_core::NvSciError;
use tegra_interop_driver::nvsci::{
    BufModule, BufPerm, CpuWaitContext, FenceSource, IpcEndpoint, IpcError, NvSciIpc, SyncAttrList,
    SyncModule, SyncPerm, Timeout,
};
use tegra_interop_driver::{Backend, Context, Stream};
use tegra_interop_sim::nvsci::IpcConfigFile;
use tegra_interop_sim::{NvSciRelease, Sim, SimConfig};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// `<role>,<release index>,<die at message n (0: never)>,<config path>`.
const CHILD_ENV: &str = "TEGRA_INTEROP_NVSCI_IPC_CHILD";
const SIZE: u64 = 1 << 14;
const FRAMES: u64 = 3;
const LONG: Timeout = Timeout::After(Duration::from_secs(20));

fn raw_attrs(size: u64, gpu: GpuId, perm: NvSciBufAttrValAccessPerm) -> BufAttrSet<6> {
    let mut a = BufAttrSet::new();
    a.set(BufAttr::types(&[NvSciBufType::NvSciBufType_RawBuffer]).unwrap())
        .unwrap();
    a.set(BufAttr::RawSize(size)).unwrap();
    a.set(BufAttr::NeedCpuAccess(true)).unwrap();
    a.set(BufAttr::RequiredPerm(perm)).unwrap();
    a.set(BufAttr::gpu_ids(&[gpu]).unwrap()).unwrap();
    a
}

/// A waiter on the GPU of `ctx` and on the CPU (`NeedCpuAccess`: the
/// library lets only such handles wait on the CPU).
fn cuda_and_cpu_waiter(syncs: &SyncModule, ctx: &Context) -> Res<SyncAttrList> {
    let mut list = syncs.cuda_waiter_attrs(ctx)?;
    let mut cpu = SyncAttrSet::<1>::new();
    cpu.set(SyncAttr::NeedCpuAccess(true))?;
    list.set(&cpu)?;
    Ok(list)
}

/// The endpoint of a role: dies (exits the process without any cleanup) at
/// its `die_at`-th message, sent or received, when that is not 0.
struct Ep {
    inner: NvSciIpc,
    count: u32,
    die_at: u32,
}

impl Ep {
    fn tick(&mut self) {
        self.count += 1;
        if self.count == self.die_at {
            std::process::exit(0);
        }
    }
}

impl IpcEndpoint for Ep {
    fn handle(&self) -> u64 {
        self.inner.handle()
    }
    fn send(&mut self, message: &[u8]) -> Result<(), IpcError> {
        self.tick();
        self.inner.send(message)
    }
    fn recv(&mut self) -> Result<Vec<u8>, IpcError> {
        self.tick();
        self.inner.recv()
    }
}

/// Messages each role sends or receives in one run.
const MESSAGES: u32 = 6 + 3 * FRAMES as u32;

fn frame(k: u64) -> Vec<u8> {
    (0..512).map(|i| (i as u64 * 31 + k * 7) as u8).collect()
}

fn expect(ep: &mut impl IpcEndpoint, message: &str) -> Res {
    let got = ep.recv()?;
    if got != message.as_bytes() {
        return Err(format!(
            "expected {message:?}, got {:?}",
            String::from_utf8_lossy(&got)
        )
        .into());
    }
    Ok(())
}

fn producer(backend: &Arc<Backend>, die_at: u32) -> Res {
    let inner = NvSciIpc::open(backend, "producer", Duration::from_secs(20))?;
    let mut ep = Ep {
        inner,
        count: 0,
        die_at,
    };
    let ctx = Context::create(Arc::clone(backend), 0, 0)?;
    let bufs = BufModule::open(backend)?;
    let syncs = SyncModule::open(backend)?;
    let gpu = GpuId(backend.device(0)?.uuid()?);

    // The consumer's requirements arrive; reconcile with ours; allocate;
    // hand the consumer a read-only handle.
    let theirs = bufs.receive_unreconciled(&mut ep)?;
    let mine = bufs.attr_list(&raw_attrs(
        SIZE,
        gpu,
        NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite,
    ))?;
    let obj = bufs.reconcile_and_alloc(&[&mine, &theirs])?;
    obj.send(Some(BufPerm::ReadOnly), &mut ep)?;

    // The sync object: the consumer's waiter list arrives over the
    // endpoint (which puts the consumer into the object's IPC topology);
    // reconciled with our CUDA signaller; the consumer gets its reconciled
    // list and a wait-only handle. Deterministic fences where the library
    // has the key (NvSciSync 2.3+).
    let waiter = syncs.receive_unreconciled(&mut ep)?;
    let mut sig = syncs.cuda_signaler_attrs(&ctx)?;
    if syncs.version().version >= tegra_interop_driver::nvsci::LibVersion::new(2, 3) {
        let mut det = SyncAttrSet::<1>::new();
        det.set(SyncAttr::RequireDeterministicFences(true))?;
        sig.set(&det)?;
    }
    let sync = syncs.reconcile_and_alloc(&[&sig, &waiter])?;
    sync.send(Some(SyncPerm::WaitOnly), &mut ep)?;

    let mem = obj.import_cuda(&ctx)?;
    let buf = mem.map_whole()?;
    let mut signaler = sync.import_cuda_signaler(&ctx)?;
    let stream = Stream::new(&ctx)?;
    for k in 1..=FRAMES {
        // The consumer has queued its wait for frame k already.
        expect(&mut ep, &format!("ready {k}"))?;
        buf.copy_from_host(0, &frame(k))?;
        let fence = signaler.signal(&stream)?;
        fence.send(&mut ep)?;
        expect(&mut ep, &format!("ack {k}"))?;
    }
    stream.synchronize()?;
    Ok(())
}

/// Waits on the CPU for frame `k`'s fence; a signal that does not come
/// (its process died before the GPU ran it) is a typed timeout.
fn cpu_wait(
    cx: &mut CpuWaitContext,
    fence: &tegra_interop_driver::nvsci::Fence,
    ep: &Ep,
    k: u64,
) -> Res {
    let limit = Duration::from_secs(5);
    if fence.wait(cx, Timeout::After(limit))? {
        return Ok(());
    }
    eprintln!("frame {k}: the producer's signal did not come");
    Err(Box::new(IpcError::Timeout {
        endpoint: ep.inner.name().to_owned(),
        waited: limit,
    }))
}

fn consumer(backend: &Arc<Backend>, die_at: u32) -> Res {
    consumer_with(backend, die_at, true)
}

/// The consumer that queues each GPU wait only once the frame's fence
/// arrived (`queue_ahead` false): what a consumer must do when the producer
/// may die, since a wait queued ahead on a fence whose signaller died never
/// completes (see `a_wait_queued_ahead_stays_pending_when_the_signaller_dies`).
fn consumer_late(backend: &Arc<Backend>, die_at: u32) -> Res {
    consumer_with(backend, die_at, false)
}

fn consumer_with(backend: &Arc<Backend>, die_at: u32, queue_ahead: bool) -> Res {
    let inner = NvSciIpc::open(backend, "consumer", Duration::from_secs(20))?;
    let mut ep = Ep {
        inner,
        count: 0,
        die_at,
    };
    let ctx = Context::create(Arc::clone(backend), 0, 0)?;
    let bufs = BufModule::open(backend)?;
    let syncs = SyncModule::open(backend)?;
    let gpu = GpuId(backend.device(0)?.uuid()?);

    // The same size as the producer's (the library refuses different ones),
    // and read-only: the producer may export no less than a peer asked for.
    let mine = bufs.attr_list(&raw_attrs(
        SIZE,
        gpu,
        NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_Readonly,
    ))?;
    bufs.send_unreconciled(&[&mine], &mut ep)?;
    let obj = bufs.receive_obj(&mut ep, &[&mine], BufPerm::ReadOnly, LONG)?;
    assert_eq!(obj.size()?, SIZE);
    assert_eq!(obj.actual_perm()?, BufPerm::ReadOnly);

    let wait_list = cuda_and_cpu_waiter(&syncs, &ctx)?;
    syncs.send_unreconciled(&[&wait_list], &mut ep)?;
    let sync = syncs.receive_obj(&mut ep, &[&wait_list], SyncPerm::WaitOnly, LONG)?;
    assert_eq!(sync.actual_perm()?, SyncPerm::WaitOnly);
    assert!(
        sync.import_cuda_signaler(&ctx).is_err(),
        "wait-only handle imported as signaller"
    );
    let waiter = sync.import_cuda_waiter(&ctx)?;
    let mem = obj.import_cuda(&ctx)?;
    let buf = mem.map_whole()?;
    let stream = Stream::new(&ctx)?;
    let source = syncs.fence_source();
    println!(
        "consumer: NvSciSync {}, fences {}",
        syncs.version(),
        source.name()
    );
    // Built: learned from the first fence received (the initial value is
    // stated nowhere), then the consumer builds the fences itself.
    let mut counter: Option<tegra_interop_core::DeterministicCounter> = None;
    let mut cx = CpuWaitContext::new(&syncs)?;
    for k in 1..=FRAMES {
        if let Some(counter) = counter.as_ref().filter(|_| queue_ahead) {
            // Built: the wait is queued before the producer signals.
            let expected = sync.fence_for_value(counter.value_of_signal(k))?;
            waiter.wait(&stream, &expected)?;
            assert!(
                !stream.is_idle()?,
                "frame {k}: the wait completed before the signal"
            );
        }
        ep.send(format!("ready {k}").as_bytes())?;
        let fence = sync.receive_fence(&mut ep)?;
        if !queue_ahead {
            // Late: the GPU waits only on a fence already signalled, so a
            // producer that dies with its signal unexecuted leaves no wait
            // behind.
            cpu_wait(&mut cx, &fence, &ep, k)?;
        }
        match &counter {
            Some(counter) => {
                assert_eq!(
                    fence.extract()?.map(|v| v.value),
                    Some(counter.value_of_signal(k))
                );
                if !queue_ahead {
                    let built = sync.fence_for_value(counter.value_of_signal(k))?;
                    waiter.wait(&stream, &built)?;
                }
            }
            // Received (and, with built fences, the first frame): the GPU
            // waits on the fence the producer sent.
            None => {
                waiter.wait(&stream, &fence)?;
                if source == FenceSource::Built {
                    counter = Some(sync.counter_from_fence(k, &fence)?);
                }
            }
        }
        if queue_ahead {
            // A CPU wait on the other process's signal (futex on shared memory).
            cpu_wait(&mut cx, &fence, &ep, k)?;
        }
        stream.synchronize()?;
        let mut seen = vec![0u8; 512];
        buf.copy_to_host(0, &mut seen)?;
        assert_eq!(seen, frame(k), "frame {k}");
        ep.send(format!("ack {k}").as_bytes())?;
    }
    // The last "ack" must be read before the endpoint closes.
    ep.inner.close()?;
    Ok(())
}

type Role = fn(&Arc<Backend>, u32) -> Res;

fn role_of(name: &str) -> Role {
    match name {
        "producer" => producer,
        "consumer-late" => consumer_late,
        _ => consumer,
    }
}

/// Runs a role in a fresh simulator; its result, then the ledgers checked
/// clean (on success and on failure alike).
fn run_role(name: &str, release: NvSciRelease, cfg: &std::path::Path, die_at: u32) -> Res {
    let sim = Sim::with_config(
        SimConfig::tegra()
            .with_nvsci_release(release)
            .with_nvsciipc_config(cfg),
    )?;
    let result = role_of(name)(&sim.backend(), die_at);
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
            .with_hang_timeout(Duration::from_millis(300)),
    )
    .unwrap();
    let err = consumer(&sim.backend(), 0).expect_err("the producer died");
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
