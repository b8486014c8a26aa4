//! A user-sized program on the pipeline library: a camera producer writes
//! frames into a ring of NvSciBuf buffers, a CUDA consumer (a stream-ordered
//! host function on the simulator) checks and processes each one in place,
//! and NvSciSync fences order the two. Runs on the built-in simulator, so it
//! works anywhere: `cargo run --example camera_ring`.
//!
//! Exit status 0 when every frame arrived intact and was processed.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use tegra_interop_pipeline::camera::TestPattern;
use tegra_interop_pipeline::host::Fault;
use tegra_interop_pipeline::nvsci::{self, Processing};
use tegra_interop_pipeline::ring::{FenceSchedule, InFlight, Ring};
use tegra_interop_pipeline::transport::{FrameGeometry, FrameTransport};
use tegra_interop_sim::{Sim, SimConfig};

const FRAMES: u64 = 24;

/// Drives `FRAMES` frames through `t`; returns the frames the consumer
/// verified.
fn drive(t: &mut dyn FrameTransport, ring: &mut Ring) -> Result<u64, String> {
    let stride = t.geometry().stride;
    let mut verified = 0;
    for frame in 0..FRAMES {
        let slot = ring.schedule().slot(frame);
        // A full ring: wait for the consumer to hand the oldest slot back.
        while ring.is_busy(slot) {
            let done = t.wait_complete().map_err(|e| e.0)?;
            ring.complete(done.slot, done.frame)?;
            verified += u64::from(done.mismatches == 0);
        }
        // The camera writes its test pattern straight into the shared buffer.
        let started = Instant::now();
        TestPattern::new(frame, stride).fill(t.producer_acquire(slot, frame).map_err(|e| e.0)?);
        t.producer_release(slot, frame).map_err(|e| e.0)?;
        ring.submit(InFlight {
            frame,
            started,
            write_ns: 0,
        })?;
        t.consumer_submit(slot, frame).map_err(|e| e.0)?;
    }
    while ring.in_flight() > 0 {
        let done = t.wait_complete().map_err(|e| e.0)?;
        ring.complete(done.slot, done.frame)?;
        verified += u64::from(done.mismatches == 0);
    }
    Ok(verified)
}

/// Sets up the simulator, the ring and the NvSci transport; runs `drive`.
fn run(fault: Fault) -> Result<u64, String> {
    let sim = Sim::with_config(SimConfig::tegra()).map_err(|e| e.to_string())?;
    let backend = Arc::new(sim.backend());
    let geometry = FrameGeometry {
        stride: 256,
        rows: 64,
    };
    let schedule = FenceSchedule::new(3)?;
    let mut ring = Ring::new(schedule);
    let processing = Processing::HostFnOverSimulatedDeviceMemory;
    nvsci::with_transport(
        &backend,
        "camera_ring",
        processing,
        geometry,
        schedule,
        fault,
        |t, _| drive(t, &mut ring),
    )?
}

fn main() -> ExitCode {
    match run(Fault::None) {
        Ok(n) if n == FRAMES => {
            println!("camera_ring: {n}/{FRAMES} frames verified");
            ExitCode::SUCCESS
        }
        Ok(n) => {
            eprintln!("camera_ring: only {n}/{FRAMES} frames verified");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("camera_ring: {e}");
            ExitCode::FAILURE
        }
    }
}

#[test]
fn every_frame_arrives_and_a_damaged_one_is_caught() {
    assert_eq!(run(Fault::None), Ok(FRAMES));
    assert_eq!(run(Fault::Corrupt), Ok(0));
}
