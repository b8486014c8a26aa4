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
//! frame back before its slot is written again: with a ring of three or more
//! on a checker thread, over the frame lent by the ring ([`Ring::lend`]), while
//! the camera writes later frames into other slots, otherwise when the slot
//! comes round. Any
//! failed check gives a non-zero exit.
//!
//! Where the transport leases its slots and the ring has two or more
//! (`--camera-ahead on`, the default), the camera writes frame f + 1 on a
//! camera thread, into a slot taken out of the transport
//! ([`Ring::take_for_write`]), while the producer thread hands frame f over
//! ([`Ring::hand_over`]) and collects, lends and takes the checker's
//! answers; otherwise the serial loop ([`Ring::produce`]) runs.
//!
//! Run `cargo run --release -- --help` for the options.
//! Exit status: 0 verified, 1 run or verification failure, 2 bad arguments.

pub mod backend;
pub mod baseline;
pub mod cli;
pub mod info;
pub mod probe;
pub mod report;
pub mod stats;
pub mod trace;

use std::process::ExitCode;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::camera::{
    frame_threads, regs, Camera, FrameInfo, FrameSink, TestPattern, TestPatternReadout,
};

use crate::app::report::{Progress, Report, Verification};
use crate::app::stats::Samples;
use crate::camera::sensor::{ModelSensorBus, SyncLine};
use crate::ring::{Collected, Ring, Ticket, MAX_SLOTS};
#[cfg(feature = "vulkan")]
use crate::transport::FrameTransport;
use crate::transport::{Completion, FrameGeometry, PeekedFrame, WriteLease};
use backend::Opened;
use cli::{Command, Options, Readback};
use trace::{Trace, Track};

