//! Capability report: what this machine offers for CUDA interop, and which
//! backend the pipeline would pick.
//!
//! Every line names its evidence, one of: `probed` (tried here, e.g. the
//! dma-buf import: export a CUDA allocation and import it back), `attribute`
//! (a device attribute's value), `call` (what a query returned), `symbol
//! present` / `library loaded` (the loader found it; says nothing about
//! whether a call succeeds), `not probed` (no side-effect-free probe exists)
//! or `measured` (a figure from the project's own runs on named hardware).
//! Nothing is inferred: device attribute 124 (DMA_BUF_SUPPORTED) describes
//! exporting dma-bufs and is not taken as evidence for DMABUF_FD import.
//!
//! ```sh
//! cargo run --bin interop_info          # this machine (the real driver)
//! cargo run --bin interop_info -- --sim # plus the simulator's view, for comparison
//! cargo run --bin interop_info -- --sim --sim-driver 11.4 # ... of a CUDA 11.4 driver (JetPack 5)
//! ```
//!
//! Exit status: 0 report printed (also when no driver exists: that is a
//! finding, not a failure), 1 the report could not be made or written to
//! stdout (a closed pipe, `interop_info | head -1`, is not a failure), 2
//! bad arguments.

use crate::app::cli::SimDriver;
use crate::app::output;
use crate::app::probe;
#[cfg(feature = "vulkan")]
use crate::transport::gpu;
use clap::{CommandFactory, Parser};

use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

use tegra_interop::driver::device::attribute;
use tegra_interop::driver::nvsci::{BufModule, FenceSource, SyncModule};
use tegra_interop::driver::table::{FunctionTable, LoaderNotes};
use tegra_interop::driver::{probe as driver_probe, Backend, Context, Device, Error, Nvrtc};
use tegra_interop::sys::cuda::CUDA_VERSION;
use tegra_interop_sim::{Sim, SimConfig};

/// The command line of `interop_info`.
#[derive(Debug, Parser)]
#[command(
    name = "interop_info",
    about = "interop_info: what this machine offers for CUDA <-> NvSci / Vulkan interop",
    after_help = "Exit status: 0 report printed (also when no driver exists: that is a finding), 1 the report could not be made or written to stdout, 2 bad arguments.",
    disable_version_flag = true
)]
struct Args {
    /// Also show the built-in simulator's view (a Tegra-like machine), for comparison
    #[arg(long)]
    sim: bool,
    /// With --sim: the CUDA driver release the simulator presents (11.4: a
    /// JetPack 5 / DRIVE OS 6.0 driver, without the entry points introduced later)
    #[arg(
        long,
        value_name = "V",
        value_enum,
        default_value = "12.9",
        requires = "sim"
    )]
    sim_driver: SimDriver,
}

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

fn device_lines(out: &mut String, backend: &Arc<Backend>, driver: Option<i32>) {
    let count = match backend.device_count() {
        Ok(n) => n,
        Err(e) => {
            line(out, "devices", format!("none usable ({e})"));
            return;
        }
    };
    line(out, "devices", format!("{count} (call: cuDeviceGetCount)"));
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
        handle_kind_lines(out, backend, driver, ordinal, &dev);
    }
}

