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
//! - [`frame`] and [`error`]: the frame types (layout, geometry, the
//!   consumer's completion) and the transport error, below everything else.
//! - [`slots`]: the one per-slot state machine and the [`slots::Ticket`] it
//!   hands out per frame.
//! - [`ring`]: the [`ring::Ring`], which owns a transport and hands its
//!   slots out as owned leases ([`ring::WriteLease`], [`ring::ReadLease`]),
//!   with a typed [`ring::RingError`].
//! - [`source`]: where frames come from ([`source::Source`]; the sensor
//!   model is [`source::SensorSource`]; any GStreamer pipeline's `appsink`
//!   is `source::gst::GstSource`, feature `gstreamer`), and the frame
//!   digest a checker compares ([`source::frame_digest`]).
//! - [`transport`]: the interface a transport implements (interop only:
//!   take a slot's memory, signal, queue the consumer, collect, lend), and
//!   the transports: [`transport::host`] (host
//!   reference), [`transport::nvsci`] (NvSciBuf/NvSciSync + CUDA, on a
//!   Jetson or the simulator), [`transport::egl`] (EGLImage / EGLStream),
//!   and `transport::gpu` (feature `vulkan`: Vulkan producer, CUDA
//!   consumer).
//! - [`consumer`]: the CUDA consumer and the user's work on each frame
//!   ([`consumer::work::FrameWork`]; the check-and-invert kernel is one).
//! - [`platform`]: the producing side's platform APIs, the crate
//!   `tegra-interop-platform` re-exported: `platform::vulkan` (feature
//!   `vulkan`: the Vulkan exporter, device by CUDA UUID, exportable memory
//!   and semaphores) and [`platform::egl`] (EGL display, streams and
//!   images).
//! - `app`: the programs built on the library (`app::run` is the
//!   `pipeline` program's one loop): `app::cli`,
//!   `app::report`, `app::stats`, `app::backend` and `app::probe`
//!   (which transport runs here and why), `app::info` (the
//!   `interop_info` capability report), `app::baseline` (plain CUDA, for
//!   `pipeline_vs_cuda`), `app::process` (the two-process mode: the
//!   camera in another process).
//!
//! # The slot protocol
//!
//! A ring of `n` slots; frame `f` uses slot `f % n` for the slot's
//! `k = f / n`-th time. Each slot has a frame buffer and two deterministic
//! fences: *ready* (producer signals, consumer waits) and *free* (consumer
//! signals, producer waits). The ring's state machine ([`slots::Slots`])
//! alone keeps where each slot is and computes the values; a transport gets
//! them in a [`slots::Ticket`] (`free_wait = k`, `ready = k + 1`,
//! `free_signal = k + 1`) and keeps no per-slot progress.
//!
//! ```text
//!          Ring::acquire              Ring::hand_over                           Ring::collect
//!   Free ----------------> Writing -------------------------> InFlight ------------------> Free
//!    ^   (take_slot: free >=   | (the WriteLease: written   (signal_ready: ready = k + 1;   |
//!    |    free_wait; a         |  on any thread)             consumer waits ready, works,   |
//!    |    WriteLease)          | dropped unwritten:          signals free = k + 1)         | Ring::read
//!    |                         +--> the same ticket again                                   v
//!    +------------------------------------------------------------------------------- Lent (a ReadLease;
//!                                                                    dropped: the slot is free again)
//! ```
//!
//! The program that drives the ring (the producer's thread) makes every
//! move; the consumer side (a CUDA stream, or the host reference's thread)
//! only signals *free*, which the transport reports as a completion.
//! [`ring::Ring::acquire`] hands out a slot only once its previous frame
//! was collected and its read lease dropped, so a slot is written again
//! only after its frame was read, and every fence value a side waits for
//! has been, or is being, signalled. The ring's module docs show the loop;
//! examples/camera_ring.rs in this crate is a whole program on it.
//!
//! Transports are values the caller owns until a ring takes them:
//! [`transport::nvsci::NvSciTransport::open`] / [`transport::nvsci::NvSciTransport::new`],
//! [`transport::host::HostReference::new`], `transport::gpu::GpuTransport::open`;
//! [`ring::Ring::close`] (or [`transport::FrameTransport::close`]) tears one
//! down and reports errors.
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
//! driver's order). A lent frame ([`transport::PeekedFrame`], which a
//! [`ring::ReadLease`] holds) is safe by its type: it shares the memory it
//! was lent from, and the transport waits for it to be dropped before it
//! writes the slot or lets the device at it.
//! The producers' platform code (Vulkan through `ash`, EGL/GLES loaded at
//! run time) is a crate of its own, `tegra-interop-platform` ([`platform`]).
//! `tests/unsafe_code.rs` reads the source tree and fails on `unsafe` (or a
//! lint level that lifts the deny) outside `src/consumer/`, the binaries
//! included.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(unsafe_code)]

#[cfg(feature = "cli")]
pub mod app;
pub mod camera;
pub mod consumer;
pub mod error;
pub mod frame;
/// The interop layer this crate is built on (the crate `tegra-interop`
/// re-exported): `interop::driver` for contexts, streams, modules and
/// kernels a user's [`consumer::work::FrameWork`] needs, `interop::core`
/// for the checked descriptors.
pub use tegra_interop as interop;
#[doc(inline)]
pub use tegra_interop_platform as platform;
/// The simulator (the crate `tegra-interop-sim` re-exported, feature
/// `sim`): a software CUDA driver, NvSci and NVRTC, where a user's kernels
/// run as Rust twins registered by name.
#[cfg(feature = "sim")]
pub use tegra_interop_sim as sim;
pub mod multicast;
pub mod ring;
pub mod slots;
pub mod source;
pub mod transport;
#[cfg(feature = "zenoh")]
pub mod zenoh;

/// The crate README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The repository README's examples (its quick start is a program on this
/// crate), compiled and run as doctests here; only in the repository (the
/// file is outside the package, and doctests are not built from it).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct RepositoryReadmeDoctests;
