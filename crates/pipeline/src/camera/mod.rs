//! Camera sensor driver over `embedded-hal` 1.0 traits (no_std, no alloc).
//!
//! The sensor is a **model**: a generic image sensor with a register map defined
//! by this crate (see [`regs`]); it is not the register map of any specific part.
//! The driver does what a real driver for such a part does:
//!
//! 1. [`Camera::init`]: probe the chip-id register over I2C, then write a
//!    configuration table (standby, resolution, frame rate, pixel format,
//!    external trigger, test-pattern generator) and start streaming.
//! 2. [`Camera::capture`]: pulse the frame-sync pin (rising edge starts the
//!    exposure), receive the frame into a caller-provided buffer through a
//!    [`FrameReadout`], and only then tell a [`FrameSink`] that the frame is
//!    ready (where a pipeline signals its fence).
//!
//! `embedded-hal` has no trait for a camera data bus (on a Jetson the frame
//! arrives over MIPI CSI into memory, completed by the capture engine), so the
//! data path is the [`FrameReadout`] trait. [`TestPatternReadout`] is the model
//! of the sensor's test-pattern generator: it writes the deterministic pattern
//! described in [`TestPattern`], seeded by the frame index, so that a consumer
//! can verify every byte of every frame.

pub mod sensor;

use ::core::convert::Infallible;
use ::core::fmt;

use embedded_hal::digital::{self, OutputPin};
use embedded_hal::i2c::{self, I2c};
use rayon::prelude::*;

/// Register map of the model sensor (16-bit register addresses, sent
/// big-endian, 8-bit values; multi-byte reads auto-increment).
pub mod regs {
    /// Default 7-bit I2C address of the model sensor.
    pub const DEFAULT_ADDRESS: u8 = 0x36;
    /// Chip id, two bytes big-endian (read-only).
    pub const CHIP_ID: u16 = 0x0000;
    /// The value [`CHIP_ID`] reads on the model sensor.
    pub const CHIP_ID_VALUE: u16 = 0x5347;
    /// Mode select: [`MODE_STANDBY`] or [`MODE_STREAMING`].
    pub const MODE_SELECT: u16 = 0x0100;
    /// [`MODE_SELECT`] value: sensor idle, configuration may change.
    pub const MODE_STANDBY: u8 = 0x00;
    /// [`MODE_SELECT`] value: sensor produces frames on trigger.
    pub const MODE_STREAMING: u8 = 0x01;
    /// Output width in pixels, high byte.
    pub const WIDTH_HI: u16 = 0x0340;
    /// Output width in pixels, low byte.
    pub const WIDTH_LO: u16 = 0x0341;
    /// Output height in lines, high byte.
    pub const HEIGHT_HI: u16 = 0x0342;
    /// Output height in lines, low byte.
    pub const HEIGHT_LO: u16 = 0x0343;
    /// Maximum frame rate in frames per second.
    pub const FRAME_RATE: u16 = 0x0350;
    /// Pixel format code (see [`crate::camera::PixelFormat::code`]).
    pub const PIXEL_FORMAT: u16 = 0x0360;
    /// Trigger mode: [`TRIGGER_EXTERNAL`] waits for the frame-sync pin.
    pub const TRIGGER_MODE: u16 = 0x0370;
    /// [`TRIGGER_MODE`] value: one frame per rising edge of the sync pin.
    pub const TRIGGER_EXTERNAL: u8 = 0x01;
    /// Test-pattern generator: [`TEST_PATTERN_SEEDED`] selects the seeded pattern.
    pub const TEST_PATTERN: u16 = 0x0600;
    /// [`TEST_PATTERN`] value: deterministic pattern seeded by the frame index.
    pub const TEST_PATTERN_SEEDED: u8 = 0x02;
}

/// Pixel formats the model sensor can output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PixelFormat {
    /// One byte per pixel (raw Bayer or grey).
    Raw8,
    /// Two bytes per pixel, little-endian (raw 10/12-bit data in 16 bits).
    Raw16,
    /// Four bytes per pixel, R, G, B, A.
    Rgba8,
}

