//! `pipeline --publish zenoh/<topic>` and `pipeline --source
//! zenoh/<topic>`: frames across hosts over Zenoh (the library's module
//! `zenoh`, feature `zenoh`).
//!
//! - `--publish`: the multicast ring of `--consumers` (on the simulator's
//!   exporter, or Vulkan with `--backend gpu`) with the Zenoh publisher
//!   attached as a mailbox consumer, beside the `--consumers` ones if any.
//!   The report adds a `zenoh publish` line (JSON: `zenoh_publish`): frames
//!   offered, published, dropped by the mailbox queue.
//! - `--source`: the usual one-consumer pipeline, its frames from a Zenoh
//!   subscriber; the `Invert` work runs on each, and the checker compares
//!   the CRC-32 each sample's data had on arrival. A line on stderr at the
//!   end counts the samples taken and refused.
//!
//! The options exist in every build; without the feature the program
//! refuses them, naming the feature.

use std::path::PathBuf;
use std::time::Duration;

/// Prefix of a Zenoh topic in `--publish` and `--source`.
pub const PREFIX: &str = "zenoh/";

/// What a build without the feature says.
pub const NO_FEATURE: &str = "this program was built without Zenoh: build it with \
    `--features zenoh` (cargo run --release -p tegra-interop-pipeline --features zenoh -- ...)";

/// The Zenoh options of the command line.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ZenohArgs {
    /// Publish every frame over Zenoh as a ROS 2 sensor_msgs/msg/Image on
    /// TOPIC's rmw_zenoh key (`zenoh/camera/image_raw`); a mailbox
    /// consumer of a multicast ring (build with --features zenoh)
    #[arg(long, value_name = "zenoh/TOPIC")]
    publish: Option<String>,
    /// Messages the publisher may queue before it drops the oldest (1..=1024,
    /// default 2)
    #[arg(long, value_name = "N")]
    publish_queue: Option<usize>,
    /// Write one line per published frame: `<sequence> <frame> <crc32 hex>`
    #[arg(long, value_name = "FILE")]
    publish_log: Option<PathBuf>,
    /// Seconds the publisher waits for a subscriber before the first frame
    /// (0..=600, default 10; it publishes anyway after that)
    #[arg(long, value_name = "SECS")]
    publish_wait: Option<u64>,
    /// The ROS domain id of the key (0..=232, default 0)
    #[arg(long, value_name = "N")]
    ros_domain: Option<u32>,
    /// A Zenoh endpoint to listen on, e.g. tcp/0.0.0.0:7447 (repeatable)
    #[arg(long, value_name = "ENDPOINT")]
    zenoh_listen: Vec<String>,
    /// A Zenoh endpoint to connect to, e.g. tcp/192.168.1.10:7447
    /// (repeatable)
    #[arg(long, value_name = "ENDPOINT")]
    zenoh_connect: Vec<String>,
    /// A Zenoh configuration file (JSON5) to start from
    #[arg(long, value_name = "FILE")]
    zenoh_config: Option<PathBuf>,
}

/// The Zenoh options, checked (the default: none given).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZenohOptions {
    /// `--publish zenoh/TOPIC`: the topic.
    pub publish: Option<String>,
    /// `--publish-queue`.
    pub queue: usize,
    /// `--publish-log`.
    pub log: Option<PathBuf>,
    /// `--publish-wait`.
    pub wait: Duration,
    /// `--ros-domain`.
    pub domain: u32,
    /// `--zenoh-listen`.
    pub listen: Vec<String>,
    /// `--zenoh-connect`.
    pub connect: Vec<String>,
    /// `--zenoh-config`.
    pub config: Option<PathBuf>,
}

impl Default for ZenohOptions {
    fn default() -> Self {
        ZenohOptions {
            publish: None,
            queue: DEFAULT_QUEUE,
            log: None,
            wait: Duration::from_secs(DEFAULT_WAIT_S),
            domain: 0,
            listen: Vec::new(),
            connect: Vec::new(),
            config: None,
        }
    }
}

