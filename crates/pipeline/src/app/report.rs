//! The end-of-run summary (human text or JSON) and the progress bar.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use crate::app::stats::Summary;

/// Verification tallies: a run is good only if every frame passed every check.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Verification {
    /// Frames the consumer found identical to the camera's pattern.
    pub consumer_ok: u64,
    /// Frames whose processed bytes the producer read back correctly.
    pub readback_ok: u64,
    /// Frame-sync pulses the camera sent; `None` where the camera has no
    /// sync line (the two-process mode's camera writes frames directly).
    pub pulses: Option<u64>,
    /// Frames that failed a check.
    pub failed: u64,
    /// The first failure, as one line.
    pub first_failure: Option<String>,
    /// The read-back was checked against a digest the source took
    /// (`--source gst:...`), not against the camera pattern (which the
    /// consumer then does not check either). In the JSON report as
    /// `"checked_against": "source-digest"` (else `"camera-pattern"`).
    #[serde(rename = "checked_against", serialize_with = "checked_against")]
    pub by_digest: bool,
}

/// `by_digest` as the JSON report names it.
fn checked_against<S: serde::Serializer>(by_digest: &bool, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(if *by_digest {
        "source-digest"
    } else {
        "camera-pattern"
    })
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
            && self.pulses.is_none_or(|p| p == frames)
    }
}

/// Everything the run prints at the end.
#[derive(Debug, Clone)]
pub struct Report {
    /// 1: one process; 2: the camera and the consumer in two processes.
    pub processes: u8,
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
    /// Whether the camera wrote each frame on its own thread while the
    /// producer thread handed the frame before over (`--camera-ahead on`
    /// where the transport leases its slots and the ring has two or more):
    /// then the *camera* stage overlaps *handover* and the producer's
    /// waits, and *held before ready* is from the camera's end to the
    /// frame's handover.
    pub camera_ahead: bool,
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
pub const STAGES: [(&str, &str); 7] = [
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
    (
        "collect wait",
        "producer thread blocked collecting finished frames before the frame: the slot's last frame, and the frame to check next (single-process mode)",
    ),
    (
        "lend wait",
        "producer thread lending the frame to check to the checker thread: the transport making the consumer's writes visible to the host (single-process mode)",
    ),
    (
        "checker wait",
        "producer thread waiting for the checker thread: handing it a frame while its queue is full, taking its answer for the slot's last frame (single-process mode)",
    ),
];

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// The version of the `--json` schema: raised whenever a field is renamed,
/// removed or changes meaning (adding a field keeps it).
pub const SCHEMA_VERSION: u32 = 1;

/// A [`Summary`] in the JSON report: microseconds, `null` where the run did
/// not measure the figure.
struct JsonSummary<'a>(&'a Summary);

impl Serialize for JsonSummary<'_> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let s = self.0;
        if s.count == 0 {
            return ser.serialize_none();
        }
        let mut m = ser.serialize_map(Some(5))?;
        m.serialize_entry("count", &s.count)?;
        m.serialize_entry("p50", &us(s.p50))?;
        m.serialize_entry("p99", &us(s.p99))?;
        m.serialize_entry("max", &us(s.max))?;
        m.serialize_entry("mean", &(s.mean / 1000.0))?;
        m.end()
    }
}

/// The stages as one JSON object, in pipeline order.
struct JsonStages<'a>(&'a [(&'static str, Summary)]);

impl Serialize for JsonStages<'_> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Stage {
            mean: f64,
            p50: f64,
        }
        let mut m = ser.serialize_map(Some(self.0.len()))?;
        for (name, s) in self.0 {
            let stage = Stage {
                mean: s.mean / 1000.0,
                p50: us(s.p50),
            };
            m.serialize_entry(name, &stage)?;
        }
        m.end()
    }
}

