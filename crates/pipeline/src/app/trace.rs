//! `pipeline --trace FILE`: each frame's stages as a Chrome trace.
//!
//! The file is the Trace Event Format's JSON object form: a `traceEvents`
//! array of complete events (`"ph": "X"`, `ts` and `dur` in microseconds),
//! one track (`tid`) per thread or stream, each named by a `thread_name`
//! metadata event, and `otherData` saying what the file holds (backend,
//! frames run, frames traced, frames left out, the clock). Perfetto
//! (ui.perfetto.dev, "Open trace file") and `chrome://tracing` open it.
//!
//! Where each stage comes from (all [`Instant`]s, the clock the report's
//! stage timings use, as microseconds since the trace was opened):
//!
//! | track    | event          | start, duration |
//! |----------|----------------|-----------------|
//! | producer | `collect wait` | loop start; the report's *collect wait* |
//! | producer | `lend wait`    | right after; the report's *lend wait* |
//! | producer | `checker wait` | right after; the report's *checker wait* |
//! | producer | `acquire`      | entering `Ring::acquire` until the write lease is the producer's (part of the report's *handover*) |
//! | producer | `check`        | an inline read-back check of the slot's previous frame (the report's *verify*) |
//! | producer | `camera`       | `--camera-ahead off` (or a transport that cannot lease its slots, or a ring of one): the camera starts writing; until it signals the frame (the report's *camera*) |
//! | producer | `copy`         | the same, `--copy` where the transport does not copy: the camera's staging buffer into the slot (part of the report's *held*) |
//! | producer | `handover`     | `Ring::hand_over` of the written lease: the slot back to the transport, ready signal, consumer queued (the rest of the report's *handover*) |
//! | camera   | `camera`, `copy` | the same two stages on the camera thread (`--camera-ahead on`, the default where the transport leases its slots): they overlap the producer track's handover of the frame before and its waits for the frame after |
//! | consumer | `consumer`     | the consumer's busy time ([`Completion::busy`], the report's *consumer*; CUDA events on a GPU), placed from the frame's ready signal ([`InFlight::signalled`]) or the previous frame's end, whichever is later; ends by the time the host saw it finished ([`Completion::finished`]) |
//! | checker  | `check`        | the checker thread's read-back check of a lent frame (the report's *verify*) |
//!
//! The consumer's own start is not timed on the host's clock, so its
//! span is placed the way a FIFO consumer runs: not before the frame was
//! signalled ready, not before the previous frame's span ended, lasting its
//! measured busy time; where that would end after the host saw the frame
//! finished, it is cut there and `args.busy_us` keeps the measured time.
//! A stage that a transport does not have (no lend on a small ring, no
//! copy without `--copy`) is simply absent, and so is a wait shorter than
//! [`MIN_WAIT`].
//!
//! Memory is bounded: only the first `--trace-frames` frames are recorded
//! (at most [`SPANS_PER_FRAME`] spans each, under 1 KiB a frame, allocated
//! once when the trace is opened; the file is serialized from them);
//! `otherData.frames_left_out` says how many were not. When no trace is
//! asked for, [`Trace::off`] records nothing and allocates nothing.
//! The file is created before the run starts (so a bad path is an error
//! before any frame) and written once at its end.

use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

#[cfg(doc)]
use crate::{ring::InFlight, transport::Completion};

/// Frames traced when `--trace-frames` is not given.
pub const DEFAULT_TRACE_FRAMES: u64 = 10_000;

/// The shortest producer wait recorded. Shorter ones are not waits a
/// person looks for, and `chrome://tracing` (which compares times to the
/// microsecond unless the file asks for nanoseconds, an option Perfetto
/// reads differently) would draw them nested in their neighbours.
pub const MIN_WAIT: Duration = Duration::from_micros(1);

/// Most spans one frame may have (every stage of the table in the module
/// docs once, and a second producer-side check).
pub const SPANS_PER_FRAME: usize = 10;

/// The track (thread or stream) a span belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Track {
    /// The producer thread: camera writes, handover, its waits.
    Producer,
    /// The consumer (a thread, or a GPU stream seen from the host).
    Consumer,
    /// The read-back checker thread.
    Checker,
    /// The camera thread (`--camera-ahead on`): the camera's writes, which
    /// overlap the producer thread's handover of the frame before.
    Camera,
}