impl PixelFormat {
    /// Bytes one pixel takes in memory.
    pub const fn bytes_per_pixel(self) -> usize {
        match self {
            PixelFormat::Raw8 => 1,
            PixelFormat::Raw16 => 2,
            PixelFormat::Rgba8 => 4,
        }
    }

    /// Value written to [`regs::PIXEL_FORMAT`].
    pub const fn code(self) -> u8 {
        match self {
            PixelFormat::Raw8 => 0x00,
            PixelFormat::Raw16 => 0x01,
            PixelFormat::Rgba8 => 0x02,
        }
    }
}

/// Sensor configuration, checked by [`SensorConfig::validate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SensorConfig {
    /// Width in pixels, `1..=MAX_WIDTH`.
    pub width: u16,
    /// Height in lines, `1..=MAX_HEIGHT`.
    pub height: u16,
    /// Frame rate in frames per second, `1..=MAX_FPS`.
    pub fps: u8,
    /// Output pixel format.
    pub format: PixelFormat,
}

impl SensorConfig {
    /// Largest width the model sensor supports.
    pub const MAX_WIDTH: u16 = 4096;
    /// Largest height the model sensor supports.
    pub const MAX_HEIGHT: u16 = 4096;
    /// Highest frame rate the model sensor supports.
    pub const MAX_FPS: u8 = 240;

    /// Checks the configuration against the sensor's limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.width == 0 || self.height == 0 {
            return Err(ConfigError::ZeroSize);
        }
        if self.width > Self::MAX_WIDTH || self.height > Self::MAX_HEIGHT {
            return Err(ConfigError::TooLarge {
                width: self.width,
                height: self.height,
            });
        }
        if self.fps == 0 || self.fps > Self::MAX_FPS {
            return Err(ConfigError::FrameRate(self.fps));
        }
        Ok(())
    }

    /// Bytes in one line of the frame.
    pub const fn stride(&self) -> usize {
        self.width as usize * self.format.bytes_per_pixel()
    }

    /// Bytes in one frame.
    pub const fn frame_len(&self) -> usize {
        self.stride() * self.height as usize
    }

    /// The `(register, value)` writes that configure the sensor, in order,
    /// ending with the switch to streaming.
    pub fn register_table(&self) -> [(u16, u8); 10] {
        let [w_hi, w_lo] = self.width.to_be_bytes();
        let [h_hi, h_lo] = self.height.to_be_bytes();
        [
            (regs::MODE_SELECT, regs::MODE_STANDBY),
            (regs::WIDTH_HI, w_hi),
            (regs::WIDTH_LO, w_lo),
            (regs::HEIGHT_HI, h_hi),
            (regs::HEIGHT_LO, h_lo),
            (regs::FRAME_RATE, self.fps),
            (regs::PIXEL_FORMAT, self.format.code()),
            (regs::TRIGGER_MODE, regs::TRIGGER_EXTERNAL),
            (regs::TEST_PATTERN, regs::TEST_PATTERN_SEEDED),
            (regs::MODE_SELECT, regs::MODE_STREAMING),
        ]
    }
}

/// A configuration the sensor cannot run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// Width or height is zero.
    ZeroSize,
    /// Width or height is above the sensor's maximum.
    TooLarge {
        /// Requested width.
        width: u16,
        /// Requested height.
        height: u16,
    },
    /// Frame rate is zero or above the sensor's maximum.
    FrameRate(u8),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::ZeroSize => f.write_str("width and height must be non-zero"),
            ConfigError::TooLarge { width, height } => write!(
                f,
                "{width}x{height} is above the sensor maximum of {}x{}",
                SensorConfig::MAX_WIDTH,
                SensorConfig::MAX_HEIGHT
            ),
            ConfigError::FrameRate(fps) => write!(
                f,
                "frame rate {fps} is outside 1..={}",
                SensorConfig::MAX_FPS
            ),
        }
    }
}

