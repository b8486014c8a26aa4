//! The `pipeline` program: a source's frames through the ring, each one
//! verified.
//!
//! The program is one loop over small parts ([`mod@run`]): the source
//! ([`build_source`]: the camera sensor model by default) fills each write
//! lease of the [`Ring`], the ring hands it over (the slot's ready fence is
//! signalled, the consumer waits on it, processes the frame in place and
//! signals the slot free), and each finished frame comes back as a read
//! lease for the [`check::Checker`]; timings and verification make the
//! [`report`]. By default (`--backend auto`) the ring is NvSciBuf buffers
//! with NvSciSync fences and a CUDA consumer, on the real driver where it
//! can run and on the built-in simulator otherwise (see `backend.rs`).
//! Every frame is verified twice: the consumer checks the camera's pattern,
//! and the checker reads the processed frame back (with a ring of three or
//! more on a checker thread while later frames are written, otherwise on
//! the producer thread). Any failed check gives a non-zero exit.
//!
//! `--camera-ahead on` (the default, rings of two or more) is a setting of
//! the same loop: the source writes frame f + 1 on a writer thread while
//! the producer thread hands frame f over ([`run::Plan::ahead`]).
//!
//! Run `cargo run --release -- --help` for the options.
//! Exit status: 0 verified, 1 run or verification failure, 2 bad arguments.

pub mod backend;
pub mod baseline;
pub mod check;
pub mod cli;
pub mod info;
pub mod multicast;
pub mod output;
pub mod probe;
pub mod process;
pub mod program;
pub mod report;
pub mod run;
pub mod stats;
pub mod trace;
pub mod zenoh;

pub use program::main;

use crate::app::report::{Progress, Report};
use crate::ring::Ring;
use crate::source::{SensorSource, Source};
use crate::transport::FrameGeometry;
#[cfg(feature = "vulkan")]
use crate::transport::FrameTransport;
use backend::Opened;
use check::Checker;
use cli::{Options, Readback};
use run::{Plan, Run, Timings};
use trace::Trace;

/// The discrete-GPU transport, in a build with `--features vulkan`.
#[cfg(feature = "vulkan")]
const GPU: Option<backend::GpuHook> = Some(backend::GpuHook {
    probe: crate::transport::gpu::probe,
    open: open_gpu,
});

/// No discrete-GPU transport in a build without `--features vulkan`.
#[cfg(not(feature = "vulkan"))]
const GPU: Option<backend::GpuHook> = None;

/// Opens the discrete-GPU transport (zero-copy, or copy-based for `--copy`)
/// with the environment's settings ([`cli::env::GpuSettings`]).
#[cfg(feature = "vulkan")]
fn open_gpu(
    geometry: FrameGeometry,
    slots: usize,
    opts: &Options,
) -> Result<(Box<dyn FrameTransport>, &'static str), String> {
    let options = cli::env::gpu_options(opts.copy, &opts.env.gpu);
    let t = crate::transport::gpu::GpuTransport::open_with(geometry, slots, options)
        .map_err(String::from)?;
    let note = t.note();
    Ok((Box::new(t), note))
}

/// The program's source, built from the options: the camera sensor model
/// (the default), and the checker for its frames.
///
/// # Errors
/// The source could not be set up.
pub fn build_source(opts: &Options) -> Result<(Box<dyn Source>, Checker), String> {
    if let cli::SourceChoice::Gst {
        description,
        fixed_size,
    } = &opts.source
    {
        return gst_source(opts, description, *fixed_size);
    }
    if let cli::SourceChoice::Zenoh { topic } = &opts.source {
        return zenoh::source(opts, topic);
    }
    let source = SensorSource::new(opts.sensor).map_err(|e| e.to_string())?;
    let checker = Checker::Pattern {
        stride: opts.sensor.stride(),
    };
    Ok((Box::new(source), checker))
}

/// `--source gst:...`: the GStreamer source in `--format`, at
/// `--width`/`--height` where given (else the stream's size); the consumer
/// inverts each frame (`backend::open`), so the checker inverts it back
/// and compares the digest GStreamer's side took.
#[cfg(feature = "gstreamer")]
fn gst_source(
    opts: &Options,
    description: &str,
    fixed_size: bool,
) -> Result<(Box<dyn Source>, Checker), String> {
    use crate::source::gst::{GstLimits, GstSource};
    let layout = crate::source::sensor::layout_of(&opts.sensor).map_err(|e| e.to_string())?;
    let limits = GstLimits::default();
    let source = match fixed_size {
        true => GstSource::new(description, layout, limits),
        false => GstSource::negotiate(description, layout.format(), limits),
    }
    .map_err(|e| format!("--source gst: {e}"))?;
    let checker = Checker::Digest {
        digest: crate::source::inverted_frame_digest,
    };
    Ok((Box::new(source), checker))
}

#[cfg(not(feature = "gstreamer"))]
fn gst_source(_: &Options, _: &str, _: bool) -> Result<(Box<dyn Source>, Checker), String> {
    Err("--source gst: this program was built without GStreamer: build it with --features gstreamer".into())
}