/// The `--json` report, schema [`SCHEMA_VERSION`]: the same fields in both
/// process modes.
#[derive(Serialize)]
struct JsonReport<'a> {
    schema_version: u32,
    /// Whether the run worked and verified (as in [`json_error`]'s object,
    /// where it is false).
    ok: bool,
    processes: u8,
    backend: &'a str,
    why: &'a str,
    processing: Option<&'a str>,
    frames: u64,
    ring: usize,
    width: u16,
    height: u16,
    format: &'a str,
    frame_bytes: usize,
    mode: &'a str,
    camera_ahead: bool,
    verified: bool,
    verification: &'a Verification,
    latency_us: JsonSummary<'a>,
    write_us: JsonSummary<'a>,
    process_us: JsonSummary<'a>,
    queued_us: JsonSummary<'a>,
    held_us: JsonSummary<'a>,
    overhead_us: JsonSummary<'a>,
    stages: JsonStages<'a>,
    transport_details: Option<&'a str>,
    wall_s: f64,
    frame_time_us: f64,
    frames_per_s: f64,
    mb_per_s: f64,
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
            let pulses = match v.pulses {
                Some(p) => format!(", {p} trigger pulses"),
                None => String::new(),
            };
            let how = match v.by_digest {
                true => "the processed frame read back matches the digest its source took before the ring",
                false => "consumer saw the camera pattern, producer read back the processed frame",
            };
            format!(
                "verified: {}/{} frames ({how}{pulses})",
                self.frames, self.frames
            )
        } else {
            format!(
                "verification FAILED: {} failed checks over {} frames (consumer ok {}, readback ok {}, pulses {}); first: {}",
                v.failed,
                self.frames,
                v.consumer_ok,
                v.readback_ok,
                v.pulses.map_or_else(|| "none (no sync line)".to_string(), |p| p.to_string()),
                v.first_failure.as_deref().unwrap_or("frames missing")
            )
        }
    }

    /// The human-readable summary.
    pub fn human(&self) -> String {
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
            "pipeline: {} frames of {}x{} {} ({} bytes), ring of {}, {}{}",
            self.frames,
            self.width,
            self.height,
            self.format,
            self.frame_len,
            self.ring,
            if self.copy { "copy-based" } else { "zero-copy" },
            if self.camera_ahead {
                ", camera thread writing ahead of the handover"
            } else {
                ""
            }
        );
        let _ = writeln!(out, "{}", self.verdict());
        self.figures(&mut out);
        if let Some(details) = &self.details {
            let _ = writeln!(out, "  transport: {details}");
        }
        let _ = write!(
            out,
            "throughput: {:.1} frames/s, {:.1} MB/s ({:.3} s); frame time {:.1} us",
            self.frames_per_s(),
            self.mb_per_s(),
            self.wall.as_secs_f64(),
            self.frame_time_us(),
        );
        if self.process.count > 0 {
            let _ = write!(
                out,
                " = mean processing {:.1} us + {:.1} us",
                self.process.mean / 1000.0,
                self.frame_time_us() - self.process.mean / 1000.0
            );
        }
        out.push('\n');
        out
    }

    /// The per-frame figures and the stages of the human-readable summary.
    fn figures(&self, out: &mut String) {
        let row = |name: &str, s: &Summary| {
            if s.count == 0 {
                return format!("  {name:<18} not measured in this mode\n");
            }
            format!(
                "  {name:<18} p50 {:>10.1}  p99 {:>10.1}  max {:>10.1}  mean {:>10.1}\n",
                us(s.p50),
                us(s.p99),
                us(s.max),
                s.mean / 1000.0
            )
        };
        let figures = [
            ("latency", &self.latency),
            ("camera write", &self.write),
            ("processing", &self.process),
            ("queued", &self.queued),
            ("held before ready", &self.held),
            ("interop overhead", &self.overhead),
        ];
        if figures.iter().all(|(_, s)| s.count == 0) {
            out.push_str("per frame: not measured in this mode (see the transport line)\n");
        } else {
            out.push_str("per frame (us):\n");
            for (name, s) in figures {
                out.push_str(&row(name, s));
            }
            out.push_str("  (latency: write start -> consumer done; held: written, kept by the producer before its ready signal; overhead = latency - write - held - processing - queued)\n");
        }
        if !self.stages.is_empty() {
            out.push_str("stages, busy time per frame (us):\n");
        }
        for (name, s) in &self.stages {
            let _ = writeln!(
                out,
                "  {name:<18} mean {:>10.1}  p50 {:>10.1}",
                s.mean / 1000.0,
                us(s.p50)
            );
        }
    }

    /// The machine-readable summary: one line, one JSON object of schema
    /// [`SCHEMA_VERSION`] (times in microseconds).
    pub fn json(&self) -> String {
        let r = JsonReport {
            schema_version: SCHEMA_VERSION,
            ok: self.passed(),
            processes: self.processes,
            backend: self.backend,
            why: &self.why,
            processing: self.note,
            frames: self.frames,
            ring: self.ring,
            width: self.width,
            height: self.height,
            format: self.format,
            frame_bytes: self.frame_len,
            mode: if self.copy { "copy" } else { "zero-copy" },
            camera_ahead: self.camera_ahead,
            verified: self.passed(),
            verification: &self.verification,
            latency_us: JsonSummary(&self.latency),
            write_us: JsonSummary(&self.write),
            process_us: JsonSummary(&self.process),
            queued_us: JsonSummary(&self.queued),
            held_us: JsonSummary(&self.held),
            overhead_us: JsonSummary(&self.overhead),
            stages: JsonStages(&self.stages),
            transport_details: self.details.as_deref(),
            wall_s: self.wall.as_secs_f64(),
            frame_time_us: self.frame_time_us(),
            frames_per_s: self.frames_per_s(),
            mb_per_s: self.mb_per_s(),
        };
        // Serialising plain numbers, strings and maps with string keys
        // cannot fail; should it, the error is the output, still JSON.
        serde_json::to_string(&r).unwrap_or_else(|e| json_error("report", &e.to_string()))
    }
}

