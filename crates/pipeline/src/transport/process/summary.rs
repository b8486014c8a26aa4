//! Both sides' figures of a two-process run.

use tegra_interop::driver::nvsci::FenceSource;

use super::wire::Figures;

/// Both sides' figures.
#[derive(Debug)]
pub struct Summary {
    pub(super) frames: u64,
    pub(super) mismatches: u64,
    pub(super) source: FenceSource,
    pub(super) cuda_pid: u32,
    pub(super) camera: Figures,
    pub(super) cuda_us: u64,
}

impl Summary {
    /// Every frame arrived intact and came back processed.
    pub fn passed(&self) -> bool {
        self.mismatches == 0 && self.camera.failed == 0 && self.camera.verified == self.frames
    }

    /// The human summary.
    pub fn human(&self) -> String {
        let fps = |us: u64| self.frames as f64 / (us.max(1) as f64 / 1e6);
        format!(
            "two processes over NvSciIpc (simulated), fences {}\n\
             cuda   (pid {}): {} frames processed, {} bytes differed from the pattern, {:.1} frames/s\n\
             camera (pid {}): {}/{} frames read back verified, {} failed, write {} us/frame, {:.1} frames/s\n\
             result: {}\n",
            self.source.name(),
            self.cuda_pid,
            self.frames,
            self.mismatches,
            fps(self.cuda_us),
            self.camera.pid,
            self.camera.verified,
            self.frames,
            self.camera.failed,
            self.camera.write_us_per_frame,
            fps(self.camera.elapsed_us),
            if self.passed() { "PASS" } else { "FAIL" },
        )
    }

    /// The JSON summary.
    pub fn json(&self) -> String {
        format!(
            "{{\"processes\":2,\"frames\":{},\"fences\":\"{}\",\"passed\":{},\"cuda\":{{\"pid\":{},\"mismatched_bytes\":{},\"elapsed_us\":{}}},\"camera\":{{\"pid\":{},\"verified\":{},\"failed\":{},\"write_us_per_frame\":{},\"elapsed_us\":{}}}}}",
            self.frames,
            self.source.name(),
            self.passed(),
            self.cuda_pid,
            self.mismatches,
            self.cuda_us,
            self.camera.pid,
            self.camera.verified,
            self.camera.failed,
            self.camera.write_us_per_frame,
            self.camera.elapsed_us,
        )
    }
}
