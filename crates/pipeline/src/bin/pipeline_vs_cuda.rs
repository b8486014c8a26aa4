//! The main job's discrete-GPU path beside the plain-CUDA baseline
//! ([`tegra_interop_pipeline::app::baseline`]), in one process, zero-copy and
//! copy-based, with the ratio ours / baseline of frames per second.
//!
//! ```text
//! pipeline_vs_cuda --backend gpu --frames 2000 --width 1920 --height 1080 --format rgba8 --ring 4 --quiet
//! ```
//!
//! Takes the pipeline's options (`--copy` is ignored: both modes run). Prints
//! both reports' stage times and one markdown table; exits non-zero when a
//! run fails or a frame fails verification.

use std::process::ExitCode;

use tegra_interop_pipeline::app::cli::{self, Command};
use tegra_interop_pipeline::app::report::Report;
use tegra_interop_pipeline::app::{self, baseline};
use tegra_interop_pipeline::transport::FrameGeometry;

fn main() -> ExitCode {
    let mut opts = match cli::parse(std::env::args_os().skip(1)) {
        Ok(Command::Run(o)) => o,
        Ok(Command::Help) => {
            print!("{}", cli::help());
            return ExitCode::SUCCESS;
        }
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
    let mut rows = Vec::new();
    for copy in [false, true] {
        let mode = if copy { "copy" } else { "zero-copy" };
        opts.copy = copy;
        let ours: Option<Report> = match app::run(&opts) {
            Ok(r) => {
                print!("== ours, {mode}\n{}", r.human());
                ok &= r.passed();
                Some(r)
            }
            Err(e) => {
                eprintln!("error: ours, {mode}: {e}");
                ok = false;
                None
            }
        };
        let base = match baseline::run(geometry, opts.ring, opts.frames, copy) {
            Ok(b) => {
                println!(
                    "== plain CUDA, {mode}: {:.1} frames/s, frame time {:.1} us, write {:.1} us, read-back check {:.1} us, {} failed frames",
                    b.frames_per_s(),
                    b.frame_time_us(),
                    b.write.as_secs_f64() * 1e6,
                    b.verify.as_secs_f64() * 1e6,
                    b.failed
                );
                ok &= b.failed == 0;
                Some(b)
            }
            Err(e) => {
                eprintln!("error: plain CUDA, {mode}: {e}");
                ok = false;
                None
            }
        };
        if let (Some(o), Some(b)) = (ours, base) {
            rows.push(format!(
                "| {mode} | {:.1} | {:.1} | {:.3} | {:.1} | {} |",
                o.frames_per_s(),
                b.frames_per_s(),
                o.frames_per_s() / b.frames_per_s(),
                o.overhead.p50 as f64 / 1000.0,
                o.stages
                    .iter()
                    .map(|(n, s)| format!("{n} {:.0}", s.mean / 1000.0))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    println!("\n| mode | ours frames/s | plain CUDA frames/s | ours / plain | ours interop overhead p50 (us) | ours stage means (us) |");
    println!("|---|---:|---:|---:|---:|---|");
    for r in rows {
        println!("{r}");
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
