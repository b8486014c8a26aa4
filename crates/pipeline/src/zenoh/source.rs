//! The Zenoh source: subscribes to a topic's images and feeds a ring.
//!
//! It subscribes to `<domain>/<topic>/*/*` (the topic under any type and
//! hash), so that a sample of the topic under another type or hash
//! arrives and is refused by name ([`SampleFault::WrongKey`]) rather than
//! never seen. Every sample is checked before a byte of it reaches the
//! ring, in this order: its key, its size against the largest message a
//! frame of the ring can be ([`SampleFault::Oversized`]), its attachment
//! where it has one, its CDR ([`SampleFault::Malformed`]), and its image
//! against the ring's layout ([`SampleFault::Layout`]). A refused sample
//! is counted ([`SourceCounts`]) and kept as the latest fault
//! ([`ZenohSource::last_fault`]); the source goes on to the next one. A
//! good one is copied into the write lease (the one copy on this side)
//! and its CRC-32 (IEEE) as it arrived is the frame's digest, which the
//! program's checker compares after the user's work.
//!
//! Memory: Zenoh hands samples over through a FIFO of
//! [`SourceConfig::queue`] samples; when it is full Zenoh's receiving
//! side waits, which holds back the TCP link and, with congestion control
//! *block*, the publisher's thread (whose own queue then drops frames).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::zenoh::handlers::{FifoChannel, FifoChannelHandler};
use ::zenoh::pubsub::Subscriber;
use ::zenoh::sample::Sample;
use ::zenoh::Wait as _;

use super::wire::{decode_image, image_key, ros_encoding, Attachment, WireError, MAX_STRING};
use super::{zerr, ZenohError};
use crate::frame::{FrameLayout, FrameMut};
use crate::source::{Filled, Source, SourceError};

/// Default [`SourceConfig::queue`].
pub const DEFAULT_QUEUE: usize = 4;

/// How a [`ZenohSource`] subscribes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceConfig {
    /// The ROS topic.
    pub topic: String,
    /// The ROS domain id.
    pub domain: u32,
    /// The ring's frame layout (every sample must match it).
    pub layout: FrameLayout,
    /// Samples Zenoh may hold for the source (at least 1).
    pub queue: usize,
    /// How long to wait for the first frame.
    pub first_limit: Duration,
    /// How long to wait for each later frame.
    pub limit: Duration,
}

/// Why a sample was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SampleFault {
    /// On another key than the source's (another type or hash).
    WrongKey {
        /// The sample's key.
        key: String,
        /// The source's key.
        expected: String,
    },
    /// Larger than any message a frame of the ring can be.
    Oversized {
        /// The sample's length.
        len: usize,
        /// The most accepted.
        max: usize,
    },
    /// An attachment that is not rmw_zenoh's.
    Attachment(WireError),
    /// Not a CDR `sensor_msgs/msg/Image`.
    Malformed(WireError),
    /// An image of another size, step or encoding than the ring's frames.
    Layout {
        /// What the sample held.
        got: String,
        /// The ring's layout.
        expected: FrameLayout,
    },
}

impl std::fmt::Display for SampleFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SampleFault::WrongKey { key, expected } => {
                write!(f, "a sample on `{key}`, not on `{expected}`")
            }
            SampleFault::Oversized { len, max } => {
                write!(
                    f,
                    "a sample of {len} bytes, over the {max} a frame can take"
                )
            }
            SampleFault::Attachment(e) => write!(f, "a sample's attachment: {e}"),
            SampleFault::Malformed(e) => write!(f, "a malformed sample: {e}"),
            SampleFault::Layout { got, expected } => {
                write!(
                    f,
                    "a sample holding {got}, the ring's frames are {expected}"
                )
            }
        }
    }
}

impl std::error::Error for SampleFault {}