/// Default `--publish-wait`, in seconds.
pub const DEFAULT_WAIT_S: u64 = 10;

impl ZenohOptions {
    /// Whether any Zenoh option was given besides `--publish`/`--source`.
    fn any_given(&self) -> bool {
        self.log.is_some()
            || !self.listen.is_empty()
            || !self.connect.is_empty()
            || self.config.is_some()
    }
}

/// The topic of a `zenoh/TOPIC` argument (`None`: not a Zenoh one).
///
/// # Errors
/// An empty topic, or a build without the feature.
pub fn topic_of(v: &str) -> Result<Option<String>, String> {
    let Some(topic) = v.strip_prefix(PREFIX) else {
        return Ok(None);
    };
    if topic.is_empty() {
        return Err("`zenoh/` needs a topic after it, e.g. zenoh/camera/image_raw".into());
    }
    if !cfg!(feature = "zenoh") {
        return Err(NO_FEATURE.into());
    }
    #[cfg(feature = "zenoh")]
    crate::zenoh::image_key(0, topic).map_err(|e| e.to_string())?;
    Ok(Some(topic.to_owned()))
}

impl ZenohArgs {
    /// The options, checked; `zenoh_source` says whether `--source` is a
    /// Zenoh topic.
    ///
    /// # Errors
    /// One line naming the option.
    pub fn options(self, zenoh_source: bool) -> Result<ZenohOptions, String> {
        let publish = match self.publish.as_deref() {
            None => None,
            Some(v) => Some(
                topic_of(v)?
                    .ok_or_else(|| format!("--publish `{v}`: the only publisher is zenoh/TOPIC"))?,
            ),
        };
        let queue = self.publish_queue.unwrap_or(DEFAULT_QUEUE);
        if !(1..=1024).contains(&queue) {
            return Err(format!("--publish-queue {queue} is outside 1..=1024"));
        }
        let wait = self.publish_wait.unwrap_or(DEFAULT_WAIT_S);
        if wait > 600 {
            return Err(format!("--publish-wait {wait} is outside 0..=600 seconds"));
        }
        let domain = self.ros_domain.unwrap_or(0);
        if domain > 232 {
            return Err(format!("--ros-domain {domain} is outside 0..=232"));
        }
        let o = ZenohOptions {
            publish,
            queue,
            log: self.publish_log,
            wait: Duration::from_secs(wait),
            domain,
            listen: self.zenoh_listen,
            connect: self.zenoh_connect,
            config: self.zenoh_config,
        };
        let publisher_only = self.publish_queue.is_some() || self.publish_wait.is_some();
        if o.publish.is_none() && (publisher_only || o.log.is_some()) {
            return Err(
                "--publish-queue, --publish-log and --publish-wait need --publish zenoh/TOPIC"
                    .into(),
            );
        }
        if o.publish.is_none() && !zenoh_source && (o.any_given() || self.ros_domain.is_some()) {
            return Err("the --zenoh-* and --ros-domain options need --publish zenoh/TOPIC or --source zenoh/TOPIC".into());
        }
        if o.publish.is_some() && zenoh_source {
            return Err("--publish zenoh/... and --source zenoh/... are one process each".into());
        }
        Ok(o)
    }
}

/// Default `--publish-queue`.
pub const DEFAULT_QUEUE: usize = 2;

/// The options `--publish zenoh/...` cannot go with.
///
/// # Errors
/// One line naming the conflicting option.
pub fn conflicts(o: &crate::app::cli::Options) -> Result<(), String> {
    use crate::app::cli::{BackendChoice, SourceChoice};
    if o.zenoh.publish.is_none() {
        return Ok(());
    }
    if !matches!(
        o.backend,
        BackendChoice::Auto | BackendChoice::Sim | BackendChoice::Gpu
    ) {
        return Err(format!(
            "--publish runs on --backend sim or gpu (auto: sim), not --backend {}",
            o.backend.name()
        ));
    }
    for (given, flag) in [
        (o.two_process(), "--processes 2 / --role"),
        (o.copy, "--copy"),
        (o.trace.is_some(), "--trace"),
        (o.fault != crate::transport::host::Fault::None, "--fault"),
        (o.source != SourceChoice::Sensor, "--source"),
    ] {
        if given {
            return Err(format!("--publish cannot be used with {flag}"));
        }
    }
    Ok(())
}

