//! Where the ring's frames come from: a [`Source`] fills each frame the
//! ring leases for writing.
//!
//! The ring asks its source for one frame at a time, in order, on the
//! thread that holds the write lease; the source writes the frame's bytes
//! (a copy from its own buffer, a sensor readout, a decoder's output) and
//! says what it wrote in a [`Filled`]. The sensor model of [`crate::camera`]
//! is one source; GStreamer's `appsink` (feature `gstreamer`) is another.

use std::fmt;
use std::time::Duration;

use crate::frame::{FrameLayout, FrameMut};

pub mod sensor;
pub use sensor::SensorSource;

/// What a source said about one frame it wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Filled {
    /// The frame's presentation time from the source, where it has one.
    pub timestamp: Option<Duration>,
    /// A digest of the bytes as the source's upstream produced them,
    /// computed independently of the ring's copy (for a check after the
    /// frame's work), where the source can give one.
    pub digest: Option<u64>,
}

/// Why a source could not give a frame.
#[derive(Debug)]
#[non_exhaustive]
pub enum SourceError {
    /// The source has no more frames (end of stream) after `frames`
    /// frames.
    Ended {
        /// Frames it gave before the end.
        frames: u64,
    },
    /// The source's frames do not have the ring's layout.
    Layout {
        /// The element or part that produced them.
        element: String,
        /// What the ring wants.
        expected: FrameLayout,
        /// What the source offered, in its own words.
        got: String,
    },
    /// A part of the source failed or is missing.
    Element {
        /// The element or part.
        element: String,
        /// What went wrong, and where known the fix.
        reason: String,
    },
    /// No frame came within the limit.
    Timeout {
        /// What was waited for.
        waiting_for: String,
        /// The limit.
        limit: Duration,
    },
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceError::Ended { frames } => write!(f, "the source ended after {frames} frame(s)"),
            SourceError::Layout {
                element,
                expected,
                got,
            } => write!(f, "`{element}` gives {got}, the ring wants {expected}"),
            SourceError::Element { element, reason } => write!(f, "`{element}`: {reason}"),
            SourceError::Timeout { waiting_for, limit } => {
                write!(f, "no {waiting_for} within {limit:?}")
            }
        }
    }
}

impl std::error::Error for SourceError {}

/// A producer of frames for the ring.
pub trait Source: Send {
    /// A short description for reports and errors (e.g. `sensor model` or
    /// the GStreamer pipeline).
    fn describe(&self) -> String;
    /// The layout of every frame it gives.
    fn layout(&self) -> FrameLayout;
    /// Writes the next frame into `frame` (its index is the ring's frame
    /// number; frames come in order).
    ///
    /// # Errors
    /// [`SourceError::Ended`] once there are no more frames; the other
    /// variants when the source failed.
    fn fill(&mut self, frame: &mut FrameMut<'_>) -> Result<Filled, SourceError>;
    /// For a source whose frames are triggered by pulses on a sync line:
    /// the pulses sent so far (a program checks one per frame). `None`,
    /// the default: no such line.
    fn trigger_pulses(&self) -> Option<u64> {
        None
    }
}
