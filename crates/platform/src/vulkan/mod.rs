//! The Vulkan exporter (feature `vulkan`): Vulkan as the API that makes the
//! memory and the semaphores CUDA imports, on a discrete GPU.
//!
//! On a discrete GPU there is no NvSci, but Vulkan can hand out the same kind of objects CUDA
//! imports: device memory and binary/timeline semaphores as opaque POSIX file descriptors.
//! [`VulkanExporter`] is a small, self-contained Vulkan setup built on `ash`:
//!
//! - the Vulkan loader is opened at run time ([`ash::Entry::load`]); a machine without one gets
//!   [`Error::LoaderNotFound`], never a panic;
//! - the physical device is chosen by its `deviceUUID`, which must equal the CUDA device UUID
//!   (`cuDeviceGetUuid_v2`); enumeration order is never used;
//! - its one queue is of the family a [`QueueChoice`] asks for (the first with compute by
//!   default; a transfer-only family puts the copies and semaphore operations on the copy
//!   engines);
//! - memory ([`VulkanMemory`]) and semaphores ([`VulkanSemaphore`]) can be exported any number
//!   of times as `OPAQUE_FD`; every export is a fresh [`OwnedFd`] that an importer consumes.
//!   The size to import is [`VulkanMemory::size`], the real allocation size, which can be larger
//!   than the size asked for;
//! - the Vulkan side can act on shared objects: host reads/writes through a persistent mapping,
//!   copies into device-local memory, queue submissions that wait for / signal semaphores, host
//!   signal / wait / counter read of timeline semaphores, and a one-invocation compute dispatch
//!   that adds 1 to a `u32` in shared memory ([`CounterIncrement`]);
//! - host-visible memory that the host writes and another API reads (or the reverse) is handed
//!   over through recorded queue batches ([`HostHandover`]): host writes reach the device only
//!   through a queue submission, never through a host-side semaphore signal.
//!
//! Nothing here reads the environment: [`QueueChoice::from_env`] is there for a program that
//! wants to offer [`QueueChoice::ENV`] as an override, and calls it itself.
//!
//! # Example
//! ```no_run
//! use tegra_interop_platform::vulkan::{MemoryLocation, QueueChoice, VulkanExporter};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The CUDA device's UUID (`tegra_interop::driver::Device::uuid`); the Vulkan device with
//! // the same UUID is the one opened.
//! let cuda_uuid = [0u8; 16];
//! let vk = VulkanExporter::with_queue(cuda_uuid, QueueChoice::TransferOnly)?;
//! let memory = vk.allocate_memory(1 << 20, MemoryLocation::HostVisible)?;
//! let fd = memory.export_fd()?; // import it into CUDA with `memory.size()` bytes
//! let (semaphore_fd, semaphore) = vk.export_timeline_semaphore(0)?;
//! # drop((fd, semaphore_fd, semaphore));
//! # Ok(())
//! # }
//! ```
//!
//! # Lifetimes and teardown
//! Every object keeps the device alive through an `Arc`, so the device and instance are
//! destroyed after the last object. Each queue submission signals an internal timeline
//! semaphore; an object remembers the last submission that used it and, when dropped, waits
//! (bounded, [`DROP_WAIT`]) for that submission before destroying the Vulkan object. If the GPU
//! work does not finish in time (for example a submission waits for a semaphore that nobody
//! signals), the object is leaked instead of being destroyed while in use. Drop never panics.
//!
//! # The compute shader
//! [`CounterIncrement`] uses a compute shader written directly as SPIR-V words in this file
//! (see `INCREMENT_SPIRV`): one invocation loads the first `u32` of a storage buffer, adds 1
//! and stores it back. It was checked with `spirv-val --target-env vulkan1.1`.

mod compute;
mod counter;
mod exporter;
mod handover;
mod memory;
mod owners;
mod queue;
mod semaphore;
mod setup;

pub use self::counter::*;
pub use self::exporter::*;
pub use self::handover::*;
pub use self::memory::*;
use self::owners::*;
pub use self::semaphore::*;
use self::setup::*;

use std::ffi::{c_char, CStr};
use std::fmt;
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ash::{khr, vk};

/// How long a drop waits for GPU work that still uses the object before leaking it instead.
pub const DROP_WAIT: Duration = Duration::from_secs(10);

/// How long the synchronous helpers ([`VulkanExporter::upload`], [`VulkanExporter::download`])
/// wait for their copy to finish.
pub const COPY_WAIT: Duration = Duration::from_secs(30);

