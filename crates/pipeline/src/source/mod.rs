//! Where the ring's frames come from: a [`Source`] fills each frame the
//! ring leases for writing.
//!
//! The ring asks its source for one frame at a time, in order, on the
//! thread that holds the write lease; the source writes the frame's bytes
//! (a copy from its own buffer, a sensor readout, a decoder's output) and
//! says what it wrote in a [`Filled`]. The sensor model of [`crate::camera`]
//! is one source; GStreamer's `appsink` (feature `gstreamer`, `gst`) is
//! another.
//!
//! # Checking a frame against its source
//!
//! A source that can see its frames before the ring's copy (GStreamer's,
//! from an element upstream of the `appsink`) returns a digest of them in
//! [`Filled::digest`]. The digest is [`frame_digest`] of the frame's pixels
//! packed line after line: each line's first `width * bytes_per_pixel`
//! bytes, without the padding a pitch may add ([`pixel_digest`]). A checker
//! that reads the frame back after the consumer's work compares:
//! [`pixel_digest`] for work that leaves the pixels as they are,
//! [`check_inverted`] after the invert work (every pixel byte replaced by
//! its complement, `255 - b`).
//!
//! ```
//! use tegra_interop_pipeline::frame::{FrameLayout, PixelFormat};
//! use tegra_interop_pipeline::source::{check_inverted, frame_digest, pixel_digest};
//!
//! // A 2x2 RGBA frame with 4 bytes of padding after each line.
//! let layout = FrameLayout::with_pitch(2, 2, 12, PixelFormat::Rgba8)?;
//! let mut frame: Vec<u8> = (0..24).collect();
//! let packed: Vec<u8> = [&frame[0..8], &frame[12..20]].concat();
//! let digest = frame_digest(&packed);
//! assert_eq!(pixel_digest(&layout, &frame)?, digest);
//! // The consumer's invert work, then the check.
//! frame.iter_mut().for_each(|b| *b = !*b);
//! assert!(check_inverted(&layout, &frame, digest)?);
//! frame[1] ^= 1;
//! assert!(!check_inverted(&layout, &frame, digest)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::hash::Hasher as _;
use std::time::Duration;

use twox_hash::XxHash3_64;

use crate::frame::{FrameLayout, FrameMut};

#[cfg(feature = "gstreamer")]
pub mod gst;
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

/// The digest a source reports for a frame and a checker compares:
/// XXH3, 64-bit, seed 0, over `bytes`.
///
/// XXH3 (the `twox-hash` crate, MIT, no dependencies) because a checker
/// hashes every frame twice (the source's copy and the read-back) and
/// XXH3 runs at memory speed, several GB/s on one core, where a
/// byte-at-a-time hash such as FNV-1a manages about one; it is not a
/// cryptographic hash and need not be: it finds damaged or misplaced
/// bytes, not an adversary. Its output for a given input is fixed by the
/// XXH3 specification, so another implementation (the C `xxhash` library's
/// `XXH3_64bits`) gives the same value.
pub fn frame_digest(bytes: &[u8]) -> u64 {
    XxHash3_64::oneshot(bytes)
}

/// The digest of lines given one after another: equal to [`frame_digest`]
/// of their concatenation.
pub(crate) fn lines_digest<'a>(lines: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut hasher = XxHash3_64::with_seed(0);
    for line in lines {
        hasher.write(line);
    }
    hasher.finish()
}

/// A frame's bytes did not match its layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameLenError {
    /// The layout the bytes were meant to hold.
    pub layout: FrameLayout,
    /// How many bytes there were.
    pub len: usize,
}

impl fmt::Display for FrameLenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a {} frame is {} bytes, these are {}",
            self.layout,
            self.layout.frame_len(),
            self.len
        )
    }
}

impl std::error::Error for FrameLenError {}

/// Each line's pixel bytes (the first `width * bytes_per_pixel` of its
/// `pitch`), in order.
fn pixel_lines<'a>(
    layout: &FrameLayout,
    frame: &'a [u8],
) -> Result<impl Iterator<Item = &'a [u8]>, FrameLenError> {
    if frame.len() != layout.frame_len() {
        return Err(FrameLenError {
            layout: *layout,
            len: frame.len(),
        });
    }
    let line = layout.width() as usize * layout.format().bytes_per_pixel();
    // `FrameLayout` guarantees `line <= pitch`, so every chunk has a line.
    Ok(frame
        .chunks_exact(layout.pitch())
        .map(move |l| l.get(..line).unwrap_or(l)))
}

/// [`frame_digest`] of a frame's pixels packed line after line (a pitch's
/// padding left out): what a source reports in [`Filled::digest`].
///
/// # Errors
/// [`FrameLenError`] when `frame` is not [`FrameLayout::frame_len`] bytes.
pub fn pixel_digest(layout: &FrameLayout, frame: &[u8]) -> Result<u64, FrameLenError> {
    Ok(lines_digest(pixel_lines(layout, frame)?))
}