/// `--json`'s answer when there is no report: one line, one JSON object
/// `{"schema_version": 1, "ok": false, "stage": ..., "error": ...}`, where
/// `stage` is `"arguments"` (the command line or the environment was
/// refused; exit status 2) or `"run"` (the run could not start or failed
/// before its report; exit status 1; `"report"` should the report itself
/// not serialize), and `error` is the message stderr shows. A run that reaches its report prints the report instead (with
/// `"ok"`: whether it verified).
pub fn json_error(stage: &str, error: &str) -> String {
    serde_json::json!({
        "schema_version": SCHEMA_VERSION,
        "ok": false,
        "stage": stage,
        "error": error,
    })
    .to_string()
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
            pulses: Some(2),
            ..Verification::default()
        };
        if !pass {
            verification.fail("frame 1 \"bad\"".into());
        }
        Report {
            processes: 1,
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
            camera_ahead: false,
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
        r.verification.pulses = Some(3);
        assert!(!r.passed());
    }

    #[test]
    fn json_error_is_one_line_of_one_object() {
        let text = json_error("run", "backend `gpu` is not available: \"x\"\nand more");
        assert!(!text.contains('\n'));
        let j: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(j["schema_version"], SCHEMA_VERSION);
        assert_eq!((&j["ok"], &j["stage"]), (&false.into(), &"run".into()));
        assert!(j["error"].as_str().unwrap().ends_with("\"x\"\nand more"));
    }

    #[test]
    fn json_parses_with_the_schema_and_the_figures() {
        let text = report(false).json();
        assert!(!text.contains('\n'));
        let j: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(j["schema_version"], SCHEMA_VERSION);
        assert_eq!(j["processes"], 1);
        assert_eq!(j["verified"], false);
        assert_eq!(j["ok"], false);
        assert_eq!(j["verification"]["first_failure"], "frame 1 \"bad\"");
        assert_eq!(j["verification"]["pulses"], 2);
        assert_eq!(j["latency_us"]["p50"], 3.0);
        assert_eq!(j["latency_us"]["count"], 1);
        assert_eq!(j["frames_per_s"], 1000.0);
        assert!((j["mb_per_s"].as_f64().unwrap() - 0.008).abs() < 1e-12);
        assert_eq!(j["mode"], "zero-copy");
        let stages: Vec<&String> = j["stages"].as_object().unwrap().keys().collect();
        assert_eq!(stages, ["camera", "consumer"]);
        let ok: serde_json::Value = serde_json::from_str(&report(true).json()).unwrap();
        assert!(ok["verification"]["first_failure"].is_null());
    }

    #[test]
    fn figures_not_measured_are_null_in_json_and_said_in_text() {
        let mut r = report(true);
        r.queued = Summary::NOT_MEASURED;
        r.verification.pulses = None;
        let j: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert!(j["queued_us"].is_null(), "{j}");
        assert!(j["verification"]["pulses"].is_null(), "{j}");
        assert!(r.passed(), "no sync line: nothing to count");
        assert!(
            r.human().contains("queued             not measured"),
            "{}",
            r.human()
        );
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
