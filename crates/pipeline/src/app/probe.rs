//! What this machine offers the pipeline, and why: shared by the pipeline's
//! `--backend auto` and the `interop_info` capability report.
//!
//! Every check answers with a reason, so that "not available" always says
//! what is missing (no driver, a discrete GPU where NvSci needs Tegra, a
//! missing library or symbol, NVRTC, or a part of this example that is not
//! built).

use std::sync::Arc;

use tegra_interop::driver::table::FunctionTable;
use tegra_interop::driver::{Backend, BackendKind};

/// A backend's availability, with the reason either way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Usable; why.
    Available(String),
    /// Not usable; why.
    Unavailable(String),
}

impl Verdict {
    /// Whether it is usable.
    pub fn is_available(&self) -> bool {
        matches!(self, Verdict::Available(_))
    }

    /// `available: why` or `not available: why`.
    pub fn line(&self) -> String {
        match self {
            Verdict::Available(why) => format!("available: {why}"),
            Verdict::Unavailable(why) => format!("not available: {why}"),
        }
    }
}

/// The NvSci entry points the NvSci transport cannot do without
/// (`NvSciSyncFenceUpdateFence` is not among them: without it, waiters
/// receive their fences instead of building them).
pub const NVSCI_NEEDED: &[&str] = &[
    "NvSciBufModuleOpen",
    "NvSciBufAttrListReconcile",
    "NvSciBufObjAlloc",
    "NvSciBufObjGetCpuPtr",
    "NvSciBufObjFlushCpuCacheRange",
    "NvSciSyncModuleOpen",
    "NvSciSyncAttrListReconcile",
    "NvSciSyncObjAlloc",
    "NvSciSyncObjSignal",
    "NvSciSyncObjGenerateFence",
    "NvSciSyncFenceWait",
    "NvSciSyncCpuWaitContextAlloc",
];

/// The CUDA entry points the NvSci transport calls through the table
/// (besides the basics every context and stream needs).
pub const CUDA_NEEDED_FOR_NVSCI: &[&str] = &[
    "cuDeviceGetNvSciSyncAttributes",
    "cuImportExternalMemory",
    "cuExternalMemoryGetMappedBuffer",
    "cuDestroyExternalMemory",
    "cuImportExternalSemaphore",
    "cuSignalExternalSemaphoresAsync",
    "cuWaitExternalSemaphoresAsync",
    "cuDestroyExternalSemaphore",
    "cuLaunchHostFunc",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuLaunchKernel",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventElapsedTime",
    "cuMemHostAlloc",
    "cuMemHostGetDevicePointer",
];

/// Needed CUDA entry points for the NvSci transport the table lacks.
pub fn cuda_missing_for_nvsci(table: &FunctionTable) -> Vec<&'static str> {
    let present: Vec<&str> = table.cuda.present().collect();
    CUDA_NEEDED_FOR_NVSCI
        .iter()
        .copied()
        .filter(|n| !present.contains(n))
        .collect()
}

/// The NVRTC entry points the consumer compiles its kernel with.
pub const NVRTC_NEEDED: &[&str] = &[
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcDestroyProgram",
];

/// Whether the backend's table has NVRTC, which the jetson backend's kernel
/// is compiled with at run time (the driver's own loader fills the table's
/// optional NVRTC part): `Err` says what is missing.
fn kernel_libraries(table: &FunctionTable) -> Result<(), String> {
    let present: Vec<&str> = table.nvrtc.present().collect();
    let missing: Vec<&str> = NVRTC_NEEDED
        .iter()
        .copied()
        .filter(|n| !present.contains(n))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "NVRTC (libnvrtc.so) lacks {}, and the kernel that processes frames is compiled with it at run time: install the CUDA toolkit's NVRTC (JetPack has it) or add its lib folder to LD_LIBRARY_PATH",
        missing.join(", ")
    ))
}

/// Needed NvSci entry points the table lacks (by C name).
pub fn nvsci_missing(table: &FunctionTable) -> Vec<&'static str> {
    let present: Vec<&str> = table
        .nvscibuf
        .present()
        .chain(table.nvscisync.present())
        .collect();
    NVSCI_NEEDED
        .iter()
        .copied()
        .filter(|n| !present.contains(n))
        .collect()
}

/// Whether the table has every NvSci and CUDA entry point the NvSci
/// transport calls: `Err` names the missing ones.
fn nvsci_entry_points(table: &FunctionTable) -> Result<(), String> {
    let missing = nvsci_missing(table);
    if !missing.is_empty() {
        return Err(format!(
            "NvSci libraries or symbols missing ({}): libnvscibuf.so.1 / libnvscisync.so.1 come with the Jetson BSP",
            missing.join(", ")
        ));
    }
    let missing = cuda_missing_for_nvsci(table);
    if !missing.is_empty() {
        return Err(format!("the CUDA driver lacks {}", missing.join(", ")));
    }
    Ok(())
}

