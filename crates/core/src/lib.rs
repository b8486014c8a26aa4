//! `tegra-interop-core`: the rules and the bookkeeping of CUDA external memory and
//! semaphores and of NvSciBuf / NvSciSync, without calling anything.
//!
//! This crate is `#![no_std]` and never allocates. It turns typed, validated values into the
//! exact C structures of `tegra-interop-sys` (reserved fields zero), and keeps the per-frame
//! state (semaphore batches, timeline values, deterministic NvSciSync fence counts) in fixed
//! capacity storage, so the same code runs on a Jetson's application cores and on its
//! Cortex-R / Cortex-M co-processors.
//!
//! | module | what it holds |
//! |---|---|
//! | [`error`] | [`CuResult`], [`NvSciError`] (open newtypes), [`ValidationError`], [`Hint`] |
//! | [`flags`] | bitflags for import, signal, wait and NvSciSync attribute flags |
//! | [`import`] | [`Import`]: the one import front end of memory and semaphores |
//! | [`memory`] | [`MemoryImport`], [`BufferMapping`], [`ArrayDesc`], [`MipmappedArrayMapping`] |
//! | [`semaphore`] | [`SemaphoreImport`], [`SignalParams`], [`WaitParams`] |
//! | [`batch`] | [`SignalBatch`], [`WaitBatch`]: handles + params as two contiguous arrays |
//! | [`fence`] | [`TimelineTracker`], [`DeterministicCounter`] |
//! | [`nvsci`] | [`BufAttrSet`], [`SyncAttrSet`]: typed NvSci attribute lists |
//!
//! The core never knows whether a handle is alive: that is what the driver crate's lifetimes
//! are for. What it checks is everything that can be checked from the values alone.
//!
//! ```
//! use tegra_interop_core::{BufferMapping, MemoryImport, SignalParams, SemaphoreHandleKind};
//!
//! let import = MemoryImport::opaque_fd(7, 1 << 20)?;
//! let buffer = BufferMapping::new(0, 4096).lower_for(&import)?;
//! assert_eq!(buffer.size, 4096);
//!
//! let signal = SignalParams::timeline(3).lower_for(SemaphoreHandleKind::TimelineSemaphoreFd)?;
//! assert_eq!(signal.params.fence.value, 3);
//! # Ok::<(), tegra_interop_core::ValidationError>(())
//! ```
#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod batch;
pub mod error;
pub mod fence;
pub mod flags;
pub mod import;
pub mod ipc;
pub mod memory;
pub mod nvsci;
pub mod semaphore;

pub use batch::{PushError, SignalBatch, SignalEntry, WaitBatch, WaitEntry};
pub use error::{CuResult, Hint, NvSciError, ValidationError};
pub use fence::{
    DeterministicCounter, DeterministicReservation, PrimitiveWidth, StreamId, TimelineReservation,
    TimelineTracker,
};
pub use flags::{MemoryImportFlags, NvSciSyncAttrFlags, SignalFlags, WaitFlags};
pub use import::{Import, ImportKind};
pub use memory::{
    ArrayDesc, ArrayFormat, BufferMapping, MemoryHandle, MemoryHandleKind, MemoryImport,
    MipmappedArrayMapping,
};
pub use nvsci::{
    BufAttr, BufAttrSet, ColorFormat, ColorStd, GpuCache, GpuCompression, GpuId, ScanType,
    SyncAttr, SyncAttrSet,
};
pub use semaphore::{
    Payload, SemaphoreHandle, SemaphoreHandleKind, SemaphoreImport, SignalParams, WaitParams,
    KEYED_MUTEX_INFINITE,
};

/// Re-export of the generated FFI layouts this crate lowers to.
pub use tegra_interop_sys as sys;
