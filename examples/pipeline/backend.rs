//! Picks and opens the transport for `--backend`, saying why.
//!
//! - `sim`: the NvSci transport ([`crate::nvsci`]) on the built-in
//!   simulator (a Tegra-like machine: integrated GPU, NvSci present);
//! - `jetson`: the same NvSci transport on the real driver; refused with the
//!   reason until it can run (see [`crate::probe::jetson`]);
//! - `gpu`: the discrete-GPU transport (Vulkan producer, CUDA consumer):
//!   not built into this example yet, refused with the reason;
//! - `host`: the host-reference transport ([`crate::host`]), a reference
//!   and testing transport, never picked by `auto`;
//! - `auto`: jetson -> gpu -> sim, the first that is available.

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
}

/// The backend that will run, after `auto` is resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Concrete {
    Host,
    Sim,
}

fn refuse(choice: BackendChoice, verdict: Verdict) -> Result<(Concrete, String), String> {
    match verdict {
        Verdict::Unavailable(why) => Err(format!(
            "backend `{}` is not available: {why}",
            choice.name()
        )),
        // Neither hardware backend can be opened by this example yet, so an
        // "available" verdict would be a bug in the probe.
        Verdict::Available(why) => Err(format!(
            "backend `{}` was reported available ({why}) but this example cannot open it",
            choice.name()
        )),
    }
}

/// Resolves `choice` to what will run, with the reason.
fn resolve(choice: BackendChoice) -> Result<(Concrete, String), String> {
    match choice {
        BackendChoice::Host => Ok((Concrete::Host, "requested with --backend host".into())),
        BackendChoice::Sim => match probe::sim() {
            Verdict::Available(why) => Ok((
                Concrete::Sim,
                format!("requested with --backend sim; {why}"),
            )),
            unavailable => refuse(choice, unavailable),
        },
        BackendChoice::Jetson => refuse(choice, Probe::new().jetson()),
        BackendChoice::Gpu => refuse(choice, Probe::new().gpu()),
        BackendChoice::Auto => match probe::auto(&Probe::new()) {
            ("sim", why) => Ok((Concrete::Sim, why)),
            ("jetson", why) => refuse(BackendChoice::Jetson, Verdict::Available(why)),
            (_, why) => refuse(BackendChoice::Gpu, Verdict::Available(why)),
        },
    }
}

/// Opens the transport `opts.backend` asks for and runs `run` over it;
/// everything the transport holds is released before this returns. On the
/// simulator, a run that leaves objects behind or that the simulator flags
/// as a misuse of the API fails here.
pub fn run_with<R>(
    opts: &Options,
    geometry: FrameGeometry,
    run: impl FnOnce(Opened<'_>) -> Result<R, String>,
) -> Result<R, String> {
    let schedule = FenceSchedule::new(opts.ring)?;
    let (concrete, why) = resolve(opts.backend)?;
    match concrete {
        Concrete::Host => {
            let mut t = HostReference::new(geometry, schedule, opts.fault);
            run(Opened {
                transport: &mut t,
                why,
                note: None,
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
                |t| {
                    run(Opened {
                        transport: t,
                        why,
                        note: Some(processing.describe()),
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
            let e = run_with(&o, g, |_| Ok(())).err().unwrap();
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
        let (name, why) =
            run_with(&o, g, |opened| Ok((opened.transport.backend(), opened.why))).unwrap();
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
        let name = run_with(&host, g, |o| Ok(o.transport.backend())).unwrap();
        assert_eq!(name, "host-reference");
    }
}
