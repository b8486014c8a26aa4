//! # tegra-interop-pipeline
//!
//! The camera -> shared buffer -> consumer pipeline of tegra-interop as a
//! library, and the two programs built on it (`pipeline`, `interop_info`).
//!
//! The crate is laid out the way the data flows:
//!
//! - [`camera`]: the camera sensor model over `embedded-hal` 1.0 traits
//!   (no alloc), which writes the frames; [`camera::sensor`] is its
//!   simulated bus.
//! - [`ring`]: the ring of slots, the one per-slot state machine, and the
//!   [`ring::Ticket`] it hands out per frame.
//! - [`transport`]: the interface a transport implements (interop only:
//!   wait, write, signal), and the transports: [`transport::host`] (host
//!   reference), [`transport::nvsci`] (NvSciBuf/NvSciSync + CUDA, on a
//!   Jetson or the simulator), [`transport::egl`] (EGLImage / EGLStream),
//!   `transport::gpu` (feature `vulkan`: Vulkan producer, CUDA consumer)
//!   and [`transport::process`] (the camera in another process).
//! - [`consumer`]: the CUDA consumer and the user's work on each frame
//!   ([`consumer::work::FrameWork`]; the check-and-invert kernel is one).
//! - [`platform`]: the producing side's platform APIs, the crate
//!   `tegra-interop-platform` re-exported: `platform::vulkan` (feature
//!   `vulkan`: the Vulkan exporter, device by CUDA UUID, exportable memory
//!   and semaphores) and [`platform::egl`] (EGL display, streams and
//!   images).
//! - [`app`]: the programs built on the library: [`app::cli`],
//!   [`app::report`], [`app::stats`], [`app::backend`] and [`app::probe`]
//!   (which transport runs here and why), [`app::info`] (the
//!   `interop_info` capability report), [`app::baseline`] (plain CUDA, for
//!   `pipeline_vs_cuda`).
//!
//! # The slot protocol
//!
//! A ring of `n` slots; frame `f` uses slot `f % n` for the slot's
//! `k = f / n`-th time. Each slot has a frame buffer and two deterministic
//! fences: *ready* (producer signals, consumer waits) and *free* (consumer
//! signals, producer waits). The [`ring::Ring`] alone keeps where each
//! slot is and computes the values; a transport gets them in a
//! [`ring::Ticket`] (`free_wait = k`, `ready = k + 1`, `free_signal = k + 1`)
//! and keeps no per-slot progress.
//!
//! ```text
//!            Ring::acquire            Ring::release           Ring::submit
//!   Free ------------------> Writing ---------------> Ready --------------> InFlight
//!    ^   (then wait_free:             (after signal_ready:    (after queue_consumer:  |
//!    |    free >= free_wait,           ready = ready)          consumer waits ready,  |
//!    |    producer writes)                                     processes, signals     |
//!    |                                                         free = free_signal)    |
//!    +------------------------------------------------------------------------------+
//!                  Ring::complete (a completion from try_complete / wait_complete)
//! ```
//!
//! The program that drives the ring (the producer's thread) makes every
//! move; the consumer side (a CUDA stream, or the host reference's thread)
//! only signals *free*, which the transport reports as a completion.
//! [`ring::Ring::acquire`] refuses a slot that is not `Free`, so a slot is
//! written again only after its frame was collected, and every fence value
//! a side waits for has been, or is being, signalled.
//! [`ring::Ring::make_room`], [`ring::Ring::produce`] and
//! [`ring::Ring::drain`] do the usual loop; examples/camera_ring.rs in the
//! repository is a whole program on them.
//!
//! Transports are values the caller owns (store them, return them):
//! [`transport::nvsci::NvSciTransport::open`] / [`transport::nvsci::NvSciTransport::new`],
//! [`transport::host::HostReference::new`], `transport::gpu::GpuTransport::open`;
//! [`transport::FrameTransport::close`] tears one down and reports errors.
//!
//! # Unsafe code
//!
//! The crate denies `unsafe` code everywhere but one module, [`consumer`],
//! which holds all of it, each block with its `// SAFETY:` line: kernel
//! launches and queued copies over frame memory (the [`Consumer`](consumer::Consumer),
//! and [`consumer::bench::Bench`] for the plain-CUDA baseline and the
//! machine's limit, which owns its memory and refuses host access until
//! the work is known complete), the host views of shared frames in
//! [`consumer::shared`] (the producer's CPU view of an NvSciBuf buffer, the
//! Vulkan host mapping of a GPU slot, the consumer's read-back buffers, the
//! simulator's host processing of a mapped buffer) and the EGLStream's two
//! CUDA ends in [`consumer::egl`] (connected to an
//! [`OwnedEglStream`](consumer::egl::OwnedEglStream), torn down in the
//! driver's order). A lent frame ([`transport::PeekedFrame`]) is safe by its
//! type: it shares the memory it was lent from, and the transport waits for
//! it to be dropped before it writes the slot or lets the device at it.
//! The producers' platform code (Vulkan through `ash`, EGL/GLES loaded at
//! run time) is a crate of its own, `tegra-interop-platform` ([`platform`]).
//! `tests/unsafe_code.rs` reads the source tree and fails on `unsafe` (or a
//! lint level that lifts the deny) outside `src/consumer/`, the binaries
//! included.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(unsafe_code)]

pub mod app;
pub mod camera;
pub mod consumer;
pub mod frame;
#[doc(inline)]
pub use tegra_interop_platform as platform;
pub mod ring;
pub mod source;
pub mod transport;

/// The crate README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
