//! `pipeline --consumers fifo,fifo,mailbox:slow=N --consumer-processes
//! --backend sim-fd` (or `--backend gpu`): the multicast ring with each
//! consumer in a process of its own.
//!
//! This process is the producer: a [`MulticastRing`] over a
//! [`ProcessFanout`] whose exporter is the simulator's memfds (`sim-fd`)
//! or Vulkan (`gpu`, a build with `--features vulkan`). Per `--consumers`
//! entry it makes a Unix socket pair and starts this program with `--role
//! consumer` (the module `fd_consumer`), its end of the pair on stdin; the
//! ring's attach sends it the slots' memory and fences as fds. Each
//! consumer process verifies every frame it takes on its own device copy
//! and answers; at the end it sends its figures and exits, and this
//! process reaps it. The report has one line per consumer as the
//! one-process `--consumers` run gives it, and one line per consumer
//! process: the frames it verified there, the fds it had left open, how it
//! exited.
//!
//! Verified where: `--backend sim-fd` on the simulator in CI
//! (`tests/multicast_processes.rs`); `--backend gpu` builds with
//! `--features vulkan` and has not run on a GPU yet.

use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::app::cli::{BackendChoice, Options, Role, SourceChoice};
use crate::app::multicast::{
    finish, lines, produce, ConsumerLine, Member, MulticastReport, Timed, LIMIT,
};
use crate::app::output;
use crate::multicast::process::{Farewell, ProcessFanout, RemoteConsumer};
use crate::multicast::ring::MulticastRing;
use crate::multicast::{ConsumerSpec, FanoutTransport, FrameGeometry, Mode};
use crate::transport::export::Exporter;
use crate::transport::fdpass::{Channel, Limits};
use crate::transport::host::Fault;

/// What `--consumer-processes` (and `--role consumer`) cannot go with.
///
/// # Errors
/// One line naming the option.
pub fn conflicts(o: &Options) -> Result<(), String> {
    let consumer = o.role == Some(Role::Consumer);
    if !consumer && o.consumers.is_empty() {
        return Err("--consumer-processes needs --consumers LIST (one process per entry)".into());
    }
    if !matches!(o.backend, BackendChoice::SimFd | BackendChoice::Gpu) {
        return Err(format!(
            "--consumer-processes and --role consumer run over fds: --backend sim-fd or gpu (not --backend {})",
            o.backend.name()
        ));
    }
    if o.backend == BackendChoice::Gpu && !cfg!(feature = "vulkan") {
        return Err("--backend gpu needs the pipeline built with --features vulkan".into());
    }
    for (given, flag) in [
        (!consumer && o.two_process(), "--processes 2 / --role"),
        (consumer && !o.consumers.is_empty(), "--consumers"),
        (o.copy, "--copy"),
        (o.trace.is_some(), "--trace"),
        (o.fault != Fault::None, "--fault"),
        (o.source != SourceChoice::Sensor, "--source"),
    ] {
        if given {
            return Err(format!(
                "--consumer-processes / --role consumer cannot be used with {flag}"
            ));
        }
    }
    Ok(())
}

/// One consumer process's line of the report.
#[derive(Clone, Debug)]
pub struct ProcessLine {
    /// Its consumer's index on the ring.
    pub index: usize,
    /// Its `--consumers` entry.
    pub spec: String,
    /// What it said and how it ended (`None`: it never left the ring).
    pub farewell: Option<Farewell>,
    /// The frames the producer saw it verify.
    pub verified_here: u64,
    /// It sent its figures, verified there every frame it was seen to
    /// verify here, failed none, left no fd open and exited with status 0.
    pub passed: bool,
}

/// What `--consumer-processes` reports.
#[derive(Clone, Debug)]
pub struct ProcessesReport {
    /// The ring's report (one line per consumer).
    pub ring: MulticastReport,
    /// One line per consumer process.
    pub processes: Vec<ProcessLine>,
}

