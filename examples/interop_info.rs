//! Capability report: what this machine offers for CUDA interop, each line
//! with the reason, and which backend the pipeline example would pick.
//!
//! ```sh
//! cargo run --example interop_info          # this machine (the real driver)
//! cargo run --example interop_info -- --sim # plus the simulator's view, for comparison
//! ```
//!
//! Exit status: 0 report printed (also when no driver exists: that is a
//! finding, not a failure), 2 bad arguments.

#[allow(dead_code)] // the pipeline uses more of it than this report
#[path = "pipeline/probe.rs"]
mod probe;

// With the Vulkan exporter built in, the report probes the discrete-GPU
// transport exactly as the pipeline does.
#[cfg(feature = "vulkan")]
#[allow(dead_code)]
#[path = "pipeline/gpu.rs"]
mod gpu;
#[cfg(feature = "vulkan")]
#[allow(dead_code)]
#[path = "pipeline/ring.rs"]
mod ring;
#[cfg(feature = "vulkan")]
#[allow(dead_code)]
#[path = "pipeline/transport.rs"]
mod transport;

use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

use tegra_interop::driver::device::attribute;
use tegra_interop::driver::nvsci::{BufModule, FenceSource, SyncModule};
use tegra_interop::driver::table::FunctionTable;
use tegra_interop::driver::{Backend, Device};
use tegra_interop::sys::cuda::CUDA_VERSION;
use tegra_interop_sim::{Sim, SimConfig};

const USAGE: &str = "\
interop_info: what this machine offers for CUDA <-> NvSci / Vulkan interop

usage: interop_info [--sim]
  --sim       also show the built-in simulator's view (a Tegra-like machine), for comparison
  -h, --help  this text
";

/// `12090` -> `12.9`.
fn version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn uuid(bytes: [u8; 16]) -> String {
    let mut s = String::from("GPU-");
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// One `name: value (why)` line.
fn line(out: &mut String, name: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "  {name:<22} {value}");
}

fn yes_no(v: bool) -> &'static str {
    if v {
        "yes"
    } else {
        "no"
    }
}

/// An attribute as `yes/no (attribute N = v)`, or why it is unknown.
fn attr(
    dev: &Device<'_>,
    name: &str,
    id: u32,
    a: tegra_interop::sys::cuda::CUdevice_attribute,
) -> String {
    match dev.attribute(a) {
        Ok(v) => format!("{} (attribute {name} ({id}) = {v})", yes_no(v != 0)),
        Err(e) => format!("unknown ({e})"),
    }
}

fn device_lines(out: &mut String, backend: &Backend, driver: Option<i32>) {
    let count = match backend.device_count() {
        Ok(n) => n,
        Err(e) => {
            line(out, "devices", format!("none usable ({e})"));
            return;
        }
    };
    line(out, "devices", format!("{count} (cuDeviceGetCount)"));
    for ordinal in 0..count {
        let dev = match backend.device(ordinal) {
            Ok(d) => d,
            Err(e) => {
                line(
                    out,
                    &format!("device {ordinal}"),
                    format!("cannot open ({e})"),
                );
                continue;
            }
        };
        let _ = writeln!(out, "  device {ordinal}:");
        line(
            out,
            "  name",
            dev.name().unwrap_or_else(|e| format!("unknown ({e})")),
        );
        line(
            out,
            "  uuid",
            dev.uuid()
                .map(uuid)
                .unwrap_or_else(|e| format!("unknown ({e})")),
        );
        line(
            out,
            "  integrated",
            format!(
                "{}; integrated = shares memory with the CPU (Jetson / DRIVE)",
                attr(&dev, "INTEGRATED", 18, attribute::INTEGRATED)
            ),
        );
        let _ = writeln!(out, "    handle kinds:");
        let opaque = match driver {
            Some(v) if v >= 10000 => format!(
                "yes (OPAQUE_FD memory and semaphores: Linux, CUDA >= 10.0; driver is {})",
                version(v)
            ),
            Some(v) => format!("no (needs CUDA >= 10.0; driver is {})", version(v)),
            None => "unknown (driver version unknown)".into(),
        };
        line(out, "    fd (opaque)", opaque);
        line(
            out,
            "    timeline semaphore",
            attr(
                &dev,
                "TIMELINE_SEMAPHORE_INTEROP_SUPPORTED",
                114,
                attribute::TIMELINE_SEMAPHORE_INTEROP_SUPPORTED,
            ),
        );
        let dmabuf = attr(&dev, "DMA_BUF_SUPPORTED", 124, attribute::DMA_BUF_SUPPORTED);
        let import = match driver {
            Some(v) if v >= 13000 => "DMABUF_FD import needs CUDA >= 13.0: driver has it",
            Some(_) => "DMABUF_FD import needs CUDA >= 13.0: this driver is older",
            None => "DMABUF_FD import needs CUDA >= 13.0",
        };
        line(out, "    dma-buf", format!("{dmabuf}; {import}"));
        let t = backend.table();
        let libraries =
            t.nvscibuf.NvSciBufModuleOpen.is_some() && t.nvscisync.NvSciSyncModuleOpen.is_some();
        let nvsci = match (t.cuda.cuDeviceGetNvSciSyncAttributes.is_some(), libraries) {
            (true, true) => {
                "cuDeviceGetNvSciSyncAttributes present and NvSci libraries loaded: NVSCIBUF / NVSCISYNC imports possible"
            }
            (true, false) => {
                "cuDeviceGetNvSciSyncAttributes present, but no NvSci libraries: NVSCIBUF / NVSCISYNC imports are not possible (the driver answers NOT_SUPPORTED)"
            }
            (false, _) => {
                "cuDeviceGetNvSciSyncAttributes missing: no NVSCIBUF / NVSCISYNC imports"
            }
        };
        line(out, "    nvsci", nvsci);
    }
}