/// The first device's name and whether it is integrated, or why not known.
fn device0(backend: &Backend) -> Result<(String, bool), String> {
    let count = backend
        .device_count()
        .map_err(|e| format!("no CUDA device ({e})"))?;
    if count < 1 {
        return Err("the CUDA driver reports no device".into());
    }
    let dev = backend
        .device(0)
        .map_err(|e| format!("no CUDA device ({e})"))?;
    let name = dev
        .name()
        .unwrap_or_else(|e| format!("<name unknown: {e}>"));
    let integrated = dev
        .is_integrated()
        .map_err(|e| format!("cannot tell if device 0 is integrated ({e})"))?;
    Ok((name, integrated))
}

/// The Jetson (NvSci, integrated GPU) backend on `backend` (a real driver,
/// or the simulator for comparison; `Err` says why there is no driver):
/// available on the real driver with an integrated device 0, the NvSci
/// libraries and every entry point the NvSci transport calls, and NVRTC for
/// its kernel. Only the refusals were exercised (here and on the H200); the
/// available path has never run on a Jetson.
pub fn jetson(backend: Result<&Backend, &str>) -> Verdict {
    let backend = match backend {
        Ok(b) => b,
        Err(why) => return Verdict::Unavailable(why.to_string()),
    };
    let (name, integrated) = match device0(backend) {
        Ok(d) => d,
        Err(why) => return Verdict::Unavailable(why),
    };
    if !integrated {
        return Verdict::Unavailable(format!(
            "device 0 ({name}) is a discrete GPU; NvSci needs a Tegra integrated GPU"
        ));
    }
    if let Err(why) = nvsci_entry_points(backend.table()) {
        return Verdict::Unavailable(why);
    }
    if backend.kind() != BackendKind::Real {
        return Verdict::Unavailable(format!(
            "not the real CUDA driver: device 0 ({name}) is integrated and NvSci is present, but the jetson backend processes frames with a CUDA kernel (NVRTC), which only a real GPU runs; the simulator's processing is the `sim` backend"
        ));
    }
    if let Err(why) = kernel_libraries(backend.table()) {
        return Verdict::Unavailable(why);
    }
    Verdict::Available(format!(
        "device 0 ({name}) is an integrated GPU, the NvSci libraries and every entry point the NvSci transport calls are present, NVRTC found (this path is built but has never been run on a Jetson)"
    ))
}

/// Whether a Vulkan loader can be opened (the discrete-GPU producer's API).
fn vulkan_loader() -> Result<(), String> {
    tegra_interop_platform::vulkan_loader_present()
}

/// Asks a discrete-GPU transport built into the program whether it can run
/// here (the pipeline's `gpu::probe` when built with `--features vulkan`):
/// the reason either way, in one line.
pub type TransportProbe = fn() -> Result<String, String>;

/// The discrete-GPU backend (Vulkan producer, CUDA consumer), as seen by a
/// program that does not contain its transport (e.g. `interop_info`): the
/// hardware checks, then "not built into this program".
#[allow(dead_code)] // used by `interop_info`, not by the pipeline
pub fn gpu(backend: Result<&Backend, &str>) -> Verdict {
    gpu_with(backend, None)
}

/// The discrete-GPU backend: the hardware checks on `backend`, then the
/// transport's own probe where the program has the transport.
pub fn gpu_with(backend: Result<&Backend, &str>, transport: Option<TransportProbe>) -> Verdict {
    let backend = match backend {
        Ok(b) => b,
        Err(why) => return Verdict::Unavailable(why.to_string()),
    };
    let (name, integrated) = match device0(backend) {
        Ok(d) => d,
        Err(why) => return Verdict::Unavailable(why),
    };
    if integrated {
        return Verdict::Unavailable(format!(
            "device 0 ({name}) is an integrated GPU: use the jetson backend"
        ));
    }
    if let Err(e) = vulkan_loader() {
        return Verdict::Unavailable(format!("no Vulkan loader ({e})"));
    }
    match transport {
        Some(probe) => match probe() {
            Ok(why) => Verdict::Available(why),
            Err(why) => Verdict::Unavailable(why),
        },
        None => Verdict::Unavailable(format!(
            "device 0 ({name}) and a Vulkan loader were found, but this program was built without the discrete-GPU transport (the pipeline example has it when built with --features vulkan)"
        )),
    }
}

/// The simulator backend: always there.
pub fn sim() -> Verdict {
    Verdict::Available(
        "the built-in simulator of the CUDA + NvSci function table (Tegra-like: integrated GPU, NvSci present); not hardware".into(),
    )
}

/// The real driver, loaded once per probe.
pub struct Probe {
    /// `Backend::real()`, or why it failed (one line).
    pub real: Result<Arc<Backend>, String>,
    /// The discrete-GPU transport's probe, where the program has it.
    pub gpu_transport: Option<TransportProbe>,
}

