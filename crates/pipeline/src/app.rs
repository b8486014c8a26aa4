//! Camera -> consumer frame pipeline over a ring of shared buffers.
//!
//! The camera (driven through `embedded-hal` traits; see
//! `crate::camera`) writes each frame into a ring slot, the slot's
//! ready fence is signalled, the consumer waits on it, processes the frame in
//! place and signals the slot free. By default (`--backend auto`) the ring
//! is NvSciBuf buffers with NvSciSync fences (deterministic, built by each
//! waiter where the library has `FenceUpdateFence`, received from the
//! signaller otherwise; the summary says which) and a CUDA consumer, on the real driver where it can run and on the built-in
//! simulator otherwise (see `backend.rs` and `nvsci.rs`). Every frame is verified twice: the
//! consumer checks the camera's pattern, and the producer reads the processed
//! frame back when it reuses the slot. Any failed check gives a non-zero exit.
//!
//! Run `cargo run --release -- --help` for the options.
//! Exit status: 0 verified, 1 run or verification failure, 2 bad arguments.

use std::process::ExitCode;
use std::time::Instant;

use crate::camera::{
    regs, Camera, FrameInfo, FrameSink, PixelFormat, TestPattern, TestPatternReadout,
};

use crate::backend::{self, Opened};
use crate::cli::{self, Command, Options};
use crate::report::{Progress, Report, Verification};
use crate::ring::{InFlight, Ring};
use crate::sensor::{ModelSensorBus, SyncLine};
use crate::stats::Samples;
use crate::transport::{Completion, FrameGeometry};