/// Why the data path could not deliver a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadoutError {
    /// No frame arrived in time after the trigger.
    Timeout,
    /// Fewer bytes than a full frame arrived.
    Truncated {
        /// Bytes that did arrive.
        received: usize,
    },
}

impl fmt::Display for ReadoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadoutError::Timeout => f.write_str("no frame arrived after the trigger"),
            ReadoutError::Truncated { received } => {
                write!(f, "frame truncated after {received} bytes")
            }
        }
    }
}

/// Errors of the camera driver. `SinkE` is the error of the [`FrameSink`]
/// given to [`Camera::capture`] (never produced by other calls).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error<I2cE, PinE, SinkE = Infallible> {
    /// An I2C transfer failed.
    I2c(I2cE),
    /// The chip-id register did not read the model sensor's id.
    WrongChipId {
        /// The id the driver expects.
        expected: u16,
        /// The id that was read.
        found: u16,
    },
    /// The configuration is outside the sensor's limits.
    Config(ConfigError),
    /// Driving the frame-sync pin failed.
    Pin(PinE),
    /// The caller's buffer cannot hold one frame.
    BufferTooSmall {
        /// Bytes one frame needs.
        needed: usize,
        /// Bytes the buffer has.
        got: usize,
    },
    /// [`Camera::capture`] was called before a successful [`Camera::init`].
    NotStreaming,
    /// The data path did not deliver the frame.
    Readout(ReadoutError),
    /// The frame sink failed to signal the frame.
    Sink(SinkE),
}

impl<I2cE: fmt::Debug, PinE: fmt::Debug, SinkE: fmt::Debug> fmt::Display
    for Error<I2cE, PinE, SinkE>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::I2c(e) => write!(f, "camera I2C transfer failed: {e:?}"),
            Error::WrongChipId { expected, found } => write!(
                f,
                "camera chip id is {found:#06x}, expected {expected:#06x} (wrong device at this address?)"
            ),
            Error::Config(e) => write!(f, "camera configuration rejected: {e}"),
            Error::Pin(e) => write!(f, "camera frame-sync pin failed: {e:?}"),
            Error::BufferTooSmall { needed, got } => write!(
                f,
                "frame buffer holds {got} bytes, one frame needs {needed}"
            ),
            Error::NotStreaming => f.write_str("camera is not initialised (call init first)"),
            Error::Readout(e) => write!(f, "camera readout failed: {e}"),
            Error::Sink(e) => write!(f, "signalling the frame failed: {e:?}"),
        }
    }
}

/// [`Error`] for a camera on the bus `I2C` and the pin `PIN`, with the sink
/// error `SinkE`.
pub type CameraError<I2C, PIN, SinkE = Infallible> =
    Error<<I2C as i2c::ErrorType>::Error, <PIN as digital::ErrorType>::Error, SinkE>;

/// Describes one captured frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameInfo {
    /// Frame index since [`Camera::init`] (0, 1, 2, ...); seeds the test pattern.
    pub index: u64,
    /// The configuration the frame was taken with.
    pub config: SensorConfig,
    /// Bytes of the frame at the start of the buffer (`config.frame_len()`).
    pub len: usize,
}

/// The data path from the sensor into memory.
pub trait FrameReadout {
    /// Receives frame `index`, triggered just before, into `buf`
    /// (exactly `config.frame_len()` bytes). Returns once the whole frame is
    /// in memory.
    fn read_frame(
        &mut self,
        config: &SensorConfig,
        index: u64,
        buf: &mut [u8],
    ) -> Result<(), ReadoutError>;
}

/// Model of the sensor's seeded test-pattern generator: writes
/// [`TestPattern`] for the frame index.
#[derive(Clone, Copy, Debug, Default)]
pub struct TestPatternReadout;