/// Vulkan 1.2, the API version the instance asks for (1.1 is the minimum accepted).
const REQUESTED_API: u32 = vk::API_VERSION_1_2;

/// Errors of the Vulkan exporter.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The Vulkan loader library could not be opened (or lacks its entry point).
    LoaderNotFound {
        /// What the dynamic loader said.
        reason: String,
    },
    /// A Vulkan call returned an error code.
    Vulkan {
        /// The Vulkan command that failed.
        call: &'static str,
        /// Its result code.
        result: vk::Result,
    },
    /// The loader or the device supports only an API version below 1.1.
    ApiVersionTooOld {
        /// What was found (Vulkan packed version).
        found: u32,
    },
    /// No physical device has the requested UUID.
    DeviceNotFound {
        /// The UUID that was looked for.
        uuid: [u8; 16],
        /// The devices that were seen instead.
        seen: Vec<DeviceInfo>,
    },
    /// The selected device lacks a device extension this exporter needs.
    MissingExtension {
        /// The extension name.
        extension: &'static str,
    },
    /// The selected device does not support timeline semaphores.
    TimelineSemaphoresUnsupported,
    /// The device has no queue family of the kind asked for.
    NoQueueFamily {
        /// What was asked for.
        choice: QueueChoice,
    },
    /// A compute dispatch was asked of an exporter whose queue has no compute.
    NoComputeQueue,
    /// A queue family choice that is not one of [`QueueChoice`]'s names.
    BadQueueChoice {
        /// The value found.
        value: String,
    },
    /// No memory type fits the buffer and the requested location.
    NoMemoryType {
        /// The location that was asked for.
        location: MemoryLocation,
    },
    /// The implementation cannot export this kind of object as an opaque fd.
    NotExportable {
        /// What could not be exported.
        what: &'static str,
    },
    /// A size of zero was asked for.
    ZeroSize,
    /// An access range lies (partly) outside the allocation.
    OutOfRange {
        /// Start of the range in bytes.
        offset: u64,
        /// Length of the range in bytes.
        len: u64,
        /// Size of the allocation.
        size: u64,
    },
    /// An offset does not have the alignment the operation requires.
    Misaligned {
        /// The offset given.
        offset: u64,
        /// The alignment required.
        alignment: u64,
    },
    /// Host access to memory that is not host-visible.
    NotHostVisible,
    /// A timeline operation on a binary semaphore.
    NotTimeline,
    /// An object that belongs to another [`VulkanExporter`] was passed in.
    ForeignObject,
    /// A [`HostHandover`] was used with memory other than the one it was recorded for.
    HandoverMismatch,
    /// A synchronous helper gave up waiting for its GPU work.
    Timeout {
        /// What was being waited for.
        what: &'static str,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::LoaderNotFound { reason } => {
                write!(
                    f,
                    "the Vulkan loader (libvulkan.so.1) could not be loaded: {reason}"
                )
            }
            Error::Vulkan { call, result } => {
                write!(f, "{call} failed: {result:?} ({})", result.as_raw())
            }
            Error::ApiVersionTooOld { found } => write!(
                f,
                "Vulkan {}.{} found, 1.1 or newer is needed",
                vk::api_version_major(*found),
                vk::api_version_minor(*found)
            ),
            Error::DeviceNotFound { uuid, seen } => {
                write!(f, "no Vulkan device has UUID {}; seen:", format_uuid(uuid))?;
                if seen.is_empty() {
                    write!(f, " none")?;
                }
                for d in seen {
                    write!(f, " [{} {}]", d.name, format_uuid(&d.device_uuid))?;
                }
                Ok(())
            }
            Error::MissingExtension { extension } => {
                write!(f, "the Vulkan device lacks the extension {extension}")
            }
            Error::TimelineSemaphoresUnsupported => {
                write!(f, "the Vulkan device does not support timeline semaphores")
            }
            Error::NoComputeQueue => write!(
                f,
                "the exporter's queue family has no compute (make the exporter with another \
                 QueueChoice for a compute dispatch)"
            ),
            Error::NoQueueFamily { choice } => {
                write!(f, "the Vulkan device has no {choice:?} queue family")
            }
            Error::BadQueueChoice { value } => write!(
                f,
                "queue family choice {value:?}: expected `first-compute`, `compute-only` or \
                 `transfer-only`"
            ),
            Error::NoMemoryType { location } => {
                write!(f, "no Vulkan memory type fits a {location:?} buffer")
            }
            Error::NotExportable { what } => {
                write!(
                    f,
                    "the Vulkan implementation cannot export {what} as an opaque fd"
                )
            }
            Error::ZeroSize => write!(f, "a size of zero bytes was asked for"),
            Error::OutOfRange { offset, len, size } => write!(
                f,
                "range {offset}..{} lies outside the {size}-byte allocation",
                offset.saturating_add(*len)
            ),
            Error::Misaligned { offset, alignment } => {
                write!(f, "offset {offset} is not a multiple of {alignment}")
            }
            Error::NotHostVisible => write!(f, "the memory is not host-visible"),
            Error::NotTimeline => write!(f, "the semaphore is binary, not a timeline"),
            Error::ForeignObject => {
                write!(f, "the object belongs to a different VulkanExporter")
            }
            Error::HandoverMismatch => write!(
                f,
                "the host handover was recorded for a different allocation"
            ),
            Error::Timeout { what } => write!(f, "timed out waiting for {what}"),
        }
    }
}

