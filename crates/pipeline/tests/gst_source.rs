//! The GStreamer source against real GStreamer (feature `gstreamer`;
//! needs the GStreamer core and base plugins: `videotestsrc`, `appsink`,
//! `appsrc`, `identity`, `capsfilter`): the good case frame by frame, and
//! each bad case with its typed error naming the element. Every wait is
//! bounded, so a test that would hang fails with a timeout instead.

use std::time::{Duration, Instant};

use tegra_interop_pipeline::frame::{FrameLayout, FrameMut, PixelFormat};
use tegra_interop_pipeline::source::gst::{GstLimits, GstSource};
use tegra_interop_pipeline::source::{frame_digest, pixel_digest, Source, SourceError};

const ACCEPTANCE: &str =
    "videotestsrc num-buffers=300 ! video/x-raw,format=RGBA,width=1280,height=720";

fn rgba(width: u32, height: u32) -> FrameLayout {
    FrameLayout::packed(width, height, PixelFormat::Rgba8).expect("layout")
}

fn quick() -> GstLimits {
    GstLimits {
        start: Duration::from_secs(10),
        frame: Duration::from_secs(5),
    }
}

/// Fills `frames` frames, checking each one's digest against the bytes
/// that arrived in the ring; returns the digests and the error after them
/// (if any came within `frames + 1` fills).
fn run(source: &mut GstSource, frames: u64) -> (Vec<u64>, Option<SourceError>) {
    let layout = source.layout();
    let mut bytes = vec![0u8; layout.frame_len()];
    let mut digests = Vec::new();
    for index in 0..=frames {
        let mut frame = FrameMut::new(index, layout, &mut bytes).expect("frame");
        match source.fill(&mut frame) {
            Ok(filled) => {
                let digest = filled.digest.expect("the GStreamer source gives a digest");
                let in_ring = pixel_digest(&layout, &bytes).expect("digest");
                assert_eq!(
                    digest, in_ring,
                    "frame {index}: ring bytes differ from GStreamer's"
                );
                digests.push(digest);
            }
            Err(e) => return (digests, Some(e)),
        }
    }
    (digests, None)
}

/// The first error of a source that should fail: from `new`, or from one
/// of its first frames.
fn first_error(description: &str, layout: FrameLayout) -> SourceError {
    match GstSource::new(description, layout, quick()) {
        Err(e) => e,
        Ok(mut source) => {
            let (_, e) = run(&mut source, 20);
            e.expect("an error within 20 frames")
        }
    }
}

#[test]
fn three_hundred_frames_arrive_as_gstreamer_made_them_then_the_end() {
    let layout = rgba(1280, 720);
    let mut source = GstSource::new(ACCEPTANCE, layout, quick()).expect("source");
    assert_eq!(source.layout(), layout);
    assert!(source.describe().contains("videotestsrc num-buffers=300"));
    let mut bytes = vec![0u8; layout.frame_len()];
    for index in 0..300u64 {
        let mut frame = FrameMut::new(index, layout, &mut bytes).expect("frame");
        let filled = source.fill(&mut frame).expect("frame");
        // Packed layout: the digest is frame_digest of the filled bytes.
        assert_eq!(filled.digest, Some(frame_digest(&bytes)), "frame {index}");
        // videotestsrc at its default 30/1: frame n at n/30 s.
        let expected = Duration::from_nanos(index * 1_000_000_000 / 30);
        let ts = filled.timestamp.expect("a timestamp");
        assert!(
            ts.abs_diff(expected) < Duration::from_millis(1),
            "frame {index}: {ts:?}"
        );
    }
    assert_eq!(source.frames(), 300);
    let mut frame = FrameMut::new(300, layout, &mut bytes).expect("frame");
    match source.fill(&mut frame) {
        Err(SourceError::Ended { frames: 300 }) => {}
        other => panic!("expected the end after 300 frames, got {other:?}"),
    }
}

#[test]
fn gstreamer_strides_and_a_padded_ring_pitch_meet_line_by_line() {
    // GRAY8 at width 318: GStreamer's lines are 320 bytes (4-aligned), the
    // ring's 384, the pixels 318; a moving pattern so frames differ.
    let layout = FrameLayout::with_pitch(318, 120, 384, PixelFormat::Gray8).expect("layout");
    let mut source = GstSource::new(
        "videotestsrc num-buffers=12 pattern=ball ! videoconvert",
        layout,
        quick(),
    )
    .expect("source");
    let (digests, end) = run(&mut source, 12);
    assert!(
        matches!(end, Some(SourceError::Ended { frames: 12 })),
        "{end:?}"
    );
    assert_eq!(digests.len(), 12);
    let mut distinct = digests.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 6, "the ball moves: {distinct:?}");
}

