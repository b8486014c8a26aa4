//! The Zenoh consumer: publishes each frame of a multicast ring as a CDR
//! `sensor_msgs/msg/Image` (see [`super::wire`] for the bytes).
//!
//! [`ZenohPublisher::reader`] is a [`HostRead`]: attach it to a
//! [`CudaFanout`](crate::multicast::cuda::CudaFanout) ring as a mailbox
//! consumer ([`CudaWork::host`](crate::multicast::CudaWork::host)). For
//! each frame it writes the message's CDR header into a fresh buffer and
//! copies the frame from the slot's host mapping right after it: the one
//! copy of the frame on this side (the buffer is then moved into Zenoh,
//! not copied). The buffer goes into a queue of [`PublishConfig::queue`]
//! messages; a frame offered while the queue is full is dropped BEFORE it
//! is copied and counted ([`PublishStats::dropped`]), so the producer
//! never waits for the network, spends no copy on a frame that will not
//! be sent (the reader runs on the producer's thread), and the memory held
//! is at most `queue + 1` frames here.
//!
//! A thread of the publisher's own takes the messages in order and puts
//! them with congestion control *block* (a slow subscriber slows this
//! thread, not the producer; Zenoh bounds each blocked put by its
//! `queue/congestion_control/block/wait_before_close`, 5 s by default),
//! the rmw_zenoh attachment on each. With a publish log it writes one
//! line per published message: `<sequence> <frame> <crc32 of the data, 8
//! hex digits>` (CRC-32 IEEE, as Python's `zlib.crc32`).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ::zenoh::bytes::ZBytes;
use ::zenoh::qos::CongestionControl;
use ::zenoh::Wait as _;

use super::wire::{encode_prefix, image_key, ros_encoding, Attachment, ImageHeader, GID_LEN};
use super::{zerr, ZenohError};
use crate::frame::FrameLayout;
use crate::multicast::cuda::{HostRead, HostSlot};
use crate::transport::TransportError;

/// Default [`PublishConfig::queue`] (`--publish-queue`).
pub const DEFAULT_QUEUE: usize = 2;

/// Largest [`PublishConfig::queue`].
pub const MAX_QUEUE: usize = 1024;

/// How a [`ZenohPublisher`] publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishConfig {
    /// The ROS topic (`camera/image_raw`).
    pub topic: String,
    /// The ROS domain id.
    pub domain: u32,
    /// Messages waiting to be put, at most (`1..=MAX_QUEUE`).
    pub queue: usize,
    /// `header.frame_id` of every message.
    pub frame_id: String,
    /// The layout of every frame.
    pub layout: FrameLayout,
    /// Where to write the publish log, if anywhere.
    pub log: Option<PathBuf>,
    /// How long [`ZenohPublisher::start`] waits for a matching subscriber
    /// before it returns (zero: no wait).
    pub wait_subscriber: Duration,
}

/// What a publisher did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublishStats {
    /// Frames the ring handed to it.
    pub offered: u64,
    /// Messages Zenoh accepted.
    pub published: u64,
    /// Frames dropped: offered while the queue was full (not copied), or
    /// offered after the end.
    pub dropped: u64,
    /// Puts Zenoh refused.
    pub failed: u64,
}

struct Message {
    frame: u64,
    buf: Vec<u8>,
    data_at: usize,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Message>,
    closed: bool,
    stats: PublishStats,
    /// The first error of the publisher thread (a put, the log).
    error: Option<String>,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    cap: usize,
}

fn lock(m: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running Zenoh publisher of images (see the module docs). Its drop
/// asks its thread to stop and does not wait; [`ZenohPublisher::finish`]
/// waits, bounded.
pub struct ZenohPublisher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    key: String,
    header: ImageHeader,
    frame_len: usize,
    matched: bool,
}

impl std::fmt::Debug for ZenohPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZenohPublisher")
            .field("key", &self.key)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// The [`HostRead`] of a [`ZenohPublisher`]: attach it to the ring.
pub struct PublishReader {
    shared: Arc<Shared>,
    header: ImageHeader,
    frame_len: usize,
}