/// The `pipeline` binary: parses the command line, runs, prints the report.
/// Exit status: 0 verified, 1 run or verification failure, 2 bad arguments.
pub fn main() -> ExitCode {
    let opts = match cli::parse(std::env::args_os().skip(1)) {
        Ok(Command::Help) => {
            print!("{}", cli::help());
            return ExitCode::SUCCESS;
        }
        Ok(Command::Run(o)) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(n) = opts.frame_threads {
        crate::camera::set_frame_threads(n);
    }
    let (result, who) = if opts.two_process() {
        let who = match opts.role {
            Some(cli::Role::Camera) => "error (camera process)",
            _ => "error (cuda process)",
        };
        let r = crate::transport::process::run(&opts).map_err(|e| e.to_string());
        (r, who)
    } else {
        (run(&opts).map(Some), "error")
    };
    match result {
        Ok(Some(report)) => {
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
        // The camera side of the two-process mode: its figures went to the
        // CUDA process, which reports them.
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{who}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The discrete-GPU transport, in a build with `--features vulkan`.
#[cfg(feature = "vulkan")]
const GPU: Option<backend::GpuHook> = Some(backend::GpuHook {
    probe: crate::transport::gpu::probe,
    open: open_gpu,
});

/// No discrete-GPU transport in a build without `--features vulkan`.
#[cfg(not(feature = "vulkan"))]
const GPU: Option<backend::GpuHook> = None;

/// Opens the discrete-GPU transport (zero-copy, or copy-based for `--copy`).
#[cfg(feature = "vulkan")]
fn open_gpu(
    geometry: FrameGeometry,
    slots: usize,
    copy: bool,
) -> Result<(Box<dyn FrameTransport>, &'static str), String> {
    let mode = crate::transport::gpu::Mode::from_copy_flag(copy);
    let t =
        crate::transport::gpu::GpuTransport::open(geometry, slots, mode).map_err(String::from)?;
    let note = t.note();
    Ok((Box::new(t), note))
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

/// Per-frame measurements, each a histogram of fixed size (see [`Samples`]).
struct Timings<'a> {
    latency: Samples,
    write: Samples,
    process: Samples,
    queued: Samples,
    /// Written frame kept by the producer before its ready signal (the
    /// copy-based variant's host copy).
    held: Samples,
    /// Per slot: the frame whose `held` time is recorded, and that time
    /// (taken at completion).
    held_by_slot: [Option<(u64, u64)>; MAX_SLOTS],
    overhead: Samples,
    /// Host check of the slot's previous frame.
    verify: Samples,
    /// Producer thread inside the transport's calls.
    handover: Samples,
    /// Consumer occupied with a frame after its wait.
    busy: Samples,
    /// Producer thread collecting finished frames, per frame: blocked until
    /// the slot's last frame and the frame to check next were finished.
    collect: Samples,
    /// Producer thread lending the frame to check to the checker thread,
    /// per frame: the transport making the consumer's writes visible to
    /// the host.
    lend: Samples,
    /// Producer thread waiting for the checker, per frame: handing it a
    /// frame (its queue full) and taking its answer for the slot's frame.
    checker: Samples,
    last_finished: Option<Instant>,
    /// `--trace`: each frame's stages (nothing when off).
    trace: &'a mut Trace,
}

/// The first byte of a slot that differs from the processed (inverted)
/// pattern of `frame`, and how long the check took.
fn first_wrong_byte(stride: usize, frame: u64, bytes: &[u8]) -> (Option<usize>, u64) {
    let began = Instant::now();
    let at = TestPattern::new(frame, stride).first_mismatch_parallel(
        bytes,
        0xff,
        frame_threads(bytes.len()),
    );
    (at, began.elapsed().as_nanos() as u64)
}

/// Counts a read-back check's result.
fn record_readback(v: &mut Verification, frame: u64, slot: usize, wrong: Option<usize>) {
    match wrong {
        None => v.readback_ok += 1,
        Some(at) => v.fail(format!(
            "frame {frame} in slot {slot}: processed bytes read back wrong at offset {at}"
        )),
    }
}

/// Checks a slot's bytes against the processed (inverted) pattern of `frame`
/// on the producer thread (where the checker thread did not), from `at`:
/// records the result, the time and the trace span.
fn check_readback(
    v: &mut Verification,
    t: &mut Timings,
    stride: usize,
    frame: u64,
    slot: usize,
    at: Instant,
    bytes: &[u8],
) {
    let (wrong, ns) = first_wrong_byte(stride, frame, bytes);
    record_readback(v, frame, slot, wrong);
    t.verify.push(ns);
    t.trace.span(
        Track::Producer,
        "check",
        frame,
        at,
        Duration::from_nanos(ns),
    );
}

/// A lent frame for the checker thread to check.
struct CheckJob {
    frame: u64,
    slot: usize,
    bytes: PeekedFrame,
}

/// The checker thread's answer for one [`CheckJob`].
struct CheckDone {
    frame: u64,
    slot: usize,
    wrong: Option<usize>,
    ns: u64,
    /// When the check ended (for `--trace`).
    ended: Instant,
}

/// The checker thread: checks each lent frame against the processed
/// pattern and answers, until its queue closes (or nobody listens).
fn check_lent_frames(stride: usize, jobs: Receiver<CheckJob>, done: SyncSender<CheckDone>) {
    for job in jobs {
        let (wrong, ns) = first_wrong_byte(stride, job.frame, job.bytes.bytes());
        // Given back before the answer: the producer gives the slot back
        // to the ring on the answer, and the transport waits for the lent
        // frame to be dropped before it writes the slot again.
        drop(job.bytes);
        let answer = CheckDone {
            frame: job.frame,
            slot: job.slot,
            wrong,
            ns,
            ended: Instant::now(),
        };
        if done.send(answer).is_err() {
            return;
        }
    }
}

/// The pipeline's camera, and its staging buffer for `--copy` where the
/// transport does not copy (empty otherwise).
type PipelineCamera = Camera<ModelSensorBus, SyncLine, TestPatternReadout>;

/// How long the producer waits for the camera thread to write one frame
/// (`--camera-ahead on`) before it gives up with an error.
pub const CAMERA_WAIT: Duration = Duration::from_secs(60);

/// A slot taken for a frame, for the camera thread to write.
struct CameraJob {
    frame: u64,
    lease: WriteLease,
}

/// The camera thread's answer for one [`CameraJob`]: the slot (written or
/// not: it goes back to the transport either way), when the camera
/// started, and when it signalled the frame and finished its copy
/// (`--copy` where the transport does not copy; `None` otherwise), or why
/// it did not write the frame.
struct CameraDone {
    frame: u64,
    lease: WriteLease,
    started: Instant,
    outcome: Result<(Instant, Option<Instant>), String>,
}

/// Captures frame `frame` into `bytes` (through `staging` when it is not
/// empty: `--copy` where the transport does not copy), checking that the
/// camera produced the frame that was due. Returns when the camera signalled
/// the frame.
fn capture_into(
    camera: &mut PipelineCamera,
    staging: &mut [u8],
    frame: u64,
    bytes: &mut [u8],
) -> Result<Instant, String> {
    let mut sink = WriteDone {
        expected_index: frame,
        at: None,
    };
    if staging.is_empty() {
        camera
            .capture(bytes, &mut sink)
            .map_err(|e| e.to_string())?;
    } else {
        camera
            .capture(staging, &mut sink)
            .map_err(|e| e.to_string())?;
    }
    let written = sink
        .at
        .ok_or("camera returned without signalling the frame")?;
    if !staging.is_empty() {
        bytes.copy_from_slice(staging);
    }
    Ok(written)
}

/// The camera thread (`--camera-ahead on`): writes each leased slot it is
/// given, in order, and answers with it, until its queue closes or nobody
/// listens. After a failed write it writes nothing more, but still answers
/// each slot it is given (with the first failure), so that every slot goes
/// back to the transport.
fn camera_thread(
    camera: &Mutex<(PipelineCamera, Vec<u8>)>,
    jobs: Receiver<CameraJob>,
    done: SyncSender<CameraDone>,
) {
    let mut guard = camera.lock();
    let mut failed = guard
        .is_err()
        .then(|| "the camera's lock was poisoned".to_string());
    for mut job in jobs {
        let started = Instant::now();
        let outcome = match (&mut guard, &failed) {
            (Ok(g), None) => {
                let (camera, staging) = &mut **g;
                let copies = !staging.is_empty();
                job.lease
                    .bytes_mut()
                    .map_err(String::from)
                    .and_then(|bytes| capture_into(camera, staging, job.frame, bytes))
                    .map(|written| (written, copies.then(Instant::now)))
            }
            (_, Some(first)) => Err(format!("frame {} not written: {first}", job.frame)),
            (Err(_), None) => Err("the camera's lock was poisoned".to_string()),
        };
        if let Err(e) = &outcome {
            failed.get_or_insert_with(|| e.clone());
        }
        let answer = CameraDone {
            frame: job.frame,
            lease: job.lease,
            started,
            outcome,
        };
        if done.send(answer).is_err() {
            return;
        }
    }
}

/// A frame whose slot went to the camera thread, not handed over yet.
struct Pending {
    ticket: Ticket,
    /// Nanoseconds the producer spent taking the slot (the first part of
    /// the frame's handover).
    take_ns: u64,
}

/// `--camera-ahead on`: waits for the camera thread's answer for `p`'s
/// frame (at most [`CAMERA_WAIT`]), records its camera span, and hands the
/// frame over ([`Ring::hand_over`]: the slot back to the transport, ready
/// signal, consumer queued).
fn hand_over_written(
    ring: &mut Ring,
    transport: &mut dyn crate::transport::FrameTransport,
    t: &mut Timings,
    done: &Receiver<CameraDone>,
    p: Pending,
    first_start: &mut Option<Instant>,
) -> Result<(), String> {
    let frame = p.ticket.frame();
    let d = done.recv_timeout(CAMERA_WAIT).map_err(|e| match e {
        RecvTimeoutError::Timeout => format!(
            "the camera thread did not write frame {frame} within {} s",
            CAMERA_WAIT.as_secs()
        ),
        RecvTimeoutError::Disconnected => "the camera thread stopped".to_string(),
    })?;
    if d.frame != frame {
        return Err(format!(
            "the camera thread answered for frame {}, frame {frame} was due",
            d.frame
        ));
    }
    let (written, copied) = match d.outcome {
        Ok(times) => times,
        Err(e) => {
            // Not written: the slot goes back to the transport unsignalled
            // (the run ends with the camera's error).
            let _ = transport.put_back(&p.ticket, d.lease);
            return Err(e);
        }
    };
    first_start.get_or_insert(d.started);
    t.trace.span(
        Track::Camera,
        "camera",
        frame,
        d.started,
        written - d.started,
    );
    if let Some(copied) = copied {
        t.trace
            .span(Track::Camera, "copy", frame, written, copied - written);
    }
    let begin = Instant::now();
    t.held_by_slot[p.ticket.slot()] = Some((
        frame,
        begin.saturating_duration_since(written).as_nanos() as u64,
    ));
    let write_ns = (written - d.started).as_nanos() as u64;
    ring.hand_over(transport, p.ticket, d.lease, d.started, write_ns)?;
    let end = Instant::now();
    t.handover.push(p.take_ns + (end - begin).as_nanos() as u64);
    t.trace
        .span(Track::Producer, "handover", frame, begin, end - begin);
    Ok(())
}

/// Verifies and measures one collected frame.
fn on_completion(
    c: &Completion,
    done: &Collected,
    t: &mut Timings,
    v: &mut Verification,
) -> Result<(), String> {
    let rec = done.rec;
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
    let queued = done.queued.as_nanos() as u64;
    let held = match t.held_by_slot.get_mut(c.slot).and_then(Option::take) {
        Some((frame, ns)) if frame == c.frame => ns,
        _ => 0,
    };
    t.latency.push(latency);
    t.write.push(rec.write_ns);
    t.process.push(process);
    t.busy.push(c.busy.as_nanos() as u64);
    t.queued.push(queued);
    t.held.push(held);
    t.overhead.push(
        latency
            .saturating_sub(rec.write_ns)
            .saturating_sub(held)
            .saturating_sub(process)
            .saturating_sub(queued),
    );
    t.last_finished = Some(c.finished);
    t.trace.consumer(c.frame, rec.signalled, c.finished, c.busy);
    Ok(())
}

/// Runs the pipeline as the binary does with `opts` and returns its report
/// (the binary prints it).
pub fn run(opts: &Options) -> Result<Report, String> {
    // The frame loop below takes its frames from the sensor model only;
    // the GStreamer source (source::gst) joins it with the loop over a
    // `Box<dyn Source>` (issue 30). Until then a gst source is refused
    // rather than run on the sensor.
    if let cli::SourceChoice::Gst { .. } = &opts.source {
        return Err(
            "--source gst:... is not wired into this program's frame loop yet \
             (the GStreamer source is the library's source::gst::GstSource)"
                .into(),
        );
    }
    let geometry = FrameGeometry {
        stride: opts.sensor.stride(),
        rows: usize::from(opts.sensor.height),
    };
    // A trace file that cannot be created is an error before the run.
    let mut trace = match &opts.trace {
        Some(path) => Trace::create(path, opts.trace_frames, opts.frames),
        None => Ok(Trace::off()),
    }
    .map_err(|e| e.to_string())?;
    let mut opened = backend::open(opts, geometry, GPU)?;
    let backend = opened.transport.backend();
    let report = pipeline(opts, geometry, &mut opened, &mut trace);
    // Released (and checked) on the error path too; the run's error wins.
    let closed = opened.close();
    // Written for a failed run too (what was recorded up to the failure).
    let traced = trace.finish(backend, opts.frames);
    let report = report?;
    closed?;
    traced.map_err(|e| e.to_string())?;
    Ok(report)
}

fn pipeline(
    opts: &Options,
    geometry: FrameGeometry,
    opened: &mut Opened,
    trace: &mut Trace,
) -> Result<Report, String> {
    let sensor = opts.sensor;
    let transport = &mut *opened.transport;
    // `--copy`: the camera writes into a staging buffer that is copied into
    // the slot, unless the transport makes its own copy.
    let host_copy = opts.copy && !opened.transport_copies;
    if transport.geometry() != geometry {
        return Err(format!(
            "transport laid out frames as {:?}, the camera needs {geometry:?}",
            transport.geometry()
        ));
    }
    let mut ring = Ring::new(transport.slot_count())?;

    let mut camera = Camera::new(
        ModelSensorBus::new(regs::DEFAULT_ADDRESS),
        SyncLine::default(),
        TestPatternReadout,
        regs::DEFAULT_ADDRESS,
        sensor,
    )
    .map_err(|e| e.to_string())?;
    camera.init().map_err(|e| e.to_string())?;

    let mut t = Timings {
        latency: Samples::new()?,
        write: Samples::new()?,
        process: Samples::new()?,
        queued: Samples::new()?,
        held: Samples::new()?,
        held_by_slot: [None; MAX_SLOTS],
        overhead: Samples::new()?,
        verify: Samples::new()?,
        handover: Samples::new()?,
        busy: Samples::new()?,
        collect: Samples::new()?,
        lend: Samples::new()?,
        checker: Samples::new()?,
        last_finished: None,
        trace,
    };
    let mut v = Verification::default();
    // The copy-based variant's camera buffer, allocated once.
    let staging = if host_copy {
        vec![0u8; geometry.frame_len()]
    } else {
        Vec::new()
    };
    // `--camera-ahead on`: the camera writes frame f + 1 on its own thread,
    // into a slot taken out of the transport, while the producer thread
    // hands frame f over and collects, lends and checks; where the
    // transport cannot lease its slots, or the ring has one slot (frame
    // f + 1 needs the slot frame f is written into), the serial loop runs.
    let ahead = opts.camera_ahead && transport.leases_frames() && ring.slots() >= 2;
    let camera = Mutex::new((camera, staging));
    let mut progress = Progress::new(opts.frames, !opts.quiet && !opts.json);
    let mut first_start = None;

    // Per slot: the slot's last checked frame. With three or more slots,
    // frame f + 1 - n (collected; its slot is the one frame f + 1 writes) is
    // lent to the checker thread just before frame f is produced, and its
    // answer taken (the slot given back to the ring) just before frame f + 1:
    // the check runs beside the camera and the handover, and holds the
    // producer only when it is the slowest stage. The checker has at most
    // two frames: the one it reads and the next one, queued. Otherwise
    // (fewer slots, or the transport cannot lend the slot now) a frame is
    // checked when its slot comes round, before the camera overwrites it.
    // Either way every frame is checked exactly once.
    let mut checked = [None::<u64>; MAX_SLOTS];
    let slots = ring.slots() as u64;
    std::thread::scope(|scope| -> Result<(), String> {
        let (job_tx, job_rx) = mpsc::sync_channel::<CheckJob>(1);
        let (done_tx, done_rx) = mpsc::sync_channel::<CheckDone>(2);
        let stride = geometry.stride;
        let checker = scope.spawn(move || check_lent_frames(stride, job_rx, done_tx));
        // The camera thread, with the ahead loop: at most two frames are
        // with it (the one it writes and the next one, queued).
        let (cam_tx, cam_rx) = mpsc::sync_channel::<CameraJob>(1);
        let (cam_done_tx, cam_done_rx) = mpsc::sync_channel::<CameraDone>(2);
        let camera_writer = if ahead {
            let camera = &camera;
            Some(scope.spawn(move || camera_thread(camera, cam_rx, cam_done_tx)))
        } else {
            drop((cam_rx, cam_done_tx));
            None
        };
        let mut pending = None::<Pending>;
        // Frames lent to the checker and not given back yet, oldest first.
        let mut lent = std::collections::VecDeque::<u64>::with_capacity(2);
        // Takes the checker's answer for the oldest lent frame.
        let finish = |lent: &mut std::collections::VecDeque<u64>,
                      ring: &mut Ring,
                      v: &mut Verification,
                      t: &mut Timings,
                      checked: &mut [Option<u64>; MAX_SLOTS]|
         -> Result<(), String> {
            let Some(frame) = lent.pop_front() else {
                return Ok(());
            };
            let d = done_rx
                .recv()
                .map_err(|_| "the read-back checker stopped".to_string())?;
            if d.frame != frame {
                return Err(format!(
                    "the read-back checker answered for frame {}, frame {frame} was lent",
                    d.frame
                ));
            }
            record_readback(v, d.frame, d.slot, d.wrong);
            t.verify.push(d.ns);
            let ns = std::time::Duration::from_nanos(d.ns);
            t.trace
                .span_ending(Track::Checker, "check", d.frame, d.ended, ns);
            checked[d.slot] = Some(d.frame);
            ring.give_back(d.frame)
        };
        let mut produced = || -> Result<(), String> {
            for frame in 0..opts.frames {
                // Where the producer thread waits, per frame (host clocks).
                let mut phase = Instant::now();
                let loop_start = phase;
                let lap = |phase: &mut Instant| {
                    let now = Instant::now();
                    let ns = now.saturating_duration_since(*phase).as_nanos() as u64;
                    *phase = now;
                    ns
                };
                let (mut collect_ns, mut lend_ns, mut checker_ns) = (0, 0, 0);
                // Collect finished frames; block only for the one holding our slot.
                ring.make_room(transport, |c, done| on_completion(c, done, &mut t, &mut v))?;
                collect_ns += lap(&mut phase);
                if let Some(g) = (frame + 1).checked_sub(slots) {
                    if opts.readback == Readback::Overlap
                        && slots >= 3
                        && checked[(g % slots) as usize] != Some(g)
                    {
                        ring.collect_through(transport, g, |c, done| {
                            on_completion(c, done, &mut t, &mut v)
                        })?;
                        collect_ns += lap(&mut phase);
                        let bytes = match ring.peek(g) {
                            Some(p) => ring.lend(transport, &p)?,
                            None => None,
                        };
                        lend_ns += lap(&mut phase);
                        if let Some(bytes) = bytes {
                            let job = CheckJob {
                                frame: g,
                                slot: (g % slots) as usize,
                                bytes,
                            };
                            job_tx
                                .send(job)
                                .map_err(|_| "the read-back checker stopped".to_string())?;
                            lent.push_back(g);
                        }
                    }
                }
                // A frame lent earlier may sit in this frame's slot: its
                // check must be done before the slot is acquired.
                let slot = (frame % slots) as usize;
                while lent.iter().any(|&g| (g % slots) as usize == slot) {
                    finish(&mut lent, &mut ring, &mut v, &mut t, &mut checked)?;
                }
                checker_ns += lap(&mut phase);
                t.collect.push(collect_ns);
                t.lend.push(lend_ns);
                t.checker.push(checker_ns);
                t.trace.producer_waits(
                    frame,
                    loop_start,
                    [
                        ("collect wait", collect_ns),
                        ("lend wait", lend_ns),
                        ("checker wait", checker_ns),
                    ],
                );
                if ahead {
                    // Take the slot, check its previous frame where that
                    // was not done beside, give it to the camera thread;
                    // then hand the frame before over while the camera
                    // writes this one.
                    let entered = Instant::now();
                    let (ticket, mut lease) = ring.take_for_write(transport)?;
                    let taken = Instant::now();
                    t.trace
                        .span(Track::Producer, "acquire", frame, entered, taken - entered);
                    if let Some(prev) = ticket.previous_frame() {
                        if checked[ticket.slot()] != Some(prev) {
                            let bytes = match lease.bytes_mut() {
                                Ok(bytes) => bytes,
                                Err(e) => {
                                    let _ = transport.put_back(&ticket, lease);
                                    return Err(e.into());
                                }
                            };
                            let slot = ticket.slot();
                            check_readback(
                                &mut v,
                                &mut t,
                                geometry.stride,
                                prev,
                                slot,
                                taken,
                                bytes,
                            );
                            checked[ticket.slot()] = Some(prev);
                        }
                    }
                    if let Err(mpsc::SendError(job)) = cam_tx.send(CameraJob { frame, lease }) {
                        let _ = transport.put_back(&ticket, job.lease);
                        return Err("the camera thread stopped".into());
                    }
                    let take_ns = (taken - entered).as_nanos() as u64;
                    if let Some(p) = pending.replace(Pending { ticket, take_ns }) {
                        hand_over_written(
                            &mut ring,
                            transport,
                            &mut t,
                            &cam_done_rx,
                            p,
                            &mut first_start,
                        )?;
                    }
                    progress.update(frame - ring.in_flight() as u64);
                    continue;
                }
                let entered = Instant::now();
                let mut inside = 0u64;
                let mut wrote = entered;
                let mut camera = camera
                    .lock()
                    .map_err(|_| "the camera's lock was poisoned".to_string())?;
                let (camera, staging) = &mut *camera;
                ring.produce(transport, |ticket, bytes| {
                    let began = Instant::now();
                    t.trace
                        .span(Track::Producer, "acquire", frame, entered, began - entered);
                    if let Some(prev) = ticket.previous_frame() {
                        if checked[ticket.slot()] != Some(prev) {
                            let slot = ticket.slot();
                            check_readback(
                                &mut v,
                                &mut t,
                                geometry.stride,
                                prev,
                                slot,
                                began,
                                bytes,
                            );
                            checked[ticket.slot()] = Some(prev);
                        }
                    }
                    let started = Instant::now();
                    first_start.get_or_insert(started);
                    let written = capture_into(camera, staging, frame, bytes)?;
                    t.trace
                        .span(Track::Producer, "camera", frame, started, written - started);
                    if host_copy {
                        let d = written.elapsed();
                        t.trace.span(Track::Producer, "copy", frame, written, d);
                    }
                    t.held_by_slot[ticket.slot()] =
                        Some((frame, written.elapsed().as_nanos() as u64));
                    wrote = Instant::now();
                    inside = (wrote - began).as_nanos() as u64;
                    Ok((started, (written - started).as_nanos() as u64))
                })?;
                t.handover
                    .push((entered.elapsed().as_nanos() as u64).saturating_sub(inside));
                if t.trace.is_on() {
                    // After the write: release and ready signal.
                    let d = wrote.elapsed();
                    t.trace.span(Track::Producer, "handover", frame, wrote, d);
                }
                progress.update(frame + 1 - ring.in_flight() as u64);
            }
            if let Some(p) = pending.take() {
                hand_over_written(
                    &mut ring,
                    transport,
                    &mut t,
                    &cam_done_rx,
                    p,
                    &mut first_start,
                )?;
            }
            while !lent.is_empty() {
                finish(&mut lent, &mut ring, &mut v, &mut t, &mut checked)?;
            }
            Ok(())
        };
        let result = produced();
        // The checker stops once its queue is closed; frames still lent
        // after a failure are read to the end before the scope (and so the
        // borrow of the transport that lent them) ends. So does the camera
        // thread (a slot it still holds after a failure is dropped with its
        // lease; the run fails anyway).
        drop(job_tx);
        drop(cam_tx);
        let result = match camera_writer.map(|w| w.join()) {
            Some(Err(_)) => result.and(Err("the camera thread panicked".to_string())),
            _ => result,
        };
        // After a failure, the slot the camera thread still had goes back
        // to the transport (its answer waits in the queue), so the
        // transport tears down every slot's memory itself.
        if let Some(p) = pending.take() {
            for d in cam_done_rx.try_iter() {
                if d.frame == p.ticket.frame() {
                    let _ = transport.put_back(&p.ticket, d.lease);
                }
            }
        }
        match checker.join() {
            Ok(()) => result,
            Err(_) => result.and(Err("the read-back checker panicked".to_string())),
        }
    })?;
    ring.drain(transport, |c, done| on_completion(c, done, &mut t, &mut v))?;
    progress.update(opts.frames);
    progress.finish();

    // Check the last frame of every slot that was not checked yet, as the
    // slot's next frame would.
    for _ in 0..ring.slots() {
        let ticket = ring.acquire()?;
        if let Some(last) = ticket.previous_frame() {
            if checked[ticket.slot()] != Some(last) {
                let bytes = transport.wait_free(&ticket).map_err(String::from)?;
                let (slot, at) = (ticket.slot(), Instant::now());
                check_readback(&mut v, &mut t, geometry.stride, last, slot, at, bytes);
            }
        }
    }
    let (camera, _) = camera
        .into_inner()
        .map_err(|_| "the camera's lock was poisoned".to_string())?;
    let (_, pin, _) = camera.release();
    v.pulses = Some(pin.pulses);

    let wall = match (first_start, t.last_finished) {
        (Some(a), Some(b)) => b.saturating_duration_since(a),
        _ => return Err("no frame completed".into()),
    };
    let none = "no samples";
    Ok(Report {
        processes: 1,
        backend: transport.backend(),
        why: opened.why.clone(),
        note: opened.note,
        details: transport.details(),
        frames: opts.frames,
        ring: ring.slots(),
        width: sensor.width,
        height: sensor.height,
        format: cli::format_name(sensor.format),
        frame_len: geometry.frame_len(),
        copy: opts.copy || opened.always_copies,
        camera_ahead: ahead,
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
        verification: v,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::camera::{PixelFormat, SensorConfig};
    use crate::transport::host::{Fault, HostReference};
    use crate::transport::FrameTransport;

    /// A camera that was never started fails its first write; the camera
    /// thread then writes nothing more but answers every slot it was given,
    /// with the first failure, so each goes back to the transport.
    #[test]
    fn the_camera_thread_answers_every_slot_after_a_failure() {
        let sensor = SensorConfig {
            width: 2,
            height: 2,
            fps: 60,
            format: PixelFormat::Rgba8,
        };
        let g = FrameGeometry {
            stride: sensor.stride(),
            rows: 2,
        };
        let mut transport = HostReference::new(g, 2, Fault::None);
        let mut ring = Ring::new(2).unwrap();
        // Not initialised: not streaming.
        let camera = Camera::new(
            ModelSensorBus::new(regs::DEFAULT_ADDRESS),
            SyncLine::default(),
            TestPatternReadout,
            regs::DEFAULT_ADDRESS,
            sensor,
        )
        .unwrap();
        let camera = Mutex::new((camera, Vec::new()));
        let (jobs_tx, jobs_rx) = mpsc::sync_channel(2);
        let (done_tx, done_rx) = mpsc::sync_channel(2);
        let mut tickets = Vec::new();
        for frame in 0..2 {
            let (ticket, lease) = ring.take_for_write(&mut transport).unwrap();
            jobs_tx.send(CameraJob { frame, lease }).unwrap();
            tickets.push(ticket);
        }
        drop(jobs_tx);
        camera_thread(&camera, jobs_rx, done_tx);
        let answers: Vec<CameraDone> = done_rx.try_iter().collect();
        assert_eq!(answers.len(), 2);
        let first = answers[0].outcome.as_ref().unwrap_err().clone();
        let second = answers[1].outcome.as_ref().unwrap_err().clone();
        assert!(second.contains("frame 1 not written") && second.contains(&first));
        for (d, ticket) in answers.into_iter().zip(&tickets) {
            assert_eq!(d.frame, ticket.frame());
            transport.put_back(ticket, d.lease).unwrap();
        }
        // Both slots are the transport's again: it signals them.
        for ticket in &tickets {
            transport.signal_ready(ticket).unwrap();
        }
        let (camera, _) = camera.into_inner().unwrap();
        let (_, pin, _) = camera.release();
        assert_eq!(pin.pulses, 0, "no trigger pulse for a frame not written");
    }
}
