//! The ping-pong of issue 6 on the simulator (CI): the exporter side (the simulator's memfd
//! memory and shared timeline semaphore, on its own thread, standing in for Vulkan) and the
//! driver side (a stream of the simulated CUDA driver) each add 1 to a shared `u32` counter
//! 10,000 times, handing over through one timeline semaphore. The same protocol runs on the
//! real GPU with Vulkan in `crates/testkit/tests/gpu_conformance.rs`.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tegra_interop::core::{BufferMapping, SignalParams, WaitParams};
use tegra_interop::driver::{Context, ExternalMemory, ExternalSemaphore, Stream};
use tegra_interop_sim::{export, Sim};

const ROUNDS: u64 = 10_000;
const WAIT: Duration = Duration::from_secs(10);

/// Exporter round `i` waits for `2i`, adds 1, signals `2i + 1`; the driver's round waits for
/// `2i + 1` on a stream, reads the counter, writes it plus one and signals `2i + 2`. The
/// driver queues its wait before the exporter signals (wait-before-signal) whenever it is
/// ahead. Every intermediate value and the final one (exactly `2 * ROUNDS`) are checked.
#[test]
fn ping_pong_exporter_and_driver_through_one_timeline() {
    let sim = Sim::new().unwrap();
    let backend = sim.backend();
    let ctx = Context::new(backend.clone(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();

    let (mem_fd, exported) = export::memory(4096).unwrap();
    let (sem_fd, timeline) = export::timeline_semaphore(0).unwrap();
    let memory = ExternalMemory::opaque_fd(&ctx, mem_fd, 4096).unwrap();
    let counter = memory.map_buffer(BufferMapping::new(0, 4)).unwrap();
    let mut semaphore = ExternalSemaphore::timeline_fd(&ctx, sem_fd).unwrap();

    std::thread::scope(|s| {
        let exporter = s.spawn(|| {
            for i in 0..ROUNDS {
                assert!(
                    timeline.wait(2 * i, WAIT),
                    "exporter: value {} never came",
                    2 * i
                );
                let mut bytes = [0u8; 4];
                exported.read(0, &mut bytes).unwrap();
                let seen = u32::from_ne_bytes(bytes);
                assert_eq!(u64::from(seen), 2 * i, "exporter's turn {i}");
                exported.write(0, &(seen + 1).to_ne_bytes()).unwrap();
                timeline.signal(2 * i + 1).unwrap();
            }
        });
        for i in 0..ROUNDS {
            stream
                .wait(&semaphore, WaitParams::timeline(2 * i + 1))
                .unwrap();
            stream.synchronize().unwrap();
            let mut bytes = [0u8; 4];
            counter.copy_to_host(0, &mut bytes).unwrap();
            let seen = u32::from_ne_bytes(bytes);
            assert_eq!(u64::from(seen), 2 * i + 1, "driver's turn {i}");
            counter
                .copy_from_host(0, &(seen + 1).to_ne_bytes())
                .unwrap();
            let tracked = stream
                .signal(&mut semaphore, SignalParams::timeline(2 * i + 2))
                .unwrap();
            assert_eq!(tracked, Some(2 * i + 2));
        }
        exporter.join().unwrap();
    });
    stream.synchronize().unwrap();
    assert_eq!(timeline.value(), 2 * ROUNDS);
    let mut bytes = [0u8; 4];
    exported.read(0, &mut bytes).unwrap();
    assert_eq!(u64::from(u32::from_ne_bytes(bytes)), 2 * ROUNDS);

    counter.destroy().unwrap();
    memory.destroy().unwrap();
    semaphore.destroy().unwrap();
    stream.destroy().unwrap();
    ctx.destroy().unwrap();
    drop(backend);
    assert!(sim.ledger().is_clean(), "leaked: {}", sim.ledger());
    let diagnostics = sim.diagnostics();
    assert!(diagnostics.is_empty(), "{diagnostics:#?}");
}
