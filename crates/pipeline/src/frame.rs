//! The frame types every part of the ring shares: a frame's layout, the
//! pixel formats the ring knows, and the writable view a source fills.
//!
//! Also the frame types of the ring's protocol: [`FrameGeometry`] (the
//! bytes a slot holds), [`Completion`] (what the consumer reports per
//! frame) and [`process_frame`] (the project's check-and-invert work on the
//! host).
//!
//! This module sits below the ring, the transports, the consumer and the
//! sources (they all import it; it imports none of them).

use std::fmt;
use std::time::{Duration, Instant};

use crate::camera::TestPattern;
use crate::error::TransportError;

/// Pixel formats a frame of the ring may hold. The ring moves bytes; the
/// format tells a user's work how to read them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PixelFormat {
    /// One byte per pixel (raw Bayer or grey).
    Gray8,
    /// Two bytes per pixel, little-endian (raw 10/12-bit data in 16 bits).
    Gray16,
    /// Four bytes per pixel: R, G, B, A.
    Rgba8,
    /// Four bytes per pixel: B, G, R, A.
    Bgra8,
}

impl PixelFormat {
    /// Bytes one pixel takes in memory.
    pub const fn bytes_per_pixel(self) -> usize {
        match self {
            PixelFormat::Gray8 => 1,
            PixelFormat::Gray16 => 2,
            PixelFormat::Rgba8 | PixelFormat::Bgra8 => 4,
        }
    }

    /// The format's name as GStreamer's `video/x-raw` caps spell it
    /// (`GRAY8`, `GRAY16_LE`, `RGBA`, `BGRA`).
    pub const fn caps_name(self) -> &'static str {
        match self {
            PixelFormat::Gray8 => "GRAY8",
            PixelFormat::Gray16 => "GRAY16_LE",
            PixelFormat::Rgba8 => "RGBA",
            PixelFormat::Bgra8 => "BGRA",
        }
    }
}

impl fmt::Display for PixelFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.caps_name())
    }
}

/// Why a [`FrameLayout`] was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutError(String);

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "frame layout refused: {}", self.0)
    }
}

impl std::error::Error for LayoutError {}

/// One frame's layout: `height` lines of `pitch` bytes, each line holding
/// `width` pixels of `format` at its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameLayout {
    width: u32,
    height: u32,
    pitch: usize,
    format: PixelFormat,
}

impl FrameLayout {
    /// A layout with lines packed tightly (`pitch = width * bytes_per_pixel`).
    ///
    /// # Errors
    /// Refused when a side is zero or the frame's size overflows `usize`.
    pub fn packed(width: u32, height: u32, format: PixelFormat) -> Result<Self, LayoutError> {
        let pitch = (width as usize)
            .checked_mul(format.bytes_per_pixel())
            .ok_or_else(|| LayoutError(format!("{width} pixels of {format} overflow a line")))?;
        Self::with_pitch(width, height, pitch, format)
    }

    /// A layout with `pitch` bytes per line (at least a line of pixels).
    ///
    /// # Errors
    /// Refused when a side is zero, the pitch is shorter than a line of
    /// pixels, or the frame's size overflows `usize`.
    pub fn with_pitch(
        width: u32,
        height: u32,
        pitch: usize,
        format: PixelFormat,
    ) -> Result<Self, LayoutError> {
        if width == 0 || height == 0 {
            return Err(LayoutError(format!("{width}x{height}: a side is zero")));
        }
        let line = (width as usize)
            .checked_mul(format.bytes_per_pixel())
            .ok_or_else(|| LayoutError(format!("{width} pixels of {format} overflow a line")))?;
        if pitch < line {
            return Err(LayoutError(format!(
                "pitch {pitch} is shorter than a line of {width} {format} pixels ({line} bytes)"
            )));
        }
        pitch
            .checked_mul(height as usize)
            .ok_or_else(|| LayoutError(format!("{height} lines of {pitch} bytes overflow")))?;
        Ok(FrameLayout {
            width,
            height,
            pitch,
            format,
        })
    }

    /// Pixels per line.
    pub const fn width(&self) -> u32 {
        self.width
    }

    /// Lines per frame.
    pub const fn height(&self) -> u32 {
        self.height
    }

    /// Bytes from one line's start to the next's.
    pub const fn pitch(&self) -> usize {
        self.pitch
    }

    /// The pixels' format.
    pub const fn format(&self) -> PixelFormat {
        self.format
    }

    /// Bytes per frame (`pitch * height`).
    pub const fn frame_len(&self) -> usize {
        self.pitch * self.height as usize
    }
}

impl fmt::Display for FrameLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}x{} {} (pitch {})",
            self.width, self.height, self.format, self.pitch
        )
    }
}

/// A frame being written: its number, its layout and its bytes (exactly
/// [`FrameLayout::frame_len`] of them). Made by the ring from a write lease
/// for the time of one [`crate::source::Source::fill`] call.
#[derive(Debug)]
pub struct FrameMut<'a> {
    index: u64,
    layout: FrameLayout,
    bytes: &'a mut [u8],
}