impl std::error::Error for Error {}

/// Result alias of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn vk_err(call: &'static str) -> impl FnOnce(vk::Result) -> Error {
    move |result| Error::Vulkan { call, result }
}

/// Formats a UUID as 32 lowercase hex digits in the usual 8-4-4-4-12 groups.
pub fn format_uuid(uuid: &[u8; 16]) -> String {
    let mut s = String::with_capacity(36);
    for (i, b) in uuid.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// What a physical device reports about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `deviceName`.
    pub name: String,
    /// `VkPhysicalDeviceIDProperties::deviceUUID` (equals the CUDA device UUID on NVIDIA).
    pub device_uuid: [u8; 16],
    /// `VkPhysicalDeviceIDProperties::driverUUID`.
    pub driver_uuid: [u8; 16],
    /// PCI vendor id.
    pub vendor_id: u32,
    /// Vendor-specific device id.
    pub device_id: u32,
    /// Packed Vulkan API version the device supports.
    pub api_version: u32,
    /// Packed, vendor-specific driver version.
    pub driver_version: u32,
    /// `VkPhysicalDeviceDriverProperties::driverName` (empty below Vulkan 1.2).
    pub driver_name: String,
    /// `VkPhysicalDeviceDriverProperties::driverInfo`, e.g. the driver's release number.
    pub driver_info: String,
    /// Extensions this exporter needs that the device lacks (empty when usable).
    pub missing_extensions: Vec<&'static str>,
}

impl DeviceInfo {
    /// The driver version decoded the way NVIDIA packs it (10.8.8.6 bits), as text.
    pub fn nvidia_driver_version(&self) -> String {
        let v = self.driver_version;
        format!("{}.{}.{:02}", v >> 22, (v >> 14) & 0xff, (v >> 6) & 0xff)
    }

    /// The API version as `major.minor.patch`.
    pub fn api_version_string(&self) -> String {
        let v = self.api_version;
        format!(
            "{}.{}.{}",
            vk::api_version_major(v),
            vk::api_version_minor(v),
            vk::api_version_patch(v)
        )
    }
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (uuid {}, Vulkan {}, driver {} {})",
            self.name,
            format_uuid(&self.device_uuid),
            self.api_version_string(),
            self.driver_name,
            self.driver_info
        )
    }
}

/// Where an exported allocation lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryLocation {
    /// Device-local memory that the host cannot map (a type without `HOST_VISIBLE` is
    /// preferred). Filled with [`VulkanExporter::upload`], read with
    /// [`VulkanExporter::download`].
    DeviceLocal,
    /// Host-visible, host-coherent memory, mapped for the object's whole life
    /// ([`VulkanMemory::write`], [`VulkanMemory::read`]). A type that is not device-local
    /// (system memory) is preferred.
    HostVisible,
    /// Device-local memory that the host can also map (`DEVICE_LOCAL | HOST_VISIBLE |
    /// HOST_COHERENT`, e.g. a resizable-BAR heap), mapped like [`MemoryLocation::HostVisible`].
    /// Not every device has such a memory type ([`Error::NoMemoryType`]).
    DeviceLocalHostVisible,
    /// Host-visible, host-coherent and host-cached system memory (`HOST_VISIBLE |
    /// HOST_COHERENT | HOST_CACHED`, a type that is not device-local preferred), mapped like
    /// [`MemoryLocation::HostVisible`]. Host reads are cached (uncached, write-combined memory
    /// reads back at a small fraction of the speed), so this suits buffers the CPU both writes
    /// and reads, such as camera frames checked after processing. Not every device has such a
    /// memory type ([`Error::NoMemoryType`]).
    HostCached,
}

