//! Camera driver tests against embedded-hal-mock expectations (no hardware).
#![allow(clippy::unwrap_used)]

use std::cell::RefCell;
use std::convert::Infallible;
use std::rc::Rc;

use embedded_hal::digital::{ErrorType, OutputPin};
use embedded_hal::i2c::ErrorKind;
use embedded_hal_mock::eh1::digital::{
    Mock as PinMock, State as PinState, Transaction as PinTransaction,
};
use embedded_hal_mock::eh1::i2c::{Mock as I2cMock, Transaction as I2cTransaction};
use embedded_hal_mock::eh1::MockError;
use tegra_interop_pipeline::camera::{
    regs, Camera, ConfigError, Error, FrameInfo, FrameReadout, FrameSink, PixelFormat,
    ReadoutError, SensorConfig, TestPattern, TestPatternReadout,
};

const ADDR: u8 = regs::DEFAULT_ADDRESS;

const VGA: SensorConfig = SensorConfig {
    width: 640,
    height: 480,
    fps: 30,
    format: PixelFormat::Raw8,
};

/// The bus traffic `init` must produce for `VGA`, written out byte by byte.
fn vga_init_i2c() -> Vec<I2cTransaction> {
    vec![
        // probe: register 0x0000, two bytes back
        I2cTransaction::write_read(ADDR, vec![0x00, 0x00], vec![0x53, 0x47]),
        I2cTransaction::write(ADDR, vec![0x01, 0x00, 0x00]), // standby
        I2cTransaction::write(ADDR, vec![0x03, 0x40, 0x02]), // width 640 = 0x0280
        I2cTransaction::write(ADDR, vec![0x03, 0x41, 0x80]),
        I2cTransaction::write(ADDR, vec![0x03, 0x42, 0x01]), // height 480 = 0x01e0
        I2cTransaction::write(ADDR, vec![0x03, 0x43, 0xe0]),
        I2cTransaction::write(ADDR, vec![0x03, 0x50, 30]), // fps
        I2cTransaction::write(ADDR, vec![0x03, 0x60, 0x00]), // Raw8
        I2cTransaction::write(ADDR, vec![0x03, 0x70, 0x01]), // external trigger
        I2cTransaction::write(ADDR, vec![0x06, 0x00, 0x02]), // seeded test pattern
        I2cTransaction::write(ADDR, vec![0x01, 0x00, 0x01]), // streaming
    ]
}

fn pulse() -> [PinTransaction; 2] {
    [
        PinTransaction::set(PinState::High),
        PinTransaction::set(PinState::Low),
    ]
}

/// Sink that checks the frame and counts calls.
#[derive(Default)]
struct CheckingSink {
    signalled: Vec<u64>,
}

impl FrameSink for CheckingSink {
    type Error = Infallible;
    fn frame_ready(&mut self, info: &FrameInfo, frame: &[u8]) -> Result<(), Infallible> {
        assert_eq!(frame.len(), info.len);
        let pattern = TestPattern::new(info.index, info.config.stride());
        assert_eq!(pattern.first_mismatch(frame, 0), None);
        self.signalled.push(info.index);
        Ok(())
    }
}

#[test]
fn init_probes_chip_id_and_writes_the_configuration_table() {
    let i2c = I2cMock::new(&vga_init_i2c());
    let pin = PinMock::new(&[PinTransaction::set(PinState::Low)]);
    let mut cam = Camera::new(i2c, pin, TestPatternReadout, ADDR, VGA).unwrap();
    cam.init().unwrap();
    assert_eq!(cam.next_index(), 0);
    let (mut i2c, mut pin, _) = cam.release();
    i2c.done();
    pin.done();
}

#[test]
fn register_table_uses_the_documented_map() {
    let cfg = SensorConfig {
        width: 1920,
        height: 1080,
        fps: 60,
        format: PixelFormat::Rgba8,
    };
    let table = cfg.register_table();
    assert_eq!(table[0], (regs::MODE_SELECT, regs::MODE_STANDBY));
    assert!(table.contains(&(regs::WIDTH_HI, 0x07)));
    assert!(table.contains(&(regs::WIDTH_LO, 0x80)));
    assert!(table.contains(&(regs::HEIGHT_HI, 0x04)));
    assert!(table.contains(&(regs::HEIGHT_LO, 0x38)));
    assert!(table.contains(&(regs::FRAME_RATE, 60)));
    assert!(table.contains(&(regs::PIXEL_FORMAT, 0x02)));
    assert_eq!(table[9], (regs::MODE_SELECT, regs::MODE_STREAMING));
    assert_eq!(cfg.frame_len(), 1920 * 1080 * 4);
}