#[test]
fn negotiate_takes_the_streams_size() {
    let mut source = GstSource::negotiate(
        "videotestsrc num-buffers=3 ! video/x-raw,width=320,height=240 ! videoconvert",
        PixelFormat::Bgra8,
        quick(),
    )
    .expect("source");
    assert_eq!(
        source.layout(),
        FrameLayout::packed(320, 240, PixelFormat::Bgra8).expect("layout")
    );
    let (digests, end) = run(&mut source, 3);
    assert_eq!(digests.len(), 3);
    assert!(
        matches!(end, Some(SourceError::Ended { frames: 3 })),
        "{end:?}"
    );
}

#[test]
fn a_caps_mismatch_is_a_layout_error_naming_the_element() {
    // Another format.
    let e = first_error(
        "videotestsrc num-buffers=10 ! capsfilter name=camcaps caps=video/x-raw,format=NV12,width=1280,height=720",
        rgba(1280, 720),
    );
    match &e {
        SourceError::Layout {
            element,
            expected,
            got,
        } => {
            assert_eq!(element, "camcaps");
            assert_eq!(*expected, rgba(1280, 720));
            assert!(got.contains("NV12"), "{got}");
        }
        other => panic!("expected a layout error, got {other:?}"),
    }
    assert!(e.to_string().contains("`camcaps` gives"), "{e}");
    // Another size, from an unnamed caps filter.
    match first_error(
        "videotestsrc num-buffers=10 ! video/x-raw,format=RGBA,width=640,height=480",
        rgba(1280, 720),
    ) {
        SourceError::Layout { element, got, .. } => {
            assert!(element.starts_with("capsfilter"), "{element}");
            assert!(got.contains("640"), "{got}");
        }
        other => panic!("expected a layout error, got {other:?}"),
    }
    // The same with the size from the stream: still a layout error, at
    // the stream's size.
    match GstSource::negotiate(
        "videotestsrc num-buffers=10 ! video/x-raw,format=NV12,width=320,height=240",
        PixelFormat::Rgba8,
        quick(),
    ) {
        Err(SourceError::Layout { expected, .. }) => assert_eq!(expected, rgba(320, 240)),
        other => panic!("expected a layout error, got {other:?}"),
    }
}

#[test]
fn a_missing_element_is_named_by_its_factory() {
    let e = first_error(
        "videotestsrc num-buffers=10 ! tegranosuchconverter ! video/x-raw,format=RGBA,width=64,height=48",
        rgba(64, 48),
    );
    match &e {
        SourceError::Element { element, reason } => {
            assert_eq!(element, "tegranosuchconverter");
            assert!(reason.contains("no such element"), "{reason}");
        }
        other => panic!("expected an element error, got {other:?}"),
    }
}

#[test]
fn descriptions_that_cannot_end_in_the_sink_are_refused() {
    for description in [
        "",
        "   ",
        "videotestsrc ! fakesink",
        "videotestsrc !",
        "videotestsrc ! queue name=tegra_interop_sink",
        "videotestsrc ! identity name=tegra_interop_digest",
    ] {
        match GstSource::new(description, rgba(64, 48), quick()) {
            Err(SourceError::Element { element, .. }) => {
                assert_eq!(element, "pipeline description", "{description:?}")
            }
            other => panic!("{description:?}: expected an element error, got {other:?}"),
        }
    }
}

#[test]
fn the_end_of_the_stream_before_the_frames_wanted_says_how_many_came() {
    let mut source = GstSource::new(
        "videotestsrc num-buffers=5 ! video/x-raw,format=RGBA,width=64,height=48",
        rgba(64, 48),
        quick(),
    )
    .expect("source");
    let (digests, end) = run(&mut source, 10);
    assert_eq!(digests.len(), 5);
    assert!(
        matches!(end, Some(SourceError::Ended { frames: 5 })),
        "{end:?}"
    );
    // And again: the end stays the end.
    let (more, end) = run(&mut source, 1);
    assert!(more.is_empty());
    assert!(
        matches!(end, Some(SourceError::Ended { frames: 5 })),
        "{end:?}"
    );
}