/// The handle kinds device `ordinal` (`dev`) can import, as the driver
/// answers (part of [`device_lines`]).
fn handle_kind_lines(
    out: &mut String,
    backend: &Arc<Backend>,
    driver: Option<i32>,
    ordinal: i32,
    dev: &Device,
) {
    let _ = writeln!(out, "    handle kinds:");
    let t = backend.table();
    let opaque = match (
        t.cuda.cuImportExternalMemory.is_some(),
        t.cuda.cuImportExternalSemaphore.is_some(),
    ) {
        (true, true) => format!(
            "entry points present (symbol present: cuImportExternalMemory, \
             cuImportExternalSemaphore; driver supports CUDA {}); import not probed: it \
             needs an exporter (Vulkan, NvSci), run the conformance suite; measured \
             working on an H200, driver 580.159",
            driver.map_or_else(|| "?".into(), version)
        ),
        _ => "no (symbol missing: cuImportExternalMemory / cuImportExternalSemaphore)".into(),
    };
    line(out, "    fd (opaque)", opaque);
    line(
        out,
        "    timeline semaphore",
        attr(
            dev,
            "TIMELINE_SEMAPHORE_INTEROP_SUPPORTED",
            114,
            attribute::TIMELINE_SEMAPHORE_INTEROP_SUPPORTED,
        ),
    );
    // Attribute 124 first appears in CUDA 11.7's attribute list (after
    // cudarc's per-release bindings); an older driver does not know it.
    let export = match (driver, dev.attribute(attribute::DMA_BUF_SUPPORTED)) {
        (Some(v), Err(e)) if v < 11070 => format!(
            "unknown to this driver: attribute DMA_BUF_SUPPORTED (124) is new in CUDA 11.7 and the driver is CUDA {} (call: cuDeviceGetAttribute answered {})",
            version(v),
            e.code().map_or_else(|| e.to_string(), |c| c.to_string())
        ),
        _ => attr(dev, "DMA_BUF_SUPPORTED", 124, attribute::DMA_BUF_SUPPORTED),
    };
    line(
        out,
        "    dma-buf export",
        format!("{export}; describes exporting device memory as a dma-buf, not importing one"),
    );
    // Probed whatever the version says: the driver's answer is the evidence.
    let mut import = match Context::primary(backend.clone(), ordinal) {
        Ok(ctx) => driver_probe::dma_buf_import(&ctx).to_string(),
        Err(e) => format!("unknown (no probe possible: {e})"),
    };
    if let Some(v) = driver.filter(|v| *v < 13000) {
        let _ = write!(
            import,
            "; note: cuDriverGetVersion = {v}, and the DMABUF_FD kind is new in CUDA 13.0"
        );
    }
    line(out, "    DMABUF_FD import", import);
    let libraries =
        t.nvscibuf.NvSciBufModuleOpen.is_some() && t.nvscisync.NvSciSyncModuleOpen.is_some();
    let nvsci = match (t.cuda.cuDeviceGetNvSciSyncAttributes.is_some(), libraries) {
        (true, true) => {
            "cuDeviceGetNvSciSyncAttributes present and NvSci libraries loaded (symbol present, library loaded; NVSCIBUF / NVSCISYNC import not probed)".to_string()
        }
        (true, false) => format!(
            "cuDeviceGetNvSciSyncAttributes present, but no NvSci libraries (library not loaded{}): NVSCIBUF / NVSCISYNC imports are not possible (measured on an H200: the driver answers NOT_SUPPORTED)",
            t.nvscibuf
                .loader
                .and_then(|n| n.load_error)
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        ),
        (false, _) => {
            "cuDeviceGetNvSciSyncAttributes missing (symbol missing): no NVSCIBUF / NVSCISYNC imports".to_string()
        }
    };
    line(out, "    nvsci", nvsci);
}

fn library_line<'a>(
    out: &mut String,
    library: &str,
    present: impl Iterator<Item = &'a str>,
    missing: impl Iterator<Item = &'a str>,
    loader: Option<&LoaderNotes>,
) {
    let present = present.count();
    let missing: Vec<&str> = missing.collect();
    let total = present + missing.len();
    let value = match loader.and_then(|n| n.load_error) {
        Some(reason) => format!("not loaded (0/{total} symbols; the loader said: {reason})"),
        None if present == 0 => format!("not loaded (0/{total} symbols)"),
        None if missing.is_empty() => format!("{present}/{total} symbols present"),
        None => format!(
            "{present}/{total} symbols present; missing: {}",
            missing.join(", ")
        ),
    };
    line(out, library, value);
}

fn table_lines(out: &mut String, t: &FunctionTable) {
    let _ = writeln!(out, "  libraries (entry points this project resolves):");
    library_line(
        out,
        "  libcuda.so.1",
        t.cuda.present(),
        t.cuda.missing(),
        t.cuda.loader,
    );
    library_line(
        out,
        "  libnvscibuf.so.1",
        t.nvscibuf.present(),
        t.nvscibuf.missing(),
        t.nvscibuf.loader,
    );
    library_line(
        out,
        "  libnvscisync.so.1",
        t.nvscisync.present(),
        t.nvscisync.missing(),
        t.nvscisync.loader,
    );
    library_line(
        out,
        "  libnvsciipc.so",
        t.nvsciipc.present(),
        t.nvsciipc.missing(),
        t.nvsciipc.loader,
    );
}

