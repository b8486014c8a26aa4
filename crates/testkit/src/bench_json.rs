//! The machine-readable form of `gpu_bench`'s results (`gpu_bench --json FILE`).
//!
//! `gpu_bench` (examples/gpu_bench.rs) times our driver calls against the raw
//! `libcuda` calls on a GPU machine and prints a markdown report; with
//! `--json FILE` it also writes one [`BenchReport`] as JSON. The rows are built
//! here from the measured samples ([`PerCallRow::from_samples`],
//! [`HandoverRow::from_samples`]), so the serialization is tested on this
//! machine with made-up samples (`tests` below) while the numbers themselves
//! only come from a GPU run.
//!
//! Every time is in nanoseconds (the field names end in `_ns`); a ratio is
//! ours divided by raw, both medians. [`SCHEMA_VERSION`] changes whenever a
//! field changes meaning or goes away.

use serde::{Deserialize, Serialize};

/// Version of the JSON layout written by `gpu_bench --json`.
pub const SCHEMA_VERSION: u32 = 1;

/// Median of `v` (sorted in place); NaN when empty.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The `p`-quantile (0..=1) of `v` by nearest rank (sorted in place); NaN when empty.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize;
    v[i.min(v.len() - 1)]
}

/// One per-call row: our call against the raw C call, both sides timed the same way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PerCallRow {
    /// What was timed, as in the markdown table (rows named "(diagnosis) ..."
    /// compare against the raw call made the way ours is, and are left out of
    /// the goal).
    pub name: String,
    /// Whether this is a diagnosis row.
    pub diagnosis: bool,
    /// Median time per call of ours (ns).
    pub ours_median_ns: f64,
    /// Median time per call of the raw call (ns).
    pub raw_median_ns: f64,
    /// `ours_median_ns / raw_median_ns`.
    pub ratio: f64,
    /// 10th percentile of ours (ns).
    pub ours_p10_ns: f64,
    /// 90th percentile of ours (ns).
    pub ours_p90_ns: f64,
    /// 10th percentile of raw (ns).
    pub raw_p10_ns: f64,
    /// 90th percentile of raw (ns).
    pub raw_p90_ns: f64,
    /// Heap allocations per call of ours.
    pub ours_allocs_per_call: f64,
    /// Heap allocations per call of raw.
    pub raw_allocs_per_call: f64,
    /// How many samples each side's median is taken over.
    pub samples: usize,
}

impl PerCallRow {
    /// The row for the samples of both sides (each sample: mean ns per call of
    /// one block, or one operation); the samples are sorted in place.
    pub fn from_samples(
        name: &str,
        ours: &mut [f64],
        raw: &mut [f64],
        ours_allocs_per_call: f64,
        raw_allocs_per_call: f64,
    ) -> Self {
        let (o, r) = (median(ours), median(raw));
        PerCallRow {
            name: name.to_owned(),
            diagnosis: name.starts_with("(diagnosis)"),
            ours_median_ns: o,
            raw_median_ns: r,
            ratio: o / r,
            ours_p10_ns: percentile(ours, 0.1),
            ours_p90_ns: percentile(ours, 0.9),
            raw_p10_ns: percentile(raw, 0.1),
            raw_p90_ns: percentile(raw, 0.9),
            ours_allocs_per_call,
            raw_allocs_per_call,
            samples: ours.len().min(raw.len()),
        }
    }
}

/// One handover-latency row (raw calls only, one handover in flight).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandoverRow {
    /// The exporter's queue family the row ran on, as printed in the table.
    pub queue: String,
    /// The handover timed.
    pub name: String,
    /// Median (ns).
    pub median_ns: f64,
    /// 10th percentile (ns).
    pub p10_ns: f64,
    /// 90th percentile (ns).
    pub p90_ns: f64,
    /// Number of samples.
    pub samples: usize,
}

impl HandoverRow {
    /// The row for `samples` (ns each; sorted in place).
    pub fn from_samples(queue: &str, name: &str, samples: &mut [f64]) -> Self {
        HandoverRow {
            queue: queue.to_owned(),
            name: name.to_owned(),
            median_ns: median(samples),
            p10_ns: percentile(samples, 0.1),
            p90_ns: percentile(samples, 0.9),
            samples: samples.len(),
        }
    }
}

/// The steady-state frame loop's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FrameLoop {
    /// Frames timed (after the warm-up frames).
    pub frames: u64,
    /// Median host time per frame (ns).
    pub median_frame_ns: f64,
    /// Heap allocations in our calls over all timed frames.
    pub ours_allocations: u64,
    /// Heap allocations in the whole frame over all timed frames.
    pub frame_allocations: u64,
}

/// Everything one `gpu_bench` run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The machine line (GPU name and UUID, CUDA and Vulkan versions, CPU, kernel).
    pub machine: String,
    /// The GPU's name as the driver reports it (e.g. "NVIDIA H100 80GB HBM3").
    pub device: String,
    /// Per-call rows, in the markdown table's order.
    pub per_call: Vec<PerCallRow>,
    /// The frame loop (absent with `GPU_BENCH_HANDOVER_ONLY`).
    pub frame_loop: Option<FrameLoop>,
    /// Handover-latency rows.
    pub handover: Vec<HandoverRow>,
    /// The largest ratio of the rows that are not diagnosis rows (`None`: no such row).
    pub worst_ratio: Option<f64>,
}

