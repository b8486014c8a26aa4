//! The main job's discrete-GPU path beside the plain-CUDA baseline
//! ([`tegra_interop_pipeline::app::baseline`]) and the machine's limit for
//! the same work ([`tegra_interop_pipeline::app::baseline::limit`]), all in
//! one process: zero-copy and copy-based, with ours / limit, ours / GPU
//! bound, plain / limit and ours / plain for each mode, and ours' latency
//! (p50 / p99: the producer starts writing a frame -> the host sees the
//! consumer's work on it done).
//!
//! "Ours" is the user-work path: the GPU transport's consumer runs its work
//! as a `Box<dyn FrameWork>` (`GpuTransport::open_with_work`, here with
//! `consumer::CheckInvert`), exactly as a user's own kernel would run, and
//! that work launches the same `check_and_invert` kernel (one NVRTC source,
//! `consumer::KERNEL_SOURCE`) that the plain-CUDA program launches. So
//! ours / plain is what the ring, its interop and the generic work seam
//! cost against a plain CUDA loop doing the same work. Defaults: 1920x1080
//! RGBA8, a ring of 4. Runs only on a GPU.
//!
//! ```text
//! pipeline_vs_cuda --frames 2000 --width 1920 --height 1080 --format rgba8 --ring 4 --quiet
//! pipeline_vs_cuda --frames 2000 --width 1920 --height 1080 --json > result.json
//! ```
//!
//! Prints each run's report and one markdown table (with `--json`, the
//! reports go to stderr and stdout holds one JSON object, schema version 1);
//! exits 1 when a run fails or a frame fails verification, 2 for bad
//! arguments.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use tegra_interop_pipeline::app::baseline::limit::{self, Comparison, ModeRow, Pieces};
use tegra_interop_pipeline::app::cli::{self, Command, Options};
use tegra_interop_pipeline::app::{self, baseline};
use tegra_interop_pipeline::transport::FrameGeometry;

/// Pixel formats of the pipeline's camera.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    Raw8,
    Raw16,
    Rgba8,
}

/// Which modes to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Modes {
    /// Zero-copy, then copy-based.
    Both,
    /// Zero-copy only.
    ZeroCopy,
    /// Copy-based only.
    Copy,
}

/// The only backend this comparison runs (kept as an option so that the
/// pipeline's own command lines work here unchanged).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    /// The discrete-GPU transport (Vulkan producer, CUDA consumer).
    Gpu,
}

/// When the producer checks a processed frame (the pipeline's `--readback`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ReadbackArg {
    Overlap,
    Inline,
}

#[derive(Debug, Parser)]
#[command(
    name = "pipeline_vs_cuda",
    about = "The discrete-GPU pipeline beside plain CUDA and the machine's limit for the same work, in one process",
    after_help = "Environment: TEGRA_INTEROP_FRAME_THREADS (threads that write and check a large frame, \
                  1..=64, for the pipeline, the baseline and the limit alike); the discrete-GPU \
                  transport's overrides TEGRA_INTEROP_GPU_HANDOVER (queue|host-only), \
                  TEGRA_INTEROP_GPU_EARLY (0|1), TEGRA_INTEROP_GPU_COPY_WITH (engines|kernels), \
                  TEGRA_INTEROP_GPU_COPY_FROM (registered|import: where copy mode's copies read), \
                  TEGRA_INTEROP_GPU_RECLAIM_AFTER (0..=8 later releases before a slot's acquire), \
                  TEGRA_INTEROP_VK_QUEUE (first-compute|compute-only|transfer-only).",
    disable_version_flag = true
)]
struct Args {
    /// Frames per run (1..=1000000)
    #[arg(long, value_name = "N", default_value_t = 2000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    frames: u64,
    /// Frame buffers in the ring (1..=8)
    #[arg(long, value_name = "K", default_value_t = 4,
          value_parser = clap::value_parser!(u8).range(1..=8))]
    ring: u8,
    /// Frame width in pixels (1..=4096)
    #[arg(long, value_name = "W", default_value_t = 1920,
          value_parser = clap::value_parser!(u16).range(1..=4096))]
    width: u16,
    /// Frame height in lines (1..=4096)
    #[arg(long, value_name = "H", default_value_t = 1080,
          value_parser = clap::value_parser!(u16).range(1..=4096))]
    height: u16,
    /// Pixel format
    #[arg(long, value_name = "F", value_enum, default_value = "rgba8")]
    format: Format,
    /// Interop backend (only gpu)
    #[arg(long, value_name = "B", value_enum, default_value = "gpu")]
    backend: BackendArg,
    /// When the pipeline checks a processed frame
    #[arg(long, value_name = "R", value_enum, default_value = "overlap")]
    readback: ReadbackArg,
    /// Which modes to run
    #[arg(long, value_name = "M", value_enum, default_value = "both")]
    modes: Modes,
    /// Repetitions of each piece of the limit (1..=10000)
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    limit_reps: u32,
    /// Print one JSON object on stdout (the reports go to stderr)
    #[arg(long)]
    json: bool,
    /// No progress display
    #[arg(long, short = 'q')]
    quiet: bool,
}

