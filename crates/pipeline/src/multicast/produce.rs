//! The producer's side of one slot shared through an [`Exporter`], as the
//! fd-backed multicast transports (`CudaFanout`, `ProcessFanout`) keep it:
//! the exported frame and its *ready* timeline, and the host staging bytes
//! the write lease holds while the slot is out for writing.

use std::any::Any;
use std::time::Duration;

use crate::frame::LeasedMemory;
use crate::transport::export::{ExportedFrame, Exporter};
use crate::transport::{SlotMemory, TransportError};

/// A slot's staging bytes, lent to a write lease.
struct Staged(Box<[u8]>);

impl LeasedMemory for Staged {
    fn bytes_mut(&mut self, _slot: usize) -> Result<&mut [u8], TransportError> {
        Ok(&mut self.0)
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// The producer's side of one slot.
pub(crate) struct ProducerSlot<E: Exporter> {
    /// The exported frame memory.
    pub(crate) frame: E::Frame,
    /// Its *ready* timeline (signalled to the slot's use).
    pub(crate) ready: E::Timeline,
    /// The staging bytes; `None` while out for writing.
    staging: Option<Box<[u8]>>,
    /// The frame the slot is out for.
    taken: Option<u64>,
}

impl<E: Exporter> ProducerSlot<E> {
    /// `slots` slots of `len`-byte frames, exported by `exporter`.
    pub(crate) fn make(
        exporter: &mut E,
        slots: usize,
        len: usize,
    ) -> Result<Vec<ProducerSlot<E>>, TransportError> {
        let mut made = Vec::with_capacity(slots);
        for _ in 0..slots {
            made.push(ProducerSlot {
                frame: exporter.export_frame(len as u64)?,
                ready: exporter.export_timeline(0)?,
                staging: Some(vec![0u8; len].into_boxed_slice()),
                taken: None,
            });
        }
        Ok(made)
    }

    /// Hands slot `slot` out for writing `frame` (`len` bytes), once the
    /// exporter gave its memory back to the host (at most `limit`); nothing
    /// changes on an error.
    pub(crate) fn take(
        &mut self,
        exporter: &mut E,
        slot: usize,
        frame: u64,
        len: usize,
        limit: Duration,
    ) -> Result<SlotMemory, TransportError> {
        if self.staging.is_none() {
            return Err(TransportError::misuse(format!(
                "slot {slot} is out for writing already"
            )));
        }
        if !exporter.reclaim(&mut self.frame, limit)? {
            return Err(TransportError::timeout(
                format!("slot {slot} to come back to the host for frame {frame}"),
                limit,
            ));
        }
        let staging = self
            .staging
            .take()
            .ok_or_else(|| TransportError::no_slot(slot))?;
        self.taken = Some(frame);
        Ok(SlotMemory::for_slot(slot, frame, len, Staged(staging)))
    }

    /// The lease's bytes back, for the frame the slot was out for.
    fn back(&mut self, slot: usize, memory: SlotMemory) -> Result<Box<[u8]>, TransportError> {
        let frame = self.taken.ok_or_else(|| {
            TransportError::misuse(format!("slot {slot} was not out for writing"))
        })?;
        let Staged(bytes) = memory.into_memory_of(slot, frame)?;
        self.taken = None;
        Ok(bytes)
    }

    /// Takes the slot back unwritten.
    pub(crate) fn put_back(
        &mut self,
        slot: usize,
        memory: SlotMemory,
    ) -> Result<(), TransportError> {
        let bytes = self.back(slot, memory)?;
        self.staging = Some(bytes);
        Ok(())
    }

    /// Takes the written slot back, copies it into the exported frame and
    /// publishes it with *ready* = `use_`.
    pub(crate) fn publish(
        &mut self,
        exporter: &mut E,
        slot: usize,
        use_: u64,
        memory: SlotMemory,
    ) -> Result<(), TransportError> {
        let bytes = self.back(slot, memory)?;
        let bytes = self.staging.insert(bytes);
        self.frame.write(0, bytes)?;
        exporter.publish(&mut self.frame, &self.ready, use_)
    }
}