/// The options with the frame size the source gives (a GStreamer source
/// may size its frames after the stream), for the transport and the report.
fn sized_by(opts: &Options, layout: crate::frame::FrameLayout) -> Result<Options, String> {
    let side = |v: u32| {
        u16::try_from(v).map_err(|_| format!("the source gives {layout} frames, too large a side"))
    };
    let mut sized = opts.clone();
    sized.sensor.width = side(layout.width())?;
    sized.sensor.height = side(layout.height())?;
    Ok(sized)
}

/// Runs the pipeline as the binary does with `opts` and returns its report
/// (the binary prints it).
pub fn run(opts: &Options) -> Result<Report, String> {
    let (source, checker) = build_source(opts)?;
    let opts = &sized_by(opts, source.layout())?;
    let geometry = FrameGeometry {
        stride: source.layout().pitch(),
        rows: source.layout().height() as usize,
    };
    // A trace file that cannot be created is an error before the run.
    let mut trace = match &opts.trace {
        Some(path) => Trace::create(path, opts.trace_frames, opts.frames),
        None => Ok(Trace::off()),
    }
    .map_err(|e| e.to_string())?;
    let opened = backend::open(opts, geometry, GPU)?;
    let backend = opened.transport.info().backend;
    let (report, closed) = pipeline(opts, opened, source, checker, &mut trace);
    // Written for a failed run too (what was recorded up to the failure).
    let traced = trace.finish(backend, opts.frames);
    let report = report?;
    closed?;
    traced.map_err(|e| e.to_string())?;
    Ok(report)
}

/// The loop over the opened transport; its report, and how the transport
/// closed (released, and checked, on the error path too).
fn pipeline(
    opts: &Options,
    opened: Opened,
    source: Box<dyn Source>,
    checker: Checker,
    trace: &mut Trace,
) -> (Result<Report, String>, Result<(), String>) {
    let (transport, rest) = opened.split();
    let ring = match Ring::from_box(transport) {
        Ok(ring) => ring,
        Err(e) => return (Err(e.to_string()), Ok(())),
    };
    let slots = ring.slots();
    let plan = Plan {
        frames: opts.frames,
        ahead: opts.camera_ahead && slots >= 2,
        overlap: opts.readback == Readback::Overlap && slots >= 3,
        host_copy: opts.copy && !rest.transport_copies,
        checker,
    };
    let timings = match Timings::new(trace) {
        Ok(t) => t,
        Err(e) => return (Err(e), rest.close(ring.close().map_err(String::from))),
    };
    let progress = Progress::new(opts.frames, !opts.quiet && !opts.json);
    let mut run = Run::new(ring, plan, timings, progress);
    let report = run_to_report(opts, &mut run, source, &plan, &rest);
    let closed = run.into_ring().close().map_err(String::from);
    (report, rest.close(closed))
}

/// Runs every frame and checks the rest, then the report.
fn run_to_report(
    opts: &Options,
    run: &mut Run<'_>,
    source: Box<dyn Source>,
    plan: &Plan,
    rest: &backend::OpenedRest,
) -> Result<Report, String> {
    let geometry = run.ring.geometry();
    let layout = source.layout();
    if layout.frame_len() != geometry.frame_len() || layout.pitch() != geometry.stride {
        return Err(format!(
            "the source gives {layout} frames, the transport laid out {geometry:?}"
        ));
    }
    run.v.by_digest = !plan.checker.counts_consumer();
    let source = run.frames(source)?;
    run.check_the_rest()?;
    run.v.pulses = source.trigger_pulses();
    report(opts, run, plan, rest)
}

/// The report of a finished run.
fn report(
    opts: &Options,
    run: &Run<'_>,
    plan: &Plan,
    rest: &backend::OpenedRest,
) -> Result<Report, String> {
    let t = &run.t;
    let wall = match (run.first_start, t.last_finished) {
        (Some(a), Some(b)) => b.saturating_duration_since(a),
        _ => return Err("no frame completed".into()),
    };
    let none = "no samples";
    let sensor = opts.sensor;
    Ok(Report {
        processes: 1,
        backend: run.ring.info().backend,
        why: rest.why.clone(),
        note: rest.note,
        details: run.ring.details(),
        frames: opts.frames,
        ring: run.ring.slots(),
        width: sensor.width,
        height: sensor.height,
        format: cli::format_name(sensor.format),
        frame_len: run.ring.geometry().frame_len(),
        copy: opts.copy || rest.always_copies,
        camera_ahead: plan.ahead,
        wall,
        latency: t.latency.summary().ok_or(none)?,
        write: t.write.summary().ok_or(none)?,
        process: t.process.summary().ok_or(none)?,
        queued: t.queued.summary().ok_or(none)?,
        held: t.held.summary().ok_or(none)?,
        overhead: t.overhead.summary().ok_or(none)?,
        stages: vec![
            ("camera", t.write.summary().ok_or(none)?),
            ("verify", t.verify.summary().ok_or(none)?),
            ("handover", t.handover.summary().ok_or(none)?),
            ("consumer", t.busy.summary().ok_or(none)?),
            ("collect wait", t.collect.summary().ok_or(none)?),
            ("lend wait", t.lend.summary().ok_or(none)?),
            ("checker wait", t.checker.summary().ok_or(none)?),
        ],
        verification: run.v.clone(),
    })
}
