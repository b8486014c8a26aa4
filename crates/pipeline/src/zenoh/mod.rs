//! Frames across hosts over [Zenoh](https://zenoh.io), readable by a ROS 2
//! node on rmw_zenoh (feature `zenoh`).
//!
//! - [`publish::ZenohPublisher`]: a consumer of a multicast ring (a
//!   [`HostRead`](crate::multicast::cuda::HostRead) attached as a mailbox
//!   consumer of a [`CudaFanout`](crate::multicast::cuda::CudaFanout)) that
//!   copies each frame once, from the slot's host mapping straight into
//!   the message buffer after its CDR header, and hands it to a publisher
//!   thread through a bounded queue: when the network is slower than the
//!   producer, a frame offered to a full queue is dropped before its copy
//!   (counted), and the producer never waits for the network.
//! - [`source::ZenohSource`]: a [`Source`](crate::source::Source) that
//!   subscribes to a topic, bounds and checks every sample (typed
//!   [`source::SampleFault`]s for oversized, malformed, wrong-key and
//!   wrong-layout samples, counted, the run goes on) and writes each good
//!   frame into the ring's write lease, with the CRC-32 its data had on
//!   arrival as the frame's digest.
//! - [`wire`]: the key expression, CDR and attachment, as rmw_zenoh lays
//!   them out.
//!
//! Sessions are peers ([`ZenohEndpoints`]): listen on or connect to TCP
//! endpoints given, no router needed; multicast scouting is off when
//! endpoints are given, so two processes find each other only through
//! them. A connecting peer retries an endpoint that is not up yet (every
//! 0.1 s at first, at most every second). Verified where: over TCP loopback on one Linux machine
//! (`tests/zenoh_loopback.rs`, and the Python eclipse-zenoh peers of
//! `tests/peers/`, in CI); not yet between two hosts, nor with a ROS 2
//! node (no ROS 2 installation here: the CDR is checked with the
//! independent `rosbags` decoder instead). The publisher declares no
//! rmw_zenoh liveliness token yet, so `ros2 topic list` does not show the
//! topic, though a subscriber on it receives the frames.

pub mod publish;
pub mod source;
pub mod wire;

use std::fmt;
use std::path::PathBuf;

use ::zenoh::Wait as _;

pub use wire::{image_key, WireError};

/// Where a peer session listens and connects (`--zenoh-listen`,
/// `--zenoh-connect`), or a Zenoh configuration file (`--zenoh-config`)
/// those are added to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ZenohEndpoints {
    /// Endpoints to listen on, such as `tcp/127.0.0.1:7447`.
    pub listen: Vec<String>,
    /// Endpoints to connect to.
    pub connect: Vec<String>,
    /// A Zenoh configuration file (JSON5) to start from.
    pub config: Option<PathBuf>,
}

/// Why a Zenoh part failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ZenohError {
    /// The session's configuration was refused.
    Config {
        /// What was refused.
        what: String,
        /// Zenoh's reason.
        reason: String,
    },
    /// Zenoh failed at `during`.
    Zenoh {
        /// What was being done.
        during: &'static str,
        /// Zenoh's reason.
        reason: String,
    },
    /// A topic, payload or attachment was refused.
    Wire(WireError),
    /// The publish log could not be written.
    Log(std::io::Error),
    /// A wait ran past its limit.
    Timeout {
        /// What was waited for.
        waiting_for: String,
        /// The limit.
        limit: std::time::Duration,
    },
}

impl fmt::Display for ZenohError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ZenohError::Config { what, reason } => {
                write!(f, "Zenoh configuration {what}: {reason}")
            }
            ZenohError::Zenoh { during, reason } => write!(f, "Zenoh, {during}: {reason}"),
            ZenohError::Wire(e) => write!(f, "{e}"),
            ZenohError::Log(e) => write!(f, "the publish log: {e}"),
            ZenohError::Timeout { waiting_for, limit } => {
                write!(f, "waited {limit:?} for {waiting_for}")
            }
        }
    }
}

impl std::error::Error for ZenohError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ZenohError::Wire(e) => Some(e),
            ZenohError::Log(e) => Some(e),
            _ => None,
        }
    }
}

impl From<WireError> for ZenohError {
    fn from(e: WireError) -> Self {
        ZenohError::Wire(e)
    }
}

/// A Zenoh error during `during`.
pub(crate) fn zerr(during: &'static str) -> impl Fn(::zenoh::Error) -> ZenohError {
    move |e| ZenohError::Zenoh {
        during,
        reason: e.to_string(),
    }
}

fn json_list(items: &[String]) -> Result<String, ZenohError> {
    let quoted: Vec<String> = items
        .iter()
        .map(|e| {
            if e.contains('"') || e.contains('\\') {
                Err(ZenohError::Config {
                    what: format!("endpoint `{e}`"),
                    reason: "an endpoint has no quotes or backslashes".into(),
                })
            } else {
                Ok(format!("\"{e}\""))
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(format!("[{}]", quoted.join(",")))
}

impl ZenohEndpoints {
    /// The peer-mode configuration these endpoints give.
    ///
    /// # Errors
    /// [`ZenohError::Config`] for a file Zenoh cannot read or an endpoint
    /// it refuses.
    pub fn config(&self) -> Result<::zenoh::Config, ZenohError> {
        let mut c = match &self.config {
            Some(path) => ::zenoh::Config::from_file(path).map_err(|e| ZenohError::Config {
                what: format!("file {}", path.display()),
                reason: e.to_string(),
            })?,
            None => ::zenoh::Config::default(),
        };
        let mut set = |key: &str, value: String| {
            c.insert_json5(key, &value).map_err(|e| ZenohError::Config {
                what: format!("{key} = {value}"),
                reason: e.to_string(),
            })
        };
        if self.config.is_none() {
            set("mode", "\"peer\"".into())?;
        }
        if !self.listen.is_empty() {
            set("listen/endpoints", json_list(&self.listen)?)?;
        }
        if !self.connect.is_empty() {
            set("connect/endpoints", json_list(&self.connect)?)?;
            if self.config.is_none() {
                // Retry a peer that is not up yet every 0.1 s at first, at
                // most every second (Zenoh's defaults: 1 s, up to 4 s).
                set(
                    "connect/retry",
                    "{period_init_ms: 100, period_max_ms: 1000, period_increase_factor: 2}".into(),
                )?;
            }
        }
        if !(self.listen.is_empty() && self.connect.is_empty()) {
            set("scouting/multicast/enabled", "false".into())?;
        }
        Ok(c)
    }

    /// Opens a session with [`ZenohEndpoints::config`].
    ///
    /// # Errors
    /// The configuration's errors; Zenoh's (a port in use, say).
    pub fn open(&self) -> Result<::zenoh::Session, ZenohError> {
        ::zenoh::open(self.config()?)
            .wait()
            .map_err(zerr("opening a session"))
    }
}