impl Track {
    const ALL: [Track; 4] = [
        Track::Producer,
        Track::Consumer,
        Track::Checker,
        Track::Camera,
    ];

    fn tid(self) -> u32 {
        match self {
            Track::Producer => 1,
            Track::Consumer => 2,
            Track::Checker => 3,
            Track::Camera => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Track::Producer => "producer thread",
            Track::Consumer => "consumer (host view)",
            Track::Checker => "checker thread",
            Track::Camera => "camera thread",
        }
    }
}

/// Why a trace could not be created or written.
#[derive(Debug)]
#[non_exhaustive]
pub enum TraceError {
    /// The file could not be created (checked before the run starts).
    Create {
        /// The path given to `--trace`.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file could not be written at the end of the run.
    Write {
        /// The path given to `--trace`.
        path: PathBuf,
        /// The error of the write (I/O or JSON).
        source: serde_json::Error,
    },
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Create { path, source } => write!(
                f,
                "--trace: cannot create {}: {source} (nothing was run)",
                path.display()
            ),
            TraceError::Write { path, source } => {
                write!(f, "--trace: cannot write {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TraceError::Create { source, .. } => Some(source),
            TraceError::Write { source, .. } => Some(source),
        }
    }
}

/// One recorded stage of one frame.
#[derive(Clone, Copy, Debug)]
struct Span {
    track: Track,
    name: &'static str,
    frame: u64,
    start: Instant,
    dur: Duration,
    /// The consumer's measured busy time, where the span is shorter.
    busy: Option<Duration>,
}

/// An open trace: where it goes and what was recorded so far.
#[derive(Debug)]
struct Recorder {
    path: PathBuf,
    out: BufWriter<File>,
    origin: Instant,
    limit: u64,
    spans: Vec<Span>,
    /// Where the last consumer span ended.
    consumer_end: Option<Instant>,
}

impl Recorder {
    /// Records `span` if its frame is traced and there is room.
    fn push(&mut self, span: Span) {
        if span.frame < self.limit && self.spans.len() < self.spans.capacity() {
            self.spans.push(span);
        }
    }
}

/// The run's trace, or nothing ([`Trace::off`]).
#[derive(Debug, Default)]
pub struct Trace(Option<Recorder>);

impl Trace {
    /// No trace: [`Trace::span`] does nothing.
    pub fn off() -> Self {
        Trace(None)
    }

    /// Creates `path` now (an error names it before anything runs) and
    /// records the first `limit` frames of a run of `frames`.
    pub fn create(path: &Path, limit: u64, frames: u64) -> Result<Self, TraceError> {
        let file = File::create(path).map_err(|source| TraceError::Create {
            path: path.to_owned(),
            source,
        })?;
        let traced = usize::try_from(limit.min(frames)).unwrap_or(usize::MAX);
        Ok(Trace(Some(Recorder {
            path: path.to_owned(),
            out: BufWriter::new(file),
            origin: Instant::now(),
            limit,
            spans: Vec::with_capacity(traced.saturating_mul(SPANS_PER_FRAME)),
            consumer_end: None,
        })))
    }

    /// Whether spans are recorded.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Records that `frame`'s stage `name` ran on `track` from `start` for
    /// `dur` (nothing when off, for a frame past the limit, or for an empty
    /// span).
    #[inline]
    pub fn span(
        &mut self,
        track: Track,
        name: &'static str,
        frame: u64,
        start: Instant,
        dur: Duration,
    ) {
        if let Some(r) = &mut self.0 {
            if !dur.is_zero() {
                r.push(Span {
                    track,
                    name,
                    frame,
                    start,
                    dur,
                    busy: None,
                });
            }
        }
    }