impl Args {
    /// The pipeline's options for the same work (through its own parser, so
    /// its checks apply).
    fn pipeline_options(&self) -> Result<Options, String> {
        let format = match self.format {
            Format::Raw8 => "raw8",
            Format::Raw16 => "raw16",
            Format::Rgba8 => "rgba8",
        };
        let readback = match self.readback {
            ReadbackArg::Overlap => "overlap",
            ReadbackArg::Inline => "inline",
        };
        let mut args: Vec<OsString> = [
            "--backend".to_string(),
            "gpu".into(),
            "--frames".into(),
            self.frames.to_string(),
            "--ring".into(),
            self.ring.to_string(),
            "--width".into(),
            self.width.to_string(),
            "--height".into(),
            self.height.to_string(),
            "--format".into(),
            format.into(),
            "--readback".into(),
            readback.into(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        if self.quiet {
            args.push("--quiet".into());
        }
        match cli::parse(args)? {
            Command::Run(o) => Ok(o),
            Command::Help => Err("the pipeline's parser asked for help".into()),
        }
    }

    fn modes(&self) -> &'static [bool] {
        match self.modes {
            Modes::Both => &[false, true],
            Modes::ZeroCopy => &[false],
            Modes::Copy => &[true],
        }
    }
}

/// Where the human-readable lines go: stdout, or stderr under `--json`.
fn say(json: bool, text: &str) {
    if json {
        eprintln!("{text}");
    } else {
        println!("{text}");
    }
}

/// What one mode's runs gave: ours and the baseline's frames/s (`None`:
/// failed), ours' latency p50 / p99 in ns, and whether both passed.
struct ModeRun {
    ours: Option<f64>,
    plain: Option<f64>,
    latency: Option<(u64, u64)>,
    passed: bool,
}

/// Runs ours and the baseline in one mode.
fn run_mode(args: &Args, opts: &Options, copy: bool) -> ModeRun {
    let mode = if copy { "copy" } else { "zero-copy" };
    // `Options` is `Copy` today and becomes `Clone` only (the pipeline's
    // clap options carry paths); `clone` works with both.
    #[allow(clippy::clone_on_copy)]
    let mut opts = opts.clone();
    opts.copy = copy;
    let mut ok = true;
    let mut latency = None;
    let ours = match app::run(&opts) {
        Ok(r) => {
            say(args.json, &format!("== ours, {mode}\n{}", r.human()));
            ok &= r.passed();
            latency = (r.latency.count > 0).then_some((r.latency.p50, r.latency.p99));
            Some(r.frames_per_s())
        }
        Err(e) => {
            eprintln!("error: ours, {mode}: {e}");
            ok = false;
            None
        }
    };
    let geometry = FrameGeometry {
        stride: opts.sensor.stride(),
        rows: usize::from(opts.sensor.height),
    };
    let plain = match baseline::run(geometry, opts.ring, opts.frames, copy) {
        Ok(b) => {
            say(args.json, &format!(
                "== plain CUDA, {mode}: {:.1} frames/s, frame time {:.1} us, write {:.1} us, read-back check {:.1} us, {} failed frames",
                b.frames_per_s(),
                b.frame_time_us(),
                b.write.as_secs_f64() * 1e6,
                b.verify.as_secs_f64() * 1e6,
                b.failed
            ));
            ok &= b.failed == 0;
            Some(b.frames_per_s())
        }
        Err(e) => {
            eprintln!("error: plain CUDA, {mode}: {e}");
            ok = false;
            None
        }
    };
    ModeRun {
        ours,
        plain,
        latency,
        passed: ok,
    }
}

/// The name of CUDA device 0, for the JSON (`None` where the driver or the
/// device cannot be opened; the runs report that themselves).
fn device_name() -> Option<String> {
    let backend = tegra_interop::driver::Backend::real().ok()?;
    let device = backend.device(0).ok()?;
    device.name().ok()
}

/// Builds the comparison from the runs and the limit's pieces.
fn compare(
    geometry: FrameGeometry,
    opts: &Options,
    pieces: Option<Pieces>,
    runs: &[(bool, ModeRun)],
    passed: bool,
) -> Comparison {
    let modes = runs
        .iter()
        .map(|(copy, r)| {
            let row = ModeRow::new(*copy, r.ours, r.plain, pieces.as_ref());
            match r.latency {
                Some((p50, p99)) => row.with_latency(p50, p99),
                None => row,
            }
        })
        .collect();
    Comparison {
        schema_version: 1,
        device: device_name(),
        stride: geometry.stride,
        rows: geometry.rows,
        ring: opts.ring,
        frames: opts.frames,
        pieces,
        modes,
        passed,
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let opts = match args.pipeline_options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let geometry = FrameGeometry {
        stride: opts.sensor.stride(),
        rows: usize::from(opts.sensor.height),
    };
    let mut ok = true;
    let pieces = match limit::measure_real(geometry, args.limit_reps) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("error: measuring the machine's limit: {e}");
            ok = false;
            None
        }
    };
    let mut runs = Vec::new();
    for &copy in args.modes() {
        let run = run_mode(&args, &opts, copy);
        ok &= run.passed;
        runs.push((copy, run));
    }
    let c = compare(geometry, &opts, pieces, &runs, ok);
    eprint!("{}", c.limit_warnings());
    say(
        args.json,
        &format!("\n{}\n\n{}", c.pieces_line(), c.table()),
    );
    if args.json {
        match serde_json::to_string(&c) {
            Ok(j) => println!("{j}"),
            Err(e) => {
                eprintln!("error: writing the JSON: {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Args::command().debug_assert();
    }

    /// The options reach the pipeline's own options unchanged (through its
    /// parser), and out-of-range values are refused by clap.
    #[test]
    fn options_map_onto_the_pipelines() {
        let a = Args::try_parse_from([
            "pipeline_vs_cuda",
            "--frames",
            "77",
            "--ring",
            "3",
            "--width",
            "320",
            "--height",
            "200",
            "--format",
            "raw16",
            "--readback",
            "inline",
            "--quiet",
        ])
        .unwrap();
        let o = a.pipeline_options().unwrap();
        assert_eq!((o.frames, o.ring, o.quiet), (77, 3, true));
        assert_eq!((o.sensor.width, o.sensor.height), (320, 200));
        assert_eq!(
            o.sensor.format,
            tegra_interop_pipeline::camera::PixelFormat::Raw16
        );
        assert_eq!(o.readback, cli::Readback::Inline);
        assert_eq!(a.modes(), &[false, true]);
        for bad in [
            &["--ring", "9"][..],
            &["--width", "99999"],
            &["--frames", "0"],
            &["--backend", "sim"],
            &["--modes", "all"],
        ] {
            let argv = std::iter::once("pipeline_vs_cuda").chain(bad.iter().copied());
            assert!(Args::try_parse_from(argv).is_err(), "{bad:?}");
        }
        let one = Args::try_parse_from(["p", "--modes", "copy", "--json"]).unwrap();
        assert_eq!((one.modes(), one.json), (&[true][..], true));
    }

    /// Each mode's row carries ours / plain and ours' latency from its
    /// runs; a failed run leaves its figures out instead of inventing them.
    #[test]
    fn the_comparison_carries_each_runs_ratio_and_latency() {
        let a = Args::try_parse_from(["p", "--frames", "10"]).unwrap();
        let o = a.pipeline_options().unwrap();
        let g = FrameGeometry {
            stride: o.sensor.stride(),
            rows: usize::from(o.sensor.height),
        };
        assert_eq!(
            (g.stride, g.rows, o.ring),
            (1920 * 4, 1080, 4),
            "the defaults"
        );
        let runs = [
            (
                false,
                ModeRun {
                    ours: Some(950.0),
                    plain: Some(1000.0),
                    latency: Some((2_000, 9_000)),
                    passed: true,
                },
            ),
            (
                true,
                ModeRun {
                    ours: None,
                    plain: Some(500.0),
                    latency: None,
                    passed: false,
                },
            ),
        ];
        let c = compare(g, &o, None, &runs, false);
        let zero = &c.modes[0];
        assert_eq!(zero.mode, "zero-copy");
        assert!((zero.ours_over_plain.unwrap() - 0.95).abs() < 1e-12);
        assert_eq!(
            (zero.ours_latency_p50_us, zero.ours_latency_p99_us),
            (Some(2.0), Some(9.0))
        );
        let copy = &c.modes[1];
        assert_eq!((copy.mode, copy.ours_over_plain), ("copy", None));
        assert_eq!(copy.ours_latency_p99_us, None);
        assert!(!c.passed);
        assert!(c.table().contains("| 0.950 | 2.0 / 9.0 |"), "{}", c.table());
    }
}
