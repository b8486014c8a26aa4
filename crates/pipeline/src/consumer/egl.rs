//! The two CUDA ends of an `EGLStreamKHR` and what they need kept alive:
//! [`OwnedEglStream`] (a stream and its owner, no end connected) and
//! `EglStreamEnds` (the consumer and producer connected to it, and the
//! producer's device buffers), torn down in the order the driver needs:
//! both ends disconnect before the stream is destroyed, and the buffers
//! the producer presented stay allocated until the producer disconnected.
//! An end that does not disconnect leaks the stream (and the producer's
//! buffers) instead of destroying them under it.

use std::any::Any;

use tegra_interop::driver::egl::{EglStreamConsumer, EglStreamProducer, ProducerFrame};
use tegra_interop::driver::{BackendKind, Context, DeviceBuffer, Stream};
use tegra_interop::sys::cuda::EGLStreamKHR;

use crate::error::{DriverResultExt, TransportError};
use crate::frame::FrameGeometry;

/// Where an [`OwnedEglStream`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// The simulator's stream: only the simulator's driver knows it.
    Simulated,
    /// A stream of a real EGL display.
    Display,
    /// A raw handle the caller vouched for.
    Raw,
}

/// An `EGLStreamKHR` with no CUDA end connected, and what keeps it alive
/// (destroyed when that is dropped, after the ends disconnected).
pub struct OwnedEglStream {
    raw: EGLStreamKHR,
    source: Source,
    keep: Box<dyn Any>,
}

impl std::fmt::Debug for OwnedEglStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedEglStream")
            .field("raw", &self.raw)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl OwnedEglStream {
    #[cfg(feature = "sim")]
    /// The simulator's stream (connected only in a context of the
    /// simulator: connecting it in a context of the real driver is refused).
    pub fn simulated(stream: tegra_interop_sim::egl::SimEglStream) -> OwnedEglStream {
        OwnedEglStream {
            raw: stream.as_raw(),
            source: Source::Simulated,
            keep: Box::new(stream),
        }
    }

    /// A stream of a real EGL display ([`crate::platform::egl`]: it keeps
    /// its display and destroys the stream when dropped).
    pub fn display(stream: crate::platform::egl::EglStream) -> OwnedEglStream {
        OwnedEglStream {
            raw: stream.as_raw() as EGLStreamKHR,
            source: Source::Display,
            keep: Box::new(stream),
        }
    }

    /// A stream the caller made some other way.
    ///
    /// # Safety
    /// `raw` must be a live `EGLStreamKHR` of an EGL display that this
    /// process's CUDA driver (the one of the context it will be connected
    /// in) can reach, with no CUDA end connected to it, and it must stay
    /// alive (not destroyed) for as long as `keep` is alive; dropping
    /// `keep` may destroy it.
    pub unsafe fn from_raw(raw: EGLStreamKHR, keep: Box<dyn Any>) -> OwnedEglStream {
        OwnedEglStream {
            raw,
            source: Source::Raw,
            keep,
        }
    }
}

/// A stream's consumer and producer ends (RGBA8 frames of one geometry),
/// the producer's pool of device buffers and the stream, torn down in the
/// driver's order (see the module docs) by [`EglStreamEnds::shut_down`] or
/// the drop.
pub(crate) struct EglStreamEnds {
    consumer: Option<EglStreamConsumer>,
    producer: Option<EglStreamProducer>,
    /// The producer's buffers, each at least a frame long.
    pool: Vec<DeviceBuffer>,
    /// Per pool buffer: presented and not returned (the consumer may hold it).
    out: Vec<bool>,
    geometry: FrameGeometry,
    stream: Option<OwnedEglStream>,
}