/// Whether `processed` is the frame whose [`pixel_digest`] is `digest`
/// with every pixel byte inverted (`!b`, that is `255 - b`), the work of
/// the consumer's invert kernel: inverts each line back and compares the
/// digest. Padding bytes after a line's pixels are not looked at.
///
/// # Errors
/// [`FrameLenError`] when `processed` is not [`FrameLayout::frame_len`]
/// bytes.
pub fn check_inverted(
    layout: &FrameLayout,
    processed: &[u8],
    digest: u64,
) -> Result<bool, FrameLenError> {
    let mut hasher = XxHash3_64::with_seed(0);
    let mut line = Vec::new();
    for l in pixel_lines(layout, processed)? {
        line.clear();
        line.extend(l.iter().map(|b| !b));
        hasher.write(&line);
    }
    Ok(hasher.finish() == digest)
}

/// [`frame_digest`] of `processed` with every byte inverted back (`!b`):
/// for a packed frame (pitch = line) after the invert work, equal to the
/// source's [`Filled::digest`] exactly when every byte came through the
/// ring and the work intact. The form of check a program that takes a
/// plain `fn(&[u8]) -> u64` uses; [`check_inverted`] is the same check
/// for any pitch.
pub fn inverted_frame_digest(processed: &[u8]) -> u64 {
    let mut hasher = XxHash3_64::with_seed(0);
    let mut chunk = [0u8; 4096];
    for part in processed.chunks(chunk.len()) {
        let out = &mut chunk[..part.len()];
        out.iter_mut().zip(part).for_each(|(o, b)| *o = !b);
        hasher.write(out);
    }
    hasher.finish()
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::PixelFormat;

    #[test]
    fn the_digest_is_xxh3_64_and_lines_give_the_same_value_as_the_whole() {
        // XXH3_64bits("") and XXH3_64bits("a") with seed 0, from the
        // reference implementation's test vectors.
        assert_eq!(frame_digest(b""), 0x2D06_8005_38D3_94C2);
        assert_eq!(frame_digest(b"a"), 0xE6C6_32B6_1E96_4E1F);
        let bytes: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let whole = frame_digest(&bytes);
        assert_eq!(lines_digest(bytes.chunks(333)), whole);
        assert_eq!(lines_digest(bytes.chunks(4096)), whole);
        assert_ne!(frame_digest(&bytes[1..]), whole);
    }

    #[test]
    fn pixel_digest_leaves_the_padding_out() {
        let layout = FrameLayout::with_pitch(3, 4, 16, PixelFormat::Rgba8).expect("layout");
        let mut frame: Vec<u8> = (0..64).collect();
        let packed: Vec<u8> = frame
            .chunks_exact(16)
            .flat_map(|l| l[..12].to_vec())
            .collect();
        let d = pixel_digest(&layout, &frame).expect("digest");
        assert_eq!(d, frame_digest(&packed));
        frame[13] = 0xff; // padding
        assert_eq!(pixel_digest(&layout, &frame).expect("digest"), d);
        frame[11] ^= 0x01; // a pixel byte
        assert_ne!(pixel_digest(&layout, &frame).expect("digest"), d);
        let e = pixel_digest(&layout, &frame[1..]).expect_err("short");
        assert_eq!(e.len, 63);
        assert!(e.to_string().contains("64 bytes"), "{e}");
    }

    #[test]
    fn check_inverted_accepts_the_inverted_frame_only() {
        let layout = FrameLayout::packed(64, 8, PixelFormat::Gray16).expect("layout");
        let frame: Vec<u8> = (0..layout.frame_len()).map(|i| (i * 31) as u8).collect();
        let digest = pixel_digest(&layout, &frame).expect("digest");
        let mut inverted: Vec<u8> = frame.iter().map(|b| 255 - b).collect();
        assert!(check_inverted(&layout, &inverted, digest).expect("check"));
        // The frame as it was (work not done) fails, as does one flipped bit
        // anywhere in the pixels.
        assert!(!check_inverted(&layout, &frame, digest).expect("check"));
        for at in [0, layout.frame_len() / 2, layout.frame_len() - 1] {
            inverted[at] ^= 0x80;
            assert!(!check_inverted(&layout, &inverted, digest).expect("check"));
            inverted[at] ^= 0x80;
        }
        assert!(check_inverted(&layout, &inverted[..10], digest).is_err());
        // The packed form gives the same answer.
        assert_eq!(inverted_frame_digest(&inverted), digest);
        inverted[5] ^= 0x10;
        assert_ne!(inverted_frame_digest(&inverted), digest);
    }
}
