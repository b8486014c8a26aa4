//! Nothing leaks (feature `gstreamer`): hundreds of GStreamer sources made,
//! run and dropped, good ones and each kind of failure, leave the process
//! with the threads and memory it had after the first few. A test binary of
//! its own, so no other test's threads or memory are counted.

use tegra_interop_pipeline::frame::{FrameLayout, FrameMut, PixelFormat};
use tegra_interop_pipeline::source::gst::{GstLimits, GstSource};
use tegra_interop_pipeline::source::Source;

/// This process's threads and resident memory (KiB), from /proc.
fn threads_and_rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("the field")
    };
    (field("Threads:"), field("VmRSS:"))
}

/// One round: a source made (or refused), up to five frames, dropped.
/// Returns the frames it gave.
fn round(n: usize, layout: FrameLayout, bytes: &mut [u8]) -> u64 {
    let description = match n % 4 {
        0 => "videotestsrc ! video/x-raw,format=RGBA,width=320,height=240",
        1 => "videotestsrc ! video/x-raw,format=NV12,width=320,height=240",
        2 => "videotestsrc num-buffers=100 ! video/x-raw,format=RGBA,width=320,height=240 ! identity error-after=3",
        _ => "videotestsrc ! tegranosuchelement",
    };
    let Ok(mut source) = GstSource::new(description, layout, GstLimits::default()) else {
        return 0;
    };
    let mut frames = 0;
    for index in 0..5 {
        let mut frame = FrameMut::new(index, layout, bytes).expect("frame");
        if source.fill(&mut frame).is_err() {
            break;
        }
        frames += 1;
    }
    frames
}

/// Threads the process may gain between the two counts without a leak.
const THREAD_SLACK: u64 = 4;

#[test]
fn sources_made_and_dropped_leave_no_threads_or_memory_behind() {
    let layout = FrameLayout::packed(320, 240, PixelFormat::Rgba8).expect("layout");
    let mut bytes = vec![0u8; layout.frame_len()];
    let mut frames = 0;
    for n in 0..40 {
        frames += round(n, layout, &mut bytes);
    }
    let (threads, rss) = threads_and_rss();
    for n in 40..400 {
        frames += round(n, layout, &mut bytes);
    }
    let (threads_after, rss_after) = threads_and_rss();
    // 100 good rounds of 5 frames, 100 of 2 before the element's error.
    assert_eq!(frames, 100 * 5 + 100 * 2);
    // GStreamer and GLib keep pools of worker threads that grow and shrink
    // on their own (one more was seen on a loaded CI machine); a source
    // that left its streaming thread behind would add one per round, 360
    // here, so a slack of a few threads still catches any leak.
    assert!(
        threads_after <= threads + THREAD_SLACK,
        "threads {threads} after 40 rounds, {threads_after} after 400"
    );
    assert!(
        rss_after <= rss + 2048,
        "resident {rss} KiB after 40 rounds, {rss_after} KiB after 400"
    );
}
