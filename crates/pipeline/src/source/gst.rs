//! Frames from GStreamer (feature `gstreamer`): [`GstSource`] runs any
//! pipeline description the user gives and copies each frame its end
//! delivers into the ring.
//!
//! # The rule for the description
//!
//! The description is what `gst-launch-1.0` takes, one chain that ends in
//! an element with a free source pad (typically a caps filter such as
//! `video/x-raw,format=RGBA,width=1280,height=720`, or a converter). The
//! source appends
//!
//! ```text
//!  ! identity name=tegra_interop_digest signal-handoffs=true
//!  ! appsink name=tegra_interop_sink sync=false max-buffers=2 drop=false enable-last-sample=false
//! ```
//!
//! and sets the `appsink`'s caps to the ring's layout (`video/x-raw` with
//! the format, width and height; see [`GstSource::new`]), so converters in
//! the description (`videoconvert`, `videoscale`, `nvvidconv`) negotiate
//! towards it. A description that ends in a sink, or that already uses one
//! of the two names, is refused when it is parsed. [`GstSource::description`]
//! gives the whole pipeline as it runs.
//!
//! The `appsink` does not sync to the clock: a live source (a camera) sets
//! the pace; a file or `videotestsrc` runs as fast as the ring takes its
//! frames. It holds at most two frames and never drops one, so GStreamer
//! waits for the ring when the ring is slower (a live camera then drops
//! frames upstream, as it would with any slow sink).
//!
//! # Verification
//!
//! The `identity` element's `handoff` signal sees each buffer before the
//! `appsink` does; the handler maps it and computes
//! [`pixel_digest`](super::pixel_digest)'s value over its pixels in the
//! ring's packed order, independently of the copy into the ring, and
//! [`GstSource::fill`] returns it in [`Filled::digest`]. A checker that
//! reads the frame back compares (see [`super::check_inverted`]).
//!
//! # Errors and limits
//!
//! Every error names the element: a missing element or plugin
//! ([`SourceError::Element`] with the factory name), a description that
//! does not parse or link, caps that cannot be negotiated to the ring's
//! layout ([`SourceError::Layout`] naming the element before the source's
//! own, with the caps it can give), an error message from any element
//! while running ([`SourceError::Element`] with its name, message and
//! debug text), and the end of the stream ([`SourceError::Ended`]). Every
//! wait is bounded by [`GstLimits`]: the start (until the pipeline runs)
//! and each frame; a [`SourceError::Timeout`] says what was waited for.
//! Dropping the source sets the pipeline to `NULL` (all its threads
//! stopped, its resources released).
//!
//! Verified on x86-64 Debian 12 with GStreamer 1.22 (`videotestsrc`), by
//! `tests/gst_source.rs` and the `pipeline --source gst:...` run in CI.
//! The Jetson pipelines in the crate README (`nvarguscamerasrc`,
//! `v4l2src`) are documented, not run: there is no Jetson here.
//!
//! # Not zero-copy
//!
//! Each frame is copied from the GStreamer buffer into the ring's slot.
//! On a Jetson, `nvarguscamerasrc` and `nvvidconv` can keep frames in DMA
//! buffers (`memory:NVMM`); the zero-copy path would hand that buffer to
//! CUDA instead of copying it (an EGLImage of the `NvBufSurface`
//! registered with CUDA, or the dmabuf file descriptor imported as CUDA
//! external memory), holding the GStreamer buffer until the consumer's
//! *free* fence. That path is not implemented (the crate README says
//! more); `nvvidconv` to `video/x-raw` (system memory) is what this source
//! takes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use gstreamer as gst;
use gstreamer_app as gst_app;
use gstreamer_video as gst_video;

use gst::glib;
use gst::glib::translate::IntoGlib;
use gst::prelude::*;
use gst_video::prelude::*;

use super::{lines_digest, Filled, Source, SourceError};
use crate::frame::{FrameLayout, FrameMut, PixelFormat};

/// The name of the `identity` element the source appends (its `handoff`
/// computes each frame's digest).
pub const DIGEST_ELEMENT: &str = "tegra_interop_digest";
/// The name of the `appsink` the source appends.
pub const SINK_ELEMENT: &str = "tegra_interop_sink";

