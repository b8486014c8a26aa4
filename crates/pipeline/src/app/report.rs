//! The end-of-run summary (human text or JSON) and the progress bar.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::app::stats::Summary;

/// Verification tallies: a run is good only if every frame passed every check.
#[derive(Debug, Default, Clone)]
pub struct Verification {
    /// Frames the consumer found identical to the camera's pattern.
    pub consumer_ok: u64,
    /// Frames whose processed bytes the producer read back correctly.
    pub readback_ok: u64,
    /// Frame-sync pulses the camera sent.
    pub pulses: u64,
    /// Frames that failed a check.
    pub failed: u64,
    /// The first failure, as one line.
    pub first_failure: Option<String>,
}

impl Verification {
    /// Records a failed check.
    pub fn fail(&mut self, what: String) {
        self.failed += 1;
        self.first_failure.get_or_insert(what);
    }

    /// Whether all `frames` passed every check.
    pub fn passed(&self, frames: u64) -> bool {
        self.failed == 0
            && self.consumer_ok == frames
            && self.readback_ok == frames
            && self.pulses == frames
    }
}

/// Everything the run prints at the end.
#[derive(Debug, Clone)]
pub struct Report {
    /// Transport name, e.g. `host-reference`.
    pub backend: &'static str,
    /// Why that backend.
    pub why: String,
    /// How frames are processed, where the reader should know (one line).
    pub note: Option<&'static str>,
    /// The transport's own measurements, one line (e.g. the GPU-side
    /// breakdown of the discrete-GPU transport); `None` where it has none.
    pub details: Option<String>,
    /// Frames run.
    pub frames: u64,
    /// Ring size.
    pub ring: usize,
    /// Frame width.
    pub width: u16,
    /// Frame height.
    pub height: u16,
    /// Pixel format name.
    pub format: &'static str,
    /// Bytes per frame.
    pub frame_len: usize,
    /// Copy-based variant.
    pub copy: bool,
    /// First write to last completion.
    pub wall: Duration,
    /// Latency: producer starts writing -> consumer done.
    pub latency: Summary,
    /// Camera write time.
    pub write: Summary,
    /// Consumer processing time.
    pub process: Summary,
    /// Time a ready frame waited behind earlier frames.
    pub queued: Summary,
    /// Time a written frame stayed with the producer before its ready
    /// signal: the `--copy` variant's host copy into the slot (the read-back
    /// check runs on its own thread and holds no written frame).
    pub held: Summary,
    /// latency - write - held - process - queued.
    pub overhead: Summary,
    /// Busy time per frame of each pipeline stage, by stage name (see
    /// [`STAGES`]), so the bottleneck is visible beside the frame time.
    pub stages: Vec<(&'static str, Summary)>,
    /// Verification tallies.
    pub verification: Verification,
}

/// The stages reported in [`Report::stages`], in pipeline order, with what
/// each one's time covers.
pub const STAGES: [(&str, &str); 4] = [
    (
        "camera",
        "camera model writing the frame into the slot (all its threads)",
    ),
    (
        "verify",
        "host check of a processed frame as the consumer left it (all its threads; on its own thread, beside the camera and the handover, with --readback overlap)",
    ),
    (
        "handover",
        "producer thread in the transport's calls: waiting for the free slot, signalling ready, queueing the consumer",
    ),
    (
        "consumer",
        "consumer occupied with the frame after its ready wait (on a GPU: the stream from the wait to the frame's end, copies, counter and free signal included)",
    ),
];

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_summary(s: &Summary) -> String {
    format!(
        "{{\"p50\": {:.3}, \"p99\": {:.3}, \"max\": {:.3}, \"mean\": {:.3}}}",
        us(s.p50),
        us(s.p99),
        us(s.max),
        s.mean / 1000.0
    )
}

impl Report {
    /// Frames per second over the wall time.
    pub fn frames_per_s(&self) -> f64 {
        self.frames as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Megabytes (10^6 bytes) of frames per second.
    pub fn mb_per_s(&self) -> f64 {
        self.frames_per_s() * self.frame_len as f64 / 1e6
    }

    /// Wall time per frame in microseconds (1 / throughput).
    pub fn frame_time_us(&self) -> f64 {
        self.wall.as_secs_f64() * 1e6 / self.frames.max(1) as f64
    }

    /// Whether the run verified.
    pub fn passed(&self) -> bool {
        self.verification.passed(self.frames)
    }

    fn verdict(&self) -> String {
        let v = &self.verification;
        if self.passed() {
            format!(
                "verified: {}/{} frames (consumer saw the camera pattern, producer read back the processed frame, {} trigger pulses)",
                self.frames, self.frames, v.pulses
            )
        } else {
            format!(
                "verification FAILED: {} failed checks over {} frames (consumer ok {}, readback ok {}, pulses {}); first: {}",
                v.failed,
                self.frames,
                v.consumer_ok,
                v.readback_ok,
                v.pulses,
                v.first_failure.as_deref().unwrap_or("frames missing")
            )
        }
    }

    /// The human-readable summary.
    pub fn human(&self) -> String {
        let row = |name: &str, s: &Summary| {
            format!(
                "  {name:<18} p50 {:>10.1}  p99 {:>10.1}  max {:>10.1}  mean {:>10.1}\n",
                us(s.p50),
                us(s.p99),
                us(s.max),
                s.mean / 1000.0
            )
        };
        let mut out = String::new();
        let _ = writeln!(out, "backend: {} ({})", self.backend, self.why);
        if self.backend == "host-reference" {
            out.push_str("  host-reference is a reference/testing transport (host memory + threads), not the simulator and not CUDA\n");
        }
        if let Some(note) = self.note {
            let _ = writeln!(out, "  {note}");
        }
        let _ = writeln!(
            out,
            "pipeline: {} frames of {}x{} {} ({} bytes), ring of {}, {}",
            self.frames,
            self.width,
            self.height,
            self.format,
            self.frame_len,
            self.ring,
            if self.copy { "copy-based" } else { "zero-copy" }
        );
        let _ = writeln!(out, "{}", self.verdict());
        out.push_str("per frame (us):\n");
        out.push_str(&row("latency", &self.latency));
        out.push_str(&row("camera write", &self.write));
        out.push_str(&row("processing", &self.process));
        out.push_str(&row("queued", &self.queued));
        out.push_str(&row("held before ready", &self.held));
        out.push_str(&row("interop overhead", &self.overhead));
        out.push_str("  (latency: write start -> consumer done; held: written, kept by the producer before its ready signal; overhead = latency - write - held - processing - queued)\n");
        out.push_str("stages, busy time per frame (us):\n");
        for (name, s) in &self.stages {
            let _ = writeln!(
                out,
                "  {name:<18} mean {:>10.1}  p50 {:>10.1}",
                s.mean / 1000.0,
                us(s.p50)
            );
        }
        if let Some(details) = &self.details {
            let _ = writeln!(out, "  transport: {details}");
        }
        let _ = writeln!(
            out,
            "throughput: {:.1} frames/s, {:.1} MB/s ({:.3} s); frame time {:.1} us = mean processing {:.1} us + {:.1} us",
            self.frames_per_s(),
            self.mb_per_s(),
            self.wall.as_secs_f64(),
            self.frame_time_us(),
            self.process.mean / 1000.0,
            self.frame_time_us() - self.process.mean / 1000.0
        );
        out
    }

    /// The machine-readable summary (one JSON object; times in microseconds).
    pub fn json(&self) -> String {
        let v = &self.verification;
        format!(
            "{{\"backend\": {}, \"why\": {}, \"processing\": {}, \"frames\": {}, \"ring\": {}, \"width\": {}, \"height\": {}, \
\"format\": {}, \"frame_bytes\": {}, \"mode\": {}, \"verified\": {}, \
\"verification\": {{\"consumer_ok\": {}, \"readback_ok\": {}, \"pulses\": {}, \"failed\": {}, \"first_failure\": {}}}, \
\"latency_us\": {}, \"write_us\": {}, \"process_us\": {}, \"queued_us\": {}, \"held_us\": {}, \"overhead_us\": {}, \
\"stages\": {{{}}}, \"transport_details\": {}, \"wall_s\": {:.6}, \"frame_time_us\": {:.3}, \"frames_per_s\": {:.3}, \"mb_per_s\": {:.3}}}",
            json_str(self.backend),
            json_str(&self.why),
            self.note.map_or("null".to_string(), json_str),
            self.frames,
            self.ring,
            self.width,
            self.height,
            json_str(self.format),
            self.frame_len,
            json_str(if self.copy { "copy" } else { "zero-copy" }),
            self.passed(),
            v.consumer_ok,
            v.readback_ok,
            v.pulses,
            v.failed,
            v.first_failure.as_deref().map_or("null".to_string(), json_str),
            json_summary(&self.latency),
            json_summary(&self.write),
            json_summary(&self.process),
            json_summary(&self.queued),
            json_summary(&self.held),
            json_summary(&self.overhead),
            self.stages
                .iter()
                .map(|(name, s)| format!(
                    "{}: {{\"mean\": {:.3}, \"p50\": {:.3}}}",
                    json_str(name),
                    s.mean / 1000.0,
                    us(s.p50)
                ))
                .collect::<Vec<_>>()
                .join(", "),
            self.details.as_deref().map_or("null".to_string(), json_str),
            self.wall.as_secs_f64(),
            self.frame_time_us(),
            self.frames_per_s(),
            self.mb_per_s()
        )
    }
}

/// A one-line progress bar on stderr, drawn only on a terminal, only once a
/// run has taken half a second, and at most ten times a second.
pub struct Progress {
    enabled: bool,
    total: u64,
    start: Instant,
    last: Option<Instant>,
}

impl Progress {
    /// A bar for `total` frames; `want` is false for `--quiet` / `--json`.
    pub fn new(total: u64, want: bool) -> Self {
        Progress {
            enabled: want && std::io::stderr().is_terminal(),
            total,
            start: Instant::now(),
            last: None,
        }
    }