#[test]
fn wrong_chip_id_stops_before_any_register_write() {
    let i2c = I2cMock::new(&[I2cTransaction::write_read(
        ADDR,
        vec![0x00, 0x00],
        vec![0x12, 0x34],
    )]);
    let pin = PinMock::new(&[PinTransaction::set(PinState::Low)]);
    let mut cam = Camera::new(i2c, pin, TestPatternReadout, ADDR, VGA).unwrap();
    assert_eq!(
        cam.init(),
        Err(Error::WrongChipId {
            expected: 0x5347,
            found: 0x1234
        })
    );
    let mut sink = CheckingSink::default();
    let mut buf = vec![0u8; VGA.frame_len()];
    assert!(matches!(
        cam.capture(&mut buf, &mut sink),
        Err(Error::NotStreaming)
    ));
    let (mut i2c, mut pin, _) = cam.release();
    i2c.done();
    pin.done();
}

#[test]
fn i2c_failure_is_reported_as_i2c_error() {
    let mut expected = vga_init_i2c();
    expected.truncate(4);
    expected[3] = expected[3].clone().with_error(ErrorKind::Other);
    let i2c = I2cMock::new(&expected);
    let pin = PinMock::new(&[PinTransaction::set(PinState::Low)]);
    let mut cam = Camera::new(i2c, pin, TestPatternReadout, ADDR, VGA).unwrap();
    assert_eq!(cam.init(), Err(Error::I2c(ErrorKind::Other)));
    let (mut i2c, mut pin, _) = cam.release();
    i2c.done();
    pin.done();
}

#[test]
fn invalid_configuration_is_rejected_without_bus_traffic() {
    let cases = [
        (SensorConfig { width: 0, ..VGA }, ConfigError::ZeroSize),
        (
            SensorConfig {
                height: 5000,
                ..VGA
            },
            ConfigError::TooLarge {
                width: 640,
                height: 5000,
            },
        ),
        (SensorConfig { fps: 0, ..VGA }, ConfigError::FrameRate(0)),
    ];
    for (cfg, want) in cases {
        let mut i2c = I2cMock::new(&[]);
        let mut pin = PinMock::new(&[]);
        let res = Camera::new(i2c.clone(), pin.clone(), TestPatternReadout, ADDR, cfg);
        assert!(matches!(res, Err(Error::Config(e)) if e == want));
        i2c.done();
        pin.done();
    }
}

#[test]
fn capture_pulses_the_pin_once_per_frame_and_writes_the_pattern() {
    let i2c = I2cMock::new(&vga_init_i2c());
    let mut pins = vec![PinTransaction::set(PinState::Low)];
    pins.extend(pulse());
    pins.extend(pulse());
    let pin = PinMock::new(&pins);
    let mut cam = Camera::new(i2c, pin, TestPatternReadout, ADDR, VGA).unwrap();
    cam.init().unwrap();

    // A larger buffer is fine; only the frame's bytes are written.
    let mut buf = vec![0xAAu8; VGA.frame_len() + 16];
    let mut sink = CheckingSink::default();
    let first = cam.capture(&mut buf, &mut sink).unwrap();
    assert_eq!(first.index, 0);
    assert_eq!(first.len, 640 * 480);
    assert!(buf[first.len..].iter().all(|&b| b == 0xAA));
    let frame0 = buf[..first.len].to_vec();

    let second = cam.capture(&mut buf, &mut sink).unwrap();
    assert_eq!(second.index, 1);
    assert_ne!(frame0, buf[..second.len], "frames must differ");
    assert_eq!(sink.signalled, vec![0, 1]);

    let (mut i2c, mut pin, _) = cam.release();
    i2c.done();
    pin.done();
}