#[test]
fn an_error_mid_stream_names_the_element_and_its_words() {
    let mut source = GstSource::new(
        "videotestsrc num-buffers=100 ! video/x-raw,format=RGBA,width=64,height=48 \
         ! identity name=broken error-after=4",
        rgba(64, 48),
        quick(),
    )
    .expect("source");
    let started = Instant::now();
    let (digests, end) = run(&mut source, 100);
    // identity fails on its 4th buffer: the 3 before it arrive intact.
    assert_eq!(digests.len(), 3);
    match end {
        Some(SourceError::Element { element, reason }) => {
            assert_eq!(element, "broken");
            assert!(reason.contains("iterations"), "{reason}");
        }
        other => panic!("expected an element error, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the error took {:?}",
        started.elapsed()
    );
}

#[test]
fn a_source_that_gives_nothing_times_out_saying_what_it_waited_for() {
    // A live appsrc nobody pushes to: the pipeline runs, no frame comes.
    let limits = GstLimits {
        start: Duration::from_secs(5),
        frame: Duration::from_millis(300),
    };
    let mut source = GstSource::new(
        "appsrc is-live=true format=time caps=video/x-raw,format=RGBA,width=64,height=48,framerate=30/1",
        rgba(64, 48),
        limits,
    )
    .expect("source");
    let started = Instant::now();
    let (digests, end) = run(&mut source, 1);
    assert!(digests.is_empty());
    match end {
        Some(SourceError::Timeout { waiting_for, limit }) => {
            assert_eq!(limit, Duration::from_millis(300));
            assert!(waiting_for.contains("frame 0"), "{waiting_for}");
            assert!(waiting_for.contains("appsrc"), "{waiting_for}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(4));
    // Not live: the pipeline cannot preroll, so starting times out.
    let limits = GstLimits {
        start: Duration::from_millis(300),
        frame: Duration::from_millis(300),
    };
    match GstSource::new(
        "appsrc caps=video/x-raw,format=RGBA,width=64,height=48,framerate=30/1",
        rgba(64, 48),
        limits,
    ) {
        Err(SourceError::Timeout { waiting_for, .. }) => {
            assert!(waiting_for.contains("to run"), "{waiting_for}")
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
}

/// Dropping takes milliseconds; the 4 s bound (as in the tests above) is
/// far below a hang and far above a loaded CI machine's delays.
#[test]
fn dropping_a_running_source_stops_it_promptly() {
    for _ in 0..10 {
        let mut source = GstSource::new(
            "videotestsrc ! video/x-raw,format=RGBA,width=320,height=240",
            rgba(320, 240),
            quick(),
        )
        .expect("source");
        let (digests, _) = run(&mut source, 1);
        assert_eq!(digests.len(), 2);
        let started = Instant::now();
        drop(source);
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
    }
}

#[test]
fn a_frame_of_another_layout_is_refused() {
    let mut source = GstSource::new(
        "videotestsrc num-buffers=2 ! video/x-raw,format=RGBA,width=64,height=48",
        rgba(64, 48),
        quick(),
    )
    .expect("source");
    let other = rgba(48, 64);
    let mut bytes = vec![0u8; other.frame_len()];
    let mut frame = FrameMut::new(0, other, &mut bytes).expect("frame");
    assert!(matches!(
        source.fill(&mut frame),
        Err(SourceError::Layout { .. })
    ));
}

// The `pipeline` program with a GStreamer source (built with the same
// features as this test): every frame verified against GStreamer's digest,
// and a run that must fail does.

fn program(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pipeline"))
        .args(args)
        .arg("--quiet")
        .output()
        .expect("the pipeline program runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const MOVING: &str =
    "gst:videotestsrc num-buffers=60 pattern=ball ! video/x-raw,format=RGBA,width=320,height=240";

#[test]
fn the_program_verifies_every_gstreamer_frame() {
    for extra in [&[][..], &["--copy", "--ring", "2"], &["--backend", "host"]] {
        let mut args = vec!["--source", MOVING, "--frames", "60"];
        args.extend_from_slice(extra);
        let (code, out, err) = program(&args);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
        assert!(out.contains("60 frames of 320x240 rgba8"), "{out}");
        assert!(
            out.contains(
                "verified: 60/60 frames (the processed frame read back matches the digest"
            ),
            "{out}"
        );
    }
}

#[test]
fn the_json_report_says_frames_were_checked_against_the_source_digest() {
    let (code, out, err) = program(&["--source", MOVING, "--frames", "20", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let line = out.lines().last().unwrap_or_default();
    let j: serde_json::Value = serde_json::from_str(line).expect("one JSON object");
    assert_eq!(
        j["verification"]["checked_against"], "source-digest",
        "{line}"
    );
    let (code, out, err) = program(&["--frames", "20", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let line = out.lines().last().unwrap_or_default();
    let j: serde_json::Value = serde_json::from_str(line).expect("one JSON object");
    assert_eq!(
        j["verification"]["checked_against"], "camera-pattern",
        "{line}"
    );
}

#[test]
fn the_program_fails_a_frame_the_work_did_not_reach_or_the_ring_damaged() {
    for fault in ["skip-process", "corrupt"] {
        let (code, out, err) = program(&[
            "--source",
            MOVING,
            "--frames",
            "10",
            "--backend",
            "sim",
            "--fault",
            fault,
        ]);
        assert_eq!(code, 1, "{fault}: {out}{err}");
        assert!(out.contains("verification FAILED"), "{fault}: {out}");
        assert!(out.contains("the source gave"), "{fault}: {out}");
    }
}

#[test]
fn the_program_names_what_went_wrong_with_its_source() {
    let (code, _, err) = program(&["--source", MOVING, "--frames", "61"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("the source ended after 60 frame(s)"), "{err}");
    let (code, _, err) = program(&[
        "--source",
        "gst:videotestsrc ! video/x-raw,format=NV12,width=320,height=240",
        "--frames",
        "5",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("`capsfilter0` gives caps video/x-raw, format=(string)NV12"),
        "{err}"
    );
    assert!(err.contains("the ring wants 320x240 RGBA"), "{err}");
}