fn library_line<'a>(
    out: &mut String,
    library: &str,
    present: impl Iterator<Item = &'a str>,
    missing: impl Iterator<Item = &'a str>,
) {
    let present = present.count();
    let missing: Vec<&str> = missing.collect();
    let total = present + missing.len();
    let value = if present == 0 {
        format!("not loaded (0/{total} symbols)")
    } else if missing.is_empty() {
        format!("{present}/{total} symbols present")
    } else {
        format!(
            "{present}/{total} symbols present; missing: {}",
            missing.join(", ")
        )
    };
    line(out, library, value);
}

fn table_lines(out: &mut String, t: &FunctionTable) {
    let _ = writeln!(out, "  libraries (entry points this project resolves):");
    library_line(out, "  libcuda.so.1", t.cuda.present(), t.cuda.missing());
    library_line(
        out,
        "  libnvscibuf.so.1",
        t.nvscibuf.present(),
        t.nvscibuf.missing(),
    );
    library_line(
        out,
        "  libnvscisync.so.1",
        t.nvscisync.present(),
        t.nvscisync.missing(),
    );
    library_line(
        out,
        "  libnvsciipc.so",
        t.nvsciipc.present(),
        t.nvsciipc.missing(),
    );
}

/// The report of one backend (the real driver, or the simulator).
/// The NvSci libraries' versions (read when a module opens) and how waiters
/// get deterministic fences with them.
fn nvsci_version_line(out: &mut String, backend: &Arc<Backend>) {
    let t = backend.table();
    if t.nvscibuf.NvSciBufModuleOpen.is_none() || t.nvscisync.NvSciSyncModuleOpen.is_none() {
        return;
    }
    let value = match (BufModule::open(backend), SyncModule::open(backend)) {
        (Ok(bufs), Ok(syncs)) => {
            let source = match syncs.fence_source() {
                FenceSource::Built => {
                    "waiters build deterministic fences (NvSciSyncFenceUpdateFence)"
                }
                FenceSource::Received => {
                    "waiters receive fences from the signaller (no NvSciSyncFenceUpdateFence)"
                }
            };
            format!(
                "NvSciBuf {}, NvSciSync {}; {source}",
                bufs.version(),
                syncs.version()
            )
        }
        (Err(e), _) | (_, Err(e)) => format!("cannot open an NvSci module: {e}"),
    };
    line(out, "  nvsci versions", value);
}

fn backend_section(out: &mut String, backend: &Arc<Backend>) {
    let driver = backend.driver_version().ok();
    line(
        out,
        "CUDA driver",
        match backend.driver_version() {
            Ok(v) => format!(
                "found; supports CUDA {} (cuDriverGetVersion = {v})",
                version(v)
            ),
            Err(e) => format!("loaded, version unknown ({e})"),
        },
    );
    device_lines(out, backend, driver);
    table_lines(out, backend.table());
    nvsci_version_line(out, backend);
}

fn pipeline_lines(out: &mut String, jetson: probe::Verdict, gpu: probe::Verdict) {
    line(out, "  jetson", jetson.line());
    line(out, "  gpu", gpu.line());
    line(out, "  sim", probe::sim().line());
    line(
        out,
        "  host",
        "available: host-reference transport, a reference/testing transport used only with --backend host",
    );
}

fn report(with_sim: bool) -> Result<String, String> {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "interop_info: bindings generated from cuda.h {} (CUDA_VERSION {CUDA_VERSION})",
        version(CUDA_VERSION as i32)
    );
    let _ = writeln!(out, "== this machine ==");
    #[cfg(feature = "vulkan")]
    let hook = Some(gpu::probe as probe::TransportProbe);
    #[cfg(not(feature = "vulkan"))]
    let hook = None;
    let probe = probe::Probe::new().with_gpu_transport(hook);
    match &probe.real {
        Ok(backend) => backend_section(&mut out, backend),
        Err(e) => {
            line(
                &mut out,
                "CUDA driver",
                format!("not found: {e}; without libcuda.so.1 there is no device, version or handle kind to query"),
            );
            line(
                &mut out,
                "NvSci",
                "not probed: the backend loads the NvSci libraries only together with the CUDA driver",
            );
        }
    }
    let (pick, why) = probe::auto(&probe);
    let _ = writeln!(
        out,
        "  pipeline backends (`--backend auto` tries jetson, gpu, sim):"
    );
    pipeline_lines(&mut out, probe.jetson(), probe.gpu());
    line(&mut out, "  auto picks", format!("{pick} ({why})"));

    if with_sim {
        let _ = writeln!(
            out,
            "== simulator (SimConfig::tegra(): a Tegra-like machine in software, not hardware) =="
        );
        let sim = Sim::with_config(SimConfig::tegra())
            .map_err(|e| format!("cannot start the simulator: {e}"))?;
        let backend = sim.backend();
        backend_section(&mut out, &backend);
        let _ = writeln!(out, "  pipeline backends on a machine like this:");
        pipeline_lines(
            &mut out,
            probe::jetson(Ok(&backend)),
            probe::gpu(Ok(&backend)),
        );
    } else {
        let _ = writeln!(out, "(run with --sim to compare with the simulator's view)");
    }
    Ok(out)
}

fn main() -> ExitCode {
    let mut with_sim = false;
    for arg in std::env::args_os().skip(1) {
        match arg.to_str() {
            Some("--sim") => with_sim = true,
            Some("-h" | "--help") => {
                print!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            _ => {
                eprintln!(
                    "error: unknown argument `{}` (see --help)",
                    arg.to_string_lossy()
                );
                return ExitCode::from(2);
            }
        }
    }
    match report(with_sim) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