impl<'a> FrameMut<'a> {
    /// A view of `bytes` as frame `index` of `layout`.
    ///
    /// # Errors
    /// Refused when `bytes` is not exactly one frame long.
    pub fn new(index: u64, layout: FrameLayout, bytes: &'a mut [u8]) -> Result<Self, LayoutError> {
        if bytes.len() != layout.frame_len() {
            return Err(LayoutError(format!(
                "a {layout} frame is {} bytes, the view has {}",
                layout.frame_len(),
                bytes.len()
            )));
        }
        Ok(FrameMut {
            index,
            layout,
            bytes,
        })
    }

    /// The frame's number (0, 1, 2, ... in the ring's order).
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The frame's layout.
    pub fn layout(&self) -> FrameLayout {
        self.layout
    }

    /// The frame's bytes, to write (they hold an earlier frame until then).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.bytes
    }

    /// The frame's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes
    }
}

/// Layout of one frame: `rows` lines of `stride` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameGeometry {
    /// Bytes per line.
    pub stride: usize,
    /// Number of lines.
    pub rows: usize,
}

impl FrameGeometry {
    /// Bytes per frame.
    pub fn frame_len(&self) -> usize {
        self.stride * self.rows
    }
}

/// One processed frame, as reported by the consumer side.
#[derive(Clone, Copy, Debug)]
pub struct Completion {
    /// Slot the frame was in.
    pub slot: usize,
    /// Frame index.
    pub frame: u64,
    /// Bytes that did not match the test pattern when the consumer read them.
    pub mismatches: u64,
    /// Time the consumer spent in [`process_frame`] (after its wait).
    pub process: Duration,
    /// Time the consumer was occupied with the frame after its wait: the
    /// processing plus whatever else it does per frame (copies, counter
    /// read-back, the *free* signal; on a GPU also any time its stream sat
    /// behind other GPU work). Equal to `process` where nothing else is done.
    pub busy: Duration,
    /// When the frame was known to be finished on the host.
    pub finished: Instant,
}

/// The project's own per-frame work, which every backend must do
/// identically (its CUDA kernel computes the same): count the bytes that
/// differ from `TestPattern::new(frame, stride)`, and invert every byte in
/// place.
pub fn process_frame(frame: u64, stride: usize, bytes: &mut [u8]) -> u64 {
    let pattern = TestPattern::new(frame, stride);
    let mut mismatches = 0u64;
    if stride == 0 {
        return 0;
    }
    for (row, line) in bytes.chunks_mut(stride).enumerate() {
        for (col, b) in line.iter_mut().enumerate() {
            mismatches += u64::from(*b != pattern.byte(row, col));
            *b = !*b;
        }
    }
    mismatches
}

/// A slot's memory as a transport keeps it, moved out of the transport
/// while a write lease holds it (the transport cannot reach it then).
pub(crate) trait LeasedMemory: Send + 'static {
    /// The memory's bytes, for the lease holder's writes (`slot` names it
    /// in an error).
    fn bytes_mut(&mut self, slot: usize) -> Result<&mut [u8], TransportError>;
    /// The memory, for the transport to take its own type back.
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_refuse_what_cannot_be_a_frame() {
        assert!(FrameLayout::packed(0, 4, PixelFormat::Rgba8).is_err());
        assert!(FrameLayout::packed(4, 0, PixelFormat::Rgba8).is_err());
        assert!(FrameLayout::with_pitch(4, 4, 15, PixelFormat::Rgba8).is_err());
        assert!(
            FrameLayout::packed(u32::MAX, u32::MAX, PixelFormat::Rgba8).is_err()
                || usize::BITS > 64
        );
        let l = FrameLayout::with_pitch(1920, 1080, 7680, PixelFormat::Rgba8).expect("layout");
        assert_eq!(l.frame_len(), 7680 * 1080);
        let mut bytes = vec![0u8; l.frame_len() - 1];
        assert!(FrameMut::new(0, l, &mut bytes).is_err());
    }

    #[test]
    fn process_counts_mismatches_and_inverts() {
        let stride = 300;
        let mut buf = vec![0u8; stride * 4];
        let p = TestPattern::new(5, stride);
        p.fill(&mut buf);
        buf[7] ^= 0x10;
        buf[stride * 3] ^= 0x01;
        assert_eq!(process_frame(5, stride, &mut buf), 2);
        // Everything but the two corrupted bytes is now the inverted pattern.
        assert_eq!(p.first_mismatch(&buf, 0xff), Some(7));
        let mut good = vec![0u8; stride * 4];
        p.fill(&mut good);
        assert_eq!(process_frame(5, stride, &mut good), 0);
        assert_eq!(p.first_mismatch(&good, 0xff), None);
        assert_eq!(process_frame(6, stride, &mut good), (stride * 4) as u64);
    }
}