/// NVRTC: whether it loaded (the loader's reason where not) and its version.
fn nvrtc_line(out: &mut String, backend: &Arc<Backend>) {
    let t = &backend.table().nvrtc;
    let value = match Nvrtc::new(backend) {
        Ok(nvrtc) => match nvrtc.version() {
            Ok((major, minor)) => format!(
                "loaded, NVRTC {major}.{minor} (library loaded; call: nvrtcVersion = {major}.{minor}); run-time compilation available"
            ),
            Err(e) => format!("loaded, version unknown ({e})"),
        },
        Err(e) => format!(
            "not usable ({}/{} symbols; {e}): no run-time compilation, so no kernel consumer (jetson, gpu backends)",
            t.present().count(),
            t.present().count() + t.missing().count()
        ),
    };
    line(out, "  libnvrtc (NVRTC)", value);
}

/// What the loaded driver lacks: each missing CUDA / NVRTC entry point of
/// the table, the release it needs where the driver is too old for it, and
/// what the project loses (`Backend::missing_entry_points`).
fn lacks_lines(out: &mut String, backend: &Arc<Backend>) {
    let missing = backend.missing_entry_points();
    if missing.is_empty() {
        line(
            out,
            "  driver lacks",
            "nothing: every CUDA and NVRTC entry point of the table is present (symbol present)",
        );
        return;
    }
    let _ = writeln!(
        out,
        "  driver lacks (symbol missing; each costs what it says):"
    );
    for m in missing {
        let why = match &m.error {
            Error::NeedsNewerDriver { since, driver, .. } => format!(
                "needs CUDA {} (the driver is CUDA {})",
                version(*since),
                version(*driver)
            ),
            _ => match m.since {
                Some(since) => format!(
                    "absent although in CUDA since {} (this driver or library does not export it)",
                    version(since)
                ),
                None => "absent".to_string(),
            },
        };
        line(
            out,
            &format!("    {}", m.symbol),
            format!("{why}: {}", m.costs),
        );
    }
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
                "NvSciBuf {}, NvSciSync {} (call: Nv*CheckVersionCompatibility, probed at module open); {source}",
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
                "found; supports CUDA {} (call: cuDriverGetVersion = {v})",
                version(v)
            ),
            Err(e) => format!("loaded, version unknown ({e})"),
        },
    );
    device_lines(out, backend, driver);
    table_lines(out, backend.table());
    nvrtc_line(out, backend);
    lacks_lines(out, backend);
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

fn report(with_sim: bool, sim_driver: SimDriver) -> Result<String, String> {
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
            "== simulator (SimConfig::tegra(): a Tegra-like machine in software, not hardware; CUDA {} driver) ==",
            sim_driver.name()
        );
        let sim = Sim::with_config(SimConfig::tegra().with_driver_version(sim_driver.version()))
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

/// The `interop_info` binary: prints the report (`--sim` adds the simulator's view).
/// Exit status: 0 report printed, 1 it could not be made or written to
/// stdout (a closed pipe is not such a failure: see [`crate::app::output`]),
/// 2 bad arguments.
pub fn main() -> ExitCode {
    let (with_sim, sim_driver) = match Args::try_parse() {
        Ok(a) => (a.sim, a.sim_driver),
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => {
            let help = Args::command().render_long_help().to_string();
            return output::stdout_then("the help", &help, ExitCode::SUCCESS);
        }
        Err(e) => {
            output::stderr_line(&format!("error: {}", crate::app::cli::one_line(&e)));
            return ExitCode::from(2);
        }
    };
    match report(with_sim, sim_driver) {
        Ok(text) => output::stdout_then("the report", &text, ExitCode::SUCCESS),
        Err(e) => {
            output::stderr_line(&format!("error: {e}"));
            ExitCode::FAILURE
        }
    }
}
