//! The Vulkan exporter on a real Vulkan device (feature `vulkan`).
//!
//! Every test that needs a device is `#[ignore]`d, so CI (no GPU) reports it as ignored. Run
//! them on a GPU machine with `--include-ignored`. The device is the one whose UUID equals
//! CUDA device 0's (read through libcuda.so.1), or, without CUDA, the UUID given as 32 hex
//! digits in `TEGRA_INTEROP_VULKAN_UUID` (e.g. a software Vulkan device for local runs).
#![allow(clippy::unwrap_used)]

use tegra_interop_testkit::raw_cuda;

use std::time::Duration;

use tegra_interop_platform::vulkan::{
    Error, MemoryLocation, QueueChoice, SemaphoreKind, SemaphoreOp, VulkanExporter,
};

const NEEDS: &str = "needs a Vulkan device (GPU machine, or TEGRA_INTEROP_VULKAN_UUID)";
const WAIT: Duration = Duration::from_secs(5);

fn parse_uuid(s: &str) -> [u8; 16] {
    let hex: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    assert_eq!(
        hex.len(),
        32,
        "TEGRA_INTEROP_VULKAN_UUID must hold 32 hex digits"
    );
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

fn uuid() -> [u8; 16] {
    if let Ok(s) = std::env::var("TEGRA_INTEROP_VULKAN_UUID") {
        return parse_uuid(&s);
    }
    let cu = raw_cuda::RawCuda::load().expect("no TEGRA_INTEROP_VULKAN_UUID and no libcuda");
    cu.init().unwrap();
    cu.device_uuid(cu.device(0).unwrap()).unwrap()
}

fn exporter() -> VulkanExporter {
    VulkanExporter::new(uuid()).unwrap()
}

#[test]
fn missing_loader_is_a_typed_error() {
    // SAFETY: the path does not exist, so nothing is loaded.
    let r = unsafe {
        VulkanExporter::with_loader(
            std::path::Path::new("/nonexistent/libvulkan-for-a-test.so.1"),
            [0; 16],
            QueueChoice::FirstCompute,
        )
    };
    match r {
        Err(Error::LoaderNotFound { reason }) => assert!(!reason.is_empty()),
        other => panic!("expected LoaderNotFound, got {other:?}"),
    }
}

#[test]
#[ignore = "needs a Vulkan device (GPU machine, or TEGRA_INTEROP_VULKAN_UUID)"]
fn selects_the_device_with_the_cuda_uuid() {
    let u = uuid();
    let vk = VulkanExporter::new(u).unwrap();
    assert_eq!(vk.device_info().device_uuid, u);
    assert!(vk.device_info().missing_extensions.is_empty());
}

#[test]
#[ignore = "needs a Vulkan device (GPU machine, or TEGRA_INTEROP_VULKAN_UUID)"]
fn unknown_uuid_is_device_not_found() {
    let mut u = uuid();
    for b in &mut u {
        *b ^= 0xa5;
    }
    match VulkanExporter::new(u) {
        Err(Error::DeviceNotFound { uuid, seen }) => {
            assert_eq!(uuid, u);
            assert!(!seen.is_empty(), "{NEEDS}");
        }
        other => panic!("expected DeviceNotFound, got {other:?}"),
    }
}

#[test]
#[ignore = "needs a Vulkan device (GPU machine, or TEGRA_INTEROP_VULKAN_UUID)"]
fn host_visible_memory_exports_and_round_trips() {
    let vk = exporter();
    let exp = vk.export_memory(1000, MemoryLocation::HostVisible).unwrap();
    assert!(exp.size >= 1000);
    assert_eq!(exp.size, exp.memory.size());
    assert_eq!(exp.memory.requested_size(), 1000);
    // Every export is a fresh descriptor.
    let again = exp.memory.export_fd().unwrap();
    use std::os::fd::AsRawFd;
    assert_ne!(again.as_raw_fd(), exp.fd.as_raw_fd());
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    exp.memory.write(0, &data).unwrap();
    let mut back = vec![0u8; 1000];
    exp.memory.read(0, &mut back).unwrap();
    assert_eq!(back, data);
    // Range checks.
    let size = exp.size;
    assert!(matches!(
        exp.memory.write(size - 1, &[1, 2]),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        exp.memory.read(u64::MAX, &mut [0u8; 1]),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(
        vk.export_memory(0, MemoryLocation::HostVisible),
        Err(Error::ZeroSize)
    ));
}

#[test]
#[ignore = "needs a Vulkan device (GPU machine, or TEGRA_INTEROP_VULKAN_UUID)"]
fn device_local_memory_upload_download() {
    let vk = exporter();
    let mem = vk
        .allocate_memory(4096, MemoryLocation::DeviceLocal)
        .unwrap();
    assert!(matches!(mem.write(0, &[1]), Err(Error::NotHostVisible)));
    let _fd = mem.export_fd().unwrap();
    let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    vk.upload(&mem, 100, &data, &[], &[]).unwrap();
    let mut back = vec![0u8; 3000];
    vk.download(&mem, 100, &mut back, &[], &[]).unwrap();
    assert_eq!(back, data);
    let size = mem.size();
    assert!(matches!(
        vk.upload(&mem, size, &[1], &[], &[]),
        Err(Error::OutOfRange { .. })
    ));
}

#[test]
#[ignore = "needs a Vulkan device (GPU machine, or TEGRA_INTEROP_VULKAN_UUID)"]
fn timeline_host_signal_wait_and_value() {
    let vk = exporter();
    let (_fd, t) = vk.export_timeline_semaphore(5).unwrap();
    assert_eq!(t.kind(), SemaphoreKind::Timeline);
    assert_eq!(t.value().unwrap(), 5);
    assert!(t.wait(5, Duration::ZERO).unwrap());
    assert!(!t.wait(6, Duration::from_millis(10)).unwrap());
    t.signal(7).unwrap();
    assert_eq!(t.value().unwrap(), 7);
    assert!(t.wait(6, Duration::ZERO).unwrap());
    let (_bfd, b) = vk.export_binary_semaphore().unwrap();
    assert_eq!(b.kind(), SemaphoreKind::Binary);
    assert!(matches!(b.signal(1), Err(Error::NotTimeline)));
    assert!(matches!(b.value(), Err(Error::NotTimeline)));
}

#[test]
#[ignore = "needs a Vulkan device (GPU machine, or TEGRA_INTEROP_VULKAN_UUID)"]
fn queue_waits_and_signals_both_kinds() {
    let vk = exporter();
    let t = vk.create_semaphore(SemaphoreKind::Timeline, 0).unwrap();
    let b = vk.create_semaphore(SemaphoreKind::Binary, 0).unwrap();
    // Binary: a batch signals it, the next batch waits for it and signals the timeline.
    vk.submit(&[], &[SemaphoreOp::binary(&b)]).unwrap();
    vk.submit(&[SemaphoreOp::binary(&b)], &[SemaphoreOp::timeline(&t, 1)])
        .unwrap();
    assert!(t.wait(1, WAIT).unwrap());
    // Timeline wait-before-signal: the batch waits for 2, which the host signals afterwards.
    vk.submit(
        &[SemaphoreOp::timeline(&t, 2)],
        &[SemaphoreOp::timeline(&t, 3)],
    )
    .unwrap();
    assert!(!t.wait(3, Duration::from_millis(20)).unwrap());
    t.signal(2).unwrap();
    assert!(t.wait(3, WAIT).unwrap());
    assert!(vk.wait_idle(WAIT).unwrap());
}

#[test]
#[ignore = "needs a Vulkan device (GPU machine, or TEGRA_INTEROP_VULKAN_UUID)"]
fn objects_of_another_exporter_are_refused() {
    let u = uuid();
    let a = VulkanExporter::new(u).unwrap();
    let b = VulkanExporter::new(u).unwrap();
    let t = b.create_semaphore(SemaphoreKind::Timeline, 0).unwrap();
    assert!(matches!(
        a.submit(&[], &[SemaphoreOp::timeline(&t, 1)]),
        Err(Error::ForeignObject)
    ));
    let m = b.allocate_memory(64, MemoryLocation::DeviceLocal).unwrap();
    assert!(matches!(
        a.upload(&m, 0, &[1], &[], &[]),
        Err(Error::ForeignObject)
    ));
}

#[test]
#[ignore = "needs a Vulkan device (GPU machine, or TEGRA_INTEROP_VULKAN_UUID)"]
fn compute_increment_chain_is_exact() {
    let vk = exporter();
    let align = vk.storage_offset_alignment();
    for location in [MemoryLocation::HostVisible, MemoryLocation::DeviceLocal] {
        let mem = vk.allocate_memory(2 * align.max(4), location).unwrap();
        vk.upload(&mem, align, &41u32.to_ne_bytes(), &[], &[])
            .unwrap();
        if align > 1 {
            assert!(matches!(
                vk.counter_incrementer(&mem, 1),
                Err(Error::Misaligned { .. })
            ));
        }
        let inc = vk.counter_incrementer(&mem, align).unwrap();
        let t = vk.create_semaphore(SemaphoreKind::Timeline, 0).unwrap();
        let n = 200;
        for i in 0..n {
            vk.submit_increment(
                &inc,
                &[SemaphoreOp::timeline(&t, i)],
                &[SemaphoreOp::timeline(&t, i + 1)],
            )
            .unwrap();
        }
        assert!(t.wait(n, WAIT).unwrap());
        let mut b = [0u8; 4];
        vk.download(&mem, align, &mut b, &[], &[]).unwrap();
        assert_eq!(u32::from_ne_bytes(b), 41 + n as u32, "{location:?}");
    }
}

#[test]
#[ignore = "needs a Vulkan device (GPU machine, or TEGRA_INTEROP_VULKAN_UUID)"]
fn ping_pong_gpu_and_host_through_one_timeline() {
    // The GPU (compute shader) and the host take turns adding 1; odd values hand over to the
    // host, even values to the GPU. All GPU batches are submitted first (wait-before-signal).
    let vk = exporter();
    let mem = vk
        .allocate_memory(
            vk.storage_offset_alignment().max(4),
            MemoryLocation::HostVisible,
        )
        .unwrap();
    mem.write_u32(0, 0).unwrap();
    let t = vk.create_semaphore(SemaphoreKind::Timeline, 0).unwrap();
    let n: u64 = 1000;
    {
        let inc = vk.counter_incrementer(&mem, 0).unwrap();
        for i in 0..n {
            vk.submit_increment(
                &inc,
                &[SemaphoreOp::timeline(&t, 2 * i)],
                &[SemaphoreOp::timeline(&t, 2 * i + 1)],
            )
            .unwrap();
        }
        for i in 0..n {
            assert!(t.wait(2 * i + 1, WAIT).unwrap());
            let v = mem.read_u32(0).unwrap();
            assert_eq!(u64::from(v), 2 * i + 1);
            mem.write_u32(0, v + 1).unwrap();
            t.signal(2 * i + 2).unwrap();
        }
        assert!(vk.wait_idle(WAIT).unwrap());
    }
    assert_eq!(u64::from(mem.read_u32(0).unwrap()), 2 * n);
    mem.write_u32(0, 0).unwrap();
}

#[test]
#[ignore = "needs a Vulkan device (GPU machine, or TEGRA_INTEROP_VULKAN_UUID)"]
fn host_handover_releases_and_acquires_through_the_queue() {
    let vk = exporter();
    let a = vk
        .allocate_memory(4096, MemoryLocation::HostCached)
        .unwrap();
    let b = vk
        .allocate_memory(4096, MemoryLocation::HostVisible)
        .unwrap();
    let dev = vk
        .allocate_memory(4096, MemoryLocation::DeviceLocal)
        .unwrap();
    assert!(matches!(vk.host_handover(&dev), Err(Error::NotHostVisible)));
    let handover = vk.host_handover(&a).unwrap();
    let (_fd, ready) = vk.export_timeline_semaphore(0).unwrap();
    let (_fd2, free) = vk.export_timeline_semaphore(0).unwrap();
    // Used with memory it was not recorded for: refused, nothing submitted.
    assert!(matches!(
        vk.release_host_writes(&handover, &b, &[], &[SemaphoreOp::timeline(&ready, 1)]),
        Err(Error::HandoverMismatch)
    ));
    assert_eq!(ready.value().unwrap(), 0);
    for round in 1..=3u64 {
        a.write_u32(0, round as u32).unwrap();
        vk.release_host_writes(&handover, &a, &[], &[SemaphoreOp::timeline(&ready, round)])
            .unwrap();
        assert!(ready.wait(round, WAIT).unwrap());
        // The acquire waits on the queue for `free`, which the host signals late.
        let acquired = std::thread::scope(|s| {
            let t = s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                free.signal(round).unwrap();
            });
            let r = vk
                .acquire_for_host(&handover, &a, &[SemaphoreOp::timeline(&free, round)], WAIT)
                .unwrap();
            t.join().unwrap();
            r
        });
        assert!(acquired, "round {round}");
        assert_eq!(free.value().unwrap(), round);
        assert_eq!(a.read_u32(0).unwrap(), round as u32);
    }
    // An acquire whose wait is never satisfied times out (and is then let through).
    let pending = vk
        .acquire_for_host(
            &handover,
            &a,
            &[SemaphoreOp::timeline(&free, 10)],
            Duration::from_millis(50),
        )
        .unwrap();
    assert!(!pending);
    free.signal(10).unwrap();
    assert!(vk.wait_idle(WAIT).unwrap());
}
