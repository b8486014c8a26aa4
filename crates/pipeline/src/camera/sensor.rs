//! Host stand-ins for the camera's buses: an I2C device that behaves like the
//! model sensor's register file, and a frame-sync line that counts pulses.
//! On a Jetson these would be `linux-embedded-hal`'s `I2cdev` and `CdevPin`.

use std::convert::Infallible;

use crate::camera::regs;
use embedded_hal::digital::{self, OutputPin};
use embedded_hal::i2c::{self, I2c, Operation};

/// The model sensor's register file behind an I2C address.
#[derive(Debug)]
pub struct ModelSensorBus {
    address: u8,
    /// Registers written so far, `(register, value)`, at most one per register.
    registers: Vec<(u16, u8)>,
    pointer: u16,
}

/// Error of [`ModelSensorBus`]: nothing answers at the address used, or a
/// transfer is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusError(i2c::ErrorKind);

impl i2c::Error for BusError {
    fn kind(&self) -> i2c::ErrorKind {
        self.0
    }
}

impl ModelSensorBus {
    /// A sensor answering at `address`.
    pub fn new(address: u8) -> Self {
        ModelSensorBus {
            address,
            registers: Vec::with_capacity(16),
            pointer: 0,
        }
    }

    /// Value of `reg` (0 when never written; the chip id is read-only).
    pub fn register(&self, reg: u16) -> u8 {
        match reg {
            r if r == regs::CHIP_ID => regs::CHIP_ID_VALUE.to_be_bytes()[0],
            r if r == regs::CHIP_ID + 1 => regs::CHIP_ID_VALUE.to_be_bytes()[1],
            _ => self
                .registers
                .iter()
                .find(|(r, _)| *r == reg)
                .map_or(0, |&(_, v)| v),
        }
    }

    fn write_bytes(&mut self, bytes: &[u8]) -> Result<(), BusError> {
        let [hi, lo, data @ ..] = bytes else {
            return Err(BusError(i2c::ErrorKind::Other));
        };
        self.pointer = u16::from_be_bytes([*hi, *lo]);
        for &v in data {
            let reg = self.pointer;
            match self.registers.iter_mut().find(|(r, _)| *r == reg) {
                Some(entry) => entry.1 = v,
                None => self.registers.push((reg, v)),
            }
            self.pointer = self.pointer.wrapping_add(1);
        }
        Ok(())
    }
}

impl i2c::ErrorType for ModelSensorBus {
    type Error = BusError;
}

impl I2c for ModelSensorBus {
    fn transaction(
        &mut self,
        address: u8,
        operations: &mut [Operation<'_>],
    ) -> Result<(), BusError> {
        if address != self.address {
            return Err(BusError(i2c::ErrorKind::NoAcknowledge(
                i2c::NoAcknowledgeSource::Address,
            )));
        }
        for op in operations {
            match op {
                Operation::Write(bytes) => self.write_bytes(bytes)?,
                Operation::Read(buf) => {
                    for b in buf.iter_mut() {
                        *b = self.register(self.pointer);
                        self.pointer = self.pointer.wrapping_add(1);
                    }
                }
            }
        }
        Ok(())
    }
}

/// A frame-sync output line that counts rising edges.
#[derive(Debug, Default)]
pub struct SyncLine {
    high: bool,
    /// Rising edges so far.
    pub pulses: u64,
}

impl digital::ErrorType for SyncLine {
    type Error = Infallible;
}

impl OutputPin for SyncLine {
    fn set_low(&mut self) -> Result<(), Infallible> {
        self.high = false;
        Ok(())
    }

    fn set_high(&mut self) -> Result<(), Infallible> {
        if !self.high {
            self.pulses += 1;
        }
        self.high = true;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::camera::{Camera, PixelFormat, SensorConfig, TestPatternReadout};

    #[test]
    fn camera_configures_the_model_sensor() {
        let cfg = SensorConfig {
            width: 1280,
            height: 720,
            fps: 30,
            format: PixelFormat::Raw16,
        };
        let bus = ModelSensorBus::new(regs::DEFAULT_ADDRESS);
        let mut cam = Camera::new(
            bus,
            SyncLine::default(),
            TestPatternReadout,
            regs::DEFAULT_ADDRESS,
            cfg,
        )
        .unwrap();
        cam.init().unwrap();
        let (bus, pin, _) = cam.release();
        assert_eq!(bus.register(regs::WIDTH_HI), 0x05);
        assert_eq!(bus.register(regs::WIDTH_LO), 0x00);
        assert_eq!(bus.register(regs::HEIGHT_LO), 0xd0);
        assert_eq!(bus.register(regs::PIXEL_FORMAT), PixelFormat::Raw16.code());
        assert_eq!(bus.register(regs::MODE_SELECT), regs::MODE_STREAMING);
        assert_eq!(pin.pulses, 0);
    }

    #[test]
    fn wrong_address_is_not_acknowledged() {
        let mut cam = Camera::new(
            ModelSensorBus::new(0x10),
            SyncLine::default(),
            TestPatternReadout,
            regs::DEFAULT_ADDRESS,
            SensorConfig {
                width: 8,
                height: 8,
                fps: 30,
                format: PixelFormat::Raw8,
            },
        )
        .unwrap();
        assert!(cam.init().is_err());
    }
}