impl EglStreamEnds {
    /// Connects the consumer, then the producer (measured: a producer
    /// first gets `CUDA_ERROR_UNKNOWN`) in `ctx` to `stream`, for frames of
    /// `geometry` (RGBA8: the stride a multiple of 4) presented from
    /// `pool` (each buffer at least a frame long).
    pub(crate) fn connect(
        ctx: &Context,
        stream: OwnedEglStream,
        geometry: FrameGeometry,
        pool: Vec<DeviceBuffer>,
    ) -> Result<EglStreamEnds, TransportError> {
        let (width, height) = rgba_size(geometry)?;
        if stream.source == Source::Simulated && ctx.backend().kind() == BackendKind::Real {
            return Err(TransportError::refused(
                "a simulated EGLStream connects only in a context of the simulator",
            ));
        }
        if let Some(short) = pool.iter().find(|b| b.len() < geometry.frame_len()) {
            return Err(TransportError::refused(format!(
                "a producer buffer of {} bytes, a frame needs {}",
                short.len(),
                geometry.frame_len()
            )));
        }
        let raw = stream.raw;
        let mut ends = EglStreamEnds {
            consumer: None,
            producer: None,
            out: vec![false; pool.len()],
            pool,
            geometry,
            stream: Some(stream),
        };
        // From here on a failure tears down what exists (Drop).
        // SAFETY: `raw` is live while `ends.stream` is (the constructors of
        // `OwnedEglStream`: made from an owner that keeps it, or vouched
        // for by `from_raw`'s caller), of a display this context's driver
        // reaches (a simulated stream only in the simulator, checked
        // above), with no end connected; `ends` drops the stream only after
        // this connection ended, or leaks it.
        ends.consumer = Some(
            unsafe { EglStreamConsumer::connect(ctx, raw, None) }
                .during("cuEGLStreamConsumerConnect")?,
        );
        // SAFETY: as above.
        ends.producer = Some(
            unsafe { EglStreamProducer::connect(ctx, raw, width, height) }
                .during("cuEGLStreamProducerConnect")?,
        );
        Ok(ends)
    }

    /// The consumer end.
    pub(crate) fn consumer(&self) -> Result<&EglStreamConsumer, TransportError> {
        self.consumer
            .as_ref()
            .ok_or_else(|| TransportError::misuse("the consumer has disconnected"))
    }

    /// Copies `src` into pool buffer `index` (`cuMemcpyHtoD`); refused
    /// while the buffer is presented and not returned.
    pub(crate) fn upload(&self, index: usize, src: &[u8]) -> Result<(), TransportError> {
        self.check_back(index)?;
        self.pool[index]
            .copy_from_host(0, src)
            .during("cuMemcpyHtoD of a frame")
    }

    fn check_back(&self, index: usize) -> Result<(), TransportError> {
        match self.out.get(index) {
            Some(false) => Ok(()),
            Some(true) => Err(TransportError::misuse(format!(
                "producer buffer {index} is presented and not returned"
            ))),
            None => Err(TransportError::misuse(format!(
                "no producer buffer {index} (the pool has {})",
                self.pool.len()
            ))),
        }
    }

    /// Presents pool buffer `index` (`cuEGLStreamProducerPresentFrame`),
    /// ordered on `stream`; refused while it is presented and not returned.
    pub(crate) fn present(&mut self, index: usize, stream: &Stream) -> Result<(), TransportError> {
        self.check_back(index)?;
        let (width, height) = rgba_size(self.geometry)?;
        let pitch = u32::try_from(self.geometry.stride)
            .map_err(|_| TransportError::refused("the stride exceeds 32 bits"))?;
        let Some(producer) = self.producer.as_mut() else {
            return Err(TransportError::misuse("the producer has disconnected"));
        };
        // SAFETY: a pool buffer, at least `frame_len` = stride x rows bytes
        // (checked at `connect`), and a row of `width` = stride / 4 RGBA
        // pixels fits the pitch.
        let frame = unsafe {
            ProducerFrame::rgba_pitch(self.pool[index].device_ptr(), width, height, pitch)
        };
        // SAFETY: the buffer is device memory of the producer's context
        // (allocated there by the transport; the driver checks the stream's
        // context), a frame long, kept allocated until the producer
        // disconnected (`shut_down` frees the pool only then, or leaks it),
        // and not written while the consumer may hold it (`upload` refuses
        // it until `return_frame` gave it back).
        unsafe { producer.present(&frame, Some(stream)) }
            .during("cuEGLStreamProducerPresentFrame")?;
        self.out[index] = true;
        Ok(())
    }

    /// A buffer the stream gave back (`cuEGLStreamProducerReturnFrame`):
    /// its pool index; `Ok(None)` while none is.
    pub(crate) fn return_frame(
        &mut self,
        stream: &Stream,
    ) -> Result<Option<usize>, TransportError> {
        let Some(producer) = self.producer.as_mut() else {
            return Err(TransportError::misuse("the producer has disconnected"));
        };
        let Some(back) = producer
            .return_frame(Some(stream))
            .during("cuEGLStreamProducerReturnFrame")?
        else {
            return Ok(None);
        };
        let index = back
            .plane_ptr(0)
            .and_then(|p| self.pool.iter().position(|b| b.device_ptr() == p))
            .ok_or_else(|| {
                TransportError::peer("the stream returned a frame the producer never presented")
            })?;
        self.out[index] = false;
        Ok(Some(index))
    }