    /// The producer's waits before `frame` (name, nanoseconds), one after
    /// the other from `start` (the loop's laps); a wait under
    /// [`MIN_WAIT`] is left out.
    #[inline]
    pub fn producer_waits(&mut self, frame: u64, start: Instant, waits: [(&'static str, u64); 3]) {
        if self.is_on() {
            let mut at = start;
            for (name, ns) in waits {
                let dur = Duration::from_nanos(ns);
                if dur >= MIN_WAIT {
                    self.span(Track::Producer, name, frame, at, dur);
                }
                at += dur;
            }
        }
    }

    /// [`Trace::span`] for a span that ends at `end`.
    #[inline]
    pub fn span_ending(
        &mut self,
        track: Track,
        name: &'static str,
        frame: u64,
        end: Instant,
        dur: Duration,
    ) {
        if self.is_on() {
            let start = end.checked_sub(dur).unwrap_or(end);
            self.span(track, name, frame, start, dur);
        }
    }

    /// The consumer's span of `frame`, signalled ready at `ready`, seen
    /// finished by the host at `finished`, busy for `busy` (measured by the
    /// consumer: CUDA events on a GPU). The consumer runs frames in order and
    /// its start is not timed on the host's clock, so the span is placed
    /// where a FIFO consumer would run it: from `ready` or the previous
    /// frame's span's end, whichever is later, for `busy`; cut to end by
    /// `finished` (then `args.busy_us` keeps the measured time).
    #[inline]
    pub fn consumer(&mut self, frame: u64, ready: Instant, finished: Instant, busy: Duration) {
        if let Some(r) = &mut self.0 {
            let earliest = r.consumer_end.map_or(ready, |prev| prev.max(ready));
            let mut end = earliest + busy;
            let mut start = earliest;
            let mut measured = None;
            if end > finished {
                end = finished.max(earliest);
                start = end.checked_sub(busy).unwrap_or(end).max(earliest);
                measured = Some(busy);
            }
            r.consumer_end = Some(end);
            r.push(Span {
                track: Track::Consumer,
                name: "consumer",
                frame,
                start,
                dur: end - start,
                busy: measured,
            });
        }
    }

    /// Writes the file (nothing when off): `backend` names the run's
    /// transport, `frames` how many frames it ran. The events are
    /// serialized straight from the recorded spans (no second copy).
    pub fn finish(self, backend: &str, frames: u64) -> Result<(), TraceError> {
        let Some(r) = self.0 else {
            return Ok(());
        };
        let Recorder {
            path,
            mut out,
            origin,
            limit,
            spans,
            ..
        } = r;
        let traced = limit.min(frames);
        let file = TraceFile {
            trace_events: Events {
                spans: &spans,
                origin,
                pid: std::process::id(),
                backend,
            },
            other_data: OtherData {
                tool: "tegra-interop pipeline --trace",
                backend,
                frames,
                frames_traced: traced,
                frames_left_out: frames - traced,
                clock: "std::time::Instant (the report's clock), microseconds since the trace file was opened",
            },
        };
        let written = serde_json::to_writer(&mut out, &file).and_then(|()| {
            out.write_all(b"\n")
                .and_then(|()| out.flush())
                .map_err(serde_json::Error::io)
        });
        written.map_err(|source| TraceError::Write { path, source })
    }
}

/// `d` in microseconds, from whole nanoseconds (so that a span's `ts +
/// dur` and the next span's `ts` agree to the nanosecond in a viewer).
fn micros(d: Duration) -> f64 {
    // Exact below 2^53 ns (104 days).
    d.as_nanos() as f64 / 1000.0
}

/// The `traceEvents` array: the process's and tracks' names, then one
/// complete event per span.
struct Events<'a> {
    spans: &'a [Span],
    origin: Instant,
    pid: u32,
    backend: &'a str,
}

impl Serialize for Events<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let pid = self.pid;
        let mut seq =
            serializer.serialize_seq(Some(1 + 2 * Track::ALL.len() + self.spans.len()))?;
        let process = format!("pipeline --backend {}", self.backend);
        seq.serialize_element(&Event::meta(
            "process_name",
            pid,
            0,
            MetaArgs::Name(&process),
        ))?;
        for track in Track::ALL {
            let tid = track.tid();
            seq.serialize_element(&Event::meta(
                "thread_name",
                pid,
                tid,
                MetaArgs::Name(track.name()),
            ))?;
            seq.serialize_element(&Event::meta(
                "thread_sort_index",
                pid,
                tid,
                MetaArgs::SortIndex(tid),
            ))?;
        }
        for s in self.spans {
            seq.serialize_element(&Event {
                name: s.name,
                cat: match s.track {
                    Track::Producer => "producer",
                    Track::Consumer => "consumer",
                    Track::Checker => "checker",
                    Track::Camera => "camera",
                },
                ph: "X",
                ts: micros(s.start.saturating_duration_since(self.origin)),
                dur: Some(micros(s.dur)),
                pid,
                tid: s.track.tid(),
                args: EventArgs::Frame {
                    frame: s.frame,
                    busy_us: s.busy.map(micros),
                },
            })?;
        }
        seq.end()
    }
}

