//! The simulator's memfd exporter behind the conformance suite's
//! [`Exporter`] trait, for the simulator-backed tests.

use std::os::fd::OwnedFd;
use std::time::Duration;

use crate::conformance::{
    ExportError, ExportedBinarySemaphore, ExportedMemory, ExportedTimelineSemaphore, Exporter,
};
use tegra_interop_sim::export;

/// The simulator's exporter (memfd memory and semaphores).
pub struct SimExporter;

struct Memory(export::ExportedMemory);

impl ExportedMemory for Memory {
    fn size(&self) -> u64 {
        self.0.size() as u64
    }
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), ExportError> {
        Ok(self.0.write(offset as usize, data)?)
    }
    fn read(&mut self, offset: u64, out: &mut [u8]) -> Result<(), ExportError> {
        Ok(self.0.read(offset as usize, out)?)
    }
}

struct Binary(export::ExportedBinarySemaphore);

impl ExportedBinarySemaphore for Binary {
    fn signal(&mut self) -> Result<(), ExportError> {
        self.0.signal();
        Ok(())
    }
    fn wait(&mut self, timeout: Duration) -> Result<bool, ExportError> {
        Ok(self.0.wait(timeout))
    }
}

struct Timeline(export::ExportedTimelineSemaphore);

impl ExportedTimelineSemaphore for Timeline {
    fn signal(&mut self, value: u64) -> Result<(), ExportError> {
        Ok(self.0.signal(value)?)
    }
    fn value(&mut self) -> Result<u64, ExportError> {
        Ok(self.0.value())
    }
    fn wait(&mut self, value: u64, timeout: Duration) -> Result<bool, ExportError> {
        Ok(self.0.wait(value, timeout))
    }
}

impl Exporter for SimExporter {
    fn export_memory(
        &mut self,
        size: u64,
    ) -> Result<(OwnedFd, Box<dyn ExportedMemory>), ExportError> {
        let (fd, memory) = export::memory(size as usize)?;
        Ok((fd, Box::new(Memory(memory))))
    }
    fn export_binary_semaphore(
        &mut self,
    ) -> Result<(OwnedFd, Box<dyn ExportedBinarySemaphore>), ExportError> {
        let (fd, sem) = export::binary_semaphore()?;
        Ok((fd, Box::new(Binary(sem))))
    }
    fn export_timeline_semaphore(
        &mut self,
        initial: u64,
    ) -> Result<(OwnedFd, Box<dyn ExportedTimelineSemaphore>), ExportError> {
        let (fd, sem) = export::timeline_semaphore(initial)?;
        Ok((fd, Box::new(Timeline(sem))))
    }
}