impl std::fmt::Debug for PublishReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublishReader").finish_non_exhaustive()
    }
}

fn now_ns() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

impl HostRead for PublishReader {
    fn name(&self) -> &str {
        "zenoh-publish"
    }

    fn frame(&mut self, frame: u64, slot: &HostSlot<'_>) -> Result<u64, TransportError> {
        {
            // A full queue: drop this frame now, before its copy.
            let mut q = lock(&self.shared.queue);
            if q.items.len() >= self.shared.cap {
                q.stats.offered += 1;
                q.stats.dropped += 1;
                return Ok(0);
            }
        }
        let now = now_ns();
        self.header.sec = i32::try_from(now.as_secs()).unwrap_or(i32::MAX);
        self.header.nanosec = now.subsec_nanos();
        let mut buf = Vec::with_capacity(128 + self.frame_len);
        let data_at = encode_prefix(&self.header, self.frame_len, &mut buf)
            .map_err(|e| TransportError::refused(e.to_string()))?;
        buf.resize(data_at + self.frame_len, 0);
        slot.read_into(buf.get_mut(data_at..).unwrap_or_default())?;
        let mut q = lock(&self.shared.queue);
        q.stats.offered += 1;
        if q.closed {
            q.stats.dropped += 1;
            return Ok(0);
        }
        q.items.push_back(Message {
            frame,
            buf,
            data_at,
        });
        while q.items.len() > self.shared.cap {
            q.items.pop_front();
            q.stats.dropped += 1;
        }
        drop(q);
        self.shared.wake.notify_one();
        Ok(0)
    }
}

/// The publisher thread's side: the Zenoh publisher, the log, the GID.
struct Sender {
    /// Keeps the session open while the thread puts.
    _session: ::zenoh::Session,
    publisher: ::zenoh::pubsub::Publisher<'static>,
    log: Option<BufWriter<File>>,
    gid: [u8; GID_LEN],
    sequence: i64,
}

impl Sender {
    /// Puts one message; its log line.
    fn put(&mut self, m: Message) -> Result<(), String> {
        // The CRC is for the log only: no pass over the frame without one.
        let crc = self
            .log
            .as_ref()
            .map(|_| crc32fast::hash(m.buf.get(m.data_at..).unwrap_or_default()));
        self.sequence += 1;
        let attachment = Attachment {
            sequence_number: self.sequence,
            source_timestamp: i64::try_from(now_ns().as_nanos()).unwrap_or(i64::MAX),
            source_gid: self.gid,
        };
        self.publisher
            .put(ZBytes::from(m.buf))
            .attachment(attachment.encode())
            .wait()
            .map_err(|e| format!("put of frame {}: {e}", m.frame))?;
        if let (Some(log), Some(crc)) = (&mut self.log, crc) {
            writeln!(log, "{} {} {crc:08x}", self.sequence, m.frame)
                .map_err(|e| format!("the publish log: {e}"))?;
        }
        Ok(())
    }
}

fn publish_loop(shared: Arc<Shared>, mut sender: Sender) {
    loop {
        let next = {
            let mut q = lock(&shared.queue);
            while q.items.is_empty() && !q.closed {
                q = match shared.wake.wait_timeout(q, Duration::from_millis(100)) {
                    Ok((g, _)) => g,
                    Err(p) => p.into_inner().0,
                };
            }
            q.items.pop_front()
        };
        let Some(m) = next else { break };
        let result = sender.put(m);
        let mut q = lock(&shared.queue);
        match result {
            Ok(()) => q.stats.published += 1,
            Err(e) => {
                q.stats.failed += 1;
                q.error.get_or_insert(e);
            }
        }
    }
    if let Some(Err(e)) = sender.log.as_mut().map(|l| l.flush()) {
        lock(&shared.queue)
            .error
            .get_or_insert(format!("the publish log: {e}"));
    }
}

