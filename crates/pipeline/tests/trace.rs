//! `pipeline --trace FILE` (issue 25, item 6): the compiled binary writes a
//! Chrome trace (Trace Event Format, JSON object form) that this test reads
//! back with serde_json and checks as a viewer would need it: the events'
//! fields, named tracks, each traced frame's stages in order, no track with
//! overlapping spans; the `--trace-frames` bound; the refusals; and that a
//! trace that is off records (and allocates) nothing.
#![allow(clippy::unwrap_used)]

mod common;
use common::child_command;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;
use tegra_interop_pipeline::app::trace::{Trace, Track};

/// Counts each thread's allocations (for the "no cost when off" test; per
/// thread, so tests running beside it do not count).
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Allocations made by this thread so far.
fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: forwards every call to the system allocator unchanged; only
// counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // `try_with`: nothing to count in a thread being torn down.
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's promises for `layout` are passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn run(args: &[&str]) -> Output {
    child_command(env!("CARGO_BIN_EXE_pipeline"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh path in the temp directory for one test's trace.
fn temp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("pipeline-trace-{}-{name}.json", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// Runs a small pipeline with `--trace path` and returns the parsed file.
fn traced_run(name: &str, backend: &str, frames: u64, extra: &[&str]) -> Value {
    let path = temp(name);
    let frames = frames.to_string();
    let mut args = vec![
        "--backend",
        backend,
        "--frames",
        &frames,
        "--width",
        "64",
        "--height",
        "16",
        "--quiet",
        "--trace",
    ];
    let p = path.to_str().unwrap();
    args.push(p);
    args.extend_from_slice(extra);
    let o = run(&args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// One complete event, as read back.
#[derive(Debug, Clone)]
struct Span {
    name: String,
    tid: u64,
    frame: u64,
    ts: f64,
    dur: f64,
}

/// Checks the Chrome trace structure and returns the complete events.
fn spans_of(trace: &Value) -> Vec<Span> {
    let events = trace["traceEvents"]
        .as_array()
        .expect("a traceEvents array");
    assert!(!events.is_empty());
    let mut named = BTreeMap::new();
    let mut spans = Vec::new();
    for e in events {
        for key in ["ph", "name"] {
            assert!(e[key].is_string(), "{key} in {e}");
        }
        for key in ["ts", "pid", "tid"] {
            assert!(e[key].is_number(), "{key} in {e}");
        }
        match e["ph"].as_str().unwrap() {
            "M" => {
                if e["name"] == "thread_name" {
                    let n = e["args"]["name"].as_str().expect("a thread's name");
                    named.insert(e["tid"].as_u64().unwrap(), n.to_owned());
                }
            }
            "X" => {
                let dur = e["dur"].as_f64().expect("a complete event's dur");
                assert!(dur >= 0.0, "{e}");
                assert!(e["ts"].as_f64().unwrap() >= 0.0, "{e}");
                assert!(e["cat"].is_string(), "{e}");
                spans.push(Span {
                    name: e["name"].as_str().unwrap().to_owned(),
                    tid: e["tid"].as_u64().unwrap(),
                    frame: e["args"]["frame"].as_u64().expect("a frame id in args"),
                    ts: e["ts"].as_f64().unwrap(),
                    dur,
                });
            }
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    // Every track with spans has a name.
    for s in &spans {
        assert!(
            named.contains_key(&s.tid),
            "track {} has no thread_name",
            s.tid
        );
    }
    // Per track: in time order, none overlapping the one before (viewers
    // draw one track's complete events as nested or disjoint).
    let mut tracks: BTreeMap<u64, Vec<&Span>> = BTreeMap::new();
    for s in &spans {
        tracks.entry(s.tid).or_default().push(s);
    }
    for (tid, list) in tracks {
        for w in list.windows(2) {
            assert!(w[0].ts <= w[1].ts, "track {tid} not monotone: {w:?}");
            assert!(
                w[1].ts >= w[0].ts + w[0].dur - 0.01,
                "track {tid}: overlapping spans {w:?}"
            );
        }
    }
    spans
}

/// The one span of `frame` named `name` (the check may be on either the
/// producer or the checker track).
fn one<'a>(spans: &'a [Span], frame: u64, name: &str) -> &'a Span {
    let found: Vec<_> = spans
        .iter()
        .filter(|s| s.frame == frame && s.name == name)
        .collect();
    assert_eq!(found.len(), 1, "frame {frame}: {name} spans {found:?}");
    found[0]
}

/// Every frame in `0..frames` has its camera, handover, consumer and check
/// spans, in that order in time; no other frame has spans.
fn assert_frames_in_order(spans: &[Span], frames: u64) {
    for f in 0..frames {
        let camera = one(spans, f, "camera");
        let handover = one(spans, f, "handover");
        let consumer = one(spans, f, "consumer");
        let check = one(spans, f, "check");
        // The camera runs on the producer thread (1), or on its own (4)
        // with `--camera-ahead on` where the transport leases its slots.
        assert!(matches!(camera.tid, 1 | 4), "frame {f}: {camera:?}");
        assert_eq!((handover.tid, consumer.tid), (1, 2), "frame {f}");
        assert!(
            camera.ts + camera.dur <= handover.ts + 0.01,
            "{camera:?} {handover:?}"
        );
        assert!(handover.ts <= consumer.ts, "{handover:?} {consumer:?}");
        assert!(
            consumer.ts + consumer.dur <= check.ts + 0.01,
            "{consumer:?} {check:?}"
        );
    }
    let mut seen: Vec<u64> = spans.iter().map(|s| s.frame).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, (0..frames).collect::<Vec<_>>());
}

#[test]
fn sim_trace_has_every_frames_stages_in_order() {
    let t = traced_run("sim", "sim", 24, &["--ring", "3"]);
    let spans = spans_of(&t);
    assert_frames_in_order(&spans, 24);
    // The producer's waits of the report are there too, and the checker
    // thread checked frames beside the camera.
    assert!(spans.iter().any(|s| s.name == "collect wait" && s.tid == 1));
    assert!(spans.iter().any(|s| s.name == "check" && s.tid == 3));
    assert_eq!(t["otherData"]["frames"], 24);
    assert_eq!(t["otherData"]["frames_traced"], 24);
    assert_eq!(t["otherData"]["frames_left_out"], 0);
    assert_eq!(t["otherData"]["backend"], "nvsci-sim");
    // Perfetto reads `displayTimeUnit` as the unit of `ts` (the format
    // says it is a display option): the file leaves it out, `ts` is in
    // microseconds as the format says.
    assert!(
        t.get("displayTimeUnit").is_none(),
        "{}",
        t["displayTimeUnit"]
    );
}

#[test]
fn host_egl_and_inline_copy_runs_are_traced_too() {
    for (name, backend, extra) in [
        ("host", "host", &[][..]),
        ("egl", "egl", &[][..]),
        ("inline", "sim", &["--readback", "inline", "--copy"][..]),
        ("ring1", "host", &["--ring", "1"][..]),
    ] {
        let t = traced_run(name, backend, 12, extra);
        let spans = spans_of(&t);
        assert_frames_in_order(&spans, 12);
        if name == "inline" {
            // Checked on the producer thread only; the staging copy shows.
            assert!(spans.iter().all(|s| s.tid != 3), "{name}");
            assert!(spans.iter().any(|s| s.name == "copy"), "{name}");
        }
    }
}

#[test]
fn trace_frames_bounds_the_file_and_says_what_was_left_out() {
    let t = traced_run("bound", "host", 30, &["--trace-frames", "7"]);
    let spans = spans_of(&t);
    assert_frames_in_order(&spans, 7);
    assert_eq!(t["otherData"]["frames_traced"], 7);
    assert_eq!(t["otherData"]["frames_left_out"], 23);
}

/// A usage mistake: exit 2, one `error:` line naming `want`, nothing on stdout.
fn assert_usage_error(args: &[&str], want: &[&str]) {
    let o = run(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    for w in want {
        assert!(err.contains(w), "{args:?} should mention {w:?}: {err}");
    }
    assert!(o.stdout.is_empty(), "{args:?}");
}

#[test]
fn trace_options_that_cannot_apply_are_refused() {
    let path = temp("refused");
    let p = path.to_str().unwrap();
    assert_usage_error(
        &["--backend", "sim", "--processes", "2", "--trace", p],
        &["--trace", "--processes 2"],
    );
    assert_usage_error(
        &["--backend", "sim", "--role", "camera", "--trace", p],
        &["--trace", "--role"],
    );
    assert_usage_error(&["--trace-frames", "5"], &["--trace-frames", "--trace"]);
    assert_usage_error(&["--trace", p, "--trace-frames", "0"], &["--trace-frames"]);
    // Refused before anything was created.
    assert!(!path.exists());
}

#[test]
fn a_trace_file_that_cannot_be_created_stops_the_run_before_it_starts() {
    let dir = std::env::temp_dir();
    let missing = dir
        .join(format!("no-such-dir-{}", std::process::id()))
        .join("t.json");
    for target in [missing.as_path(), dir.as_path()] {
        let o = run(&[
            "--backend",
            "host",
            "--frames",
            "5",
            "--quiet",
            "--json",
            "--trace",
            target.to_str().unwrap(),
        ]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("--trace: cannot create"), "{err}");
        assert!(err.contains(target.to_str().unwrap()), "{err}");
        // No report, nothing ran: `--json`'s error object instead.
        let j: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(
            (&j["ok"], &j["stage"]),
            (&false.into(), &"run".into()),
            "{j}"
        );
    }
}

#[test]
fn a_trace_that_is_off_records_nothing_and_allocates_nothing() {
    let mut off = Trace::off();
    let now = Instant::now();
    let before = allocations();
    for f in 0..10_000 {
        off.span(Track::Producer, "camera", f, now, Duration::from_micros(1));
        off.consumer(f, now, now, Duration::from_micros(1));
        off.producer_waits(
            f,
            now,
            [("collect wait", 1), ("lend wait", 1), ("checker wait", 1)],
        );
    }
    assert_eq!(allocations() - before, 0);
    assert!(!off.is_on());
}

#[test]
fn an_open_trace_allocates_once_and_keeps_only_its_frames() {
    let path = temp("alloc");
    let mut on = Trace::create(&path, 100, 1_000_000).unwrap();
    let now = Instant::now();
    let before = allocations();
    // Far more frames than the limit.
    for f in 0..5_000 {
        on.span(Track::Producer, "camera", f, now, Duration::from_micros(1));
        on.consumer(f, now, now, Duration::from_micros(1));
    }
    // And far more spans for one frame than a frame has.
    for _ in 0..5_000 {
        on.span(Track::Checker, "check", 3, now, Duration::from_micros(1));
    }
    assert_eq!(allocations() - before, 0);
    on.finish("test", 1_000_000).unwrap();
    let t: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).unwrap();
    let frames: Vec<u64> = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| e["args"]["frame"].as_u64().unwrap())
        .collect();
    assert!(
        frames.iter().all(|&f| f < 100),
        "a frame past the limit was kept"
    );
    assert_eq!(frames.iter().filter(|&&f| f != 3).count(), 2 * 99);
    assert_eq!(
        frames.len(),
        100 * tegra_interop_pipeline::app::trace::SPANS_PER_FRAME,
        "the spans of the first 100 frames fill the room allocated, no more"
    );
    assert_eq!(t["otherData"]["frames_left_out"], 1_000_000 - 100);
}

/// The discrete-GPU transport, zero-copy and `--copy` (needs an NVIDIA GPU
/// with Vulkan; run on the GPU machine with `--include-ignored`). Through
/// the library's `app::run`, so that the test binary alone is enough there.
#[cfg(feature = "vulkan")]
#[test]
#[ignore = "needs an NVIDIA GPU with Vulkan"]
fn gpu_trace_has_every_frames_stages_in_order() {
    use tegra_interop_pipeline::app::cli::{BackendChoice, Options};
    for (copy, camera_ahead) in [(false, true), (true, true), (true, false)] {
        let path = temp(if copy { "gpu-copy" } else { "gpu" });
        let opts = Options {
            frames: 200,
            backend: BackendChoice::Gpu,
            copy,
            quiet: true,
            trace: Some(path.clone()),
            camera_ahead,
            ..Options::default()
        };
        let report = tegra_interop_pipeline::app::run(&opts).unwrap();
        assert!(report.passed(), "copy {copy}");
        // The GPU transport leases its slots: the camera thread ran.
        assert_eq!(report.camera_ahead, camera_ahead, "copy {copy}");
        let t: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        let spans = spans_of(&t);
        assert_frames_in_order(&spans, 200);
        assert_eq!(t["otherData"]["frames_left_out"], 0);
        let backend = tegra_interop_pipeline::transport::gpu::BACKEND_NAME;
        assert_eq!(t["otherData"]["backend"], backend);
    }
}

/// `--camera-ahead on` (host transport, which leases its slots): the
/// camera writes on its own track, and the producer takes frame f + 1's
/// slot and gives it to the camera before it hands frame f over, so the
/// camera's write of f + 1 overlaps f's handover; `off` keeps the serial
/// loop (each frame's camera write after the handover of the one before).
#[test]
fn the_camera_writes_the_next_frame_while_the_producer_hands_over() {
    let frames = 40;
    // Whether a write overlaps in time depends on the scheduler (on a busy
    // machine, with frames this small, the camera may be done before the
    // producer gives it the next slot): up to five runs, each checked for
    // the order, until one shows an overlap.
    let mut overlapped = 0;
    for run in 0..5 {
        let t = traced_run("ahead", "host", frames, &["--camera-ahead", "on"]);
        let spans = spans_of(&t);
        assert_frames_in_order(&spans, frames);
        for f in 0..frames - 1 {
            let handover = one(&spans, f, "handover");
            let next_acquire = one(&spans, f + 1, "acquire");
            let next_camera = one(&spans, f + 1, "camera");
            assert_eq!(one(&spans, f, "camera").tid, 4, "run {run}, frame {f}");
            // Always: f + 1's slot went to the camera thread before f was
            // handed over (the serial loop takes it after).
            assert!(
                next_acquire.ts + next_acquire.dur <= handover.ts + 0.01,
                "run {run}, frame {f}: {next_acquire:?} {handover:?}"
            );
            if next_camera.ts < handover.ts + handover.dur {
                overlapped += 1;
            }
        }
        if overlapped > 0 {
            break;
        }
    }
    assert!(
        overlapped >= 1,
        "no camera write overlapped a handover in five runs"
    );

    let t = traced_run("serial", "host", frames, &["--camera-ahead", "off"]);
    let spans = spans_of(&t);
    assert_frames_in_order(&spans, frames);
    for f in 0..frames - 1 {
        let handover = one(&spans, f, "handover");
        let next_camera = one(&spans, f + 1, "camera");
        assert_eq!(next_camera.tid, 1, "frame {f}");
        assert!(
            next_camera.ts >= handover.ts + handover.dur - 0.01,
            "frame {f}: {next_camera:?} {handover:?}"
        );
    }
}