#[cfg(feature = "zenoh")]
pub use with_feature::{main_publish, run_publish, source, PublishReport};

#[cfg(feature = "zenoh")]
mod with_feature {
    use super::*;
    use crate::app::check::Checker;
    use crate::app::cli::{BackendChoice, Options};
    use crate::app::multicast::{self as mc, MulticastReport, LIMIT};
    use crate::frame::{FrameLayout, FrameMut};
    use crate::multicast::cuda::CudaFanout;
    use crate::multicast::ring::MulticastRing;
    use crate::multicast::{ConsumerSpec, CudaWork, FanoutTransport, FrameGeometry};
    use crate::source::{Filled, Source, SourceError};
    use crate::transport::export::Exporter;
    use crate::zenoh::publish::{PublishConfig, PublishStats, ZenohPublisher};
    use crate::zenoh::source::{inverted_crc32, SourceConfig, SourceCounts, ZenohSource};
    use crate::zenoh::ZenohEndpoints;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use tegra_interop::driver::Context;

    fn endpoints(z: &ZenohOptions) -> ZenohEndpoints {
        ZenohEndpoints {
            listen: z.listen.clone(),
            connect: z.connect.clone(),
            config: z.config.clone(),
        }
    }

    /// What `--publish` reports.
    #[derive(Clone, Debug)]
    pub struct PublishReport {
        /// The ring's report (its `--consumers` lines, if any).
        pub ring: MulticastReport,
        /// The key published on.
        pub key: String,
        /// The publisher's counts.
        pub stats: PublishStats,
        /// Whether a subscriber matched before the first frame.
        pub matched: bool,
        /// `--publish-queue`.
        pub queue: usize,
    }

    impl PublishReport {
        /// Every frame offered and each published or dropped (counted), no
        /// put failed, and every `--consumers` consumer passed.
        pub fn passed(&self) -> bool {
            let s = self.stats;
            self.ring.passed()
                && s.offered == self.ring.frames
                && s.published + s.dropped == s.offered
                && s.failed == 0
        }

        /// The `zenoh publish` line.
        pub fn line(&self) -> String {
            let s = self.stats;
            format!(
                "zenoh publish: {} offered {}, published {}, dropped {} (queue {}), failed {}, \
                 subscriber at start: {}\n",
                self.key,
                s.offered,
                s.published,
                s.dropped,
                self.queue,
                s.failed,
                if self.matched { "yes" } else { "no" }
            )
        }

        /// The JSON report: the ring's, with `zenoh_publish`.
        pub fn json(&self) -> serde_json::Value {
            let mut v = self.ring.json();
            if let Some(o) = v.as_object_mut() {
                o.insert(
                    "zenoh_publish".into(),
                    serde_json::json!({
                        "key": self.key,
                        "offered": self.stats.offered,
                        "published": self.stats.published,
                        "dropped": self.stats.dropped,
                        "failed": self.stats.failed,
                        "queue": self.queue,
                        "subscriber_at_start": self.matched,
                        "passed": self.passed(),
                    }),
                );
            }
            v
        }
    }

    /// The session and the publisher of `--publish`.
    fn publisher(
        opts: &Options,
        layout: FrameLayout,
    ) -> Result<(::zenoh::Session, ZenohPublisher), String> {
        let z = &opts.zenoh;
        let topic = z.publish.clone().unwrap_or_default();
        let session = endpoints(z).open().map_err(|e| e.to_string())?;
        let config = PublishConfig {
            topic,
            domain: z.domain,
            queue: z.queue,
            frame_id: "camera".into(),
            layout,
            log: z.log.clone(),
            wait_subscriber: z.wait,
        };
        let p = ZenohPublisher::start(&session, &config).map_err(|e| e.to_string())?;
        Ok((session, p))
    }