    /// Disconnects the producer, then the consumer, frees the pool (only
    /// once the producer disconnected) and drops the stream (only once
    /// both did; leaked otherwise); the first error. Safe to call twice.
    pub(crate) fn shut_down(&mut self) -> Result<(), TransportError> {
        let mut first: Option<TransportError> = None;
        let mut note = |r: Result<(), TransportError>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        let producer_left = match self.producer.take() {
            Some(p) => {
                let r = p.disconnect().during("cuEGLStreamProducerDisconnect");
                let ok = r.is_ok();
                note(r);
                ok
            }
            None => true,
        };
        let consumer_left = match self.consumer.take() {
            Some(c) => {
                let r = c
                    .disconnect()
                    .map_err(|e| TransportError::driver("cuEGLStreamConsumerDisconnect", e.into()));
                let ok = r.is_ok();
                note(r);
                ok
            }
            None => true,
        };
        if producer_left {
            // The header: presented memory stays allocated until the
            // producer disconnected; freed now (cuMemFree).
            for b in self.pool.drain(..) {
                note(b.destroy().during("cuMemFree of a frame buffer"));
            }
        } else if !self.pool.is_empty() {
            note(Err(TransportError::refused(
                "the producer did not disconnect, so its frame buffers are left allocated",
            )));
            std::mem::forget(std::mem::take(&mut self.pool));
        }
        self.out.clear();
        if let Some(stream) = self.stream.take() {
            if producer_left && consumer_left {
                drop(stream.keep);
            } else {
                note(Err(TransportError::refused(
                    "an end of the EGLStream did not disconnect, so the stream is left alive",
                )));
                std::mem::forget(stream.keep);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for EglStreamEnds {
    fn drop(&mut self) {
        // `shut_down` reports errors where it is called; a drop without it
        // tears down the same way.
        let _ = self.shut_down();
    }
}

/// An RGBA8 frame's width and height in pixels (the stride a multiple of 4).
fn rgba_size(geometry: FrameGeometry) -> Result<(u32, u32), TransportError> {
    let width = u32::try_from(geometry.stride / 4)
        .ok()
        .filter(|w| *w as usize * 4 == geometry.stride)
        .ok_or_else(|| {
            TransportError::refused("RGBA8 lines: the stride must be a multiple of 4")
        })?;
    let height = u32::try_from(geometry.rows)
        .map_err(|_| TransportError::refused("the frame height exceeds 32 bits"))?;
    Ok((width, height))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tegra_interop_sim::egl::EglStreamMode;

    const G: FrameGeometry = FrameGeometry {
        stride: 64,
        rows: 4,
    };

    fn sim_stream(sim: &tegra_interop_sim::Sim) -> OwnedEglStream {
        OwnedEglStream::simulated(sim.create_egl_stream(EglStreamMode::Fifo(2)).unwrap())
    }

    fn pool(ctx: &Context, n: usize, len: usize) -> Vec<DeviceBuffer> {
        (0..n)
            .map(|_| DeviceBuffer::new(ctx, len).unwrap())
            .collect()
    }

    #[test]
    #[cfg_attr(miri, ignore = "runs the simulator's stream threads")]
    fn a_presented_buffer_is_neither_written_nor_presented_again_until_returned() {
        let sim = tegra_interop_sim::Sim::new().unwrap();
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let mut ends =
            EglStreamEnds::connect(&ctx, sim_stream(&sim), G, pool(&ctx, 2, G.frame_len()))
                .unwrap();
        let frame = vec![3u8; G.frame_len()];
        ends.upload(0, &frame).unwrap();
        ends.present(0, &stream).unwrap();
        let e = ends.upload(0, &frame).unwrap_err().to_string();
        assert!(e.contains("presented and not returned"), "{e}");
        assert!(ends.present(0, &stream).is_err(), "presented twice");
        assert!(ends.upload(2, &frame).is_err(), "no buffer 2");
        ends.upload(1, &frame).unwrap();
        ends.shut_down().unwrap();
        ends.shut_down().unwrap();
        assert!(ends.consumer().is_err(), "disconnected");
    }

    #[test]
    #[cfg_attr(miri, ignore = "runs the simulator")]
    fn a_producer_buffer_shorter_than_a_frame_or_a_bad_stride_is_refused() {
        let sim = tegra_interop_sim::Sim::new().unwrap();
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let short = pool(&ctx, 2, G.frame_len() - 1);
        let e = EglStreamEnds::connect(&ctx, sim_stream(&sim), G, short)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("a frame needs"), "{e}");
        let odd = FrameGeometry {
            stride: 63,
            rows: 4,
        };
        let e = EglStreamEnds::connect(&ctx, sim_stream(&sim), odd, pool(&ctx, 2, 256))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("multiple of 4"), "{e}");
    }
}
