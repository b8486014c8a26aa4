//! The camera sensor model of [`crate::camera`] as a [`Source`]: each frame
//! is triggered on the model's sync line and read out as the frame's test
//! pattern ([`crate::camera::TestPattern`]), which the program's checker
//! verifies after the consumer's work.

use crate::camera::sensor::{ModelSensorBus, SyncLine};
use crate::camera::{
    regs, Camera, FrameInfo, FrameSink, PixelFormat as SensorFormat, SensorConfig,
    TestPatternReadout,
};
use crate::frame::{FrameLayout, FrameMut, PixelFormat};
use crate::source::{Filled, Source, SourceError};

/// What the errors name as the failing part.
const ELEMENT: &str = "sensor model";

/// The sensor model, initialised and streaming (see the module docs).
pub struct SensorSource {
    camera: Camera<ModelSensorBus, SyncLine, TestPatternReadout>,
    layout: FrameLayout,
}

impl std::fmt::Debug for SensorSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SensorSource")
            .field("layout", &self.layout)
            .field("next_frame", &self.camera.next_index())
            .finish()
    }
}

/// The frame layout of a sensor configuration.
///
/// # Errors
/// Refused for a configuration that is not a frame (a side of zero).
pub fn layout_of(config: &SensorConfig) -> Result<FrameLayout, SourceError> {
    let format = match config.format {
        SensorFormat::Raw8 => PixelFormat::Gray8,
        SensorFormat::Raw16 => PixelFormat::Gray16,
        SensorFormat::Rgba8 => PixelFormat::Rgba8,
    };
    FrameLayout::packed(u32::from(config.width), u32::from(config.height), format).map_err(|e| {
        SourceError::Element {
            element: ELEMENT.into(),
            reason: e.to_string(),
        }
    })
}

impl SensorSource {
    /// The model sensor with `config`, set up over its bus and streaming.
    ///
    /// # Errors
    /// The configuration or the set-up was refused.
    pub fn new(config: SensorConfig) -> Result<SensorSource, SourceError> {
        let failed = |e: &dyn std::fmt::Display| SourceError::Element {
            element: ELEMENT.into(),
            reason: e.to_string(),
        };
        let mut camera = Camera::new(
            ModelSensorBus::new(regs::DEFAULT_ADDRESS),
            SyncLine::default(),
            TestPatternReadout,
            regs::DEFAULT_ADDRESS,
            config,
        )
        .map_err(|e| failed(&e))?;
        camera.init().map_err(|e| failed(&e))?;
        Ok(SensorSource {
            layout: layout_of(&config)?,
            camera,
        })
    }
}

/// Checks that the sensor produced the frame that was due.
struct Due(u64);

impl FrameSink for Due {
    type Error = String;
    fn frame_ready(&mut self, info: &FrameInfo, _frame: &[u8]) -> Result<(), String> {
        match info.index == self.0 {
            true => Ok(()),
            false => Err(format!(
                "produced frame {} where {} was due",
                info.index, self.0
            )),
        }
    }
}

impl Source for SensorSource {
    fn describe(&self) -> String {
        format!("{ELEMENT} ({})", self.layout)
    }

    fn layout(&self) -> FrameLayout {
        self.layout
    }

    fn fill(&mut self, frame: &mut FrameMut<'_>) -> Result<Filled, SourceError> {
        let mut due = Due(frame.index());
        self.camera
            .capture(frame.bytes_mut(), &mut due)
            .map_err(|e| SourceError::Element {
                element: ELEMENT.into(),
                reason: e.to_string(),
            })?;
        Ok(Filled::default())
    }

    fn trigger_pulses(&self) -> Option<u64> {
        Some(self.camera.pin().pulses)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::camera::TestPattern;

    #[test]
    fn the_sensor_fills_each_frame_with_its_pattern_and_pulses_once() {
        let config = SensorConfig {
            width: 8,
            height: 4,
            fps: 60,
            format: SensorFormat::Rgba8,
        };
        let mut s = SensorSource::new(config).unwrap();
        let layout = s.layout();
        assert_eq!(layout.pitch(), config.stride());
        let mut bytes = vec![0u8; layout.frame_len()];
        for index in 0..3 {
            let mut f = FrameMut::new(index, layout, &mut bytes).unwrap();
            assert_eq!(s.fill(&mut f).unwrap(), Filled::default());
            let p = TestPattern::new(index, layout.pitch());
            assert_eq!(p.first_mismatch(&bytes, 0), None);
        }
        assert_eq!(s.trigger_pulses(), Some(3));
        // A frame out of order is refused, naming the sensor.
        let mut f = FrameMut::new(7, layout, &mut bytes).unwrap();
        let e = s.fill(&mut f).unwrap_err().to_string();
        assert!(e.contains("sensor model") && e.contains("7 was due"), "{e}");
        assert!(s.describe().contains("8x4 RGBA"));
    }
}