/// How often a wait looks at the pipeline's error messages.
const POLL: Duration = Duration::from_millis(20);
/// Digests kept for frames the ring has not taken yet; the `appsink` holds
/// two, so more means the two ends are out of step.
const MAX_PENDING_DIGESTS: usize = 16;

/// How long [`GstSource`] waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GstLimits {
    /// For the pipeline to run (`PLAYING`, or the first frame's caps for
    /// [`GstSource::negotiate`]).
    pub start: Duration,
    /// For each frame.
    pub frame: Duration,
}

impl Default for GstLimits {
    /// 10 s to start (plugin loading, a camera's warm-up), 5 s a frame.
    fn default() -> Self {
        GstLimits {
            start: Duration::from_secs(10),
            frame: Duration::from_secs(5),
        }
    }
}

/// The first error message an element posted.
#[derive(Clone, Debug)]
struct BusError {
    element: String,
    message: String,
    debug: Option<String>,
    not_negotiated: bool,
}

/// One frame's digest from the `handoff`, or why there is none.
struct PendingDigest {
    pts: Option<gst::ClockTime>,
    digest: Result<u64, String>,
}

/// What the streaming threads tell the source.
#[derive(Default)]
struct Shared {
    digests: Mutex<VecDeque<PendingDigest>>,
    error: Mutex<Option<BusError>>,
}

impl Shared {
    fn error(&self) -> Option<BusError> {
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn record_error(&self, e: BusError) {
        let mut slot = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(e);
        }
    }

    fn push_digest(&self, d: PendingDigest) {
        let mut q = self.digests.lock().unwrap_or_else(PoisonError::into_inner);
        if q.len() >= MAX_PENDING_DIGESTS {
            // Never grows without bound; the frame that misses its digest
            // gets an error in `take_digest`, not a wrong value.
            q.pop_front();
        }
        q.push_back(d);
    }

    fn pop_digest(&self) -> Option<PendingDigest> {
        self.digests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
    }
}

/// A [`Source`] that takes frames from an `appsink` at the end of a
/// GStreamer pipeline description (see the [module docs](self) for the
/// rule, the verification and the limits).
///
/// ```
/// use tegra_interop_pipeline::frame::{FrameLayout, FrameMut, PixelFormat};
/// use tegra_interop_pipeline::source::gst::{GstLimits, GstSource};
/// use tegra_interop_pipeline::source::{pixel_digest, Source};
///
/// let layout = FrameLayout::packed(1280, 720, PixelFormat::Rgba8)?;
/// let mut source = GstSource::new(
///     "videotestsrc num-buffers=10 ! videoconvert",
///     layout,
///     GstLimits::default(),
/// )?;
/// let mut bytes = vec![0u8; layout.frame_len()];
/// for index in 0..10 {
///     let mut frame = FrameMut::new(index, layout, &mut bytes)?;
///     let filled = source.fill(&mut frame)?;
///     assert_eq!(filled.digest, Some(pixel_digest(&layout, &bytes)?));
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct GstSource {
    description: String,
    layout: FrameLayout,
    limits: GstLimits,
    pipeline: gst::Pipeline,
    sink: gst_app::AppSink,
    shared: Arc<Shared>,
    frames: u64,
    /// Whether the width and height were asked for ([`GstSource::new`]) or
    /// are the stream's ([`GstSource::negotiate`]).
    size_asked: bool,
}

impl std::fmt::Debug for GstSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GstSource")
            .field("description", &self.description)
            .field("layout", &self.layout)
            .field("limits", &self.limits)
            .field("frames", &self.frames)
            .finish_non_exhaustive()
    }
}

/// The GStreamer name of a ring format.
fn video_format(format: PixelFormat) -> gst_video::VideoFormat {
    gst_video::VideoFormat::from_string(format.caps_name())
}

/// The ring format of a GStreamer one, where the ring has it.
fn ring_format(format: gst_video::VideoFormat) -> Option<PixelFormat> {
    [
        PixelFormat::Gray8,
        PixelFormat::Gray16,
        PixelFormat::Rgba8,
        PixelFormat::Bgra8,
    ]
    .into_iter()
    .find(|f| video_format(*f) == format)
}