    /// Shows `done` frames finished.
    pub fn update(&mut self, done: u64) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        // Short runs never show a bar; long ones redraw ten times a second.
        let early = now - self.start < Duration::from_millis(500);
        let recent = self
            .last
            .is_some_and(|t| now - t < Duration::from_millis(100));
        if early || (recent && done < self.total) {
            return;
        }
        self.last = Some(now);
        let width = 30u64;
        let filled = (done * width / self.total.max(1)) as usize;
        let rate = done as f64 / (now - self.start).as_secs_f64().max(1e-9);
        let _ = write!(
            std::io::stderr(),
            "\r[{:<w$}] {done}/{} frames {rate:>8.0} f/s",
            "#".repeat(filled),
            self.total,
            w = width as usize
        );
    }

    /// Removes the bar.
    pub fn finish(&mut self) {
        if self.enabled && self.last.is_some() {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn summary(v: u64) -> Summary {
        Summary {
            count: 1,
            p50: v,
            p99: v,
            max: v,
            mean: v as f64,
        }
    }

    fn report(pass: bool) -> Report {
        let mut verification = Verification {
            consumer_ok: 2,
            readback_ok: 2,
            pulses: 2,
            ..Verification::default()
        };
        if !pass {
            verification.fail("frame 1 \"bad\"".into());
        }
        Report {
            backend: "host-reference",
            why: "requested".into(),
            note: None,
            details: None,
            frames: 2,
            ring: 2,
            width: 4,
            height: 2,
            format: "raw8",
            frame_len: 8,
            copy: false,
            wall: Duration::from_millis(2),
            latency: summary(3000),
            write: summary(1000),
            process: summary(1500),
            queued: summary(0),
            held: summary(0),
            overhead: summary(500),
            stages: vec![("camera", summary(1000)), ("consumer", summary(2000))],
            verification,
        }
    }

    #[test]
    fn passes_only_when_every_check_passed() {
        assert!(report(true).passed());
        assert!(!report(false).passed());
        let mut r = report(true);
        r.verification.readback_ok = 1;
        assert!(
            !r.passed(),
            "a frame that was not read back is not verified"
        );
        r = report(true);
        r.verification.pulses = 3;
        assert!(!r.passed());
    }

    #[test]
    fn json_has_the_figures_and_escapes_strings() {
        let j = report(false).json();
        assert!(j.contains("\"verified\": false"), "{j}");
        assert!(
            j.contains("\"first_failure\": \"frame 1 \\\"bad\\\"\""),
            "{j}"
        );
        assert!(j.contains("\"latency_us\": {\"p50\": 3.000"), "{j}");
        assert!(j.contains("\"frames_per_s\": 1000.000"), "{j}");
        assert!(j.contains("\"mb_per_s\": 0.008"), "{j}");
        assert!(!j.contains('\n'));
        assert!(report(true).json().contains("\"first_failure\": null"));
    }

    #[test]
    fn human_summary_names_the_backend_honestly() {
        let h = report(true).human();
        assert!(h.starts_with("backend: host-reference"));
        assert!(h.contains("not the simulator and not CUDA"));
        assert!(h.contains("verified: 2/2 frames"));
        assert!(report(false).human().contains("verification FAILED"));
    }
}
