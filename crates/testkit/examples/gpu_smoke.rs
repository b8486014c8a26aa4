//! GPU smoke test: Vulkan exports, CUDA imports through the raw driver API.
//!
//! Needs a machine with an NVIDIA driver (libcuda.so.1) and a Vulkan loader + ICD. Prints one
//! line per check and `GPU SMOKE: PASS` / `GPU SMOKE: FAIL`; exits with 1 on failure.
//!
//! ```text
//! cargo run --release -p tegra-interop-testkit --features vulkan --example gpu_smoke
//! ```
//!
//! The first two checks are the smoke test proper (host-visible memory written by Vulkan and
//! read by CUDA; a timeline value signalled by CUDA and waited for on the Vulkan host). The
//! others exercise the rest of the exporter on the real driver: CUDA -> Vulkan data, device-
//! local memory both ways, binary semaphores both ways, a Vulkan host signal waited for by a
//! CUDA stream, and a short ping-pong (Vulkan compute shader and CUDA each add 1 to a shared
//! counter, handing over through one timeline semaphore).

use tegra_interop_testkit::raw_cuda;

use std::time::{Duration, Instant};

use raw_cuda::RawCuda;
use tegra_interop_platform::vulkan::{
    format_uuid, MemoryLocation, SemaphoreOp, VulkanExporter, VulkanSemaphore,
};

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

const WAIT: Duration = Duration::from_secs(5);

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

struct Report {
    all_ok: bool,
}

impl Report {
    fn check(&mut self, name: &str, r: AnyResult<String>) {
        match r {
            Ok(detail) => println!("CHECK {name}: PASS ({detail})"),
            Err(e) => {
                self.all_ok = false;
                println!("CHECK {name}: FAIL ({e})");
            }
        }
    }
}

fn ensure(cond: bool, what: impl Into<String>) -> AnyResult<()> {
    if cond {
        Ok(())
    } else {
        Err(what.into().into())
    }
}

/// Vulkan host-visible memory written by Vulkan (mapping), read by CUDA (cuMemcpyDtoH); then
/// written by CUDA (cuMemcpyHtoD), read by Vulkan (mapping).
fn host_visible(cu: &RawCuda, vk: &VulkanExporter, location: MemoryLocation) -> AnyResult<String> {
    let len = 64 * 1024;
    let exp = vk.export_memory(len, location)?;
    let data = pattern(len as usize, 7);
    exp.memory.write(0, &data)?;
    let ext = cu.import_memory_fd(exp.fd, exp.size, exp.dedicated)?;
    let ptr = cu.map_buffer(ext, 0, len)?;
    let mut seen = vec![0u8; len as usize];
    cu.dtoh(&mut seen, ptr)?;
    let first_ok = seen == data;
    let back = pattern(len as usize, 99);
    cu.htod(ptr, &back)?;
    let mut seen_vk = vec![0u8; len as usize];
    exp.memory.read(0, &mut seen_vk)?;
    cu.free(ptr)?;
    cu.destroy_memory(ext)?;
    ensure(first_ok, "CUDA read different bytes than Vulkan wrote")?;
    ensure(
        seen_vk == back,
        "Vulkan read different bytes than CUDA wrote",
    )?;
    Ok(format!(
        "{len} B asked, {} B allocated, memory type {}, dedicated {}",
        exp.size,
        exp.memory.memory_type_index(),
        exp.dedicated
    ))
}

/// Timeline: CUDA signals, the Vulkan host waits; the Vulkan host signals, a CUDA stream waits.
fn timeline(cu: &RawCuda, vk: &VulkanExporter, stream: raw_cuda::CUstream) -> AnyResult<String> {
    let (fd, sem) = vk.export_timeline_semaphore(0)?;
    let ext = cu.import_semaphore_fd(fd, true)?;
    let r = (|| -> AnyResult<String> {
        cu.signal(ext, 1, stream)?;
        ensure(
            sem.wait(1, WAIT)?,
            "Vulkan host wait for value 1 (signalled by CUDA) timed out",
        )?;
        let v = sem.value()?;
        ensure(v == 1, format!("counter is {v}, expected 1"))?;
        sem.signal(2)?;
        cu.wait(ext, 2, stream)?;
        cu.sync(stream)?;
        // A wait enqueued in CUDA before Vulkan signals (wait-before-signal).
        cu.wait(ext, 3, stream)?;
        cu.signal(ext, 4, stream)?;
        std::thread::sleep(Duration::from_millis(20));
        let before = sem.value()?;
        ensure(
            before == 2,
            format!("CUDA ran past its wait: counter {before}"),
        )?;
        sem.signal(3)?;
        ensure(
            sem.wait(4, WAIT)?,
            "CUDA did not continue after its wait was satisfied",
        )?;
        cu.sync(stream)?;
        Ok("CUDA->Vulkan 1, Vulkan->CUDA 2, wait-before-signal 3->4".to_owned())
    })();
    cu.destroy_semaphore(ext)?;
    r
}