fn element_error(element: &str, reason: impl Into<String>) -> SourceError {
    SourceError::Element {
        element: element.to_owned(),
        reason: reason.into(),
    }
}

/// A `Duration` as GStreamer's clock time (saturating).
fn clock_time(d: Duration) -> gst::ClockTime {
    gst::ClockTime::from_nseconds(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Initialises GStreamer (once per process; later calls return at once).
/// Before any other GStreamer call: gstreamer-rs panics on calls made
/// without it.
fn init() -> Result<(), SourceError> {
    gst::init().map_err(|e| element_error("gstreamer", format!("did not initialise: {e}")))
}

/// A parse error as the source's error: the missing factory by name where
/// that is the cause.
fn parse_error(context: &gst::ParseContext, e: &glib::Error) -> SourceError {
    let missing = context.missing_elements();
    if let Some(first) = missing.first() {
        return element_error(
            first,
            format!(
                "no such element: GStreamer has no element factory `{first}` (a plugin that \
                 provides it is not installed or did not load; `gst-inspect-1.0 {first}` says \
                 which); the description was not run ({e})"
            ),
        );
    }
    element_error(
        "pipeline description",
        format!(
            "{e}; the description must be one chain ending in an element with a free source \
             pad (e.g. a caps filter), to which the source links `identity name={DIGEST_ELEMENT}` \
             and `appsink name={SINK_ELEMENT}`"
        ),
    )
}

/// The digest of a buffer's pixels as the `handoff` computes it: the
/// caps from `identity`'s sink pad, the frame mapped by its strides (and
/// video meta), each line's pixel bytes in order.
fn buffer_digest(identity: &gst::Element, buffer: &gst::BufferRef) -> Result<u64, String> {
    let caps = identity
        .static_pad("sink")
        .and_then(|p| p.current_caps())
        .ok_or_else(|| format!("`{DIGEST_ELEMENT}` saw a buffer before its caps"))?;
    let info = gst_video::VideoInfo::from_caps(&caps)
        .map_err(|e| format!("`{DIGEST_ELEMENT}`: caps {caps} are not raw video: {e}"))?;
    let frame = gst_video::VideoFrameRef::from_buffer_ref_readable(buffer, &info)
        .map_err(|e| format!("`{DIGEST_ELEMENT}` could not map a buffer: {e}"))?;
    let lines = frame_lines(&frame)?;
    Ok(lines_digest(lines))
}

/// Each line's pixel bytes of plane 0 of a mapped single-plane frame.
fn frame_lines<'a>(
    frame: &'a gst_video::VideoFrameRef<&gst::BufferRef>,
) -> Result<impl Iterator<Item = &'a [u8]>, String> {
    let format = ring_format(frame.format())
        .ok_or_else(|| format!("format {:?} is not one the ring has", frame.format()))?;
    let stride = frame
        .plane_stride()
        .first()
        .and_then(|s| usize::try_from(*s).ok())
        .ok_or_else(|| "a frame without a positive line stride".to_owned())?;
    let data = frame
        .plane_data(0)
        .map_err(|e| format!("plane 0 could not be read: {e}"))?;
    let line = frame.width() as usize * format.bytes_per_pixel();
    let height = frame.height() as usize;
    let lines: Vec<&[u8]> = (0..height)
        .map_while(|y| data.get(y * stride..y * stride + line))
        .collect();
    if lines.len() != height || stride < line {
        return Err(format!(
            "a buffer of {} bytes holds no {height} lines of {line} bytes at stride {stride}",
            data.len()
        ));
    }
    Ok(lines.into_iter())
}

impl GstSource {
    /// Parses `description` (see the [module docs](self) for the rule),
    /// asks for frames of exactly `layout` (format, width and height; the
    /// ring's pitch may be longer than GStreamer's lines) and starts the
    /// pipeline; returns once it runs.
    ///
    /// # Errors
    /// [`SourceError::Element`] for a missing element (named by its
    /// factory), a description that does not parse or link, or an element
    /// that fails to start; [`SourceError::Layout`] when the caps cannot
    /// be negotiated to `layout`; [`SourceError::Timeout`] when it does not
    /// run within `limits.start`.
    pub fn new(
        description: &str,
        layout: FrameLayout,
        limits: GstLimits,
    ) -> Result<Self, SourceError> {
        init()?;
        let width = i32::try_from(layout.width());
        let height = i32::try_from(layout.height());
        let (Ok(width), Ok(height)) = (width, height) else {
            return Err(SourceError::Layout {
                element: SINK_ELEMENT.to_owned(),
                expected: layout,
                got: "a size GStreamer caps cannot hold (over 2^31 - 1)".to_owned(),
            });
        };
        let caps = gst_video::VideoCapsBuilder::new()
            .format(video_format(layout.format()))
            .width(width)
            .height(height)
            .build();
        let mut source = Self::build(description, layout, limits, &caps)?;
        source.size_asked = true;
        source.start()?;
        Ok(source)
    }