#[test]
fn too_small_buffer_triggers_nothing() {
    let i2c = I2cMock::new(&vga_init_i2c());
    let pin = PinMock::new(&[PinTransaction::set(PinState::Low)]);
    let mut cam = Camera::new(i2c, pin, TestPatternReadout, ADDR, VGA).unwrap();
    cam.init().unwrap();
    let mut buf = vec![0u8; VGA.frame_len() - 1];
    let mut sink = CheckingSink::default();
    assert!(matches!(
        cam.capture(&mut buf, &mut sink),
        Err(Error::BufferTooSmall {
            needed: 307_200,
            got: 307_199
        })
    ));
    assert!(sink.signalled.is_empty());
    assert_eq!(cam.next_index(), 0);
    let (mut i2c, mut pin, _) = cam.release();
    i2c.done();
    pin.done();
}

#[test]
fn pin_failure_is_reported_and_nothing_is_signalled() {
    let i2c = I2cMock::new(&vga_init_i2c());
    let err = MockError::Io(std::io::ErrorKind::NotConnected);
    let pin = PinMock::new(&[
        PinTransaction::set(PinState::Low),
        PinTransaction::set(PinState::High).with_error(err.clone()),
    ]);
    let mut cam = Camera::new(i2c, pin, TestPatternReadout, ADDR, VGA).unwrap();
    cam.init().unwrap();
    let mut buf = vec![0u8; VGA.frame_len()];
    let mut sink = CheckingSink::default();
    assert!(matches!(cam.capture(&mut buf, &mut sink), Err(Error::Pin(e)) if e == err));
    assert!(sink.signalled.is_empty());
    assert_eq!(cam.next_index(), 0);
    let (mut i2c, mut pin, _) = cam.release();
    i2c.done();
    pin.done();
}

// ---- ordering: trigger -> frame written -> fence signalled ----------------

#[derive(Clone, Debug, PartialEq, Eq)]
enum Event {
    PinHigh,
    PinLow,
    FrameWritten(u64),
    Signalled(u64),
}

type Log = Rc<RefCell<Vec<Event>>>;

/// Wraps the pin mock (which checks the levels) and logs each edge.
struct LoggingPin {
    inner: PinMock,
    log: Log,
}

impl ErrorType for LoggingPin {
    type Error = MockError;
}

impl OutputPin for LoggingPin {
    fn set_low(&mut self) -> Result<(), MockError> {
        self.inner.set_low()?;
        self.log.borrow_mut().push(Event::PinLow);
        Ok(())
    }
    fn set_high(&mut self) -> Result<(), MockError> {
        self.inner.set_high()?;
        self.log.borrow_mut().push(Event::PinHigh);
        Ok(())
    }
}

/// Wraps the test-pattern readout and logs when a frame is in memory; can
/// be told to fail.
struct LoggingReadout {
    log: Log,
    fail: bool,
}

impl FrameReadout for LoggingReadout {
    fn read_frame(
        &mut self,
        config: &SensorConfig,
        index: u64,
        buf: &mut [u8],
    ) -> Result<(), ReadoutError> {
        if self.fail {
            return Err(ReadoutError::Timeout);
        }
        TestPatternReadout.read_frame(config, index, buf)?;
        self.log.borrow_mut().push(Event::FrameWritten(index));
        Ok(())
    }
}

/// Stands in for the pipeline's fence: logs the signal, checks the frame is
/// complete at that moment, and can refuse.
struct FenceSink {
    log: Log,
    refuse: bool,
}

#[derive(Debug, PartialEq)]
struct FenceError;

impl FrameSink for FenceSink {
    type Error = FenceError;
    fn frame_ready(&mut self, info: &FrameInfo, frame: &[u8]) -> Result<(), FenceError> {
        if self.refuse {
            return Err(FenceError);
        }
        let pattern = TestPattern::new(info.index, info.config.stride());
        assert_eq!(pattern.first_mismatch(frame, 0), None, "signalled early");
        self.log.borrow_mut().push(Event::Signalled(info.index));
        Ok(())
    }
}

fn logging_camera(
    extra_pins: &[PinTransaction],
    fail_readout: bool,
) -> (Camera<I2cMock, LoggingPin, LoggingReadout>, Log) {
    let log: Log = Rc::default();
    let mut pins = vec![PinTransaction::set(PinState::Low)];
    pins.extend_from_slice(extra_pins);
    let pin = LoggingPin {
        inner: PinMock::new(&pins),
        log: log.clone(),
    };
    let readout = LoggingReadout {
        log: log.clone(),
        fail: fail_readout,
    };
    let mut cam = Camera::new(I2cMock::new(&vga_init_i2c()), pin, readout, ADDR, VGA).unwrap();
    cam.init().unwrap();
    log.borrow_mut().clear(); // drop the idle-low from init
    (cam, log)
}