    fn run_on<E: Exporter>(
        opts: &Options,
        ctx: &Context,
        exporter: E,
    ) -> Result<PublishReport, String> {
        let layout = crate::source::sensor::layout_of(&opts.sensor).map_err(|e| e.to_string())?;
        let geometry = FrameGeometry {
            stride: layout.pitch(),
            rows: layout.height() as usize,
        };
        let fanout = CudaFanout::open(ctx, exporter, geometry, opts.ring).map_err(String::from)?;
        let backend = format!("{} ({})", fanout.info().backend, fanout.exporter_name());
        let mut ring =
            MulticastRing::new(mc::Timed::new(fanout, opts.frames)).map_err(|e| e.to_string())?;
        let mut members = mc::attach_all(&mut ring, &opts.consumers, opts.frames, true)?;
        let (session, publisher) = publisher(opts, layout)?;
        let work = CudaWork::host(Box::new(publisher.reader()));
        ring.attach(ConsumerSpec::mailbox(work, LIMIT))
            .map_err(|e| format!("attaching the Zenoh publisher: {e}"))?;
        let produced = mc::produce(&mut ring, &mut members, opts.frames);
        let report = produced.and_then(|produced| {
            let all: Vec<&mc::Member> = members.iter().collect();
            Ok(MulticastReport {
                backend,
                frames: opts.frames,
                slots: opts.ring,
                geometry,
                produced,
                hop: mc::hops(&ring, &all)?.summary(),
                consumers: mc::lines(&ring, &members, opts.frames)?,
            })
        });
        let closed = mc::finish(ring);
        let key = publisher.key().to_string();
        let matched = publisher.matched_at_start();
        let stats = publisher.finish(LIMIT).map_err(|e| e.to_string())?;
        // Closing sends what Zenoh still holds in its transmit queue (a
        // process that just exits would lose the last messages).
        ::zenoh::Wait::wait(session.close())
            .map_err(|e| format!("closing the Zenoh session: {e}"))?;
        let ring = report?;
        closed?;
        Ok(PublishReport {
            ring,
            key,
            stats,
            matched,
            queue: opts.zenoh.queue,
        })
    }

    /// `pipeline --publish zenoh/TOPIC` (see the module docs).
    ///
    /// # Errors
    /// Set-up or run failure, as one line.
    pub fn run_publish(opts: &Options) -> Result<PublishReport, String> {
        if opts.backend == BackendChoice::Gpu {
            return run_gpu(opts);
        }
        let sim = crate::sim::Sim::new().map_err(|e| format!("cannot start the simulator: {e}"))?;
        crate::consumer::twin::register(&sim);
        let ctx = Context::new(sim.backend(), 0).map_err(|e| format!("CUDA context: {e}"))?;
        run_on(opts, &ctx, crate::transport::export::SimExporter)
    }

    #[cfg(feature = "vulkan")]
    fn run_gpu(opts: &Options) -> Result<PublishReport, String> {
        let (ctx, exporter) = mc::open_gpu()?;
        run_on(opts, &ctx, exporter)
    }

    #[cfg(not(feature = "vulkan"))]
    fn run_gpu(_: &Options) -> Result<PublishReport, String> {
        Err("--backend gpu needs a build with --features vulkan".into())
    }

    /// Runs `--publish` and prints its report (text or `--json`); the
    /// exit status: 0 when [`PublishReport::passed`].
    pub fn main_publish(opts: &Options) -> std::process::ExitCode {
        use crate::app::output;
        use std::process::ExitCode;
        match run_publish(opts) {
            Ok(r) => {
                let status = match r.passed() {
                    true => ExitCode::SUCCESS,
                    false => ExitCode::FAILURE,
                };
                let text = match opts.json {
                    true => format!("{}\n", r.json()),
                    false => format!("{}{}", r.ring.human(), r.line()),
                };
                let status = output::stdout_then("the report", &text, status);
                if !r.passed() {
                    output::stderr_line("error: the publisher or a consumer missed a frame");
                }
                status
            }
            Err(e) => {
                output::stderr_line(&format!("error: {e}"));
                if opts.json {
                    let object = format!("{}\n", crate::app::report::json_error("run", &e));
                    return output::stdout_then("the JSON error", &object, ExitCode::FAILURE);
                }
                ExitCode::FAILURE
            }
        }
    }