    /// Like [`GstSource::new`], but only the pixel format is asked for:
    /// the width and height are the stream's (the description's caps, or
    /// what its elements choose), read from the first negotiated caps; the
    /// layout is packed (pitch = width * bytes per pixel). For a program
    /// that sizes its ring after the camera.
    ///
    /// # Errors
    /// As [`GstSource::new`]; [`SourceError::Timeout`] also when no caps
    /// are negotiated within `limits.start` (a live source that gives no
    /// frame).
    pub fn negotiate(
        description: &str,
        format: PixelFormat,
        limits: GstLimits,
    ) -> Result<Self, SourceError> {
        init()?;
        let caps = gst_video::VideoCapsBuilder::new()
            .format(video_format(format))
            .build();
        // A stand-in until the caps are known; replaced below.
        let provisional = FrameLayout::packed(1, 1, format)
            .map_err(|e| element_error(SINK_ELEMENT, format!("no layout for {format}: {e}")))?;
        let mut source = Self::build(description, provisional, limits, &caps)?;
        source.start()?;
        source.layout = source.negotiated_layout(format)?;
        Ok(source)
    }

    /// The whole pipeline as it runs: the user's description and the
    /// source's own tail.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Frames given so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    fn build(
        user: &str,
        layout: FrameLayout,
        limits: GstLimits,
        caps: &gst::Caps,
    ) -> Result<Self, SourceError> {
        let user = user.trim();
        if user.is_empty() {
            return Err(element_error(
                "pipeline description",
                "empty: give a GStreamer pipeline description, e.g. \
                 `videotestsrc ! video/x-raw,format=RGBA,width=1280,height=720`",
            ));
        }
        if let Some(name) = [DIGEST_ELEMENT, SINK_ELEMENT]
            .into_iter()
            .find(|n| user.contains(n))
        {
            return Err(element_error(
                "pipeline description",
                format!("uses the name `{name}`, which the source gives its own element"),
            ));
        }
        let description = format!(
            "{user} ! identity name={DIGEST_ELEMENT} signal-handoffs=true \
             ! appsink name={SINK_ELEMENT} sync=false max-buffers=2 drop=false \
             enable-last-sample=false"
        );
        let mut context = gst::ParseContext::new();
        let element = gst::parse::launch_full(
            &description,
            Some(&mut context),
            gst::ParseFlags::FATAL_ERRORS,
        )
        .map_err(|e| parse_error(&context, &e))?;
        let pipeline = element.downcast::<gst::Pipeline>().map_err(|e| {
            let _ = e.set_state(gst::State::Null);
            element_error("pipeline description", "did not make a pipeline")
        })?;
        // From here on, `Drop` takes the pipeline down on any error.
        let sink = match pipeline
            .by_name(SINK_ELEMENT)
            .and_then(|e| e.downcast::<gst_app::AppSink>().ok())
        {
            Some(sink) => sink,
            None => {
                let _ = pipeline.set_state(gst::State::Null);
                return Err(element_error(
                    SINK_ELEMENT,
                    "the name is used by an element of the description that is not the source's appsink",
                ));
            }
        };
        sink.set_caps(Some(caps));
        let source = GstSource {
            description,
            layout,
            limits,
            pipeline,
            sink,
            shared: Arc::new(Shared::default()),
            frames: 0,
            size_asked: false,
        };
        source.watch_bus()?;
        source.connect_digest()?;
        Ok(source)
    }

    /// Records the first error message of any element; every message is
    /// handled on the thread that posts it and dropped, so none pile up.
    fn watch_bus(&self) -> Result<(), SourceError> {
        let bus = self
            .pipeline
            .bus()
            .ok_or_else(|| element_error("pipeline", "has no bus"))?;
        let shared = Arc::clone(&self.shared);
        bus.set_sync_handler(move |_, message| {
            if let gst::MessageView::Error(e) = message.view() {
                let error = e.error();
                let debug = e.debug().map(|d| d.to_string());
                let flow = e.details().and_then(|d| d.get::<i32>("flow-return").ok());
                let not_negotiated = flow == Some(gst::FlowReturn::NotNegotiated.into_glib())
                    || error.matches(gst::CoreError::Negotiation)
                    || debug
                        .as_deref()
                        .is_some_and(|d| d.contains("not-negotiated"));
                shared.record_error(BusError {
                    element: message
                        .src()
                        .map(|s| s.name().to_string())
                        .unwrap_or_else(|| "pipeline".to_owned()),
                    message: error.to_string(),
                    debug,
                    not_negotiated,
                });
            }
            gst::BusSyncReply::Drop
        });
        Ok(())
    }

    /// Connects the digest to the `identity` element's `handoff`.
    fn connect_digest(&self) -> Result<(), SourceError> {
        let identity = self
            .pipeline
            .by_name(DIGEST_ELEMENT)
            .ok_or_else(|| element_error(DIGEST_ELEMENT, "not in the pipeline"))?;
        if glib::subclass::signal::SignalId::lookup("handoff", identity.type_()).is_none() {
            return Err(element_error(
                DIGEST_ELEMENT,
                "has no `handoff` signal (the name is used by another element of the description)",
            ));
        }
        let shared = Arc::clone(&self.shared);
        identity.connect("handoff", false, move |args| {
            let identity = args.first().and_then(|v| v.get::<gst::Element>().ok());
            let buffer = args.get(1).and_then(|v| v.get::<gst::Buffer>().ok());
            let pending = match (identity, buffer) {
                (Some(identity), Some(buffer)) => PendingDigest {
                    pts: buffer.pts(),
                    digest: buffer_digest(&identity, &buffer),
                },
                _ => PendingDigest {
                    pts: None,
                    digest: Err("`handoff` without an element and a buffer".to_owned()),
                },
            };
            shared.push_digest(pending);
            None
        });
        Ok(())
    }

    /// Starts the pipeline: `PAUSED` first, waiting until it has
    /// prerolled (its first frame at the `appsink`), an element fails, or
    /// the limit passes; then `PLAYING`. A live source (a camera) does not
    /// preroll: it goes to `PLAYING` at once, and the frame waits bound
    /// the rest.
    fn start(&mut self) -> Result<(), SourceError> {
        let live = match self.pipeline.set_state(gst::State::Paused) {
            Err(_) => return Err(self.refusal("PAUSED")),
            Ok(gst::StateChangeSuccess::NoPreroll) => true,
            Ok(_) => false,
        };
        if !live {
            self.wait_preroll()?;
        }
        if self.pipeline.set_state(gst::State::Playing).is_err() {
            return Err(self.refusal("PLAYING"));
        }
        Ok(())
    }

    /// Waits for the pipeline to reach `PAUSED` (prerolled).
    fn wait_preroll(&self) -> Result<(), SourceError> {
        let deadline = Instant::now() + self.limits.start;
        loop {
            if let Some(e) = self.failure() {
                return Err(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.pipeline.state(clock_time(left.min(POLL))).0 {
                Ok(gst::StateChangeSuccess::Async) => {}
                Ok(_) => return Ok(()),
                Err(_) => return Err(self.refusal("PAUSED")),
            }
            if left.is_zero() {
                return Err(SourceError::Timeout {
                    waiting_for: format!(
                        "the GStreamer pipeline `{}` to run (its first frame at `{SINK_ELEMENT}`)",
                        self.description
                    ),
                    limit: self.limits.start,
                });
            }
        }
    }

    /// The error of a refused state change: the element's own error
    /// message where it posts one. The pipeline marks the change failed
    /// just before the message reaches the source's handler, so this waits
    /// briefly for it.
    fn refusal(&self, state: &str) -> SourceError {
        let deadline = Instant::now() + Duration::from_millis(500);
        loop {
            if let Some(e) = self.failure() {
                return e;
            }
            if Instant::now() >= deadline {
                return element_error(
                    "pipeline",
                    format!("refused to go to {state} (no element said why)"),
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The layout of the caps the `appsink` negotiated (waits for them).
    fn negotiated_layout(&self, format: PixelFormat) -> Result<FrameLayout, SourceError> {
        let pad = self
            .sink
            .static_pad("sink")
            .ok_or_else(|| element_error(SINK_ELEMENT, "has no sink pad"))?;
        let deadline = Instant::now() + self.limits.start;
        let caps = loop {
            if let Some(caps) = pad.current_caps() {
                break caps;
            }
            if let Some(e) = self.failure() {
                return Err(e);
            }
            if self.sink.is_eos() {
                return Err(SourceError::Ended { frames: 0 });
            }
            if Instant::now() >= deadline {
                return Err(SourceError::Timeout {
                    waiting_for: format!(
                        "the caps of the first frame of `{}` (appsink `{SINK_ELEMENT}`)",
                        self.description
                    ),
                    limit: self.limits.start,
                });
            }
            std::thread::sleep(POLL);
        };
        let info = gst_video::VideoInfo::from_caps(&caps)
            .map_err(|e| element_error(SINK_ELEMENT, format!("caps {caps}: {e}")))?;
        FrameLayout::packed(info.width(), info.height(), format).map_err(|e| {
            element_error(
                SINK_ELEMENT,
                format!("caps {caps} give no frame layout: {e}"),
            )
        })
    }

    /// The error an element posted, as the source's error; `None` while
    /// there is none.
    fn failure(&self) -> Option<SourceError> {
        let e = self.shared.error()?;
        if e.not_negotiated {
            let (element, caps) = self.upstream_caps();
            let element = element.unwrap_or(e.element);
            let got = caps
                .as_ref()
                .map(|c| format!("caps {c}"))
                .unwrap_or_else(|| "caps that cannot be negotiated".to_owned());
            return Some(match self.expected_layout(caps.as_ref()) {
                Some(expected) => SourceError::Layout {
                    element,
                    expected,
                    got,
                },
                None => element_error(
                    &element,
                    format!(
                        "gives {got}, which cannot be negotiated to {} frames ({})",
                        self.layout.format(),
                        e.message
                    ),
                ),
            });
        }
        let debug = e.debug.map(|d| format!(" ({d})")).unwrap_or_default();
        Some(element_error(&e.element, format!("{}{debug}", e.message)))
    }

    /// The layout the ring wants: as asked, or for [`GstSource::negotiate`]
    /// the ring's format at the size the upstream caps give (`None` where
    /// they give no fixed size).
    fn expected_layout(&self, upstream: Option<&gst::Caps>) -> Option<FrameLayout> {
        if self.size_asked {
            return Some(self.layout);
        }
        let s = upstream?.structure(0)?;
        let width = u32::try_from(s.get::<i32>("width").ok()?).ok()?;
        let height = u32::try_from(s.get::<i32>("height").ok()?).ok()?;
        FrameLayout::packed(width, height, self.layout.format()).ok()
    }

    /// The user's last element (the one linked to the source's `identity`)
    /// and the caps it can give.
    fn upstream_caps(&self) -> (Option<String>, Option<gst::Caps>) {
        let peer = self
            .pipeline
            .by_name(DIGEST_ELEMENT)
            .and_then(|i| i.static_pad("sink"))
            .and_then(|p| p.peer());
        let element = peer
            .as_ref()
            .and_then(|p| p.parent_element())
            .map(|e| e.name().to_string());
        (element, peer.map(|p| p.query_caps(None)))
    }

    /// Waits for the next sample: one the `appsink` has, else the first
    /// error, the end of the stream, or the frame limit.
    fn pull(&self) -> Result<gst::Sample, SourceError> {
        let deadline = Instant::now() + self.limits.frame;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Some(sample) = self.sink.try_pull_sample(clock_time(left.min(POLL))) {
                return Ok(sample);
            }
            if let Some(e) = self.failure() {
                return Err(e);
            }
            if self.sink.is_eos() {
                return Err(SourceError::Ended {
                    frames: self.frames,
                });
            }
            if left.is_zero() {
                return Err(SourceError::Timeout {
                    waiting_for: format!(
                        "frame {} from `{}` (appsink `{SINK_ELEMENT}`)",
                        self.frames, self.description
                    ),
                    limit: self.limits.frame,
                });
            }
        }
    }

    /// The digest the `handoff` computed for the buffer with `pts`.
    fn take_digest(&self, pts: Option<gst::ClockTime>) -> Result<u64, SourceError> {
        let pending = self.shared.pop_digest().ok_or_else(|| {
            element_error(
                DIGEST_ELEMENT,
                format!(
                    "no digest for frame {} (the handoff did not see it)",
                    self.frames
                ),
            )
        })?;
        if pending.pts != pts {
            return Err(element_error(
                DIGEST_ELEMENT,
                format!(
                    "the digests are out of step with the frames: frame {} has pts {:?}, \
                     the next digest is for {:?}",
                    self.frames, pts, pending.pts
                ),
            ));
        }
        pending
            .digest
            .map_err(|reason| element_error(DIGEST_ELEMENT, reason))
    }

    /// Copies the sample's pixels into `frame`, line by line (GStreamer's
    /// stride to the ring's pitch).
    fn copy_into(&self, sample: &gst::Sample, frame: &mut FrameMut<'_>) -> Result<(), SourceError> {
        let buffer = sample
            .buffer()
            .ok_or_else(|| element_error(SINK_ELEMENT, "a sample without a buffer"))?;
        let caps = sample
            .caps()
            .ok_or_else(|| element_error(SINK_ELEMENT, "a sample without caps"))?;
        let info = gst_video::VideoInfo::from_caps(caps)
            .map_err(|e| element_error(SINK_ELEMENT, format!("caps {caps}: {e}")))?;
        let layout = frame.layout();
        if ring_format(info.format()) != Some(layout.format())
            || info.width() != layout.width()
            || info.height() != layout.height()
        {
            let (element, _) = self.upstream_caps();
            return Err(SourceError::Layout {
                element: element.unwrap_or_else(|| SINK_ELEMENT.to_owned()),
                expected: layout,
                got: format!("caps {caps}"),
            });
        }
        let mapped = gst_video::VideoFrameRef::from_buffer_ref_readable(buffer, &info)
            .map_err(|e| element_error(SINK_ELEMENT, format!("could not map a buffer: {e}")))?;
        let lines = frame_lines(&mapped).map_err(|e| element_error(SINK_ELEMENT, e))?;
        let pitch = layout.pitch();
        for (src, dst) in lines.zip(frame.bytes_mut().chunks_exact_mut(pitch)) {
            if let Some(dst) = dst.get_mut(..src.len()) {
                dst.copy_from_slice(src);
            }
        }
        Ok(())
    }
}

impl Source for GstSource {
    fn describe(&self) -> String {
        format!("GStreamer `{}`", self.description)
    }

    fn layout(&self) -> FrameLayout {
        self.layout
    }

    fn fill(&mut self, frame: &mut FrameMut<'_>) -> Result<Filled, SourceError> {
        let layout = frame.layout();
        if layout.format() != self.layout.format()
            || layout.width() != self.layout.width()
            || layout.height() != self.layout.height()
        {
            return Err(SourceError::Layout {
                element: SINK_ELEMENT.to_owned(),
                expected: layout,
                got: format!("frames of {}", self.layout),
            });
        }
        let sample = self.pull()?;
        let pts = sample.buffer().and_then(|b| b.pts());
        // The digest first: it is taken for every sample, so a failed copy
        // cannot put the two out of step.
        let digest = self.take_digest(pts);
        self.copy_into(&sample, frame)?;
        let digest = digest?;
        self.frames += 1;
        Ok(Filled {
            timestamp: pts.map(|t| Duration::from_nanos(t.nseconds())),
            digest: Some(digest),
        })
    }
}

impl Drop for GstSource {
    fn drop(&mut self) {
        // Stops every streaming thread and releases the elements'
        // resources; an error here has no one to go to.
        let _ = self.pipeline.set_state(gst::State::Null);
        if let Some(bus) = self.pipeline.bus() {
            bus.unset_sync_handler();
        }
    }
}