/// The `pipeline` binary: parses the command line, runs, prints the report.
/// Exit status: 0 verified, 1 run or verification failure, 2 bad arguments.
pub fn main() -> ExitCode {
    let opts = match cli::parse(std::env::args_os().skip(1)) {
        Ok(Command::Help) => {
            print!("{}", cli::USAGE);
            return ExitCode::SUCCESS;
        }
        Ok(Command::Run(o)) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&opts) {
        Ok(report) => {
            if opts.json {
                println!("{}", report.json());
            } else {
                print!("{}", report.human());
            }
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                eprintln!("error: frames failed verification; the pipeline is broken");
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The discrete-GPU transport, in a build with `--features vulkan`.
#[cfg(feature = "vulkan")]
const GPU: Option<backend::GpuHook> = Some(backend::GpuHook {
    probe: crate::gpu::probe,
    open: open_gpu,
});

/// No discrete-GPU transport in a build without `--features vulkan`.
#[cfg(not(feature = "vulkan"))]
const GPU: Option<backend::GpuHook> = None;

/// Opens the discrete-GPU transport (zero-copy, or copy-based for `--copy`)
/// and runs the pipeline's body over it.
#[cfg(feature = "vulkan")]
fn open_gpu(
    geometry: FrameGeometry,
    schedule: crate::ring::FenceSchedule,
    copy: bool,
    why: String,
    body: backend::Body<'_>,
) -> Result<(), String> {
    crate::gpu::with_transport(
        geometry,
        schedule,
        crate::gpu::Mode::from_copy_flag(copy),
        |t, note| {
            body(Opened {
                transport: t,
                why,
                note: Some(note),
                transport_copies: true,
            })
        },
    )
    .map_err(|e| e.to_string())?
}

/// Remembers when the camera finished writing and checks the frame order.
struct WriteDone {
    expected_index: u64,
    at: Option<Instant>,
}

impl FrameSink for WriteDone {
    type Error = String;
    fn frame_ready(&mut self, info: &FrameInfo, _frame: &[u8]) -> Result<(), String> {
        if info.index != self.expected_index {
            return Err(format!(
                "camera produced frame {} where {} was due",
                info.index, self.expected_index
            ));
        }
        self.at = Some(Instant::now());
        Ok(())
    }
}

/// Per-frame measurements, each in a buffer sized once for the whole run.
struct Timings {
    latency: Samples,
    write: Samples,
    process: Samples,
    queued: Samples,
    overhead: Samples,
    last_finished: Option<Instant>,
}

fn format_name(f: PixelFormat) -> &'static str {
    match f {
        PixelFormat::Raw8 => "raw8",
        PixelFormat::Raw16 => "raw16",
        PixelFormat::Rgba8 => "rgba8",
    }
}

/// Checks a slot's bytes against the processed (inverted) pattern of `frame`.
fn check_readback(v: &mut Verification, stride: usize, frame: u64, slot: usize, bytes: &[u8]) {
    match TestPattern::new(frame, stride).first_mismatch(bytes, 0xff) {
        None => v.readback_ok += 1,
        Some(at) => v.fail(format!(
            "frame {frame} in slot {slot}: processed bytes read back wrong at offset {at}"
        )),
    }
}

fn on_completion(
    c: Completion,
    ring: &mut Ring,
    t: &mut Timings,
    v: &mut Verification,
) -> Result<(), String> {
    let rec = ring.complete(c.slot, c.frame)?;
    if c.mismatches == 0 {
        v.consumer_ok += 1;
    } else {
        v.fail(format!(
            "frame {} in slot {}: consumer saw {} byte(s) that differ from the camera pattern",
            c.frame, c.slot, c.mismatches
        ));
    }
    let latency = c.finished.saturating_duration_since(rec.started).as_nanos() as u64;
    let process = c.process.as_nanos() as u64;
    let queued = c.queued.as_nanos() as u64;
    t.latency.push(latency)?;
    t.write.push(rec.write_ns)?;
    t.process.push(process)?;
    t.queued.push(queued)?;
    t.overhead.push(
        latency
            .saturating_sub(rec.write_ns)
            .saturating_sub(process)
            .saturating_sub(queued),
    )?;
    t.last_finished = Some(c.finished);
    Ok(())
}

fn run(opts: &Options) -> Result<Report, String> {
    let geometry = FrameGeometry {
        stride: opts.sensor.stride(),
        rows: usize::from(opts.sensor.height),
    };
    backend::run_with(opts, geometry, GPU, |opened| {
        pipeline(opts, geometry, opened)
    })
}

fn pipeline(opts: &Options, geometry: FrameGeometry, opened: Opened<'_>) -> Result<Report, String> {
    let sensor = opts.sensor;
    let transport = opened.transport;
    // `--copy`: the camera writes into a staging buffer that is copied into
    // the slot, unless the transport makes its own copy.
    let host_copy = opts.copy && !opened.transport_copies;
    if transport.geometry() != geometry {
        return Err(format!(
            "transport laid out frames as {:?}, the camera needs {geometry:?}",
            transport.geometry()
        ));
    }
    let mut ring = Ring::new(crate::ring::FenceSchedule::new(transport.slot_count())?);
    let schedule = ring.schedule();

    let mut camera = Camera::new(
        ModelSensorBus::new(regs::DEFAULT_ADDRESS),
        SyncLine::default(),
        TestPatternReadout,
        regs::DEFAULT_ADDRESS,
        sensor,
    )
    .map_err(|e| e.to_string())?;
    camera.init().map_err(|e| e.to_string())?;

    let n = usize::try_from(opts.frames).map_err(|_| "too many frames".to_string())?;
    let mut t = Timings {
        latency: Samples::with_capacity(n),
        write: Samples::with_capacity(n),
        process: Samples::with_capacity(n),
        queued: Samples::with_capacity(n),
        overhead: Samples::with_capacity(n),
        last_finished: None,
    };
    let mut v = Verification::default();
    // The copy-based variant's camera buffer, allocated once.
    let mut staging = if host_copy {
        vec![0u8; geometry.frame_len()]
    } else {
        Vec::new()
    };
    let mut progress = Progress::new(opts.frames, !opts.quiet && !opts.json);
    let mut first_start = None;

    for frame in 0..opts.frames {
        let slot = schedule.slot(frame);
        // Collect finished frames; block only for the one holding our slot.
        while let Some(c) = transport.try_complete().map_err(|e| e.to_string())? {
            on_completion(c, &mut ring, &mut t, &mut v)?;
        }
        while ring.is_busy(slot) {
            let c = transport.wait_complete().map_err(|e| e.to_string())?;
            on_completion(c, &mut ring, &mut t, &mut v)?;
        }
        let bytes = transport
            .producer_acquire(slot, frame)
            .map_err(|e| e.to_string())?;
        if let Some(prev) = ring.last_done(slot) {
            check_readback(&mut v, geometry.stride, prev, slot, bytes);
        }

        let started = Instant::now();
        first_start.get_or_insert(started);
        let mut sink = WriteDone {
            expected_index: frame,
            at: None,
        };
        let target: &mut [u8] = if host_copy { &mut staging } else { bytes };
        camera
            .capture(target, &mut sink)
            .map_err(|e| e.to_string())?;
        let written = sink
            .at
            .ok_or("camera returned without signalling the frame")?;
        if host_copy {
            bytes.copy_from_slice(&staging);
        }
        transport
            .producer_release(slot, frame)
            .map_err(|e| e.to_string())?;
        transport
            .consumer_submit(slot, frame)
            .map_err(|e| e.to_string())?;
        ring.submit(InFlight {
            frame,
            started,
            write_ns: (written - started).as_nanos() as u64,
        })?;
        progress.update(frame + 1 - ring.in_flight() as u64);
    }
    while ring.in_flight() > 0 {
        let c = transport.wait_complete().map_err(|e| e.to_string())?;
        on_completion(c, &mut ring, &mut t, &mut v)?;
    }
    progress.update(opts.frames);
    progress.finish();

    // Read back the last frame of every slot, as the next frame would.
    for slot in 0..schedule.slots() {
        if let Some(last) = ring.last_done(slot) {
            let next = last + schedule.slots() as u64;
            let bytes = transport
                .producer_acquire(slot, next)
                .map_err(|e| e.to_string())?;
            check_readback(&mut v, geometry.stride, last, slot, bytes);
        }
    }
    let (_, pin, _) = camera.release();
    v.pulses = pin.pulses;

    let wall = match (first_start, t.last_finished) {
        (Some(a), Some(b)) => b.saturating_duration_since(a),
        _ => return Err("no frame completed".into()),
    };
    let none = "no samples";
    Ok(Report {
        backend: transport.backend(),
        why: opened.why,
        note: opened.note,
        frames: opts.frames,
        ring: schedule.slots(),
        width: sensor.width,
        height: sensor.height,
        format: format_name(sensor.format),
        frame_len: geometry.frame_len(),
        copy: opts.copy,
        wall,
        latency: t.latency.summary().ok_or(none)?,
        write: t.write.summary().ok_or(none)?,
        process: t.process.summary().ok_or(none)?,
        queued: t.queued.summary().ok_or(none)?,
        overhead: t.overhead.summary().ok_or(none)?,
        verification: v,
    })
}