/// The file's top level (Trace Event Format, JSON object form).
#[derive(Serialize)]
struct TraceFile<'a> {
    #[serde(rename = "traceEvents")]
    trace_events: Events<'a>,
    #[serde(rename = "otherData")]
    other_data: OtherData<'a>,
}

/// `otherData`: what the file holds.
#[derive(Serialize)]
struct OtherData<'a> {
    tool: &'static str,
    backend: &'a str,
    frames: u64,
    frames_traced: u64,
    frames_left_out: u64,
    clock: &'static str,
}

/// One trace event: a complete span (`X`) or metadata (`M`).
#[derive(Serialize)]
struct Event<'a> {
    name: &'a str,
    cat: &'a str,
    ph: &'static str,
    ts: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    pid: u32,
    tid: u32,
    args: EventArgs<'a>,
}

impl<'a> Event<'a> {
    fn meta(name: &'static str, pid: u32, tid: u32, args: MetaArgs<'a>) -> Self {
        Event {
            name,
            cat: "__metadata",
            ph: "M",
            ts: 0.0,
            dur: None,
            pid,
            tid,
            args: EventArgs::Meta(args),
        }
    }
}

/// An event's `args`.
#[derive(Serialize)]
#[serde(untagged)]
enum EventArgs<'a> {
    Frame {
        frame: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        busy_us: Option<f64>,
    },
    Meta(MetaArgs<'a>),
}

/// A metadata event's `args`.
#[derive(Serialize)]
enum MetaArgs<'a> {
    #[serde(rename = "name")]
    Name(&'a str),
    #[serde(rename = "sort_index")]
    SortIndex(u32),
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("trace-unit-{}-{name}.json", std::process::id()))
    }

    #[test]
    fn off_records_nothing_and_writes_nothing() {
        let mut t = Trace::off();
        t.span(
            Track::Producer,
            "camera",
            0,
            Instant::now(),
            Duration::from_micros(5),
        );
        assert!(!t.is_on());
        t.finish("sim", 1).unwrap();
    }

    #[test]
    fn spans_past_the_limit_are_left_out_and_counted() {
        let path = temp("limit");
        let mut t = Trace::create(&path, 2, 5).unwrap();
        let now = Instant::now();
        for f in 0..5 {
            t.span(Track::Producer, "camera", f, now, Duration::from_micros(3));
            // An empty span is not recorded.
            t.span(Track::Producer, "lend wait", f, now, Duration::ZERO);
            // A wait under a microsecond is not recorded; a longer one is.
            t.producer_waits(
                f,
                now,
                [
                    ("collect wait", 999),
                    ("lend wait", 1_000),
                    ("checker wait", 0),
                ],
            );
        }
        t.finish("sim", 5).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        let spans: Vec<_> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .collect();
        assert_eq!(spans.len(), 4);
        assert_eq!(spans[2]["args"]["frame"], 1);
        assert_eq!(spans[1]["name"], "lend wait");
        assert_eq!(v["otherData"]["frames_left_out"], 3);
        assert_eq!(v["otherData"]["frames_traced"], 2);
    }

    #[test]
    fn metadata_names_each_track() {
        let path = temp("meta");
        Trace::create(&path, 1, 1)
            .unwrap()
            .finish("host", 1)
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        let names: Vec<_> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| {
                (
                    e["tid"].as_u64().unwrap(),
                    e["args"]["name"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(names.len(), 4);
        assert!(names
            .iter()
            .any(|(t, n)| *t == 2 && n.starts_with("consumer")));
        assert!(names.iter().any(|(t, n)| *t == 4 && n == "camera thread"));
    }

    /// `--help` and the README say a traced frame costs under 1 KiB.
    #[test]
    fn a_traced_frame_reserves_under_one_kib() {
        let per_frame = std::mem::size_of::<Span>() * SPANS_PER_FRAME;
        assert!(per_frame <= 1024, "{per_frame} bytes a frame");
    }

    #[test]
    fn a_path_that_cannot_be_created_is_named() {
        let path = Path::new("/nonexistent-dir-for-trace-test/t.json");
        let e = Trace::create(path, 1, 1).unwrap_err();
        assert!(matches!(e, TraceError::Create { .. }));
        assert!(e
            .to_string()
            .contains("/nonexistent-dir-for-trace-test/t.json"));
    }
}