impl MemoryLocation {
    /// Whether memory at this location is mapped for host access.
    pub fn is_host_visible(self) -> bool {
        !matches!(self, MemoryLocation::DeviceLocal)
    }
}

/// Binary or timeline semaphore.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SemaphoreKind {
    /// A binary semaphore (CUDA: `OPAQUE_FD`).
    Binary,
    /// A timeline semaphore (CUDA: `TIMELINE_SEMAPHORE_FD`).
    Timeline,
}

/// One semaphore operation of a queue submission: wait for, or signal, `value`.
///
/// `value` is used for timeline semaphores and ignored for binary ones.
#[derive(Clone, Copy, Debug)]
pub struct SemaphoreOp<'a> {
    /// The semaphore.
    pub semaphore: &'a VulkanSemaphore,
    /// The timeline value (ignored for binary semaphores).
    pub value: u64,
}

impl<'a> SemaphoreOp<'a> {
    /// Wait for / signal `value` on a timeline semaphore.
    pub fn timeline(semaphore: &'a VulkanSemaphore, value: u64) -> Self {
        Self { semaphore, value }
    }

    /// Wait for / signal a binary semaphore.
    pub fn binary(semaphore: &'a VulkanSemaphore) -> Self {
        Self {
            semaphore,
            value: 0,
        }
    }
}

/// Which queue family an exporter submits to ([`VulkanExporter::with_queue`]).
///
/// On NVIDIA the first family is the graphics one, and the others are served by separate
/// engines: a transfer-only family runs copies and semaphore operations on the copy engines,
/// beside the compute work of other APIs. Parsed from and shown as `first-compute`,
/// `compute-only` and `transfer-only` (for a command-line option, say).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueChoice {
    /// The first family with compute (the default): on NVIDIA the
    /// graphics + compute + transfer family.
    FirstCompute,
    /// A family with compute and without graphics.
    ComputeOnly,
    /// A family with transfer and neither graphics nor compute (copy
    /// engines). Compute dispatches are refused with
    /// [`Error::NoComputeQueue`].
    TransferOnly,
}

impl QueueChoice {
    /// Every choice, in the order of [`QueueChoice::name`]'s list.
    pub const ALL: [QueueChoice; 3] = [
        QueueChoice::FirstCompute,
        QueueChoice::ComputeOnly,
        QueueChoice::TransferOnly,
    ];

    /// The environment variable [`QueueChoice::from_env`] reads: `first-compute`,
    /// `compute-only` or `transfer-only`. Only read where a program calls
    /// [`QueueChoice::from_env`] or [`QueueChoice::from_env_if_set`].
    pub const ENV: &'static str = "TEGRA_INTEROP_VK_QUEUE";

    /// The name this choice is parsed from and shown as.
    pub fn name(self) -> &'static str {
        match self {
            QueueChoice::FirstCompute => "first-compute",
            QueueChoice::ComputeOnly => "compute-only",
            QueueChoice::TransferOnly => "transfer-only",
        }
    }

    /// The choice [`QueueChoice::ENV`] asks for ([`QueueChoice::FirstCompute`] when unset);
    /// [`Error::BadQueueChoice`] for a value that is not a choice's name.
    pub fn from_env() -> Result<QueueChoice> {
        Ok(Self::from_env_if_set()?.unwrap_or(QueueChoice::FirstCompute))
    }

    /// The choice [`QueueChoice::ENV`] asks for, if it is set.
    pub fn from_env_if_set() -> Result<Option<QueueChoice>> {
        match std::env::var(Self::ENV) {
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(v)) => Err(Error::BadQueueChoice {
                value: v.to_string_lossy().into_owned(),
            }),
            Ok(v) => v.parse().map(Some),
        }
    }

    /// Whether a family with `flags` is what this choice asks for.
    pub fn accepts(self, flags: ash::vk::QueueFlags) -> bool {
        use ash::vk::QueueFlags as F;
        match self {
            QueueChoice::FirstCompute => flags.contains(F::COMPUTE),
            QueueChoice::ComputeOnly => flags.contains(F::COMPUTE) && !flags.contains(F::GRAPHICS),
            QueueChoice::TransferOnly => {
                flags.contains(F::TRANSFER) && !flags.intersects(F::COMPUTE | F::GRAPHICS)
            }
        }
    }
}