impl FrameReadout for TestPatternReadout {
    fn read_frame(
        &mut self,
        config: &SensorConfig,
        index: u64,
        buf: &mut [u8],
    ) -> Result<(), ReadoutError> {
        TestPattern::new(index, config.stride()).fill_parallel(buf, frame_threads(buf.len()));
        Ok(())
    }
}

/// Receives the "frame ready" notification after the frame is in memory.
pub trait FrameSink {
    /// Error of [`FrameSink::frame_ready`].
    type Error;
    /// Called once per frame, after the whole frame is in `frame`; a pipeline
    /// signals its fence here.
    fn frame_ready(&mut self, info: &FrameInfo, frame: &[u8]) -> Result<(), Self::Error>;
}

/// The deterministic test pattern: byte `(row, col)` of frame `index`, where
/// `col` counts bytes within a row of `stride` bytes.
///
/// With `s = splitmix64(index)`, `s0 = s & 0xff`, `s1 = (s >> 8) & 0xff`,
/// `s2 = (s >> 16) & 0xff` and all arithmetic modulo 256:
///
/// ```text
/// byte = ((col & 0xff) ^ s0) + 7 * (col >> 8)
///      + 3 * ((row & 0xff) ^ s1) + 5 * (row >> 8) + s2
/// ```
///
/// A CUDA kernel or shader can compute it too; a frame in the wrong slot,
/// shifted, partly written or stale does not match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TestPattern {
    s0: u8,
    s1: u8,
    s2: u8,
    stride: usize,
}

impl TestPattern {
    /// The pattern of frame `index` for rows of `stride` bytes.
    pub const fn new(index: u64, stride: usize) -> Self {
        let s = splitmix64(index);
        TestPattern {
            s0: s as u8,
            s1: (s >> 8) as u8,
            s2: (s >> 16) as u8,
            stride,
        }
    }

    fn row_term(&self, row: usize) -> u8 {
        ((row as u8) ^ self.s1)
            .wrapping_mul(3)
            .wrapping_add(((row >> 8) as u8).wrapping_mul(5))
            .wrapping_add(self.s2)
    }

    fn col_term(&self, col: usize) -> u8 {
        ((col as u8) ^ self.s0).wrapping_add(((col >> 8) as u8).wrapping_mul(7))
    }

    /// Byte `col` of row `row`.
    pub fn byte(&self, row: usize, col: usize) -> u8 {
        self.col_term(col).wrapping_add(self.row_term(row))
    }

    /// The column terms of one 256-byte block of a row: byte `j` of block
    /// `k` is `table[j] + 7 * k` plus the row's term.
    fn block_table(&self) -> [u8; 256] {
        let mut table = [0u8; 256];
        for (j, t) in table.iter_mut().enumerate() {
            *t = (j as u8) ^ self.s0;
        }
        table
    }

    /// Writes the pattern over all of `buf` (a last partial row included).
    pub fn fill(&self, buf: &mut [u8]) {
        self.fill_rows(buf, 0);
    }

    /// Writes the pattern over `buf`, which holds the rows from `first_row`
    /// on (a last partial row included): what [`TestPattern::fill`] writes
    /// at offset `first_row * stride` of a whole frame. Lets several threads
    /// each fill a band of one frame.
    ///
    /// The pattern is separable (a column term plus a row term), so each row
    /// is a precomputed 256-byte table plus one constant per 256-byte block:
    /// a loop the compiler vectorises, so the fill runs at memory speed.
    pub fn fill_rows(&self, buf: &mut [u8], first_row: usize) {
        if self.stride == 0 {
            return;
        }
        let table = self.block_table();
        for (i, line) in buf.chunks_mut(self.stride).enumerate() {
            let r = self.row_term(first_row + i);
            for (k, block) in line.chunks_mut(256).enumerate() {
                let add = r.wrapping_add((k as u8).wrapping_mul(7));
                for (b, &t) in block.iter_mut().zip(table.iter()) {
                    *b = t.wrapping_add(add);
                }
            }
        }
    }