/// What a source took and refused, shared with whoever holds a
/// [`ZenohSource::counts`] handle (the source itself goes into the ring).
#[derive(Debug, Default)]
pub struct SourceCounts {
    /// Samples written into the ring.
    pub accepted: AtomicU64,
    /// [`SampleFault::WrongKey`] samples.
    pub wrong_key: AtomicU64,
    /// [`SampleFault::Oversized`] samples.
    pub oversized: AtomicU64,
    /// [`SampleFault::Attachment`] samples.
    pub attachment: AtomicU64,
    /// [`SampleFault::Malformed`] samples.
    pub malformed: AtomicU64,
    /// [`SampleFault::Layout`] samples.
    pub layout: AtomicU64,
    /// Accepted samples whose attachment's sequence number was not the
    /// one after the previous sample's (frames lost or reordered before
    /// they reached the source).
    pub sequence_gaps: AtomicU64,
    last_fault: Mutex<Option<SampleFault>>,
}

impl SourceCounts {
    /// Samples refused, of every kind.
    pub fn refused(&self) -> u64 {
        [
            &self.wrong_key,
            &self.oversized,
            &self.attachment,
            &self.malformed,
            &self.layout,
        ]
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .sum()
    }

    /// The latest refused sample's fault.
    pub fn last_fault(&self) -> Option<SampleFault> {
        self.last_fault
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn fault(&self, fault: SampleFault) {
        let counter = match &fault {
            SampleFault::WrongKey { .. } => &self.wrong_key,
            SampleFault::Oversized { .. } => &self.oversized,
            SampleFault::Attachment(_) => &self.attachment,
            SampleFault::Malformed(_) => &self.malformed,
            SampleFault::Layout { .. } => &self.layout,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        *self.last_fault.lock().unwrap_or_else(|p| p.into_inner()) = Some(fault);
    }
}

/// The digest the program's checker compares for a frame from a Zenoh
/// source after the `Invert` work: the CRC-32 of the processed bytes
/// inverted back, which is the CRC-32 the sample's data had on arrival.
pub fn inverted_crc32(processed: &[u8]) -> u64 {
    let mut hasher = crc32fast::Hasher::new();
    let mut chunk = [0u8; 4096];
    for part in processed.chunks(chunk.len()) {
        let out = chunk.get_mut(..part.len()).unwrap_or_default();
        out.iter_mut().zip(part).for_each(|(o, b)| *o = !b);
        hasher.update(out);
    }
    u64::from(hasher.finalize())
}

/// A source of frames from a Zenoh topic (see the module docs).
pub struct ZenohSource {
    /// Keeps the session open while the source lives.
    _session: ::zenoh::Session,
    subscriber: Subscriber<FifoChannelHandler<Sample>>,
    key: String,
    config: SourceConfig,
    max_len: usize,
    counts: Arc<SourceCounts>,
    last_sequence: Option<i64>,
    taken: u64,
}

impl std::fmt::Debug for ZenohSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZenohSource")
            .field("key", &self.key)
            .field("taken", &self.taken)
            .finish_non_exhaustive()
    }
}

impl ZenohSource {
    /// Subscribes on `session` (the source keeps the subscriber; the
    /// session lives as long as any of its handles does).
    ///
    /// # Errors
    /// A bad topic, a queue of 0, Zenoh's refusal.
    pub fn subscribe(
        session: &::zenoh::Session,
        config: SourceConfig,
    ) -> Result<ZenohSource, ZenohError> {
        if config.queue == 0 {
            return Err(ZenohError::Config {
                what: "source queue 0".into(),
                reason: "a source holds at least one sample".into(),
            });
        }
        let key = image_key(config.domain, &config.topic)?;
        let name = config.topic.strip_prefix('/').unwrap_or(&config.topic);
        let subscriber = session
            .declare_subscriber(format!("{}/{name}/*/*", config.domain))
            .with(FifoChannel::new(config.queue))
            .wait()
            .map_err(zerr("declaring the subscriber"))?;
        // Encapsulation, stamp, two strings at their longest with length
        // and padding, four u32 fields, is_bigendian and padding, then the
        // data.
        let max_len = 4 + 8 + 2 * (4 + MAX_STRING + 1 + 3) + 4 * 4 + 4 + config.layout.frame_len();
        Ok(ZenohSource {
            _session: session.clone(),
            subscriber,
            key,
            config,
            max_len,
            counts: Arc::new(SourceCounts::default()),
            last_sequence: None,
            taken: 0,
        })
    }