impl ProcessesReport {
    /// Whether every consumer and every consumer process passed.
    pub fn passed(&self) -> bool {
        self.ring.passed() && self.processes.iter().all(|p| p.passed)
    }

    /// The report as text: the ring's, then one line per process.
    pub fn human(&self) -> String {
        let mut s = self.ring.human();
        for p in &self.processes {
            let Some(f) = &p.farewell else {
                s += &format!(
                    "consumer process of consumer {} {}: never left the ring: FAILED\n",
                    p.index, p.spec
                );
                continue;
            };
            let figures = match &f.figures {
                Some(g) => format!(
                    "{}/{} frames verified in its process, {} failed, {} fds left open",
                    g.verified, g.taken, g.failed, g.fds_left
                ),
                None => "sent no figures".into(),
            };
            s += &format!(
                "consumer process {} (consumer {} {}): {figures}, {}{}: {}\n",
                f.pid,
                p.index,
                p.spec,
                f.exit.as_deref().unwrap_or("not reaped"),
                f.ended
                    .as_ref()
                    .map(|e| format!(", ended early: {e}"))
                    .unwrap_or_default(),
                if p.passed { "verified" } else { "FAILED" }
            );
        }
        s
    }

    /// The report as one JSON object (the ring's, with `processes`).
    pub fn json(&self) -> serde_json::Value {
        let mut v = self.ring.json();
        let procs: Vec<serde_json::Value> = self
            .processes
            .iter()
            .map(|p| {
                let f = p.farewell.as_ref();
                let g = f.and_then(|f| f.figures);
                serde_json::json!({
                    "index": p.index, "spec": p.spec, "pid": f.map(|f| f.pid),
                    "taken": g.map(|g| g.taken), "verified": g.map(|g| g.verified),
                    "failed": g.map(|g| g.failed), "fds_left": g.map(|g| g.fds_left),
                    "exit": f.and_then(|f| f.exit.clone()), "ended": f.and_then(|f| f.ended.clone()),
                    "passed": p.passed,
                })
            })
            .collect();
        v["mode"] = "multicast-processes".into();
        v["ok"] = self.passed().into();
        v["processes"] = procs.into();
        v
    }
}

/// Starts this program as a consumer process of `opts`, its stdin the
/// socket `theirs` (closed here once the child has it).
fn spawn_consumer(opts: &Options, theirs: Channel) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the current executable: {e}"))?;
    let consumer = Options {
        role: Some(Role::Consumer),
        processes: 1,
        json: false,
        consumers: Vec::new(),
        consumer_processes: false,
        ..opts.clone()
    };
    Command::new(exe)
        .args(consumer.to_args())
        .stdin(Stdio::from(theirs.into_socket()))
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting a consumer process: {e}"))
}

/// Starts one consumer process per `--consumers` entry and attaches it.
fn attach_processes<T: FanoutTransport<Work = RemoteConsumer>>(
    ring: &mut MulticastRing<T>,
    opts: &Options,
) -> Result<Vec<Member>, String> {
    let mut out = Vec::with_capacity(opts.consumers.len());
    for arg in &opts.consumers {
        let (mine, theirs) =
            Channel::pair(Limits::new(opts.peer_timeout)).map_err(|e| e.to_string())?;
        let child = spawn_consumer(opts, theirs)?;
        let delay = Arc::new(AtomicU64::new(0));
        let work = RemoteConsumer::new(mine)
            .with_child(child)
            .with_delay(Arc::clone(&delay));
        let spec = match arg.mode {
            Mode::Fifo => ConsumerSpec::fifo(work, LIMIT),
            Mode::Mailbox => ConsumerSpec::mailbox(work, LIMIT),
        };
        let id = ring.attach(spec).map_err(|e| {
            format!(
                "attaching consumer process {} ({}): {e}",
                out.len(),
                arg.name()
            )
        })?;
        out.push(Member {
            arg: *arg,
            id,
            starts: None,
            delay,
            verified: Vec::new(),
            failed: 0,
            disconnected: None,
        });
    }
    Ok(out)
}