    /// Offset of the first byte of `buf` that is not `pattern ^ xor_mask`
    /// (`xor_mask` 0 checks the pattern as written, 0xff its bitwise
    /// inverse), or `None` when every byte matches.
    pub fn first_mismatch(&self, buf: &[u8], xor_mask: u8) -> Option<usize> {
        self.first_mismatch_rows(buf, 0, xor_mask)
    }

    /// [`TestPattern::first_mismatch`] for `buf` holding the rows from
    /// `first_row` on (the offset returned is relative to `buf`). Every byte
    /// is compared; a block is scanned byte by byte only once it is known to
    /// hold a difference.
    pub fn first_mismatch_rows(&self, buf: &[u8], first_row: usize, xor_mask: u8) -> Option<usize> {
        if self.stride == 0 {
            return None;
        }
        let table = self.block_table();
        for (i, line) in buf.chunks(self.stride).enumerate() {
            let r = self.row_term(first_row + i);
            for (k, block) in line.chunks(256).enumerate() {
                let add = r.wrapping_add((k as u8).wrapping_mul(7));
                let diff = block.iter().zip(table.iter()).fold(0u8, |acc, (&b, &t)| {
                    acc | (b ^ t.wrapping_add(add) ^ xor_mask)
                });
                if diff != 0 {
                    let at = block
                        .iter()
                        .zip(table.iter())
                        .position(|(&b, &t)| b != t.wrapping_add(add) ^ xor_mask)
                        .unwrap_or(0);
                    return Some(i * self.stride + k * 256 + at);
                }
            }
        }
        None
    }
}

/// Frames smaller than this are written and checked by one thread: below it
/// starting threads costs more than it saves.
pub const PARALLEL_MIN_BYTES: usize = 1 << 20;

/// Environment variable that sets the threads [`frame_threads`] uses for a
/// large frame (1..=64), for measuring: e.g. whether writing and checking are
/// bound by the cores or by memory bandwidth. [`set_frame_threads`] (the
/// `pipeline` program's `--frame-threads`) wins over it.
pub const FRAME_THREADS_ENV: &str = "TEGRA_INTEROP_FRAME_THREADS";

/// The threads for a large frame, decided once per process.
static FRAME_THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// Sets the threads [`frame_threads`] uses for a large frame (clamped to
/// 1..=64). Only before the first frame: the camera's and the check's thread
/// pools are started once; returns false (and changes nothing) when the
/// number was already decided.
pub fn set_frame_threads(threads: usize) -> bool {
    FRAME_THREADS.set(threads.clamp(1, 64)).is_ok()
}

/// Threads used to write or check a frame of `len` bytes: one below
/// [`PARALLEL_MIN_BYTES`], else the number given to [`set_frame_threads`],
/// else [`FRAME_THREADS_ENV`] where set to a number in 1..=64, else a
/// quarter of the machine's parallelism, 1..=8: the camera
/// and the read-back check run at the same time, and both are bound by
/// memory bandwidth before cores (measured on the 16-core H200 host: 4
/// threads each wrote and checked about as fast as 8, and 8 + 8 at once
/// oversubscribed the cores and ran 30% slower than 4 + 4). Worked out once
/// per process (the machine's parallelism is read from cgroup files).
pub fn frame_threads(len: usize) -> usize {
    if len < PARALLEL_MIN_BYTES {
        return 1;
    }
    *FRAME_THREADS.get_or_init(|| {
        std::env::var(FRAME_THREADS_ENV)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| (1..=64).contains(n))
            .unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, |n| (n.get() / 4).clamp(1, 8))
            })
    })
}

impl TestPattern {
    /// Rows per band when a frame of `len` bytes is split into `threads`
    /// bands (at least one row).
    fn band_rows(&self, len: usize, threads: usize) -> usize {
        let rows = len.div_ceil(self.stride.max(1));
        rows.div_ceil(threads.max(1)).max(1)
    }