    /// The key expression of the topic's images.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The counts, shared (they go on counting after the source moved
    /// into the ring).
    pub fn counts(&self) -> Arc<SourceCounts> {
        Arc::clone(&self.counts)
    }

    /// The latest refused sample's fault.
    pub fn last_fault(&self) -> Option<SampleFault> {
        self.counts.last_fault()
    }

    /// Checks `sample` and copies its image into `out`; the CRC-32 of the
    /// data and the stamp.
    fn take(&mut self, sample: &Sample, out: &mut [u8]) -> Result<(u32, Duration), SampleFault> {
        let key = sample.key_expr().as_str();
        if key != self.key {
            return Err(SampleFault::WrongKey {
                key: key.to_string(),
                expected: self.key.clone(),
            });
        }
        let len = sample.payload().len();
        if len > self.max_len {
            return Err(SampleFault::Oversized {
                len,
                max: self.max_len,
            });
        }
        let sequence = match sample.attachment() {
            Some(a) => Some(
                Attachment::decode(&a.to_bytes())
                    .map_err(SampleFault::Attachment)?
                    .sequence_number,
            ),
            None => None,
        };
        let bytes = sample.payload().to_bytes();
        let image = decode_image(&bytes).map_err(SampleFault::Malformed)?;
        let l = self.config.layout;
        let h = &image.header;
        let fits = h.width == l.width()
            && h.height == l.height()
            && h.step as usize == l.pitch()
            && h.encoding == ros_encoding(l.format())
            && h.is_bigendian == 0
            && image.data.len() == out.len();
        if !fits {
            return Err(SampleFault::Layout {
                got: format!(
                    "{}x{} {} (step {}, {} bytes, big endian {})",
                    h.width,
                    h.height,
                    h.encoding,
                    h.step,
                    image.data.len(),
                    h.is_bigendian
                ),
                expected: l,
            });
        }
        out.copy_from_slice(image.data);
        if let (Some(seq), Some(last)) = (sequence, self.last_sequence) {
            if seq != last.wrapping_add(1) {
                self.counts.sequence_gaps.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.last_sequence = sequence.or(self.last_sequence);
        let stamp = Duration::new(
            u64::try_from(h.sec).unwrap_or(0),
            h.nanosec.min(999_999_999),
        );
        Ok((crc32fast::hash(image.data), stamp))
    }
}

impl Source for ZenohSource {
    fn describe(&self) -> String {
        format!("zenoh subscriber of {}", self.key)
    }

    fn layout(&self) -> FrameLayout {
        self.config.layout
    }

    fn fill(&mut self, frame: &mut FrameMut<'_>) -> Result<Filled, SourceError> {
        let limit = match self.taken {
            0 => self.config.first_limit,
            _ => self.config.limit,
        };
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let sample = self
                .subscriber
                .recv_timeout(left)
                .map_err(|e| SourceError::Element {
                    element: self.describe(),
                    reason: format!("the subscriber's channel: {e}"),
                })?;
            let Some(sample) = sample else {
                return Err(SourceError::Timeout {
                    waiting_for: format!("sample on {} (frame {})", self.key, frame.index()),
                    limit,
                });
            };
            match self.take(&sample, frame.bytes_mut()) {
                Ok((crc, stamp)) => {
                    self.taken += 1;
                    self.counts.accepted.fetch_add(1, Ordering::Relaxed);
                    return Ok(Filled {
                        timestamp: Some(stamp),
                        digest: Some(u64::from(crc)),
                    });
                }
                Err(fault) => self.counts.fault(fault),
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn inverted_crc32_undoes_the_invert() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let inverted: Vec<u8> = data.iter().map(|b| !b).collect();
        assert_eq!(inverted_crc32(&inverted), u64::from(crc32fast::hash(&data)));
        // zlib.crc32(b"123456789") == 0xcbf43926, the CRC-32 check value.
        assert_eq!(
            inverted_crc32(&b"123456789".iter().map(|b| !b).collect::<Vec<_>>()),
            0xcbf4_3926
        );
    }
}