/// Device-local memory: Vulkan upload -> CUDA read; CUDA write -> Vulkan download.
fn device_local(cu: &RawCuda, vk: &VulkanExporter) -> AnyResult<String> {
    let len: u64 = 1 << 20;
    let exp = vk.export_memory(len, MemoryLocation::DeviceLocal)?;
    let data = pattern(len as usize, 3);
    vk.upload(&exp.memory, 0, &data, &[], &[])?;
    let ext = cu.import_memory_fd(exp.fd, exp.size, exp.dedicated)?;
    let ptr = cu.map_buffer(ext, 0, len)?;
    let mut seen = vec![0u8; len as usize];
    cu.dtoh(&mut seen, ptr)?;
    let first_ok = seen == data;
    let back = pattern(len as usize, 200);
    cu.htod(ptr, &back)?;
    cu.free(ptr)?;
    cu.destroy_memory(ext)?;
    let mut seen_vk = vec![0u8; len as usize];
    vk.download(&exp.memory, 0, &mut seen_vk, &[], &[])?;
    ensure(first_ok, "CUDA read different bytes than Vulkan uploaded")?;
    ensure(
        seen_vk == back,
        "Vulkan downloaded different bytes than CUDA wrote",
    )?;
    Ok(format!(
        "{len} B, {} B allocated, memory type {}, dedicated {}",
        exp.size,
        exp.memory.memory_type_index(),
        exp.dedicated
    ))
}

/// Binary semaphores: CUDA signals, a Vulkan batch waits (and signals a timeline the host
/// waits for); a Vulkan batch signals, a CUDA stream waits.
fn binary(cu: &RawCuda, vk: &VulkanExporter, stream: raw_cuda::CUstream) -> AnyResult<String> {
    let (fd, bin) = vk.export_binary_semaphore()?;
    let tl: VulkanSemaphore =
        vk.create_semaphore(tegra_interop_platform::vulkan::SemaphoreKind::Timeline, 0)?;
    let ext = cu.import_semaphore_fd(fd, false)?;
    let r = (|| -> AnyResult<String> {
        cu.signal(ext, 0, stream)?;
        cu.sync(stream)?;
        vk.submit(
            &[SemaphoreOp::binary(&bin)],
            &[SemaphoreOp::timeline(&tl, 1)],
        )?;
        ensure(
            tl.wait(1, WAIT)?,
            "Vulkan batch waiting for CUDA's binary signal never ran",
        )?;
        vk.submit(&[], &[SemaphoreOp::binary(&bin)])?;
        cu.wait(ext, 0, stream)?;
        cu.sync(stream)?;
        ensure(vk.wait_idle(WAIT)?, "Vulkan queue did not go idle")?;
        Ok("CUDA->Vulkan and Vulkan->CUDA".to_owned())
    })();
    cu.destroy_semaphore(ext)?;
    r
}

