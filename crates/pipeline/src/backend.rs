//! Picks and opens the transport for `--backend`, saying why.
//!
//! - `sim`: the NvSci transport ([`crate::nvsci`]) on the built-in
//!   simulator (a Tegra-like machine: integrated GPU, NvSci present);
//! - `jetson`: the same NvSci transport on the real driver, its frames
//!   processed by the NVRTC kernel ([`Processing::CudaKernel`]), when
//!   [`crate::probe::jetson`] finds an integrated GPU, the NvSci libraries
//!   and symbols and NVRTC; otherwise refused with the reason. Built and
//!   its refusals tested; never run on a Jetson;
//! - `gpu`: the discrete-GPU transport (Vulkan producer, CUDA NVRTC kernel
//!   consumer, `gpu.rs`), when the program was built with it (the pipeline
//!   with `--features vulkan` passes it in as a [`GpuHook`]) and its probe
//!   finds a discrete NVIDIA GPU, a matching Vulkan device and NVRTC;
//!   otherwise refused with the reason;
//! - `host`: the host-reference transport ([`crate::host`]), a reference
//!   and testing transport, never picked by `auto`;
//! - `auto`: jetson -> gpu -> sim, the first that is available.

use std::sync::Arc;

use tegra_interop::driver::Backend;
use tegra_interop_sim::{Sim, SimConfig};

use crate::cli::{BackendChoice, Options};
use crate::host::HostReference;
use crate::nvsci::{self, Processing};
use crate::probe::{self, Probe, Verdict};
use crate::ring::FenceSchedule;
use crate::transport::{FrameGeometry, FrameTransport};

/// An opened transport, the reason it was chosen, and what to tell the
/// reader about it.
pub struct Opened<'a> {
    /// The transport.
    pub transport: &'a mut dyn FrameTransport,
    /// One line: why this backend.
    pub why: String,
    /// One line about how frames are processed, where it matters.
    pub note: Option<&'static str>,
    /// In `--copy` mode the transport makes the copy itself (the GPU
    /// transport copies through device memory), so the camera writes into
    /// the slot directly instead of into a staging buffer.
    pub transport_copies: bool,
}

/// The pipeline's body, run once over the opened transport (its result is
/// kept by the caller of [`run_with`]).
pub type Body<'b> = &'b mut dyn FnMut(Opened<'_>) -> Result<(), String>;

/// The discrete-GPU transport, passed in by a program built with it (the
/// pipeline with `--features vulkan`); programs without it pass `None`.
#[derive(Clone, Copy)]
pub struct GpuHook {
    /// Whether it can run here (see [`probe::TransportProbe`]).
    pub probe: probe::TransportProbe,
    /// Opens it for the geometry, the ring and `--copy`, and runs the body
    /// over it with the given reason; everything is released before it
    /// returns.
    pub open: fn(FrameGeometry, FenceSchedule, bool, String, Body<'_>) -> Result<(), String>,
}

/// The backend that will run, after `auto` is resolved.
#[derive(Clone)]
enum Concrete {
    Host,
    Sim,
    /// The NvSci transport with the kernel, on this (real) driver.
    Jetson(Arc<Backend>),
    Gpu(GpuHook),
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

/// Opens the transport `opts.backend` asks for and runs `run` over it;
/// everything the transport holds is released before this returns. On the
/// simulator, a run that leaves objects behind or that the simulator flags
/// as a misuse of the API fails here.
pub fn run_with<R>(
    opts: &Options,
    geometry: FrameGeometry,
    gpu: Option<GpuHook>,
    run: impl FnOnce(Opened<'_>) -> Result<R, String>,
) -> Result<R, String> {
    let schedule = FenceSchedule::new(opts.ring)?;
    let (concrete, why) = resolve(opts.backend, gpu)?;
    match concrete {
        Concrete::Gpu(hook) => {
            let mut run = Some(run);
            let mut out = None;
            (hook.open)(geometry, schedule, opts.copy, why, &mut |opened| {
                let run = run.take().ok_or("the pipeline body was run twice")?;
                out = Some(run(opened)?);
                Ok(())
            })?;
            out.ok_or_else(|| "the GPU transport did not run the pipeline".to_string())
        }
        Concrete::Jetson(backend) => {
            // Built, never run on a Jetson (see `nvsci.rs`).
            let processing = Processing::CudaKernel;
            let result = nvsci::with_transport(
                &backend,
                "nvsci-jetson",
                processing,
                geometry,
                schedule,
                opts.fault,
                |t, note| {
                    run(Opened {
                        transport: t,
                        why,
                        note: Some(note),
                        transport_copies: false,
                    })
                },
            )??;
            if let Some(e) = backend.take_drop_errors().first() {
                return Err(format!(
                    "releasing the CUDA / NvSci objects: {}",
                    e.to_string().replace('\n', " ")
                ));
            }
            Ok(result)
        }
        Concrete::Host => {
            let mut t = HostReference::new(geometry, schedule, opts.fault);
            run(Opened {
                transport: &mut t,
                why,
                note: None,
                transport_copies: false,
            })
        }
        Concrete::Sim => {
            let sim = Sim::with_config(SimConfig::tegra())
                .map_err(|e| format!("cannot start the simulator: {e}"))?;
            let processing = Processing::HostFnOverSimulatedDeviceMemory;
            let result = nvsci::with_transport(
                &sim.backend(),
                "nvsci-sim",
                processing,
                geometry,
                schedule,
                opts.fault,
                |t, note| {
                    run(Opened {
                        transport: t,
                        why,
                        note: Some(note),
                        transport_copies: false,
                    })
                },
            )??;
            let (ledger, nvsci_ledger) = (sim.ledger(), sim.nvsci_ledger());
            if !ledger.is_clean() || !nvsci_ledger.is_clean() {
                return Err(format!(
                    "the simulator still holds objects after the run (CUDA: {ledger}; NvSci: {nvsci_ledger})"
                ));
            }
            if let Some(d) = sim.diagnostics().first() {
                return Err(format!(
                    "the simulator flagged a misuse of the API: {}",
                    d.to_string().replace('\n', " ")
                ));
            }
            Ok(result)
        }
    }
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
            let e = run_with(&o, g, None, |_| Ok(())).err().unwrap();
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
        let o = Options::default();
        let (name, why) = run_with(&o, g, None, |opened| {
            Ok((opened.transport.backend(), opened.why))
        })
        .unwrap();
        assert_eq!(name, "nvsci-sim");
        assert!(
            why.starts_with("auto: the simulator, because jetson: not available: "),
            "{why}"
        );
        assert!(why.contains("; gpu: not available: "), "{why}");
        let host = Options {
            backend: BackendChoice::Host,
            ..Options::default()
        };
        let name = run_with(&host, g, None, |o| Ok(o.transport.backend())).unwrap();
        assert_eq!(name, "host-reference");
    }
}
