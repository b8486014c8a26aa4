//! The two roles of the cross-process NvSci flow, shared by the simulator
//! test (`nvsci_ipc.rs`, two real processes over simulated NvSciIpc) and the
//! Jetson suite (`hw_jetson.rs`, the BSP's endpoints): a producer that
//! signals from CUDA and a consumer that waits on the GPU and on the CPU,
//! connected only by an NvSciIpc endpoint pair. The waiter's unreconciled
//! lists go to the signaller, the reconciled lists and objects come back,
//! fences follow (or, with deterministic fences, only the object).
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use tegra_interop_core::nvsci::{BufAttr, BufAttrSet, GpuId, SyncAttr, SyncAttrSet};
use tegra_interop_core::sys::nvsci::{NvSciBufAttrValAccessPerm, NvSciBufType};
use tegra_interop_driver::nvsci::{
    BufModule, BufPerm, CpuWaitContext, FenceSource, IpcEndpoint, IpcError, NvSciIpc, SyncAttrList,
    SyncModule, SyncPerm, Timeout,
};
use tegra_interop_driver::{Backend, Context, Stream};

pub type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

const SIZE: u64 = 1 << 14;
pub const FRAMES: u64 = 3;
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

// SAFETY: `handle` forwards to the wrapped `NvSciIpc`, which keeps its
// endpoint open for as long as this value lives.
unsafe impl IpcEndpoint for Ep {
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
pub const MESSAGES: u32 = 6 + 3 * FRAMES as u32;

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

/// What both roles open first: the endpoint (dying at its `die_at`-th
/// message), a CUDA context, both NvSci modules and the GPU's id.
fn open_role(
    backend: &Arc<Backend>,
    name: &str,
    die_at: u32,
) -> Res<(Ep, Context, BufModule, SyncModule, GpuId)> {
    let inner = NvSciIpc::open(backend, name, Duration::from_secs(20))?;
    let ep = Ep {
        inner,
        count: 0,
        die_at,
    };
    let ctx = Context::create(Arc::clone(backend), 0, 0)?;
    let bufs = BufModule::open(backend)?;
    let syncs = SyncModule::open(backend)?;
    let gpu = GpuId(backend.device(0)?.uuid()?);
    Ok((ep, ctx, bufs, syncs, gpu))
}

pub fn producer(backend: &Arc<Backend>, name: &str, die_at: u32) -> Res {
    let (mut ep, ctx, bufs, syncs, gpu) = open_role(backend, name, die_at)?;

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
    // In slices, watching the connection: a producer that died before its
    // GPU ran the signal leaves the fence unsignalled for good.
    let limit = Duration::from_secs(20);
    let start = std::time::Instant::now();
    while !fence.wait(cx, Timeout::After(Duration::from_millis(50)))? {
        if let Err(e) = ep.inner.check_connection() {
            eprintln!("frame {k}: the producer's signal did not come");
            return Err(Box::new(e));
        }
        if start.elapsed() >= limit {
            return Err(Box::new(IpcError::Timeout {
                endpoint: ep.inner.name().to_owned(),
                waited: limit,
                waiting_for: "the producer's signal of the frame's fence",
            }));
        }
    }
    Ok(())
}

pub fn consumer(backend: &Arc<Backend>, name: &str, die_at: u32) -> Res {
    consumer_with(backend, name, die_at, true)
}

/// The consumer that queues each GPU wait only once the frame's fence
/// arrived (`queue_ahead` false): what a consumer must do when the producer
/// may die, since a wait queued ahead on a fence whose signaller died never
/// completes (see `a_wait_queued_ahead_stays_pending_when_the_signaller_dies`).
pub fn consumer_late(backend: &Arc<Backend>, name: &str, die_at: u32) -> Res {
    consumer_with(backend, name, die_at, false)
}

fn consumer_with(backend: &Arc<Backend>, name: &str, die_at: u32, queue_ahead: bool) -> Res {
    let (mut ep, ctx, bufs, syncs, gpu) = open_role(backend, name, die_at)?;

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

/// A role: backend, its endpoint name, the message to die at (0: never).
pub type Role = fn(&Arc<Backend>, &str, u32) -> Res;

/// The role called `name` ("producer", "consumer", "consumer-late").
pub fn role_of(name: &str) -> Role {
    match name {
        "producer" => producer,
        "consumer-late" => consumer_late,
        _ => consumer,
    }
}