impl std::str::FromStr for QueueChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<QueueChoice> {
        QueueChoice::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| Error::BadQueueChoice {
                value: s.to_owned(),
            })
    }
}

impl fmt::Display for QueueChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod queue_choice_tests {
    use super::QueueChoice;
    use ash::vk::QueueFlags as F;

    /// The three families an NVIDIA GPU reports (graphics + compute +
    /// transfer; transfer only; compute + transfer) and what each choice
    /// takes of them.
    #[test]
    fn each_choice_takes_its_family() {
        let graphics = F::GRAPHICS | F::COMPUTE | F::TRANSFER | F::SPARSE_BINDING;
        let copy = F::TRANSFER | F::SPARSE_BINDING;
        let compute = F::COMPUTE | F::TRANSFER | F::SPARSE_BINDING;
        let takes = |c: QueueChoice| [graphics, copy, compute].map(|f| c.accepts(f));
        assert_eq!(takes(QueueChoice::FirstCompute), [true, false, true]);
        assert_eq!(takes(QueueChoice::ComputeOnly), [false, false, true]);
        assert_eq!(takes(QueueChoice::TransferOnly), [false, true, false]);
    }

    /// Each choice parses from the name it shows; anything else is a typed error that names
    /// the value and the three names.
    #[test]
    fn choices_parse_from_their_names_only() {
        for c in QueueChoice::ALL {
            assert_eq!(c.to_string().parse::<QueueChoice>().unwrap(), c);
        }
        for bad in ["", "transfer", "Transfer-Only", "first-compute "] {
            let e = bad.parse::<QueueChoice>().unwrap_err();
            assert!(
                matches!(&e, super::Error::BadQueueChoice { value } if value == bad),
                "{e:?}"
            );
            let text = e.to_string();
            assert!(
                text.contains(&format!("{bad:?}")) && text.contains("transfer-only"),
                "{text}"
            );
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod error_tests {
    use super::*;

    /// Host accesses are checked against the allocation before any pointer is formed,
    /// including ranges whose end overflows `u64`.
    #[test]
    fn ranges_outside_the_allocation_are_refused() {
        assert!(range_within(16, 0, 16).is_ok());
        assert!(range_within(16, 8, 8).is_ok());
        assert!(range_within(16, 16, 0).is_ok());
        for (offset, len) in [(8, 9), (17, 0), (u64::MAX, 2), (1, u64::MAX)] {
            match range_within(16, offset, len) {
                Err(Error::OutOfRange {
                    offset: o,
                    len: l,
                    size: 16,
                }) => {
                    assert_eq!((o, l), (offset, len));
                }
                other => panic!("{offset}+{len}: {other:?}"),
            }
        }
        let e = range_within(16, u64::MAX, 2).unwrap_err().to_string();
        assert!(e.contains("outside the 16-byte allocation"), "{e}");
    }

    #[test]
    fn a_missing_device_lists_the_devices_seen() {
        let seen = DeviceInfo {
            name: "Some GPU".into(),
            device_uuid: [0xab; 16],
            driver_uuid: [0; 16],
            vendor_id: 0x10de,
            device_id: 0x2330,
            api_version: vk::make_api_version(0, 1, 3, 0),
            driver_version: (580 << 22) | (159 << 14),
            driver_name: "NVIDIA".into(),
            driver_info: "580.159".into(),
            missing_extensions: Vec::new(),
        };
        assert_eq!(seen.nvidia_driver_version(), "580.159.00");
        assert_eq!(seen.api_version_string(), "1.3.0");
        let e = Error::DeviceNotFound {
            uuid: [1; 16],
            seen: vec![seen],
        }
        .to_string();
        assert!(
            e.starts_with("no Vulkan device has UUID 01010101-0101-0101-0101-010101010101; seen:"),
            "{e}"
        );
        assert!(
            e.contains("[Some GPU abababab-abab-abab-abab-abababababab]"),
            "{e}"
        );
        let none = Error::DeviceNotFound {
            uuid: [0; 16],
            seen: Vec::new(),
        };
        assert!(none.to_string().ends_with("seen: none"), "{none}");
    }
}
