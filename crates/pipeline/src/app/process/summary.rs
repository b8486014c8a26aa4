//! Both sides' figures of a two-process run, as the pipeline's [`Report`].

use std::time::Duration;

use tegra_interop::driver::nvsci::FenceSource;

use super::error::ProcessError;
use super::wire::Figures;
use super::Settings;
use crate::app::cli::{format_name, Options};
use crate::app::report::{Report, Verification};
use crate::app::stats::{Samples, Summary as Stat};

/// Both sides' figures.
#[derive(Debug)]
pub struct Summary {
    pub(super) frames: u64,
    /// Bytes the consumer found different from the pattern.
    pub(super) mismatches: u64,
    /// Frames in which it found any.
    pub(super) bad_frames: u64,
    pub(super) source: FenceSource,
    /// The real driver (a Jetson), or the simulator.
    pub(super) real: bool,
    /// How the frames were processed and fences travelled (one line).
    pub(super) note: &'static str,
    /// On the simulator: launches of the check-and-invert kernel its twin
    /// ran (one per processed frame).
    pub(super) kernel_launches: Option<u64>,
    pub(super) cuda_pid: u32,
    pub(super) camera: Figures,
    pub(super) cuda_us: u64,
    /// Per frame, measured by the CUDA process's ring.
    pub(super) latency: Option<Stat>,
    pub(super) write: Option<Stat>,
    pub(super) process: Option<Stat>,
    pub(super) queued: Option<Stat>,
}

/// The per-frame figures the CUDA process measures: latency from the
/// ticket handed to the camera to the frame processed, the camera's write
/// (as it reports it), the processing, the time a ready frame queued.
pub(super) struct Timings {
    pub latency: Samples,
    pub write: Samples,
    pub process: Samples,
    pub queued: Samples,
}

impl Timings {
    pub fn new() -> Result<Timings, ProcessError> {
        let new = || Samples::new().map_err(ProcessError::Figures);
        Ok(Timings {
            latency: new()?,
            write: new()?,
            process: new()?,
            queued: new()?,
        })
    }
}

impl Summary {
    /// Every frame arrived intact and came back processed.
    pub fn passed(&self) -> bool {
        self.mismatches == 0 && self.camera.failed == 0 && self.camera.verified == self.frames
    }

    fn verification(&self) -> Verification {
        let missing = self.frames.saturating_sub(self.camera.verified);
        let first_failure = if self.bad_frames > 0 {
            Some(format!(
                "the consumer saw {} byte(s) that differ from the camera pattern in {} frame(s)",
                self.mismatches, self.bad_frames
            ))
        } else if self.camera.failed > 0 || missing > 0 {
            Some(format!(
                "the camera read back {}/{} frames, {} of them wrong",
                self.camera.verified, self.frames, self.camera.failed
            ))
        } else {
            None
        };
        Verification {
            consumer_ok: self.frames.saturating_sub(self.bad_frames),
            readback_ok: self.camera.verified.saturating_sub(self.camera.failed),
            pulses: None,
            failed: self.bad_frames + self.camera.failed + missing,
            first_failure,
            by_digest: false,
        }
    }

    /// The run's [`Report`], as the one-process mode gives it: the figures
    /// this mode measures, the others marked as not measured.
    pub(super) fn report(&self, opts: &Options, settings: &Settings) -> Report {
        let or_none = |s: Option<Stat>| s.unwrap_or(Stat::NOT_MEASURED);
        let (backend, over) = match self.real {
            true => ("nvsci-ipc-jetson", "the real driver"),
            false => ("nvsci-ipc-sim", "the built-in simulator"),
        };
        let launches = match self.kernel_launches {
            Some(n) => format!(", {n} kernel launches (its simulator twin)"),
            None => String::new(),
        };
        Report {
            processes: 2,
            backend,
            why: format!(
                "--processes 2: the camera in a second process, connected to this CUDA process only by NvSciIpc on {over}; fences {}",
                self.source.name()
            ),
            note: Some(self.note),
            details: Some(format!(
                "cuda pid {}: {} frames processed in {} us{launches}, {} bytes differed from the pattern; camera pid {}: {}/{} frames read back verified, {} failed, write {} us/frame, {} us",
                self.cuda_pid,
                self.frames,
                self.cuda_us,
                self.mismatches,
                self.camera.pid,
                self.camera.verified,
                self.frames,
                self.camera.failed,
                self.camera.write_us_per_frame,
                self.camera.elapsed_us,
            )),
            frames: self.frames,
            ring: settings.ring,
            width: opts.sensor.width,
            height: opts.sensor.height,
            format: format_name(opts.sensor.format),
            frame_len: settings.geometry.frame_len(),
            copy: false,
            camera_ahead: false,
            wall: Duration::from_micros(self.cuda_us),
            latency: or_none(self.latency),
            write: or_none(self.write),
            process: or_none(self.process),
            queued: or_none(self.queued),
            held: Stat::NOT_MEASURED,
            overhead: Stat::NOT_MEASURED,
            stages: Vec::new(),
            verification: self.verification(),
        }
    }
}
