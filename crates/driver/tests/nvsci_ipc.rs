//! NvSci objects and fences shared between two real processes on the
//! simulator: the test binary starts itself a second time as the consumer
//! (the ignored test `child_consumer`, selected with `--exact` and given
//! its sockets through an environment variable). The producer's simulator
//! and the consumer's are separate; the buffer's memfd and the sync
//! object's semaphore page cross with `SCM_RIGHTS`, so both processes see
//! the same bytes and the same counter.
//!
//! The pair runs once per NvSci release the simulator can claim
//! (`NvSciRelease::ALL`, passed to the child in `TEGRA_INTEROP_NVSCI_IPC_RELEASE`):
//! the consumer builds each frame's fence with `FenceUpdateFence` and queues
//! its wait before the producer signals where the library has it, and waits
//! on the fence the producer sends where it does not (NvSciSync 2.0, the
//! 2.4 flavour).
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::io::Read as _;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tegra_interop_core::nvsci::{BufAttr, BufAttrSet, GpuId, SyncAttr, SyncAttrSet};
use tegra_interop_core::sys::nvsci::{NvSciBufAttrValAccessPerm, NvSciBufType};
use tegra_interop_driver::nvsci::{
    BufModule, BufPerm, CpuWaitContext, FenceSource, IpcEndpoint, NvSciIpcChannel, SyncAttrList,
    SyncModule, SyncPerm, Timeout,
};
use tegra_interop_driver::{Backend, Context, Stream};
use tegra_interop_sim::nvsci::{endpoint_pair, set_inheritable};
use tegra_interop_sim::{NvSciRelease, Sim, SimConfig};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

const CHILD_ENV: &str = "TEGRA_INTEROP_NVSCI_IPC_CHILD";
const RELEASE_ENV: &str = "TEGRA_INTEROP_NVSCI_IPC_RELEASE";
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

fn producer(backend: &Arc<Backend>, app: UnixStream) -> Res {
    let mut ep = NvSciIpcChannel::open(backend, "producer", app)?;
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

    // The sync object: our CUDA signaller, and a CUDA waiter standing in
    // for the consumer's list (NvSciSync attribute-list IPC is not in the
    // project's subset). The consumer gets a wait-only handle. Deterministic
    // fences where the library has the key (NvSciSync 2.3+).
    let mut sig = syncs.cuda_signaler_attrs(&ctx)?;
    if syncs.version().version >= tegra_interop_driver::nvsci::LibVersion::new(2, 3) {
        let mut det = SyncAttrSet::<1>::new();
        det.set(SyncAttr::RequireDeterministicFences(true))?;
        sig.set(&det)?;
    }
    let stand_in = cuda_and_cpu_waiter(&syncs, &ctx)?;
    let sync = syncs.reconcile_and_alloc(&[&sig, &stand_in])?;
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

fn consumer(backend: &Arc<Backend>, app: UnixStream) -> Res {
    let mut ep = NvSciIpcChannel::open(backend, "consumer", app)?;
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
    let sync = syncs.receive_obj(&mut ep, &wait_list, SyncPerm::WaitOnly, LONG)?;
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
        if let Some(counter) = &counter {
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
        match &counter {
            Some(counter) => assert_eq!(
                fence.extract()?.map(|v| v.value),
                Some(counter.value_of_signal(k))
            ),
            // Received (and, with built fences, the first frame): the GPU
            // waits on the fence the producer sent.
            None => {
                waiter.wait(&stream, &fence)?;
                if source == FenceSource::Built {
                    counter = Some(sync.counter_from_fence(k, &fence)?);
                }
            }
        }
        // A CPU wait on the other process's signal (futex on shared memory).
        assert!(fence.wait(&mut cx, LONG)?, "frame {k}: CPU wait timed out");
        stream.synchronize()?;
        let mut seen = vec![0u8; 512];
        buf.copy_to_host(0, &mut seen)?;
        assert_eq!(seen, frame(k), "frame {k}");
        ep.send(format!("ack {k}").as_bytes())?;
    }
    Ok(())
}

fn run_role(
    name: &str,
    release: NvSciRelease,
    socket: OwnedFd,
    app: UnixStream,
    role: fn(&Arc<Backend>, UnixStream) -> Res,
) {
    app.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut cfg = SimConfig::tegra();
    cfg.nvsci_release = release;
    let sim = Sim::with_config(cfg).unwrap();
    sim.nvsci_register_endpoint(name, socket);
    role(&sim.backend(), app).unwrap_or_else(|e| panic!("{name} at {release}: {e}"));
    assert!(sim.ledger().is_clean(), "{name}: {}", sim.ledger());
    assert!(
        sim.nvsci_ledger().is_clean(),
        "{name}: {}",
        sim.nvsci_ledger()
    );
    assert!(
        sim.diagnostics().is_empty(),
        "{name}: {:#?}",
        sim.diagnostics()
    );
}

#[test]
fn two_processes_share_frames_and_fences_at_every_release() {
    for (index, release) in NvSciRelease::ALL.into_iter().enumerate() {
        two_processes(index, release);
    }
}

fn two_processes(index: usize, release: NvSciRelease) {
    let (mine, theirs) = endpoint_pair().unwrap();
    let (app_mine, app_theirs) = UnixStream::pair().unwrap();
    set_inheritable(theirs.as_fd(), true).unwrap();
    set_inheritable(app_theirs.as_fd(), true).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut child = child_command(exe)
        .args([
            "child_consumer",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            CHILD_ENV,
            format!("{},{}", theirs.as_raw_fd(), app_theirs.as_raw_fd()),
        )
        .env(RELEASE_ENV, index.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop((theirs, app_theirs));
    run_role("producer", release, mine, app_mine, producer);
    let status = child.wait().unwrap();
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
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
    assert!(out.contains("test child_consumer ... "), "{out}");
    assert!(out.contains("test result: ok. 1 passed"), "{out}");
}

/// The consumer half of `two_processes_share_frames_and_fences_at_every_release`, which
/// starts this binary again with `child_consumer --exact --ignored` and the
/// sockets in `TEGRA_INTEROP_NVSCI_IPC_CHILD`. Run on its own (without that
/// variable) it has nothing to talk to and fails.
#[test]
#[ignore = "consumer half of two_processes_share_frames_and_fences_at_every_release, which starts it in a child process"]
fn child_consumer() {
    let fds = std::env::var(CHILD_ENV)
        .expect("started by two_processes_share_frames_and_fences_at_every_release");
    let release: usize = std::env::var(RELEASE_ENV).unwrap().parse().unwrap();
    let release = NvSciRelease::ALL[release];
    let (a, b) = fds.split_once(',').unwrap();
    let (a, b): (i32, i32) = (a.parse().unwrap(), b.parse().unwrap());
    // SAFETY: (test) the parent passed these two open descriptors to this
    // process for its sole use.
    let (socket, app) = unsafe { (OwnedFd::from_raw_fd(a), OwnedFd::from_raw_fd(b)) };
    set_inheritable(socket.as_fd(), false).unwrap();
    set_inheritable(app.as_fd(), false).unwrap();
    run_role("consumer", release, socket, UnixStream::from(app), consumer);
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
