//! A user-sized program on the pipeline library: a camera producer writes
//! frames into a ring of NvSciBuf buffers, a CUDA consumer (a stream-ordered
//! host function on the simulator) checks and processes each one in place,
//! and NvSciSync fences order the two. Runs on the built-in simulator, so it
//! works anywhere:
//! `cargo run -p tegra-interop-pipeline --example camera_ring`.
//!
//! Each slot is handed out as a write lease: written here, then handed
//! over (a lease dropped unwritten would give its slot back). Each finished
//! frame comes back, and its processed bytes can be read through a read
//! lease. [`CameraRing`] keeps the ring (which owns the transport) and the
//! CUDA context in one struct, returned from [`open`].

use std::process::ExitCode;

use tegra_interop::driver::Context;
use tegra_interop_pipeline::camera::TestPattern;
use tegra_interop_pipeline::ring::{Finished, Ring, RingError};
use tegra_interop_pipeline::transport::host::Fault;
use tegra_interop_pipeline::transport::nvsci::{NvSciTransport, Processing};
use tegra_interop_pipeline::transport::FrameGeometry;
use tegra_interop_sim::{Sim, SimConfig};

const FRAMES: u64 = 24;

/// Everything a long-lived camera ring needs, in one value (fields drop in
/// order: the ring and its transport before the context, the simulator
/// last).
struct CameraRing {
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
        ring: Ring::new(transport).map_err(|e| e.to_string())?,
        _ctx: ctx,
        _sim: sim,
    })
}

impl CameraRing {
    /// Runs `frames` frames; returns how many came back intact (the
    /// consumer saw the camera's pattern, and the processed bytes read
    /// back are that pattern inverted).
    fn run(&mut self, frames: u64) -> Result<u64, RingError> {
        let stride = self.ring.geometry().stride;
        let mut verified = 0;
        for _ in 0..frames {
            // A full ring: wait for the consumer to finish the next slot's
            // frame, and read what finished before the slot is written again.
            self.ring.make_room()?;
            while let Some(done) = self.ring.collect()? {
                verified += u64::from(self.intact(&done, stride)?);
            }
            let mut lease = self.ring.acquire()?;
            let frame = lease.frame();
            // The camera writes its test pattern straight into the shared buffer.
            TestPattern::new(frame, stride).fill(lease.bytes_mut()?);
            self.ring.hand_over(lease)?;
        }
        while self.ring.pending() > 0 {
            let done = self.ring.wait_collect()?;
            verified += u64::from(self.intact(&done, stride)?);
        }
        Ok(verified)
    }

    /// Whether a finished frame came back intact (its read lease is
    /// dropped at the end, which gives the slot back).
    fn intact(&mut self, done: &Finished, stride: usize) -> Result<bool, RingError> {
        let Some(read) = self.ring.read(done)? else {
            return Ok(false);
        };
        let processed = TestPattern::new(done.frame(), stride);
        Ok(done.completion.mismatches == 0
            && processed.first_mismatch(read.bytes(), 0xff).is_none())
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
    let verified = open(Fault::None).and_then(|mut cam| cam.run(FRAMES).map_err(|e| e.to_string()));
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
    let run = |cam: &mut CameraRing| cam.run(FRAMES).map_err(|e| e.to_string());
    let mut cam = open(Fault::None)?;
    assert_eq!(run(&mut cam), Ok(FRAMES));
    assert_eq!(run(&mut cam), Ok(FRAMES), "the stored ring runs on");
    assert_eq!(open(Fault::Corrupt).and_then(|mut c| run(&mut c)), Ok(0));
    Ok(())
}