impl BenchReport {
    /// A report of the given rows; `worst_ratio` is computed from them.
    pub fn new(
        machine: String,
        device: String,
        per_call: Vec<PerCallRow>,
        frame_loop: Option<FrameLoop>,
        handover: Vec<HandoverRow>,
    ) -> Self {
        let worst_ratio = per_call
            .iter()
            .filter(|r| !r.diagnosis)
            .map(|r| r.ratio)
            .reduce(f64::max);
        BenchReport {
            schema_version: SCHEMA_VERSION,
            machine,
            device,
            per_call,
            frame_loop,
            handover,
            worst_ratio,
        }
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(self)
    }

    /// Writes [`to_json`](Self::to_json) to `path`.
    pub fn write_json(&self, path: &std::path::Path) -> std::io::Result<()> {
        let text = self.to_json().map_err(std::io::Error::other)?;
        std::fs::write(path, text + "\n")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Made-up samples standing in for a GPU run's.
    fn fake() -> BenchReport {
        let mut ours = vec![1100.0, 1000.0, 1050.0, 990.0, 1010.0];
        let mut raw = vec![1000.0, 950.0, 960.0, 1020.0, 980.0];
        let signal =
            PerCallRow::from_samples("`Stream::signal` (timeline)", &mut ours, &mut raw, 0.0, 0.0);
        let mut ours = vec![800.0, 820.0];
        let mut raw = vec![780.0, 800.0];
        let diag = PerCallRow::from_samples(
            "(diagnosis) `Stream::signal` vs raw `cuCtxSetCurrent` + signal",
            &mut ours,
            &mut raw,
            0.0,
            0.0,
        );
        let mut h = vec![16_000.0, 15_000.0, 17_000.0];
        let handover = HandoverRow::from_samples(
            "family 1 (TRANSFER)",
            "Vulkan submission that signals -> CUDA stream past the wait",
            &mut h,
        );
        BenchReport::new(
            "NVIDIA H100 80GB HBM3 (uuid x), CUDA driver API 13.0".into(),
            "NVIDIA H100 80GB HBM3".into(),
            vec![signal, diag],
            Some(FrameLoop {
                frames: 5000,
                median_frame_ns: 327_000.0,
                ours_allocations: 0,
                frame_allocations: 0,
            }),
            vec![handover],
        )
    }

    #[test]
    fn rows_are_medians_and_ratios_of_the_samples() {
        let r = fake();
        let s = &r.per_call[0];
        assert_eq!((s.ours_median_ns, s.raw_median_ns), (1010.0, 980.0));
        assert!((s.ratio - 1010.0 / 980.0).abs() < 1e-12);
        assert_eq!((s.ours_p10_ns, s.ours_p90_ns), (990.0, 1100.0));
        assert_eq!(s.samples, 5);
        assert!(!s.diagnosis && r.per_call[1].diagnosis);
        // The even-length median is the mean of the middle two.
        assert_eq!(r.per_call[1].ours_median_ns, 810.0);
        assert_eq!(r.handover[0].median_ns, 16_000.0);
        // The diagnosis row (810 / 790 = 1.025) is left out of the worst ratio.
        assert_eq!(r.worst_ratio, Some(1010.0 / 980.0));
    }

    #[test]
    fn the_json_parses_back_with_every_row_and_unit() {
        let r = fake();
        let text = r.to_json().unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["schema_version"], SCHEMA_VERSION);
        assert_eq!(v["device"], "NVIDIA H100 80GB HBM3");
        let rows = v["per_call"].as_array().unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["name"], "`Stream::signal` (timeline)");
        assert_eq!(rows[0]["ours_median_ns"], 1010.0);
        assert_eq!(rows[0]["raw_median_ns"], 980.0);
        assert_eq!(v["handover"][0]["median_ns"], 16_000.0);
        assert_eq!(v["frame_loop"]["median_frame_ns"], 327_000.0);
        // Every time field says its unit.
        for key in rows[0].as_object().unwrap().keys() {
            let timed = key.contains("median") || key.contains("_p10") || key.contains("_p90");
            assert!(!timed || key.ends_with("_ns"), "{key} has no unit");
        }
        let back: BenchReport = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn write_json_writes_a_file_that_parses() {
        let dir = std::env::temp_dir().join(format!("gpu-bench-json-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bench.json");
        fake().write_json(&path).unwrap();
        let back: BenchReport =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(back.per_call.len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn empty_samples_give_nan_not_a_panic() {
        let row = PerCallRow::from_samples("x", &mut [], &mut [], 0.0, 0.0);
        assert!(row.ours_median_ns.is_nan() && row.ratio.is_nan());
        assert_eq!(row.samples, 0);
        // NaN is not JSON: serde_json writes it as null.
        let v: serde_json::Value = serde_json::to_value(&row).unwrap();
        assert!(v["ours_median_ns"].is_null());
    }
}