    /// [`TestPattern::fill`], with the frame split into `threads` bands of
    /// whole rows written at once by the camera's band pool (persistent
    /// threads, [`frame_threads`] of them, so no thread is started per
    /// frame); written by the calling thread alone where `threads` is 1 or
    /// the pool could not be started.
    pub fn fill_parallel(&self, buf: &mut [u8], threads: usize) {
        let pool = band_pool(BandPool::Camera);
        let (Some(pool), true) = (pool, threads > 1 && self.stride > 0) else {
            return self.fill(buf);
        };
        let rows = self.band_rows(buf.len(), threads);
        pool.install(|| {
            buf.par_chunks_mut(rows * self.stride)
                .enumerate()
                .for_each(|(i, band)| self.fill_rows(band, i * rows));
        });
    }

    /// [`TestPattern::first_mismatch`], with `threads` bands of whole rows
    /// checked at once by the read-back check's band pool (its own
    /// persistent threads, so that a check and a camera write run side by
    /// side). Every byte is checked; the lowest mismatching offset is
    /// returned.
    pub fn first_mismatch_parallel(
        &self,
        buf: &[u8],
        xor_mask: u8,
        threads: usize,
    ) -> Option<usize> {
        let pool = band_pool(BandPool::Check);
        let (Some(pool), true) = (pool, threads > 1 && self.stride > 0) else {
            return self.first_mismatch(buf, xor_mask);
        };
        let rows = self.band_rows(buf.len(), threads);
        let band_len = rows * self.stride;
        pool.install(|| {
            buf.par_chunks(band_len)
                .enumerate()
                .filter_map(|(i, band)| {
                    self.first_mismatch_rows(band, i * rows, xor_mask)
                        .map(|at| i * band_len + at)
                })
                .min()
        })
    }

    /// [`TestPattern::fill_parallel`] on threads started for this call (the
    /// calling thread writes one band) instead of the camera's pool. For a
    /// program that writes and checks one after the other on one thread,
    /// as the plain-CUDA baseline does: there a pool's threads fall asleep
    /// between two uses, and waking them cost more than starting threads
    /// (measured on the H100 host: 518 us per frame written, 555 us checked,
    /// against 284 and 379 us with threads started per call).
    pub fn fill_on_new_threads(&self, buf: &mut [u8], threads: usize) {
        if threads <= 1 || self.stride == 0 {
            return self.fill(buf);
        }
        let rows = self.band_rows(buf.len(), threads);
        let mut bands = buf.chunks_mut(rows * self.stride).enumerate();
        let first = bands.next();
        std::thread::scope(|scope| {
            for (i, band) in bands {
                scope.spawn(move || self.fill_rows(band, i * rows));
            }
            if let Some((_, band)) = first {
                self.fill_rows(band, 0);
            }
        });
    }

