//! Picks and opens the transport for `--backend`, saying why.
//!
//! - `sim`: the NvSci transport ([`crate::transport::nvsci`]) on the built-in
//!   simulator (a Tegra-like machine: integrated GPU, NvSci present);
//! - `jetson`: the same NvSci transport on the real driver, its frames
//!   processed by the NVRTC kernel ([`Processing::CudaKernel`]), when
//!   [`crate::app::probe::jetson`] finds an integrated GPU, the NvSci libraries
//!   and symbols and NVRTC; otherwise refused with the reason. Built and
//!   its refusals tested; never run on a Jetson;
//! - `gpu`: the discrete-GPU transport (Vulkan producer, CUDA NVRTC kernel
//!   consumer, `gpu.rs`), when the program was built with it (the pipeline
//!   with `--features vulkan` passes it in as a [`GpuHook`]) and its probe
//!   finds a discrete NVIDIA GPU, a matching Vulkan device and NVRTC;
//!   otherwise refused with the reason;
//! - `egl`: the EGLStream transport ([`crate::transport::egl`]): on a real GPU with
//!   an EGL display when the program was built with `--features vulkan`
//!   and one opens, otherwise on the simulator, saying why;
//! - `host`: the host-reference transport ([`crate::transport::host`]), a reference
//!   and testing transport, never picked by `auto`;
//! - `auto`: jetson -> gpu -> sim, the first that is available.

use std::sync::Arc;

use tegra_interop::driver::Backend;
use tegra_interop_sim::{Sim, SimConfig};

use crate::app::cli::{BackendChoice, Options, SimDriver};
use crate::app::probe::{self, Probe, Verdict};
use crate::ring::MAX_SLOTS;
use crate::transport::host::HostReference;
use crate::transport::nvsci::{NvSciTransport, Processing};
use crate::transport::{FrameGeometry, FrameTransport};

/// An opened transport, the reason it was chosen, and what to tell the
/// reader about it. The caller owns it; [`Opened::close`] releases it and
/// reports what was left behind.
pub struct Opened {
    /// The transport.
    pub transport: Box<dyn FrameTransport>,
    /// One line: why this backend.
    pub why: String,
    /// One line about how frames are processed, where it matters.
    pub note: Option<&'static str>,
    /// In `--copy` mode the transport makes the copy itself (the GPU
    /// transport copies through device memory), so the camera writes into
    /// the slot directly instead of into a staging buffer.
    pub transport_copies: bool,
    /// The transport copies every frame whatever `--copy` says (the
    /// EGLStream: the consumer acquires the driver's copy), so the run is
    /// reported as copy-based.
    pub always_copies: bool,
    /// What to check once the transport is closed (declared after it, so
    /// a dropped `Opened` drops the transport first).
    after: After,
}

/// What [`Opened::close`] checks after the transport is released.
enum After {
    Nothing,
    /// The simulator's ledgers and diagnostics.
    Sim(Sim),
    /// The real driver's deferred release errors.
    Driver(Arc<Backend>),
}

/// An [`Opened`] without its transport (which went into a ring): what to
/// report about it, and what to check once it is closed.
pub struct OpenedRest {
    /// One line: why this backend.
    pub why: String,
    /// One line about how frames are processed, where it matters.
    pub note: Option<&'static str>,
    /// See [`Opened::transport_copies`].
    pub transport_copies: bool,
    /// See [`Opened::always_copies`].
    pub always_copies: bool,
    after: After,
}

impl Opened {
    /// The transport, and the rest.
    pub fn split(self) -> (Box<dyn FrameTransport>, OpenedRest) {
        let rest = OpenedRest {
            why: self.why,
            note: self.note,
            transport_copies: self.transport_copies,
            always_copies: self.always_copies,
            after: self.after,
        };
        (self.transport, rest)
    }

    /// Closes the transport, then checks what it left: on the simulator, a
    /// run that leaves objects behind or that the simulator flagged as a
    /// misuse of the API fails here; on the real driver, a failed release.
    pub fn close(self) -> Result<(), String> {
        let (transport, rest) = self.split();
        rest.close(transport.close().map_err(String::from))
    }
}