/// Ping-pong: the counter lives in device-local memory shared by both. Vulkan adds 1 with its
/// compute shader (waits 2i, signals 2i+1); CUDA waits 2i+1 on a stream, reads the counter,
/// adds 1 through cuMemcpyHtoD and signals 2i+2. All Vulkan batches are submitted up front
/// (timeline wait-before-signal).
fn ping_pong(cu: &RawCuda, vk: &VulkanExporter, stream: raw_cuda::CUstream) -> AnyResult<String> {
    let n: u64 = 1000;
    let align = vk.storage_offset_alignment().max(4);
    let exp = vk.export_memory(align, MemoryLocation::DeviceLocal)?;
    vk.upload(&exp.memory, 0, &0u32.to_ne_bytes(), &[], &[])?;
    let (fd, tl) = vk.export_timeline_semaphore(0)?;
    let mem = cu.import_memory_fd(exp.fd, exp.size, exp.dedicated)?;
    let sem = cu.import_semaphore_fd(fd, true)?;
    let ptr = cu.map_buffer(mem, 0, 4)?;
    let start = Instant::now();
    let r = (|| -> AnyResult<String> {
        let inc = vk.counter_incrementer(&exp.memory, 0)?;
        for i in 0..n {
            vk.submit_increment(
                &inc,
                &[SemaphoreOp::timeline(&tl, 2 * i)],
                &[SemaphoreOp::timeline(&tl, 2 * i + 1)],
            )?;
        }
        let mut b = [0u8; 4];
        for i in 0..n {
            cu.wait(sem, 2 * i + 1, stream)?;
            cu.sync(stream)?;
            cu.dtoh(&mut b, ptr)?;
            let v = u32::from_ne_bytes(b);
            ensure(
                u64::from(v) == 2 * i + 1,
                format!("round {i}: CUDA saw {v}, expected {}", 2 * i + 1),
            )?;
            cu.htod(ptr, &(v + 1).to_ne_bytes())?;
            cu.signal(sem, 2 * i + 2, stream)?;
        }
        cu.sync(stream)?;
        ensure(tl.wait(2 * n, WAIT)?, "final timeline value not reached")?;
        let mut b = [0u8; 4];
        vk.download(&exp.memory, 0, &mut b, &[], &[])?;
        let end = u32::from_ne_bytes(b);
        ensure(
            u64::from(end) == 2 * n,
            format!("final counter {end}, expected {}", 2 * n),
        )?;
        drop(inc);
        Ok(format!(
            "N={n} rounds, counter {end}, {:.1} us per round trip",
            start.elapsed().as_secs_f64() * 1e6 / n as f64
        ))
    })();
    // On failure, Vulkan batches may still wait for values nobody signals: the exporter's
    // drops then wait a bounded time and leak those objects instead of destroying them.
    cu.free(ptr)?;
    cu.destroy_semaphore(sem)?;
    cu.destroy_memory(mem)?;
    r
}

fn run() -> AnyResult<bool> {
    let cu = RawCuda::load()?;
    let version = cu.init()?;
    let dev = cu.device(0)?;
    let name = cu.device_name(dev)?;
    let uuid = cu.device_uuid(dev)?;
    // CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED = 114
    let timeline_attr = match cu.attribute(dev, 114) {
        Ok(v) => v.to_string(),
        Err(e) => e.to_string(),
    };
    println!(
        "CUDA: driver API {}.{}, device 0 = {name}, uuid {}, timeline interop {timeline_attr}",
        version / 1000,
        (version % 1000) / 10,
        format_uuid(&uuid)
    );
    match VulkanExporter::devices() {
        Ok(list) => {
            for d in list {
                println!("Vulkan device: {d}; missing {:?}", d.missing_extensions);
            }
        }
        Err(e) => println!("Vulkan device list failed: {e}"),
    }
    let vk = VulkanExporter::new(uuid)?;
    let info = vk.device_info();
    println!(
        "selected Vulkan device: {info}, NVIDIA-packed driver version {}",
        info.nvidia_driver_version()
    );
    let mut report = Report { all_ok: true };
    report.check(
        "uuid-match",
        if info.device_uuid == uuid {
            Ok(format_uuid(&uuid))
        } else {
            Err("selected device's UUID differs".into())
        },
    );
    let _ctx = cu.primary_context(dev)?;
    let stream = cu.stream()?;
    report.check(
        "host-visible-both-ways",
        host_visible(&cu, &vk, MemoryLocation::HostVisible),
    );
    report.check("timeline-cuda-to-vulkan", timeline(&cu, &vk, stream));
    report.check("device-local-both-ways", device_local(&cu, &vk));
    report.check("binary-both-ways", binary(&cu, &vk, stream));
    report.check("ping-pong-compute", ping_pong(&cu, &vk, stream));
    // Informational: device-local host-visible (BAR) memory, where the device has such a type.
    match host_visible(&cu, &vk, MemoryLocation::DeviceLocalHostVisible) {
        Ok(d) => println!("INFO device-local-host-visible: works ({d})"),
        Err(e) => println!("INFO device-local-host-visible: not usable ({e})"),
    }
    cu.sync(stream)?;
    cu.destroy_stream(stream)?;
    drop(vk);
    cu.release_primary_context(dev)?;
    println!("teardown: ok");
    Ok(report.all_ok)
}

fn main() {
    let ok = match run() {
        Ok(ok) => ok,
        Err(e) => {
            println!("error: {e}");
            false
        }
    };
    println!("GPU SMOKE: {}", if ok { "PASS" } else { "FAIL" });
    if !ok {
        std::process::exit(1);
    }
}