    /// A [`ZenohSource`] that says on stderr, when dropped at the end of
    /// the run, what it took and refused.
    struct Counted {
        inner: ZenohSource,
        counts: Arc<SourceCounts>,
    }

    impl Source for Counted {
        fn describe(&self) -> String {
            self.inner.describe()
        }
        fn layout(&self) -> FrameLayout {
            self.inner.layout()
        }
        fn fill(&mut self, frame: &mut FrameMut<'_>) -> Result<Filled, SourceError> {
            self.inner.fill(frame)
        }
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            let c = &self.counts;
            let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            let last = c
                .last_fault()
                .map(|f| format!("; last: {f}"))
                .unwrap_or_default();
            crate::app::output::stderr_line(&format!(
                "zenoh source: {} took {}, refused {} (wrong key {}, oversized {}, attachment {}, \
                 malformed {}, layout {}), sequence gaps {}{last}",
                self.inner.key(),
                n(&c.accepted),
                c.refused(),
                n(&c.wrong_key),
                n(&c.oversized),
                n(&c.attachment),
                n(&c.malformed),
                n(&c.layout),
                n(&c.sequence_gaps),
            ));
        }
    }

    /// `--source zenoh/TOPIC`: the source in `--width`/`--height`/`--format`,
    /// and the checker of the CRC-32 each sample had on arrival.
    ///
    /// # Errors
    /// The session or the subscriber could not be made.
    pub fn source(opts: &Options, topic: &str) -> Result<(Box<dyn Source>, Checker), String> {
        let layout = crate::source::sensor::layout_of(&opts.sensor).map_err(|e| e.to_string())?;
        let session = endpoints(&opts.zenoh)
            .open()
            .map_err(|e| format!("--source zenoh: {e}"))?;
        let config = SourceConfig {
            topic: topic.to_owned(),
            domain: opts.zenoh.domain,
            layout,
            queue: crate::zenoh::source::DEFAULT_QUEUE,
            first_limit: opts.peer_timeout.max(Duration::from_secs(30)),
            limit: opts.peer_timeout.max(Duration::from_secs(10)),
        };
        let inner =
            ZenohSource::subscribe(&session, config).map_err(|e| format!("--source zenoh: {e}"))?;
        let counts = inner.counts();
        let checker = Checker::Digest {
            digest: inverted_crc32,
        };
        Ok((Box::new(Counted { inner, counts }), checker))
    }
}

#[cfg(not(feature = "zenoh"))]
/// `--source zenoh/...` in a build without the feature (refused earlier
/// by the command line; kept for the type).
///
/// # Errors
/// Always: the feature is missing.
pub fn source(
    _: &crate::app::cli::Options,
    _: &str,
) -> Result<(Box<dyn crate::source::Source>, crate::app::check::Checker), String> {
    Err(NO_FEATURE.into())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn zenoh_topics_need_the_feature_and_a_name() {
        assert_eq!(topic_of("sensor").unwrap(), None);
        assert!(topic_of("zenoh/").unwrap_err().contains("needs a topic"));
        let with_feature = cfg!(feature = "zenoh");
        match topic_of("zenoh/camera/image_raw") {
            Ok(t) => {
                assert!(with_feature);
                assert_eq!(t.as_deref(), Some("camera/image_raw"));
            }
            Err(e) => {
                assert!(!with_feature);
                assert!(e.contains("--features zenoh"), "{e}");
            }
        }
        if cfg!(feature = "zenoh") {
            assert!(topic_of("zenoh/a b").is_err());
        }
    }
}