impl Probe {
    /// Tries to load the installed NVIDIA driver.
    #[allow(clippy::new_without_default)] // it loads the real driver: not a default value
    pub fn new() -> Probe {
        Probe {
            real: Backend::real().map_err(|e| e.to_string().replace('\n', " ")),
            gpu_transport: None,
        }
    }

    /// The same, for a program that contains the discrete-GPU transport
    /// (`probe` is its own check: Vulkan device, NVRTC, ...).
    pub fn with_gpu_transport(mut self, probe: Option<TransportProbe>) -> Probe {
        self.gpu_transport = probe;
        self
    }

    fn backend(&self) -> Result<&Backend, &str> {
        self.real.as_deref().map_err(String::as_str)
    }

    /// The Jetson verdict on this machine.
    pub fn jetson(&self) -> Verdict {
        jetson(self.backend())
    }

    /// The discrete-GPU verdict on this machine.
    pub fn gpu(&self) -> Verdict {
        gpu_with(self.backend(), self.gpu_transport)
    }
}

/// What `--backend auto` picks among jetson -> gpu -> sim: the name and one
/// line saying why, naming why each earlier choice was passed over.
pub fn auto(probe: &Probe) -> (&'static str, String) {
    let mut passed = Vec::new();
    for (name, verdict) in [("jetson", probe.jetson()), ("gpu", probe.gpu())] {
        if verdict.is_available() {
            return (name, format!("auto: {name}: {}", verdict.line()));
        }
        passed.push(format!("{name}: {}", verdict.line()));
    }
    (
        "sim",
        format!("auto: the simulator, because {}", passed.join("; ")),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tegra_interop_sim::{Sim, SimConfig};

    fn unavailable(v: Verdict) -> String {
        match v {
            Verdict::Unavailable(why) => why,
            Verdict::Available(why) => panic!("available: {why}"),
        }
    }

    #[test]
    fn jetson_refuses_the_simulator_for_what_it_lacks() {
        // A Tegra-like simulator passes every hardware check; what it lacks
        // is the ability to run the kernel.
        let sim = Sim::with_config(SimConfig::tegra()).unwrap();
        let why = unavailable(jetson(Ok(&sim.backend())));
        assert!(
            why.starts_with("not the real CUDA driver: device 0 ("),
            "{why}"
        );
        assert!(why.contains("`sim` backend"), "{why}");
        // A discrete GPU is refused for that first.
        let sim = Sim::new().unwrap();
        let why = unavailable(jetson(Ok(&sim.backend())));
        assert!(why.contains("is a discrete GPU"), "{why}");
        // No driver: the loader's reason, as given.
        assert_eq!(unavailable(jetson(Err("no libcuda"))), "no libcuda");
    }

    #[test]
    fn jetson_names_the_missing_entry_points() {
        let sim = Sim::with_config(SimConfig::tegra()).unwrap();
        // The whole table passes (the Tegra simulator is refused later, for
        // its kernel: see the test above).
        assert_eq!(nvsci_entry_points(&sim.table()), Ok(()));
        let mut table = sim.table();
        table.nvscibuf.NvSciBufObjFlushCpuCacheRange = None;
        let why = nvsci_entry_points(&table).unwrap_err();
        assert!(
            why.starts_with("NvSci libraries or symbols missing (NvSciBufObjFlushCpuCacheRange)"),
            "{why}"
        );
        let mut table = sim.table();
        table.cuda.cuLaunchHostFunc = None;
        table.cuda.cuWaitExternalSemaphoresAsync = None;
        let why = nvsci_entry_points(&table).unwrap_err();
        assert_eq!(
            why,
            "the CUDA driver lacks cuWaitExternalSemaphoresAsync, cuLaunchHostFunc"
        );
        // NVRTC comes from the table's NVRTC part (the driver's loader), not
        // from cudarc: present on the simulator, named when missing.
        assert_eq!(kernel_libraries(sim.backend().table()), Ok(()));
        let mut table = sim.table();
        table.nvrtc.nvrtcCompileProgram = None;
        let why = kernel_libraries(&table).unwrap_err();
        assert!(
            why.starts_with("NVRTC (libnvrtc.so) lacks nvrtcCompileProgram,"),
            "{why}"
        );
        // Every name in the lists is an entry of the table.
        let all = sim.table();
        for n in CUDA_NEEDED_FOR_NVSCI {
            assert!(all.cuda.present().any(|p| p == *n), "{n}");
        }
        for n in NVRTC_NEEDED {
            assert!(all.nvrtc.present().any(|p| p == *n), "{n}");
        }
        for n in NVSCI_NEEDED {
            assert!(
                all.nvscibuf
                    .present()
                    .chain(all.nvscisync.present())
                    .any(|p| p == *n),
                "{n}"
            );
        }
    }
}