/// Each consumer's process line, from the farewells.
fn process_lines(consumers: &[ConsumerLine], farewells: &[Farewell]) -> Vec<ProcessLine> {
    consumers
        .iter()
        .map(|c| {
            let farewell = farewells.iter().find(|f| f.index == c.index).cloned();
            let passed = farewell.as_ref().is_some_and(|f| {
                f.exit_ok
                    && f.figures.is_some_and(|g| {
                        g.failed == 0 && g.fds_left == 0 && g.verified == c.verified
                    })
            });
            ProcessLine {
                index: c.index,
                spec: c.spec.clone(),
                farewell,
                verified_here: c.verified,
                passed,
            }
        })
        .collect()
}

/// Runs the ring over `exporter` with one process per consumer.
///
/// # Errors
/// Set-up or run failure, as one line.
pub fn run_on<E: Exporter>(opts: &Options, exporter: E) -> Result<ProcessesReport, String> {
    let bpp = opts.sensor.format.bytes_per_pixel();
    let geometry = FrameGeometry {
        stride: opts.sensor.width as usize * bpp,
        rows: opts.sensor.height as usize,
    };
    let fanout = ProcessFanout::open(exporter, geometry, opts.ring).map_err(String::from)?;
    let farewells = fanout.farewells();
    let backend = format!(
        "{} ({}, one process per consumer)",
        fanout.info().backend,
        fanout.exporter_name()
    );
    let mut ring =
        MulticastRing::new(Timed::new(fanout, opts.frames)).map_err(|e| e.to_string())?;
    let report = attach_processes(&mut ring, opts).and_then(|mut members| {
        let produced = produce(&mut ring, &mut members, opts.frames)?;
        Ok(MulticastReport {
            backend,
            frames: opts.frames,
            slots: opts.ring,
            geometry,
            produced,
            hop: None,
            consumers: lines(&ring, &members, opts.frames)?,
        })
    });
    let closed = finish(ring);
    let ring = report?;
    closed?;
    let farewells = farewells
        .lock()
        .map_err(|_| "the consumers' farewells (a lock)".to_string())?
        .clone();
    Ok(ProcessesReport {
        processes: process_lines(&ring.consumers, &farewells),
        ring,
    })
}

/// `--consumer-processes` (see the module docs).
///
/// # Errors
/// Set-up or run failure, as one line.
pub fn run(opts: &Options) -> Result<ProcessesReport, String> {
    conflicts(opts)?;
    if opts.backend == BackendChoice::Gpu {
        return run_gpu(opts);
    }
    run_on(opts, crate::transport::export::SimExporter)
}

#[cfg(feature = "vulkan")]
fn run_gpu(opts: &Options) -> Result<ProcessesReport, String> {
    // The context only finds the device's UUID for the exporter; this
    // process runs no CUDA work.
    let (_ctx, exporter) = crate::app::multicast::open_gpu()?;
    run_on(opts, exporter)
}

#[cfg(not(feature = "vulkan"))]
fn run_gpu(_: &Options) -> Result<ProcessesReport, String> {
    Err("--backend gpu needs a build with --features vulkan".into())
}

/// The program's `--consumer-processes` run: the report on stdout (JSON
/// with `--json`), errors on stderr; exit status 0 only when every
/// consumer and every consumer process passed.
pub fn main(opts: &Options) -> ExitCode {
    let r = match run(opts) {
        Ok(r) => r,
        Err(e) => {
            output::stderr_line(&format!("error: {e}"));
            if !opts.json {
                return ExitCode::FAILURE;
            }
            let object = format!("{}\n", crate::app::report::json_error("run", &e));
            return output::stdout_then("the JSON error", &object, ExitCode::FAILURE);
        }
    };
    let status = match r.passed() {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    };
    let text = match opts.json {
        true => format!("{}\n", r.json()),
        false => r.human(),
    };
    let status = output::stdout_then("the report", &text, status);
    if !r.passed() {
        output::stderr_line("error: a consumer or a consumer process missed or failed a frame");
    }
    status
}
