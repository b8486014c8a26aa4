//! The machine a simulator models (`SimConfig`) and why one could not be made (`SimError`).

#![deny(unsafe_code)]

use super::*;

/// What the simulated machine looks like.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimConfig {
    /// Number of devices (default 1).
    pub devices: usize,
    /// `CU_DEVICE_ATTRIBUTE_INTEGRATED`: a Tegra-like integrated GPU.
    pub integrated: bool,
    /// `CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED`; when
    /// false, `TIMELINE_SEMAPHORE_FD` imports fail with NOT_SUPPORTED.
    pub timeline_supported: bool,
    /// What `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` (124) reports. On the
    /// H200 it is 1 (measured), and it describes *exporting* dma-bufs
    /// (`cuMemGetHandleForAddressRange`); it says nothing about importing
    /// them (see `dmabuf_import`).
    pub dmabuf_supported: bool,
    /// Whether `DMABUF_FD` memory imports are accepted. Default false, as
    /// measured on the H200: every `DMABUF_FD` import answered NOT_SUPPORTED
    /// (801) and left the fd open, even for a dma-buf CUDA exported itself.
    /// `true` is a chosen, unmeasured behaviour (a platform where the
    /// import works; memfd stands in for the dma-buf).
    pub dmabuf_import: bool,
    /// NvSci is present (Tegra). When false, the NvSci entry points answer
    /// like the measured discrete GPU without NvSci.
    pub nvsci: bool,
    /// The NvSci release the simulated libraries claim to be (default
    /// [`NvSciRelease::V6_0_10`]): keys and entry points that release lacks
    /// are missing, as on the real library.
    pub nvsci_release: NvSciRelease,
    /// What `cuDriverGetVersion` reports (default 12090, the header the
    /// project binds), and so which driver the simulator presents: its
    /// table lacks every CUDA entry point introduced after this release
    /// (`tegra_interop_sys::versions`, from the header's revision
    /// typedefs), as a real driver of that release does not export them;
    /// device attributes that release does not know are refused with
    /// INVALID_VALUE; its NVRTC reports the same release. See
    /// [`SimConfig::with_driver_version`] and [`SimConfig::CUDA_11_4`].
    pub driver_version: i32,
    /// How long `cuStreamSynchronize` / `cuCtxSynchronize` / synchronous
    /// copies wait before they give up with `CUDA_ERROR_TIMEOUT` and a
    /// [`DiagnosticKind::Hang`] diagnostic (the real driver would block
    /// forever). Default 30 s.
    pub hang_timeout: Duration,
    /// The NvSciIpc configuration file `NvSciIpcInit` reads, in the BSP's
    /// format (`INTER_PROCESS <ep_a> <ep_b> <nframes> <frame_size>` lines).
    /// `None` (the default) reads `/etc/nvsciipc.cfg`, as the BSP does.
    /// A path given here (with `nvsci` on) is checked when the simulator is
    /// made: a file that is not regular, too large, malformed or beyond the
    /// simulator's bounds is [`SimError::IpcConfig`].
    pub nvsciipc_config: Option<std::path::PathBuf>,
    /// How long [`Sim::with_config`] waits for a free slot when all
    /// [`SLOTS`] are in use. Default 60 s.
    pub slot_wait: Duration,
    /// Whether each [`Diagnostic`] is also written to stderr when it is
    /// recorded (default `true`: a program on the simulator sees its misuse
    /// at once, as a line starting `tegra-interop-sim`). A test that
    /// provokes misuse on purpose turns it off (here or with
    /// [`Sim::set_diagnostic_echo`]) and asserts on
    /// [`Sim::take_diagnostics`] instead.
    pub echo_diagnostics: bool,
    /// Whether the table has an NVRTC part (the simulator's stand-in that
    /// "compiles" sources whose kernels are registered, see
    /// [`crate::kernels`]); `false` models a machine without NVRTC.
    pub nvrtc: bool,
}

impl Default for SimConfig {
    /// The measured machine: one discrete GPU, timeline semaphores
    /// supported, dma-buf export reported (attribute 124 = 1) but
    /// `DMABUF_FD` import not supported, no NvSci.
    fn default() -> Self {
        SimConfig {
            devices: 1,
            integrated: false,
            timeline_supported: true,
            dmabuf_supported: true,
            dmabuf_import: false,
            nvsci: false,
            nvsci_release: NvSciRelease::V6_0_10,
            driver_version: 12090,
            hang_timeout: cuda::DEFAULT_HANG_TIMEOUT,
            nvsciipc_config: None,
            slot_wait: Duration::from_secs(60),
            echo_diagnostics: true,
            nvrtc: true,
        }
    }
}

impl SimConfig {
    /// The driver of JetPack 5 and DRIVE OS 6.0: CUDA 11.4 (11040).
    pub const CUDA_11_4: i32 = 11040;

    /// The driver the project's bindings come from: CUDA 12.9 (12090), the
    /// default.
    pub const CUDA_12_9: i32 = 12090;

    /// The same configuration presenting a driver of release `version`
    /// (as `cuDriverGetVersion` reports it, e.g. [`SimConfig::CUDA_11_4`]):
    /// see [`SimConfig::driver_version`].
    pub fn with_driver_version(mut self, version: i32) -> Self {
        self.driver_version = version;
        self
    }

    /// A Jetson-like machine: one integrated GPU with NvSci.
    pub fn tegra() -> Self {
        SimConfig {
            integrated: true,
            nvsci: true,
            ..SimConfig::default()
        }
    }

    /// The same configuration with `devices` devices.
    pub fn with_devices(mut self, devices: usize) -> Self {
        self.devices = devices;
        self
    }

    /// The same configuration claiming the NvSci release `release`.
    pub fn with_nvsci_release(mut self, release: NvSciRelease) -> Self {
        self.nvsci_release = release;
        self
    }

    /// The same configuration reading its NvSciIpc endpoints from `path`
    /// (a file in the BSP's `nvsciipc.cfg` format).
    pub fn with_nvsciipc_config(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.nvsciipc_config = Some(path.into());
        self
    }

    /// The same configuration with diagnostics written to stderr (`true`,
    /// the default) or only recorded (`false`); see
    /// [`SimConfig::echo_diagnostics`].
    pub fn with_diagnostic_echo(mut self, on: bool) -> Self {
        self.echo_diagnostics = on;
        self
    }

    /// The same configuration without NVRTC (`false`) or with it.
    pub fn with_nvrtc(mut self, present: bool) -> Self {
        self.nvrtc = present;
        self
    }

    /// The same configuration with another hang timeout.
    pub fn with_hang_timeout(mut self, timeout: Duration) -> Self {
        self.hang_timeout = timeout;
        self
    }
}

/// Why a simulator could not be made.
#[derive(Debug)]
#[non_exhaustive]
pub enum SimError {
    /// All [`SLOTS`] instance slots stayed in use for the configured wait.
    NoFreeSlot {
        /// The number of slots.
        slots: usize,
    },
    /// The NvSciIpc configuration named by [`SimConfig::nvsciipc_config`]
    /// cannot be used (checked when the simulator is made; `NvSciIpcInit`
    /// reads it again).
    IpcConfig(crate::nvsci::IpcConfigError),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::NoFreeSlot { slots } => write!(
                f,
                "all {slots} simulator slots are in use (drop unused Sims, or fewer tests in parallel)"
            ),
            SimError::IpcConfig(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SimError::IpcConfig(e) => Some(e),
            SimError::NoFreeSlot { .. } => None,
        }
    }
}