fn finish(cam: Camera<I2cMock, LoggingPin, LoggingReadout>) {
    let (mut i2c, mut pin, _) = cam.release();
    i2c.done();
    pin.inner.done();
}

#[test]
fn capture_orders_trigger_then_write_then_signal() {
    let [a, b] = pulse();
    let (mut cam, log) = logging_camera(&[a.clone(), b.clone(), a, b], false);
    let mut buf = vec![0u8; VGA.frame_len()];
    let mut fence = FenceSink {
        log: log.clone(),
        refuse: false,
    };
    cam.capture(&mut buf, &mut fence).unwrap();
    cam.capture(&mut buf, &mut fence).unwrap();
    assert_eq!(
        *log.borrow(),
        vec![
            Event::PinHigh,
            Event::PinLow,
            Event::FrameWritten(0),
            Event::Signalled(0),
            Event::PinHigh,
            Event::PinLow,
            Event::FrameWritten(1),
            Event::Signalled(1),
        ]
    );
    finish(cam);
}

#[test]
fn failed_readout_is_never_signalled() {
    let (mut cam, log) = logging_camera(&pulse(), true);
    let mut buf = vec![0u8; VGA.frame_len()];
    let mut fence = FenceSink {
        log: log.clone(),
        refuse: false,
    };
    assert!(matches!(
        cam.capture(&mut buf, &mut fence),
        Err(Error::Readout(ReadoutError::Timeout))
    ));
    assert_eq!(*log.borrow(), vec![Event::PinHigh, Event::PinLow]);
    // The triggered exposure used up index 0.
    assert_eq!(cam.next_index(), 1);
    finish(cam);
}

#[test]
fn sink_failure_is_returned() {
    let (mut cam, log) = logging_camera(&pulse(), false);
    let mut buf = vec![0u8; VGA.frame_len()];
    let mut fence = FenceSink { log, refuse: true };
    assert_eq!(
        cam.capture(&mut buf, &mut fence).unwrap_err(),
        Error::Sink(FenceError)
    );
    finish(cam);
}

// ---- the test pattern ------------------------------------------------------

#[test]
fn pattern_detects_wrong_frame_shift_inversion_and_partial_write() {
    let stride = 1000; // wider than 256 so the high column term matters
    let mut buf = vec![0u8; stride * 300];
    let p = TestPattern::new(42, stride);
    p.fill(&mut buf);
    assert_eq!(p.first_mismatch(&buf, 0), None);
    assert_eq!(p.first_mismatch(&buf, 0xff), Some(0));

    // Another frame index (e.g. a stale slot) does not match.
    for other in [41, 43, 42 + 8, 42 + 256] {
        assert!(TestPattern::new(other, stride)
            .first_mismatch(&buf, 0)
            .is_some());
    }
    // Inverted in place, as the consumer does.
    let mut inv: Vec<u8> = buf.iter().map(|b| !b).collect();
    assert_eq!(p.first_mismatch(&inv, 0xff), None);
    // A partial write is found at its offset.
    inv[stride * 299 + 5] ^= 1;
    assert_eq!(p.first_mismatch(&inv, 0xff), Some(stride * 299 + 5));
    // Data shifted by 256 bytes within a row does not match.
    let mut shifted = buf.clone();
    shifted[..stride].rotate_left(256);
    assert!(p.first_mismatch(&shifted, 0).is_some());
    // A single byte agrees with the closed-form definition.
    assert_eq!(p.byte(3, 700), buf[3 * stride + 700]);
}

#[test]
fn error_messages_are_one_line() {
    let e: Error<ErrorKind, MockError> = Error::WrongChipId {
        expected: 0x5347,
        found: 0x1234,
    };
    let msg = e.to_string();
    assert!(msg.contains("0x1234") && msg.contains("0x5347"), "{msg}");
    let e: Error<ErrorKind, MockError> = Error::BufferTooSmall { needed: 10, got: 3 };
    assert!(!e.to_string().contains('\n'));
}
