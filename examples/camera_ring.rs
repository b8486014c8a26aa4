//! A user-sized program on the pipeline library: a camera producer writes
//! frames into a ring of NvSciBuf buffers, a CUDA consumer (a stream-ordered
//! host function on the simulator) checks and processes each one in place,
//! and NvSciSync fences order the two. Runs on the built-in simulator, so it
//! works anywhere: `cargo run -p tegra-interop --example camera_ring`.
//!
//! [`CameraRing`] stores the CUDA context, the ring and its buffers and
//! semaphores (the transport) in one struct, returned from [`open`].

use std::process::ExitCode;
use std::time::Instant;

use tegra_interop::driver::Context;
use tegra_interop_pipeline::camera::TestPattern;
use tegra_interop_pipeline::ring::{Collected, Ring};
use tegra_interop_pipeline::transport::host::Fault;
use tegra_interop_pipeline::transport::nvsci::{NvSciTransport, Processing};
use tegra_interop_pipeline::transport::{Completion, FrameGeometry, FrameTransport};
use tegra_interop_sim::{Sim, SimConfig};

const FRAMES: u64 = 24;

/// Everything a long-lived camera ring needs, in one value (fields drop in
/// order: the transport before the context, the simulator last).
struct CameraRing {
    /// The NvSciBuf buffers, NvSciSync semaphores and the consumer's stream.
    transport: NvSciTransport,
    ring: Ring,
    /// The consumer's context, kept for the program's own CUDA work.
    _ctx: Context,
    _sim: Sim,
}

/// Opens a 3-slot ring of 256 x 64 frames on a simulated Jetson.
fn open(fault: Fault) -> Result<CameraRing, String> {
    let sim = Sim::with_config(SimConfig::tegra()).map_err(|e| e.to_string())?;
    let ctx = Context::new(sim.backend(), 0).map_err(|e| e.to_string())?;
    let geometry = FrameGeometry {
        stride: 256,
        rows: 64,
    };
    let sim_fn = Processing::HostFnOverSimulatedDeviceMemory;
    let transport = NvSciTransport::new(&ctx, "camera_ring", sim_fn, geometry, 3, fault)?;
    Ok(CameraRing {
        transport,
        ring: Ring::new(3)?,
        _ctx: ctx,
        _sim: sim,
    })
}

impl CameraRing {
    /// Runs `frames` frames; returns how many the consumer found intact.
    fn run(&mut self, frames: u64) -> Result<u64, String> {
        let (t, ring) = (&mut self.transport, &mut self.ring);
        let stride = t.geometry().stride;
        let mut verified = 0;
        let mut count = |c: &Completion, _: &Collected| {
            verified += u64::from(c.mismatches == 0);
            Ok(())
        };
        for _ in 0..frames {
            // A full ring: wait for the consumer to hand the oldest slot back.
            ring.make_room(t, &mut count)?;
            ring.produce(t, |ticket, bytes| {
                // The camera writes its test pattern straight into the shared buffer.
                let started = Instant::now();
                TestPattern::new(ticket.frame(), stride).fill(bytes);
                Ok((started, started.elapsed().as_nanos() as u64))
            })?;
        }
        ring.drain(t, &mut count)?;
        Ok(verified)
    }
}

/// What the program says about a run of `frames` frames: how many arrived
/// intact, or why the run failed.
fn summary(verified: &Result<u64, String>, frames: u64) -> String {
    match verified {
        Ok(n) => format!("camera_ring: {n} of {frames} frames verified"),
        Err(e) => format!("camera_ring: the run failed: {e}"),
    }
}

fn main() -> ExitCode {
    let verified = open(Fault::None).and_then(|mut cam| cam.run(FRAMES));
    let line = summary(&verified, FRAMES);
    if verified.is_ok() {
        println!("{line}");
    } else {
        eprintln!("{line}");
    }
    ExitCode::from(u8::from(verified != Ok(FRAMES)))
}

#[test]
fn the_summary_names_counts_and_errors_plainly() {
    // It printed "Ok(24) of 24 frames verified" (issue 24).
    assert_eq!(
        summary(&Ok(24), 24),
        "camera_ring: 24 of 24 frames verified"
    );
    assert_eq!(summary(&Ok(0), 24), "camera_ring: 0 of 24 frames verified");
    let failed = summary(&Err("CUDA context: no device".into()), 24);
    assert_eq!(
        failed,
        "camera_ring: the run failed: CUDA context: no device"
    );
    assert!(
        !failed.contains("Err(") && !failed.contains('"'),
        "{failed}"
    );
}

#[test]
fn every_frame_arrives_and_a_damaged_one_is_caught() -> Result<(), String> {
    let mut cam = open(Fault::None)?;
    assert_eq!(cam.run(FRAMES), Ok(FRAMES));
    assert_eq!(cam.run(FRAMES), Ok(FRAMES), "the stored ring runs on");
    assert_eq!(open(Fault::Corrupt).and_then(|mut c| c.run(FRAMES)), Ok(0));
    Ok(())
}
