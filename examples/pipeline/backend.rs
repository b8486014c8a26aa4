//! Picks and opens the transport for `--backend`, saying why.
//!
//! Only the host-reference transport is wired into the example so far; the
//! simulator (NvSci objects on the simulated driver), discrete-GPU (Vulkan
//! producer, CUDA consumer) and Jetson transports plug in here as further
//! [`FrameTransport`] implementations.

use crate::cli::{BackendChoice, Options};
use crate::host::HostReference;
use crate::ring::FenceSchedule;
use crate::transport::{FrameGeometry, FrameTransport};

/// An opened transport and the reason it was chosen.
pub struct Opened {
    /// The transport.
    pub transport: Box<dyn FrameTransport>,
    /// One line: why this backend.
    pub why: String,
}

/// Why `choice` cannot run here, or `None` when it can.
pub fn unavailable(choice: BackendChoice) -> Option<String> {
    match choice {
        BackendChoice::Auto | BackendChoice::Host => None,
        BackendChoice::Sim => {
            Some("the simulator transport is not wired into this example yet".into())
        }
        BackendChoice::Gpu => Some(
            "the discrete-GPU (Vulkan + CUDA) transport is not wired into this example yet".into(),
        ),
        BackendChoice::Jetson if !cfg!(tegra_aarch64_linux) => Some(
            "this is not an aarch64 Linux build, so no Jetson NvSci libraries can exist".into(),
        ),
        BackendChoice::Jetson => {
            Some("the Jetson (NvSci) transport is not wired into this example yet".into())
        }
    }
}

/// Opens the transport `opts.backend` asks for.
pub fn open(opts: &Options, geometry: FrameGeometry) -> Result<Opened, String> {
    let schedule = FenceSchedule::new(opts.ring)?;
    if let Some(why) = unavailable(opts.backend) {
        return Err(format!(
            "backend `{}` is not available: {why}",
            opts.backend.name()
        ));
    }
    let why = match opts.backend {
        BackendChoice::Host => "requested with --backend host".to_string(),
        _ => {
            let skipped: Vec<String> = [
                BackendChoice::Jetson,
                BackendChoice::Gpu,
                BackendChoice::Sim,
            ]
            .into_iter()
            .filter_map(|b| unavailable(b).map(|w| format!("{}: {w}", b.name())))
            .collect();
            format!(
                "auto: no interop backend available ({})",
                skipped.join("; ")
            )
        }
    };
    Ok(Opened {
        transport: Box::new(HostReference::new(geometry, schedule, opts.fault)),
        why,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn unwired_backends_are_refused_with_a_reason() {
        let g = FrameGeometry { stride: 4, rows: 4 };
        for b in [
            BackendChoice::Sim,
            BackendChoice::Gpu,
            BackendChoice::Jetson,
        ] {
            let o = Options {
                backend: b,
                ..Options::default()
            };
            let e = open(&o, g).err().unwrap();
            assert!(
                e.starts_with(&format!("backend `{}` is not available: ", b.name())),
                "{e}"
            );
        }
        let o = Options::default();
        let opened = open(&o, g).unwrap();
        assert_eq!(opened.transport.backend(), "host-reference");
        assert!(opened.why.starts_with("auto:"));
    }
}