/// Waits up to `limit` for a subscriber matching `publisher`.
fn wait_matching(
    publisher: &::zenoh::pubsub::Publisher<'static>,
    limit: Duration,
) -> Result<bool, ZenohError> {
    let deadline = Instant::now() + limit;
    loop {
        let status = publisher
            .matching_status()
            .wait()
            .map_err(zerr("reading the publisher's matching status"))?;
        if status.matching() {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl ZenohPublisher {
    /// Declares the publisher on `session` and starts its thread; waits
    /// up to [`PublishConfig::wait_subscriber`] for a subscriber.
    ///
    /// # Errors
    /// A bad topic or queue size, a log that cannot be created, Zenoh's
    /// refusal.
    pub fn start(
        session: &::zenoh::Session,
        config: &PublishConfig,
    ) -> Result<ZenohPublisher, ZenohError> {
        if !(1..=MAX_QUEUE).contains(&config.queue) {
            return Err(ZenohError::Config {
                what: format!("publish queue {}", config.queue),
                reason: format!("outside 1..={MAX_QUEUE}"),
            });
        }
        let key = image_key(config.domain, &config.topic)?;
        let log = match &config.log {
            Some(path) => Some(BufWriter::new(File::create(path).map_err(ZenohError::Log)?)),
            None => None,
        };
        let publisher = session
            .declare_publisher(key.clone())
            .congestion_control(CongestionControl::Block)
            .wait()
            .map_err(zerr("declaring the publisher"))?;
        let matched = wait_matching(&publisher, config.wait_subscriber)?;
        let layout = config.layout;
        let header = ImageHeader {
            sec: 0,
            nanosec: 0,
            frame_id: config.frame_id.clone(),
            height: layout.height(),
            width: layout.width(),
            encoding: ros_encoding(layout.format()).to_string(),
            is_bigendian: 0,
            step: u32::try_from(layout.pitch()).unwrap_or(u32::MAX),
        };
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            cap: config.queue,
        });
        let sender = Sender {
            _session: session.clone(),
            publisher,
            log,
            gid: session.zid().to_le_bytes(),
            sequence: 0,
        };
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("zenoh-publish".into())
            .spawn(move || publish_loop(for_thread, sender))
            .map_err(ZenohError::Log)?;
        Ok(ZenohPublisher {
            shared,
            thread: Some(thread),
            key,
            header,
            frame_len: layout.frame_len(),
            matched,
        })
    }

    /// The key expression it publishes on.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether a subscriber matched before [`ZenohPublisher::start`]
    /// returned.
    pub fn matched_at_start(&self) -> bool {
        self.matched
    }

    /// A reader to attach to the ring (each reader feeds this publisher).
    pub fn reader(&self) -> PublishReader {
        PublishReader {
            shared: Arc::clone(&self.shared),
            header: self.header.clone(),
            frame_len: self.frame_len,
        }
    }

    /// What it did so far.
    pub fn stats(&self) -> PublishStats {
        lock(&self.shared.queue).stats
    }

    /// Puts what is queued, then stops: waits up to `limit` for the
    /// thread; the final counts. A message Zenoh accepted may still wait
    /// in its transmit queue: close the session (`Session::close`) before
    /// the process ends, which sends it.
    ///
    /// # Errors
    /// [`ZenohError::Timeout`] when the thread did not end in time (it is
    /// left to end on its own); the first put or log error.
    pub fn finish(mut self, limit: Duration) -> Result<PublishStats, ZenohError> {
        lock(&self.shared.queue).closed = true;
        self.shared.wake.notify_all();
        let deadline = Instant::now() + limit;
        if let Some(t) = self.thread.take() {
            while !t.is_finished() {
                if Instant::now() >= deadline {
                    return Err(ZenohError::Timeout {
                        waiting_for: format!("the publisher of {} to put its queue", self.key),
                        limit,
                    });
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            let _ended = t.join();
        }
        let q = lock(&self.shared.queue);
        match &q.error {
            Some(e) => Err(ZenohError::Zenoh {
                during: "publishing",
                reason: e.clone(),
            }),
            None => Ok(q.stats),
        }
    }
}

impl Drop for ZenohPublisher {
    fn drop(&mut self) {
        lock(&self.shared.queue).closed = true;
        self.shared.wake.notify_all();
    }
}