impl OpenedRest {
    /// Once the transport was closed (`closed`: how that went), checks what
    /// it left (see [`Opened::close`]); the first error.
    pub fn close(self, closed: Result<(), String>) -> Result<(), String> {
        closed?;
        match self.after {
            After::Nothing => Ok(()),
            After::Driver(backend) => match backend.take_drop_errors().first() {
                Some(e) => Err(format!(
                    "releasing the CUDA / NvSci objects: {}",
                    e.to_string().replace('\n', " ")
                )),
                None => Ok(()),
            },
            After::Sim(sim) => {
                let (ledger, nvsci_ledger) = (sim.ledger(), sim.nvsci_ledger());
                if !ledger.is_clean() || !nvsci_ledger.is_clean() {
                    return Err(format!(
                        "the simulator still holds objects after the run (CUDA: {ledger}; NvSci: {nvsci_ledger})"
                    ));
                }
                match sim.diagnostics().first() {
                    Some(d) => Err(format!(
                        "the simulator flagged a misuse of the API: {}",
                        d.to_string().replace('\n', " ")
                    )),
                    None => Ok(()),
                }
            }
        }
    }
}

/// The discrete-GPU transport's opener: geometry, slots, the options
/// (`--copy`, the environment's GPU settings); the transport and its
/// one-line note.
pub type GpuOpen =
    fn(FrameGeometry, usize, &Options) -> Result<(Box<dyn FrameTransport>, &'static str), String>;

/// The discrete-GPU transport, passed in by a program built with it (the
/// pipeline with `--features vulkan`); programs without it pass `None`.
#[derive(Clone, Copy)]
pub struct GpuHook {
    /// Whether it can run here (see [`probe::TransportProbe`]).
    pub probe: probe::TransportProbe,
    /// Opens it for the geometry, the ring's size and the options.
    pub open: GpuOpen,
}

/// The backend that will run, after `auto` is resolved.
#[derive(Clone)]
enum Concrete {
    Host,
    Sim,
    /// The NvSci transport with the kernel, on this (real) driver.
    Jetson(Arc<Backend>),
    Gpu(GpuHook),
    Egl,
}

fn refuse(choice: BackendChoice, verdict: Verdict) -> Result<(Concrete, String), String> {
    match verdict {
        Verdict::Unavailable(why) => Err(format!(
            "backend `{}` is not available: {why}",
            choice.name()
        )),
        // Only reached for a backend this program cannot open, so an
        // "available" verdict would be a bug in the probe.
        Verdict::Available(why) => Err(format!(
            "backend `{}` was reported available ({why}) but this example cannot open it",
            choice.name()
        )),
    }
}

/// The jetson backend on the probed driver, once its probe said available.
fn jetson_on(probe: &Probe, why: String) -> Result<(Concrete, String), String> {
    match &probe.real {
        Ok(backend) => Ok((Concrete::Jetson(Arc::clone(backend)), why)),
        Err(e) => refuse(BackendChoice::Jetson, Verdict::Unavailable(e.clone())),
    }
}

/// Resolves `choice` to what will run, with the reason.
fn resolve(choice: BackendChoice, gpu: Option<GpuHook>) -> Result<(Concrete, String), String> {
    let probe = || Probe::new().with_gpu_transport(gpu.map(|g| g.probe));
    match choice {
        BackendChoice::Host => Ok((Concrete::Host, "requested with --backend host".into())),
        BackendChoice::Egl => Ok((Concrete::Egl, "requested with --backend egl".into())),
        BackendChoice::Sim => match probe::sim() {
            Verdict::Available(why) => Ok((
                Concrete::Sim,
                format!("requested with --backend sim; {why}"),
            )),
            unavailable => refuse(choice, unavailable),
        },
        BackendChoice::Jetson => {
            let p = probe();
            match p.jetson() {
                Verdict::Available(why) => {
                    jetson_on(&p, format!("requested with --backend jetson; {why}"))
                }
                unavailable => refuse(choice, unavailable),
            }
        }
        BackendChoice::Gpu => match (probe().gpu(), gpu) {
            (Verdict::Available(why), Some(hook)) => Ok((
                Concrete::Gpu(hook),
                format!("requested with --backend gpu; {why}"),
            )),
            (verdict, _) => refuse(choice, verdict),
        },
        BackendChoice::Auto => {
            let p = probe();
            match (probe::auto(&p), gpu) {
                (("sim", why), _) => Ok((Concrete::Sim, why)),
                (("gpu", why), Some(hook)) => Ok((Concrete::Gpu(hook), why)),
                (("jetson", why), _) => jetson_on(&p, why),
                ((_, why), _) => refuse(BackendChoice::Gpu, Verdict::Available(why)),
            }
        }
    }
}

/// Opens the transport `opts.backend` asks for, with the reason; the
/// caller owns it and closes it with [`Opened::close`].
pub fn open(
    opts: &Options,
    geometry: FrameGeometry,
    gpu: Option<GpuHook>,
) -> Result<Opened, String> {
    if opts.ring == 0 || opts.ring > MAX_SLOTS {
        return Err(format!(
            "ring size {} is outside 1..={MAX_SLOTS} (the ring has a fixed capacity)",
            opts.ring
        ));
    }
    let (concrete, why) = resolve(opts.backend, gpu)?;
    let why = match concrete {
        Concrete::Sim if opts.sim_driver != SimDriver::default() => format!(
            "{why}; presenting a CUDA {} driver (--sim-driver): no entry point introduced later",
            opts.sim_driver.name()
        ),
        _ => why,
    };
    if matches!(concrete, Concrete::Egl) {
        return open_egl(why, geometry, opts.ring, opts.egl_pool);
    }
    let opened = |transport: Box<dyn FrameTransport>, note, transport_copies, after| Opened {
        transport,
        why,
        note,
        transport_copies,
        always_copies: false,
        after,
    };
    Ok(match concrete {
        Concrete::Egl => return open_egl(String::new(), geometry, opts.ring, opts.egl_pool),
        Concrete::Gpu(hook) => {
            let (t, note) = (hook.open)(geometry, opts.ring, opts)?;
            opened(t, Some(note), true, After::Nothing)
        }
        Concrete::Jetson(backend) => {
            // Built, never run on a Jetson (see `nvsci.rs`).
            let t = NvSciTransport::open(
                &backend,
                "nvsci-jetson",
                Processing::CudaKernel,
                geometry,
                opts.ring,
            )
            .map(|t| t.with_fault(opts.fault))?;
            let note = Some(t.note());
            opened(Box::new(t), note, false, After::Driver(backend))
        }
        Concrete::Host => {
            let t = HostReference::new(geometry, opts.ring, opts.fault);
            opened(Box::new(t), None, false, After::Nothing)
        }
        Concrete::Sim => {
            // The kernel path, as on a Jetson: the same Consumer (NVRTC,
            // module, launches, events, counters) through the simulator's
            // table, the kernels running as their registered Rust twins.
            // `--sim-driver`: the release the simulated driver presents.
            let config = SimConfig::tegra().with_driver_version(opts.sim_driver.version());
            let sim =
                Sim::with_config(config).map_err(|e| format!("cannot start the simulator: {e}"))?;
            crate::consumer::twin::register(&sim);
            let t = open_nvsci_sim(opts, geometry, &sim)?;
            let note = Some(t.note());
            opened(Box::new(t), note, false, After::Sim(sim))
        }
    })
}

/// The simulator's NvSci transport: the check-and-invert kernel for the
/// sensor model's frames; for a source's own frames (no test pattern,
/// `--source gst:...`) the `Invert` work, which the checker undoes
/// (`build_source`).
fn open_nvsci_sim(
    opts: &Options,
    geometry: FrameGeometry,
    sim: &Sim,
) -> Result<NvSciTransport, String> {
    if opts.source == crate::app::cli::SourceChoice::Sensor {
        let processing = Processing::CudaKernel;
        let t = NvSciTransport::open(&sim.backend(), "nvsci-sim", processing, geometry, opts.ring)?;
        return Ok(t.with_fault(opts.fault));
    }
    crate::consumer::Invert::register_twin(sim);
    let ctx = tegra_interop::driver::Context::new(sim.backend(), 0)
        .map_err(|e| format!("CUDA context on the simulator: {e}"))?;
    let (work, placement) = nvsci_work(&opts.source);
    let t = NvSciTransport::with_work(&ctx, "nvsci-sim", work, placement, geometry, opts.ring)?;
    Ok(t.with_fault(opts.fault))
}

/// The consumer's work in the NvSci modes (one process, and the CUDA
/// process of `--processes 2`), in place on the NvSciBuf buffer: the
/// check-and-invert kernel ([`CheckInvert`](crate::consumer::CheckInvert))
/// for the sensor model's frames, the `Invert` work for a source's own
/// frames (no test pattern; the checker undoes it). On the simulator the
/// caller registers the chosen work's twins.
pub(crate) fn nvsci_work(
    source: &crate::app::cli::SourceChoice,
) -> (
    Box<dyn crate::consumer::FrameWork>,
    crate::consumer::Placement,
) {
    let work: Box<dyn crate::consumer::FrameWork> = match source {
        crate::app::cli::SourceChoice::Sensor => crate::consumer::CheckInvert::boxed(),
        _ => Box::new(crate::consumer::Invert::new()),
    };
    (work, crate::consumer::Placement::InPlace)
}

/// The EGLStream transport: on a real GPU with an EGL display where one
/// opens, else on the simulator with the reason. The stream makes the copy
/// (measured on the H200: the consumer acquires its own copy), so the
/// camera writes the slot directly.
fn open_egl(
    why: String,
    geometry: FrameGeometry,
    ring: usize,
    pool: Option<usize>,
) -> Result<Opened, String> {
    Ok(
        match crate::transport::egl::open_real(geometry, ring, pool) {
            Ok((t, backend)) => Opened {
                note: Some(t.note()),
                transport: Box::new(t),
                why: format!("{why}; a GPU with an EGL display"),
                transport_copies: true,
                always_copies: true,
                after: After::Driver(backend),
            },
            Err(no) => {
                let (t, sim) = crate::transport::egl::open_sim(geometry, ring, pool)?;
                Opened {
                    note: Some(t.note()),
                    transport: Box::new(t),
                    why: format!("{why}; on the simulator, because no real EGLStream opened: {no}")
                        .replace('\n', " "),
                    transport_copies: true,
                    always_copies: true,
                    after: After::Sim(sim),
                }
            }
        },
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hardware_backends_are_refused_with_a_reason_here() {
        let g = FrameGeometry { stride: 4, rows: 4 };
        for b in [BackendChoice::Gpu, BackendChoice::Jetson] {
            let o = Options {
                backend: b,
                ..Options::default()
            };
            let e = open(&o, g, None).err().unwrap();
            assert!(
                e.starts_with(&format!("backend `{}` is not available: ", b.name())),
                "{e}"
            );
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn auto_falls_back_to_the_simulator_and_says_why() {
        let g = FrameGeometry { stride: 4, rows: 4 };
        let opened = open(&Options::default(), g, None).unwrap();
        assert_eq!(opened.transport.info().backend, "nvsci-sim");
        let why = opened.why.clone();
        opened.close().unwrap();
        assert!(
            why.starts_with("auto: the simulator, because jetson: not available: "),
            "{why}"
        );
        assert!(why.contains("; gpu: not available: "), "{why}");
        let host = Options {
            backend: BackendChoice::Host,
            ..Options::default()
        };
        let opened = open(&host, g, None).unwrap();
        assert_eq!(opened.transport.info().backend, "host-reference");
        opened.close().unwrap();
    }
}