    /// [`TestPattern::first_mismatch_parallel`] on threads started for this
    /// call (see [`TestPattern::fill_on_new_threads`] for when). Every byte
    /// is checked; the lowest mismatching offset is returned.
    pub fn first_mismatch_on_new_threads(
        &self,
        buf: &[u8],
        xor_mask: u8,
        threads: usize,
    ) -> Option<usize> {
        if threads <= 1 || self.stride == 0 {
            return self.first_mismatch(buf, xor_mask);
        }
        let rows = self.band_rows(buf.len(), threads);
        let band_len = rows * self.stride;
        let mut bands = buf.chunks(band_len).enumerate();
        let first = bands.next();
        std::thread::scope(|scope| {
            let handles: Vec<_> = bands
                .map(|(i, band)| {
                    scope.spawn(move || {
                        self.first_mismatch_rows(band, i * rows, xor_mask)
                            .map(|at| i * band_len + at)
                    })
                })
                .collect();
            let mut found = first.and_then(|(_, band)| self.first_mismatch_rows(band, 0, xor_mask));
            for h in handles {
                // A band's check cannot panic; a thread that did anyway
                // counts as a mismatch at its band, never as a pass.
                let r = h.join().unwrap_or(Some(usize::MAX));
                found = match (found, r) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            found
        })
    }
}

/// The two persistent pools of band threads: the camera's writes and the
/// read-back checks run at the same time, each on its own threads.
#[derive(Clone, Copy)]
enum BandPool {
    Camera,
    Check,
}

/// The pool for `which`, started on first use with [`frame_threads`] threads
/// for a large frame; `None` where it could not be started (the callers then
/// work on their own thread).
fn band_pool(which: BandPool) -> Option<&'static rayon::ThreadPool> {
    static CAMERA: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    static CHECK: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    let (cell, name) = match which {
        BandPool::Camera => (&CAMERA, "camera-band"),
        BandPool::Check => (&CHECK, "check-band"),
    };
    cell.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(frame_threads(PARALLEL_MIN_BYTES))
            .thread_name(move |i| format!("{name}-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// The splitmix64 finaliser, used to spread frame indices over the pattern seed.
const fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Driver for the model sensor: set-up over `I2C`, frame trigger on `PIN`,
/// frame data through `R`.
#[derive(Debug)]
pub struct Camera<I2C, PIN, R = TestPatternReadout> {
    i2c: I2C,
    pin: PIN,
    readout: R,
    address: u8,
    config: SensorConfig,
    streaming: bool,
    next_index: u64,
}

impl<I2C: I2c, PIN: OutputPin, R: FrameReadout> Camera<I2C, PIN, R> {
    /// Creates the driver (no bus traffic yet); rejects an invalid `config`.
    pub fn new(
        i2c: I2C,
        pin: PIN,
        readout: R,
        address: u8,
        config: SensorConfig,
    ) -> Result<Self, CameraError<I2C, PIN>> {
        config.validate().map_err(Error::Config)?;
        Ok(Camera {
            i2c,
            pin,
            readout,
            address,
            config,
            streaming: false,
            next_index: 0,
        })
    }

    /// The configuration written by [`Camera::init`].
    pub fn config(&self) -> &SensorConfig {
        &self.config
    }

    /// Index the next captured frame will get.
    pub fn next_index(&self) -> u64 {
        self.next_index
    }

    /// Drives the trigger pin low, probes the chip id, writes the
    /// configuration table and starts streaming. Resets the frame index to 0.
    pub fn init(&mut self) -> Result<(), CameraError<I2C, PIN>> {
        self.streaming = false;
        self.pin.set_low().map_err(Error::Pin)?;
        let found = self.read_chip_id()?;
        if found != regs::CHIP_ID_VALUE {
            return Err(Error::WrongChipId {
                expected: regs::CHIP_ID_VALUE,
                found,
            });
        }
        for (reg, value) in self.config.register_table() {
            self.write_reg(reg, value)?;
        }
        self.streaming = true;
        self.next_index = 0;
        Ok(())
    }

    /// Puts the sensor in standby; [`Camera::capture`] fails until the next
    /// [`Camera::init`].
    pub fn stop(&mut self) -> Result<(), CameraError<I2C, PIN>> {
        self.streaming = false;
        self.write_reg(regs::MODE_SELECT, regs::MODE_STANDBY)
    }

    /// Reads the two-byte chip id.
    pub fn read_chip_id(&mut self) -> Result<u16, CameraError<I2C, PIN>> {
        let mut id = [0u8; 2];
        self.i2c
            .write_read(self.address, &regs::CHIP_ID.to_be_bytes(), &mut id)
            .map_err(Error::I2c)?;
        Ok(u16::from_be_bytes(id))
    }

    fn write_reg(&mut self, reg: u16, value: u8) -> Result<(), CameraError<I2C, PIN>> {
        let [hi, lo] = reg.to_be_bytes();
        self.i2c
            .write(self.address, &[hi, lo, value])
            .map_err(Error::I2c)
    }

    /// Captures one frame into the start of `buf`:
    /// trigger (pulse the sync pin high then low) -> frame written by the
    /// readout -> `sink.frame_ready`. Nothing is triggered when `buf` is too
    /// small; the sink is not called when the trigger or the readout fails.
    /// The frame index advances once the rising edge went out.
    pub fn capture<S: FrameSink>(
        &mut self,
        buf: &mut [u8],
        sink: &mut S,
    ) -> Result<FrameInfo, CameraError<I2C, PIN, S::Error>> {
        if !self.streaming {
            return Err(Error::NotStreaming);
        }
        let len = self.config.frame_len();
        let got = buf.len();
        let frame = buf
            .get_mut(..len)
            .ok_or(Error::BufferTooSmall { needed: len, got })?;
        self.pin.set_high().map_err(Error::Pin)?;
        // The rising edge started an exposure: that frame index is used up.
        let index = self.next_index;
        self.next_index = self.next_index.wrapping_add(1);
        self.pin.set_low().map_err(Error::Pin)?;
        self.readout
            .read_frame(&self.config, index, frame)
            .map_err(Error::Readout)?;
        let info = FrameInfo {
            index,
            config: self.config,
            len,
        };
        sink.frame_ready(&info, frame).map_err(Error::Sink)?;
        Ok(info)
    }

    /// The trigger pin (for a model pin that counts its pulses).
    pub fn pin(&self) -> &PIN {
        &self.pin
    }

    /// Gives the bus, the pin and the readout back.
    pub fn release(self) -> (I2C, PIN, R) {
        (self.i2c, self.pin, self.readout)
    }
}

#[cfg(test)]
mod tests {
    use super::TestPattern;

    /// The block-table fill and check agree with the per-byte definition,
    /// for strides that are and are not multiples of the 256-byte block.
    #[test]
    fn fast_fill_and_check_match_the_definition() {
        for stride in [1usize, 7, 255, 256, 300, 7680] {
            let rows = 5;
            let p = TestPattern::new(42, stride);
            let mut buf = vec![0u8; stride * rows + stride / 2];
            p.fill(&mut buf);
            for (i, b) in buf.iter().enumerate() {
                assert_eq!(*b, p.byte(i / stride, i % stride), "stride {stride} at {i}");
            }
            assert_eq!(p.first_mismatch(&buf, 0), None);
            let mut band = vec![0u8; stride * 2];
            p.fill_rows(&mut band, 3);
            assert_eq!(band[..], buf[3 * stride..5 * stride]);
            assert_eq!(p.first_mismatch_rows(&band, 3, 0), None);
            let last = buf.len() - 1;
            buf[last] ^= 1;
            assert_eq!(p.first_mismatch(&buf, 0), Some(last));
            buf[stride] ^= 0x80;
            assert_eq!(p.first_mismatch(&buf, 0), Some(stride));
            let inverted: Vec<u8> = buf.iter().map(|b| !b).collect();
            assert_eq!(p.first_mismatch(&inverted, 0xff), Some(stride));
            for threads in [2, 3, 8] {
                let mut par = vec![0u8; stride * rows + stride / 2];
                p.fill_parallel(&mut par, threads);
                assert_eq!(p.first_mismatch_parallel(&par, 0, threads), None);
                let mut fresh = vec![0u8; par.len()];
                p.fill_on_new_threads(&mut fresh, threads);
                assert_eq!(fresh, par, "stride {stride}, {threads} new threads");
                fresh[last] ^= 2;
                fresh[2] ^= 2;
                assert_eq!(p.first_mismatch_on_new_threads(&fresh, 0, threads), Some(2));
                let mut want = vec![0u8; par.len()];
                p.fill(&mut want);
                assert_eq!(par, want, "stride {stride}, {threads} threads");
                par[last] ^= 4;
                assert_eq!(p.first_mismatch_parallel(&par, 0, threads), Some(last));
                par[1] ^= 4;
                assert_eq!(p.first_mismatch_parallel(&par, 0, threads), Some(1));
            }
        }
    }
}
