//! Vulkan as the exporting API, for GPU tests, examples and benchmarks (feature `vulkan`).
//!
//! On a discrete GPU there is no NvSci, but Vulkan can hand out the same kind of objects CUDA
//! imports: device memory and binary/timeline semaphores as opaque POSIX file descriptors.
//! [`VulkanExporter`] is a small, self-contained Vulkan setup built on `ash`:
//!
//! - the Vulkan loader is opened at run time ([`ash::Entry::load`]); a machine without one gets
//!   [`Error::LoaderNotFound`], never a panic;
//! - the physical device is chosen by its `deviceUUID`, which must equal the CUDA device UUID
//!   (`cuDeviceGetUuid_v2`); enumeration order is never used;
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
    /// The device has no queue family with compute (and therefore transfer) support.
    NoComputeQueue,
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
            Error::NoComputeQueue => write!(f, "the Vulkan device has no compute queue"),
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

// ---------------------------------------------------------------------------------------------
// Owned instance / device
// ---------------------------------------------------------------------------------------------

/// The loader and the instance. Destroys the instance on drop unless told to leak it.
struct InstanceOwner {
    instance: ash::Instance,
    // Kept loaded while the instance lives; dropped (unloaded) after it, never before.
    entry: ManuallyDrop<ash::Entry>,
    leak: bool,
}

impl InstanceOwner {
    fn create(entry: ash::Entry) -> Result<Self> {
        // SAFETY: plain query of the loaded entry point table.
        let version = unsafe { entry.try_enumerate_instance_version() }
            .map_err(vk_err("vkEnumerateInstanceVersion"))?
            .unwrap_or(vk::API_VERSION_1_0);
        if version < vk::API_VERSION_1_1 {
            return Err(Error::ApiVersionTooOld { found: version });
        }
        let app = vk::ApplicationInfo::default()
            .application_name(c"tegra-interop")
            .engine_name(c"tegra-interop")
            .api_version(REQUESTED_API);
        let info = vk::InstanceCreateInfo::default().application_info(&app);
        // SAFETY: `info` and everything it points to live across the call.
        let instance =
            unsafe { entry.create_instance(&info, None) }.map_err(vk_err("vkCreateInstance"))?;
        Ok(Self {
            instance,
            entry: ManuallyDrop::new(entry),
            leak: false,
        })
    }
}

impl Drop for InstanceOwner {
    fn drop(&mut self) {
        if self.leak {
            return;
        }
        // SAFETY: every device made from this instance is destroyed (or leaked together with
        // the instance, in which case `leak` is set) before this owner is dropped.
        unsafe { self.instance.destroy_instance(None) };
        // SAFETY: the instance is gone, nothing uses the loader any more; dropped once.
        unsafe { ManuallyDrop::drop(&mut self.entry) };
    }
}

/// Objects created once per device for the counter-increment compute pipeline.
#[derive(Default)]
struct ComputeObjects {
    shader: vk::ShaderModule,
    set_layout: vk::DescriptorSetLayout,
    pipeline_layout: vk::PipelineLayout,
    pipeline: vk::Pipeline,
}

/// State guarded by the queue lock: the queue, the command pool and submission counting.
struct QueueState {
    queue: vk::Queue,
    pool: vk::CommandPool,
    /// The value the last submission signals on the progress semaphore.
    last_submitted: u64,
    compute: Option<ComputeObjects>,
}

/// The logical device and everything created once per device.
/// Destroys its children and the device on drop unless told to leak them.
struct DeviceOwner {
    device: ash::Device,
    progress: vk::Semaphore,
    state: Mutex<QueueState>,
    leak: bool,
}

impl Drop for DeviceOwner {
    fn drop(&mut self) {
        if self.leak {
            return;
        }
        let state = self
            .state
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let d = &self.device;
        // SAFETY: all submissions have finished (checked by `Shared::drop`) and every object
        // made from the device is gone (they hold the `Arc<Shared>` that owns us). Null
        // handles are allowed by the destroy commands and do nothing.
        unsafe {
            if let Some(c) = state.compute.take() {
                d.destroy_pipeline(c.pipeline, None);
                d.destroy_pipeline_layout(c.pipeline_layout, None);
                d.destroy_descriptor_set_layout(c.set_layout, None);
                d.destroy_shader_module(c.shader, None);
            }
            d.destroy_command_pool(state.pool, None);
            d.destroy_semaphore(self.progress, None);
            d.destroy_device(None);
        }
    }
}

/// Timeline semaphore entry points: Vulkan 1.2 core or `VK_KHR_timeline_semaphore`.
enum TimelineFns {
    Core,
    Khr(khr::timeline_semaphore::Device),
}

/// Everything shared by the exporter and the objects it made.
struct Shared {
    // Field order matters: the device is dropped before the instance.
    dev: DeviceOwner,
    inst: InstanceOwner,
    info: DeviceInfo,
    memory_props: vk::PhysicalDeviceMemoryProperties,
    physical: vk::PhysicalDevice,
    queue_family: u32,
    min_storage_align: u64,
    mem_fd: khr::external_memory_fd::Device,
    sem_fd: khr::external_semaphore_fd::Device,
    timeline: TimelineFns,
}

impl Shared {
    fn device(&self) -> &ash::Device {
        &self.dev.device
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.dev
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn signal_semaphore(&self, sem: vk::Semaphore, value: u64) -> Result<()> {
        let info = vk::SemaphoreSignalInfo::default()
            .semaphore(sem)
            .value(value);
        // SAFETY: `sem` is a live timeline semaphore of this device; `info` outlives the call.
        let r = unsafe {
            match &self.timeline {
                TimelineFns::Core => self.device().signal_semaphore(&info),
                TimelineFns::Khr(k) => k.signal_semaphore(&info),
            }
        };
        r.map_err(vk_err("vkSignalSemaphore"))
    }

    /// Host wait; `Ok(false)` on timeout.
    fn wait_semaphore(&self, sem: vk::Semaphore, value: u64, timeout: Duration) -> Result<bool> {
        let sems = [sem];
        let values = [value];
        let info = vk::SemaphoreWaitInfo::default()
            .semaphores(&sems)
            .values(&values);
        let ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: `sem` is a live timeline semaphore of this device; the arrays outlive the call.
        let r = unsafe {
            match &self.timeline {
                TimelineFns::Core => self.device().wait_semaphores(&info, ns),
                TimelineFns::Khr(k) => k.wait_semaphores(&info, ns),
            }
        };
        match r {
            Ok(()) => Ok(true),
            Err(vk::Result::TIMEOUT) => Ok(false),
            Err(e) => Err(vk_err("vkWaitSemaphores")(e)),
        }
    }

    fn semaphore_value(&self, sem: vk::Semaphore) -> Result<u64> {
        // SAFETY: `sem` is a live timeline semaphore of this device.
        let r = unsafe {
            match &self.timeline {
                TimelineFns::Core => self.device().get_semaphore_counter_value(sem),
                TimelineFns::Khr(k) => k.get_semaphore_counter_value(sem),
            }
        };
        r.map_err(vk_err("vkGetSemaphoreCounterValue"))
    }

    /// Waits until submission `value` finished; `false` when it did not within `timeout`.
    fn wait_progress(&self, value: u64, timeout: Duration) -> bool {
        value == 0
            || matches!(
                self.wait_semaphore(self.dev.progress, value, timeout),
                Ok(true)
            )
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let last = self.lock().last_submitted;
        if !self.wait_progress(last, DROP_WAIT) {
            // Work is still pending (e.g. waiting for a semaphore nobody signals): destroying
            // the device now would be invalid, so leak it and the instance.
            self.dev.leak = true;
            self.inst.leak = true;
        }
    }
}

/// How many semaphores of one kind a submission passes without a heap allocation.
const INLINE_OPS: usize = 16;

/// A short list kept on the stack, moved to the heap only past [`INLINE_OPS`] entries.
struct SmallList<T> {
    inline: [T; INLINE_OPS],
    len: usize,
    heap: Vec<T>,
}

impl<T: Copy + Default> SmallList<T> {
    fn new() -> Self {
        Self {
            inline: [T::default(); INLINE_OPS],
            len: 0,
            heap: Vec::new(),
        }
    }

    fn push(&mut self, item: T) {
        if self.heap.is_empty() && self.len < INLINE_OPS {
            self.inline[self.len] = item;
            self.len += 1;
            return;
        }
        if self.heap.is_empty() {
            self.heap.extend_from_slice(&self.inline[..self.len]);
        }
        self.heap.push(item);
    }

    fn as_slice(&self) -> &[T] {
        if self.heap.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }
}

/// Records which submission last used an object.
#[derive(Default)]
struct LastUse(AtomicU64);

impl LastUse {
    fn mark(&self, value: u64) {
        self.0.fetch_max(value, Ordering::AcqRel);
    }
    fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

// ---------------------------------------------------------------------------------------------
// Device selection
// ---------------------------------------------------------------------------------------------

fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn required_extensions(api_version: u32) -> Vec<&'static CStr> {
    let mut v = vec![
        khr::external_memory_fd::NAME,
        khr::external_semaphore_fd::NAME,
    ];
    if api_version < vk::API_VERSION_1_2 {
        v.push(khr::timeline_semaphore::NAME);
    }
    v
}

fn describe_device(instance: &ash::Instance, pd: vk::PhysicalDevice) -> Result<DeviceInfo> {
    // SAFETY: `pd` was enumerated from `instance`.
    let props = unsafe { instance.get_physical_device_properties(pd) };
    let mut id = vk::PhysicalDeviceIDProperties::default();
    let mut driver = vk::PhysicalDeviceDriverProperties::default();
    let has_driver_props = props.api_version >= vk::API_VERSION_1_2;
    {
        let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut id);
        if has_driver_props {
            props2 = props2.push_next(&mut driver);
        }
        // SAFETY: Vulkan 1.1 core query (the instance is 1.1+); the chained structs live
        // across the call.
        unsafe { instance.get_physical_device_properties2(pd, &mut props2) };
    }
    // SAFETY: `pd` was enumerated from `instance`.
    let exts = unsafe { instance.enumerate_device_extension_properties(pd) }
        .map_err(vk_err("vkEnumerateDeviceExtensionProperties"))?;
    let missing_extensions = required_extensions(props.api_version.min(REQUESTED_API))
        .into_iter()
        .filter(|want| {
            !exts
                .iter()
                .any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == *want))
        })
        .map(|want| want.to_str().unwrap_or("(non-UTF-8 extension name)"))
        .collect();
    let (driver_name, driver_info) = if has_driver_props {
        (
            c_chars_to_string(&driver.driver_name),
            c_chars_to_string(&driver.driver_info),
        )
    } else {
        (String::new(), String::new())
    };
    Ok(DeviceInfo {
        name: c_chars_to_string(&props.device_name),
        device_uuid: id.device_uuid,
        driver_uuid: id.driver_uuid,
        vendor_id: props.vendor_id,
        device_id: props.device_id,
        api_version: props.api_version,
        driver_version: props.driver_version,
        driver_name,
        driver_info,
        missing_extensions,
    })
}

fn load_entry(loader: Option<&std::path::Path>) -> Result<ash::Entry> {
    let r = match loader {
        // SAFETY: opening the Vulkan loader runs its library initialisers; it is the system's
        // (or the caller's chosen) loader, which is designed to be opened this way.
        None => unsafe { ash::Entry::load() },
        // SAFETY: as above, for a loader at a path the caller picked.
        Some(p) => unsafe { ash::Entry::load_from(p) },
    };
    r.map_err(|e| Error::LoaderNotFound {
        reason: e.to_string(),
    })
}

fn enumerate(inst: &InstanceOwner) -> Result<Vec<(vk::PhysicalDevice, DeviceInfo)>> {
    // SAFETY: plain enumeration on a live instance.
    let pds = unsafe { inst.instance.enumerate_physical_devices() }
        .map_err(vk_err("vkEnumeratePhysicalDevices"))?;
    pds.into_iter()
        .map(|pd| describe_device(&inst.instance, pd).map(|i| (pd, i)))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The exporter
// ---------------------------------------------------------------------------------------------

/// A Vulkan instance + device on the GPU that CUDA uses, exporting memory and semaphores.
///
/// Cheap to share by reference; objects it makes keep the device alive on their own.
pub struct VulkanExporter {
    shared: Arc<Shared>,
}

impl fmt::Debug for VulkanExporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanExporter")
            .field("device", &self.shared.info)
            .finish_non_exhaustive()
    }
}

impl VulkanExporter {
    /// Lists the physical devices of the system's Vulkan loader (for diagnostics).
    pub fn devices() -> Result<Vec<DeviceInfo>> {
        let inst = InstanceOwner::create(load_entry(None)?)?;
        Ok(enumerate(&inst)?.into_iter().map(|(_, i)| i).collect())
    }

    /// Opens the system's Vulkan loader and creates a device on the physical device whose
    /// `deviceUUID` equals `cuda_uuid` (the bytes of `cuDeviceGetUuid_v2`).
    pub fn new(cuda_uuid: [u8; 16]) -> Result<Self> {
        Self::build(load_entry(None)?, cuda_uuid)
    }

    /// Like [`VulkanExporter::new`] with the loader library at `loader` (a path or a name for
    /// the dynamic linker).
    pub fn with_loader(loader: &std::path::Path, cuda_uuid: [u8; 16]) -> Result<Self> {
        Self::build(load_entry(Some(loader))?, cuda_uuid)
    }

    fn build(entry: ash::Entry, uuid: [u8; 16]) -> Result<Self> {
        let inst = InstanceOwner::create(entry)?;
        let devices = enumerate(&inst)?;
        let Some(pos) = devices.iter().position(|(_, i)| i.device_uuid == uuid) else {
            return Err(Error::DeviceNotFound {
                uuid,
                seen: devices.into_iter().map(|(_, i)| i).collect(),
            });
        };
        let (physical, info) = devices.into_iter().nth(pos).ok_or(Error::DeviceNotFound {
            uuid,
            seen: Vec::new(),
        })?;
        if let Some(ext) = info.missing_extensions.first() {
            return Err(Error::MissingExtension { extension: ext });
        }
        if info.api_version < vk::API_VERSION_1_1 {
            return Err(Error::ApiVersionTooOld {
                found: info.api_version,
            });
        }
        let instance = &inst.instance;
        let effective_api = info.api_version.min(REQUESTED_API);

        // Timeline semaphore feature.
        let mut timeline_feat = vk::PhysicalDeviceTimelineSemaphoreFeatures::default();
        {
            let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut timeline_feat);
            // SAFETY: 1.1 core query with a chain that lives across the call.
            unsafe { instance.get_physical_device_features2(physical, &mut f2) };
        }
        if timeline_feat.timeline_semaphore == vk::FALSE {
            return Err(Error::TimelineSemaphoresUnsupported);
        }

        // A queue family with compute (compute families also support transfer).
        // SAFETY: `physical` belongs to `instance`.
        let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
        let queue_family = families
            .iter()
            .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE) && q.queue_count > 0)
            .and_then(|i| u32::try_from(i).ok())
            .ok_or(Error::NoComputeQueue)?;

        // SAFETY: `physical` belongs to `instance`.
        let props = unsafe { instance.get_physical_device_properties(physical) };
        // SAFETY: `physical` belongs to `instance`.
        let memory_props = unsafe { instance.get_physical_device_memory_properties(physical) };

        let priorities = [1.0f32];
        let queue_info = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(queue_family)
            .queue_priorities(&priorities)];
        let ext_names: Vec<*const c_char> = required_extensions(effective_api)
            .iter()
            .map(|n| n.as_ptr())
            .collect();
        let mut enable_timeline =
            vk::PhysicalDeviceTimelineSemaphoreFeatures::default().timeline_semaphore(true);
        let device_info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queue_info)
            .enabled_extension_names(&ext_names)
            .push_next(&mut enable_timeline);
        // SAFETY: everything `device_info` points to lives across the call; the extensions
        // were checked to exist and the timeline feature to be supported.
        let device = unsafe { instance.create_device(physical, &device_info, None) }
            .map_err(vk_err("vkCreateDevice"))?;
        // SAFETY: family `queue_family` was created with one queue.
        let queue = unsafe { device.get_device_queue(queue_family, 0) };
        let timeline = if effective_api >= vk::API_VERSION_1_2 {
            TimelineFns::Core
        } else {
            TimelineFns::Khr(khr::timeline_semaphore::Device::new(instance, &device))
        };
        let mem_fd = khr::external_memory_fd::Device::new(instance, &device);
        let sem_fd = khr::external_semaphore_fd::Device::new(instance, &device);
        // From here on `Shared` owns the device; a failure below drops it cleanly.
        let mut shared = Shared {
            dev: DeviceOwner {
                device,
                progress: vk::Semaphore::null(),
                state: Mutex::new(QueueState {
                    queue,
                    pool: vk::CommandPool::null(),
                    last_submitted: 0,
                    compute: None,
                }),
                leak: false,
            },
            inst,
            info,
            memory_props,
            physical,
            queue_family,
            min_storage_align: props.limits.min_storage_buffer_offset_alignment.max(1),
            mem_fd,
            sem_fd,
            timeline,
        };
        let pool_info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(queue_family)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: valid create info for a live device.
        let pool = unsafe { shared.device().create_command_pool(&pool_info, None) }
            .map_err(vk_err("vkCreateCommandPool"))?;
        shared.lock().pool = pool;
        let mut type_info = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let sem_info = vk::SemaphoreCreateInfo::default().push_next(&mut type_info);
        // SAFETY: valid create info (timeline feature enabled) for a live device.
        let progress = unsafe { shared.device().create_semaphore(&sem_info, None) }
            .map_err(vk_err("vkCreateSemaphore"))?;
        shared.dev.progress = progress;
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// The selected physical device.
    pub fn device_info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    /// The required alignment of [`VulkanExporter::counter_incrementer`] offsets.
    pub fn storage_offset_alignment(&self) -> u64 {
        self.shared.min_storage_align
    }

    fn check_own(&self, other: &Arc<Shared>) -> Result<()> {
        if Arc::ptr_eq(&self.shared, other) {
            Ok(())
        } else {
            Err(Error::ForeignObject)
        }
    }

    // ----- memory -----

    /// Allocates at least `size` bytes of exportable memory at `location`, bound to a buffer
    /// usable for transfers and as a storage buffer. The real size is [`VulkanMemory::size`].
    pub fn allocate_memory(&self, size: u64, location: MemoryLocation) -> Result<VulkanMemory> {
        VulkanMemory::create(&self.shared, size, location, true)
    }

    /// Allocates memory and exports it once: the fd, the size to import and the object.
    pub fn export_memory(&self, size: u64, location: MemoryLocation) -> Result<ExportedMemory> {
        let memory = self.allocate_memory(size, location)?;
        let fd = memory.export_fd()?;
        Ok(ExportedMemory {
            fd,
            size: memory.size(),
            dedicated: memory.dedicated(),
            memory,
        })
    }

    // ----- semaphores -----

    /// Creates an exportable semaphore (`initial` is the timeline start value; ignored for
    /// binary semaphores).
    pub fn create_semaphore(&self, kind: SemaphoreKind, initial: u64) -> Result<VulkanSemaphore> {
        VulkanSemaphore::create(&self.shared, kind, initial)
    }

    /// Creates a timeline semaphore starting at `initial` and exports it once.
    pub fn export_timeline_semaphore(&self, initial: u64) -> Result<(OwnedFd, VulkanSemaphore)> {
        let s = self.create_semaphore(SemaphoreKind::Timeline, initial)?;
        Ok((s.export_fd()?, s))
    }

    /// Creates a binary semaphore and exports it once.
    pub fn export_binary_semaphore(&self) -> Result<(OwnedFd, VulkanSemaphore)> {
        let s = self.create_semaphore(SemaphoreKind::Binary, 0)?;
        Ok((s.export_fd()?, s))
    }

    // ----- queue work -----

    /// Submits a batch without commands that waits for `waits` and then signals `signals`
    /// (GPU side, asynchronous).
    ///
    /// A binary semaphore may only be waited for once a signal for it has been submitted
    /// (by Vulkan or, for an exported one, by the importer).
    pub fn submit(&self, waits: &[SemaphoreOp<'_>], signals: &[SemaphoreOp<'_>]) -> Result<()> {
        self.submit_inner(None, waits, signals, &[]).map(|_| ())
    }

    fn submit_inner(
        &self,
        cmd: Option<vk::CommandBuffer>,
        waits: &[SemaphoreOp<'_>],
        signals: &[SemaphoreOp<'_>],
        also_used: &[&LastUse],
    ) -> Result<u64> {
        for op in waits.iter().chain(signals) {
            self.check_own(&op.semaphore.shared)?;
        }
        let mut state = self.shared.lock();
        self.submit_locked(&mut state, cmd, waits, signals, also_used)
    }

    fn submit_locked(
        &self,
        state: &mut QueueState,
        cmd: Option<vk::CommandBuffer>,
        waits: &[SemaphoreOp<'_>],
        signals: &[SemaphoreOp<'_>],
        also_used: &[&LastUse],
    ) -> Result<u64> {
        let value = state.last_submitted + 1;
        // Kept on the stack for the usual handful of semaphores, so a steady-state submission
        // makes no heap allocation.
        let mut wait_sems = SmallList::new();
        let mut wait_values = SmallList::new();
        let mut stages = SmallList::new();
        for op in waits {
            wait_sems.push(op.semaphore.sem);
            wait_values.push(op.value);
            stages.push(vk::PipelineStageFlags::ALL_COMMANDS);
        }
        let mut signal_sems = SmallList::new();
        let mut signal_values = SmallList::new();
        for op in signals {
            signal_sems.push(op.semaphore.sem);
            signal_values.push(op.value);
        }
        signal_sems.push(self.shared.dev.progress);
        signal_values.push(value);
        let (wait_sems, wait_values, stages) = (
            wait_sems.as_slice(),
            wait_values.as_slice(),
            stages.as_slice(),
        );
        let (signal_sems, signal_values) = (signal_sems.as_slice(), signal_values.as_slice());
        let cmds: &[vk::CommandBuffer] = match &cmd {
            Some(c) => std::slice::from_ref(c),
            None => &[],
        };
        let mut timeline_info = vk::TimelineSemaphoreSubmitInfo::default()
            .wait_semaphore_values(wait_values)
            .signal_semaphore_values(signal_values);
        let submit = vk::SubmitInfo::default()
            .wait_semaphores(wait_sems)
            .wait_dst_stage_mask(stages)
            .command_buffers(cmds)
            .signal_semaphores(signal_sems)
            .push_next(&mut timeline_info);
        // SAFETY: the queue and pool are used under the lock held by the caller; every handle
        // belongs to this device (checked by the caller) and every array outlives the call.
        unsafe {
            self.shared
                .device()
                .queue_submit(state.queue, &[submit], vk::Fence::null())
        }
        .map_err(vk_err("vkQueueSubmit"))?;
        state.last_submitted = value;
        for op in waits.iter().chain(signals) {
            op.semaphore.last_use.mark(value);
        }
        for u in also_used {
            u.mark(value);
        }
        Ok(value)
    }

    /// Waits until all work submitted so far has finished; `Ok(false)` on timeout.
    pub fn wait_idle(&self, timeout: Duration) -> Result<bool> {
        let last = self.shared.lock().last_submitted;
        if last == 0 {
            return Ok(true);
        }
        self.shared
            .wait_semaphore(self.shared.dev.progress, last, timeout)
    }

    fn begin_one_time(&self, state: &QueueState) -> Result<vk::CommandBuffer> {
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(state.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool is used under the queue lock (held by the caller).
        let cmd = unsafe { self.shared.device().allocate_command_buffers(&info) }
            .map_err(vk_err("vkAllocateCommandBuffers"))?
            .into_iter()
            .next()
            .ok_or(Error::Vulkan {
                call: "vkAllocateCommandBuffers",
                result: vk::Result::ERROR_UNKNOWN,
            })?;
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: freshly allocated command buffer, pool lock held.
        if let Err(e) = unsafe { self.shared.device().begin_command_buffer(cmd, &begin) } {
            // SAFETY: never submitted; pool lock held.
            unsafe {
                self.shared
                    .device()
                    .free_command_buffers(state.pool, &[cmd])
            };
            return Err(vk_err("vkBeginCommandBuffer")(e));
        }
        Ok(cmd)
    }

    /// Copies `src_range` of `src` to `dst` at `dst_offset` on the queue, then waits.
    #[allow(clippy::too_many_arguments)]
    fn copy_sync(
        &self,
        src: &VulkanMemory,
        src_offset: u64,
        dst: &VulkanMemory,
        dst_offset: u64,
        len: u64,
        waits: &[SemaphoreOp<'_>],
        signals: &[SemaphoreOp<'_>],
    ) -> Result<()> {
        for op in waits.iter().chain(signals) {
            self.check_own(&op.semaphore.shared)?;
        }
        let d = self.shared.device();
        let mut state = self.shared.lock();
        let cmd = self.begin_one_time(&state)?;
        let family = self.shared.queue_family;
        // Exported buffers are taken from the external owner and handed back afterwards;
        // staging buffers only need their transfer writes made visible to host reads.
        let (mut acquire, mut release) = ownership_barriers(
            src,
            family,
            vk::AccessFlags::TRANSFER_READ,
            vk::AccessFlags::empty(),
        );
        let (a, r) = ownership_barriers(
            dst,
            family,
            vk::AccessFlags::TRANSFER_WRITE,
            vk::AccessFlags::TRANSFER_WRITE,
        );
        acquire.extend(a);
        release.extend(r);
        if !dst.exportable {
            release.push(
                vk::BufferMemoryBarrier::default()
                    .buffer(dst.buffer)
                    .offset(0)
                    .size(vk::WHOLE_SIZE)
                    .src_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
                    .dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
                    .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                    .dst_access_mask(vk::AccessFlags::HOST_READ),
            );
        }
        let region = [vk::BufferCopy::default()
            .src_offset(src_offset)
            .dst_offset(dst_offset)
            .size(len)];
        // SAFETY: recording into a command buffer we own, pool lock held; buffers are live
        // and the region was checked against both allocations by the callers.
        let recorded = unsafe {
            d.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::TOP_OF_PIPE,
                vk::PipelineStageFlags::TRANSFER,
                vk::DependencyFlags::empty(),
                &[],
                &acquire,
                &[],
            );
            d.cmd_copy_buffer(cmd, src.buffer, dst.buffer, &region);
            d.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::BOTTOM_OF_PIPE | vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &[],
                &release,
                &[],
            );
            d.end_command_buffer(cmd)
        };
        let submitted = recorded
            .map_err(vk_err("vkEndCommandBuffer"))
            .and_then(|()| {
                self.submit_locked(
                    &mut state,
                    Some(cmd),
                    waits,
                    signals,
                    &[&src.last_use, &dst.last_use],
                )
            });
        let value = match submitted {
            Ok(v) => v,
            Err(e) => {
                // SAFETY: never submitted; pool lock held.
                unsafe { d.free_command_buffers(state.pool, &[cmd]) };
                return Err(e);
            }
        };
        drop(state);
        if !self.shared.wait_progress(value, COPY_WAIT) {
            // The command buffer stays allocated (freed with the pool) since it may still run.
            return Err(Error::Timeout { what: "a copy" });
        }
        let state = self.shared.lock();
        // SAFETY: the submission finished; pool lock held.
        unsafe { d.free_command_buffers(state.pool, &[cmd]) };
        Ok(())
    }

    /// Writes `data` into `dst` at `offset` through a staging buffer and a queue copy, then
    /// waits for the copy. The copy's batch first waits for `waits` and afterwards signals
    /// `signals`. Works for both memory locations.
    pub fn upload(
        &self,
        dst: &VulkanMemory,
        offset: u64,
        data: &[u8],
        waits: &[SemaphoreOp<'_>],
        signals: &[SemaphoreOp<'_>],
    ) -> Result<()> {
        self.check_own(&dst.shared)?;
        let len = data.len() as u64;
        dst.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let staging = VulkanMemory::create(&self.shared, len, MemoryLocation::HostVisible, false)?;
        staging.write(0, data)?;
        self.copy_sync(&staging, 0, dst, offset, len, waits, signals)
    }

    /// Reads `out.len()` bytes of `src` at `offset` through a queue copy into a staging
    /// buffer, after the batch waited for `waits`; the batch then signals `signals`.
    pub fn download(
        &self,
        src: &VulkanMemory,
        offset: u64,
        out: &mut [u8],
        waits: &[SemaphoreOp<'_>],
        signals: &[SemaphoreOp<'_>],
    ) -> Result<()> {
        self.check_own(&src.shared)?;
        let len = out.len() as u64;
        src.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let staging = VulkanMemory::create(&self.shared, len, MemoryLocation::HostVisible, false)?;
        self.copy_sync(src, offset, &staging, 0, len, waits, signals)?;
        staging.read(0, out)
    }

    // ----- compute -----

    fn compute_objects(
        &self,
        state: &mut QueueState,
    ) -> Result<(vk::DescriptorSetLayout, vk::PipelineLayout, vk::Pipeline)> {
        if let Some(c) = &state.compute {
            return Ok((c.set_layout, c.pipeline_layout, c.pipeline));
        }
        let d = self.shared.device();
        let mut c = ComputeObjects::default();
        let result = (|| -> Result<()> {
            let module_info = vk::ShaderModuleCreateInfo::default().code(&INCREMENT_SPIRV);
            // SAFETY: valid SPIR-V (checked with spirv-val) for a live device.
            c.shader = unsafe { d.create_shader_module(&module_info, None) }
                .map_err(vk_err("vkCreateShaderModule"))?;
            let bindings = [vk::DescriptorSetLayoutBinding::default()
                .binding(0)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)];
            let dsl_info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
            // SAFETY: valid create info for a live device.
            c.set_layout = unsafe { d.create_descriptor_set_layout(&dsl_info, None) }
                .map_err(vk_err("vkCreateDescriptorSetLayout"))?;
            let layouts = [c.set_layout];
            let pl_info = vk::PipelineLayoutCreateInfo::default().set_layouts(&layouts);
            // SAFETY: valid create info for a live device.
            c.pipeline_layout = unsafe { d.create_pipeline_layout(&pl_info, None) }
                .map_err(vk_err("vkCreatePipelineLayout"))?;
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(c.shader)
                .name(c"main");
            let info = [vk::ComputePipelineCreateInfo::default()
                .stage(stage)
                .layout(c.pipeline_layout)];
            // SAFETY: valid create info for a live device.
            let pipelines =
                unsafe { d.create_compute_pipelines(vk::PipelineCache::null(), &info, None) }
                    .map_err(|(_, e)| vk_err("vkCreateComputePipelines")(e))?;
            c.pipeline = pipelines.into_iter().next().unwrap_or_default();
            Ok(())
        })();
        if let Err(e) = result {
            // SAFETY: objects never used by any submission; null handles are ignored.
            unsafe {
                d.destroy_pipeline(c.pipeline, None);
                d.destroy_pipeline_layout(c.pipeline_layout, None);
                d.destroy_descriptor_set_layout(c.set_layout, None);
                d.destroy_shader_module(c.shader, None);
            }
            return Err(e);
        }
        let r = (c.set_layout, c.pipeline_layout, c.pipeline);
        state.compute = Some(c);
        Ok(r)
    }

    /// Records, once, a command buffer that adds 1 to the `u32` at `offset` of `memory` on
    /// the GPU (compute shader, one invocation). Submit it with
    /// [`VulkanExporter::submit_increment`] as often as needed. `offset` must be a multiple
    /// of [`VulkanExporter::storage_offset_alignment`].
    pub fn counter_incrementer<'m>(
        &self,
        memory: &'m VulkanMemory,
        offset: u64,
    ) -> Result<CounterIncrement<'m>> {
        self.check_own(&memory.shared)?;
        memory.check_range(offset, 4)?;
        let align = self.shared.min_storage_align;
        if !offset.is_multiple_of(align) {
            return Err(Error::Misaligned {
                offset,
                alignment: align,
            });
        }
        let d = self.shared.device();
        let (set_layout, pipeline_layout, pipeline) = {
            let mut state = self.shared.lock();
            self.compute_objects(&mut state)?
        };
        // From here `op` owns what is made; an early return destroys it (without the lock
        // being held, since its drop takes the lock).
        let mut op = CounterIncrement {
            shared: Arc::clone(&self.shared),
            memory,
            pool: vk::DescriptorPool::null(),
            cmd: vk::CommandBuffer::null(),
            last_use: LastUse::default(),
        };
        let sizes = [vk::DescriptorPoolSize::default()
            .ty(vk::DescriptorType::STORAGE_BUFFER)
            .descriptor_count(1)];
        let pool_info = vk::DescriptorPoolCreateInfo::default()
            .max_sets(1)
            .pool_sizes(&sizes);
        // SAFETY: valid create info for a live device.
        op.pool = unsafe { d.create_descriptor_pool(&pool_info, None) }
            .map_err(vk_err("vkCreateDescriptorPool"))?;
        let layouts = [set_layout];
        let alloc = vk::DescriptorSetAllocateInfo::default()
            .descriptor_pool(op.pool)
            .set_layouts(&layouts);
        // SAFETY: the pool has room for exactly this one set.
        let set = unsafe { d.allocate_descriptor_sets(&alloc) }
            .map_err(vk_err("vkAllocateDescriptorSets"))?
            .into_iter()
            .next()
            .ok_or(Error::Vulkan {
                call: "vkAllocateDescriptorSets",
                result: vk::Result::ERROR_UNKNOWN,
            })?;
        let buffer_info = [vk::DescriptorBufferInfo::default()
            .buffer(memory.buffer)
            .offset(offset)
            .range(4)];
        let write = [vk::WriteDescriptorSet::default()
            .dst_set(set)
            .dst_binding(0)
            .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
            .buffer_info(&buffer_info)];
        // SAFETY: the set is not in use by any command buffer yet.
        unsafe { d.update_descriptor_sets(&write, &[]) };

        let family = self.shared.queue_family;
        let (acquire, release) = ownership_barriers(
            memory,
            family,
            vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE,
            vk::AccessFlags::SHADER_WRITE,
        );
        let recorded = {
            let state = self.shared.lock();
            let info = vk::CommandBufferAllocateInfo::default()
                .command_pool(state.pool)
                .level(vk::CommandBufferLevel::PRIMARY)
                .command_buffer_count(1);
            // SAFETY: the pool is used under the queue lock.
            let cmds = unsafe { d.allocate_command_buffers(&info) }
                .map_err(vk_err("vkAllocateCommandBuffers"));
            cmds.and_then(|cmds| {
                op.cmd = cmds.into_iter().next().unwrap_or_default();
                let begin = vk::CommandBufferBeginInfo::default()
                    .flags(vk::CommandBufferUsageFlags::SIMULTANEOUS_USE);
                // SAFETY: recording a fresh command buffer under the pool lock; every handle
                // is live.
                unsafe {
                    d.begin_command_buffer(op.cmd, &begin)
                        .map_err(vk_err("vkBeginCommandBuffer"))?;
                    d.cmd_pipeline_barrier(
                        op.cmd,
                        vk::PipelineStageFlags::TOP_OF_PIPE,
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                        vk::DependencyFlags::empty(),
                        &[],
                        &acquire,
                        &[],
                    );
                    d.cmd_bind_pipeline(op.cmd, vk::PipelineBindPoint::COMPUTE, pipeline);
                    d.cmd_bind_descriptor_sets(
                        op.cmd,
                        vk::PipelineBindPoint::COMPUTE,
                        pipeline_layout,
                        0,
                        &[set],
                        &[],
                    );
                    d.cmd_dispatch(op.cmd, 1, 1, 1);
                    d.cmd_pipeline_barrier(
                        op.cmd,
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                        vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                        vk::DependencyFlags::empty(),
                        &[],
                        &release,
                        &[],
                    );
                    d.end_command_buffer(op.cmd)
                        .map_err(vk_err("vkEndCommandBuffer"))
                }
            })
        };
        recorded?;
        Ok(op)
    }

    /// Submits `op` (add 1 to its counter) in a batch that first waits for `waits` and then
    /// signals `signals`. Asynchronous.
    pub fn submit_increment(
        &self,
        op: &CounterIncrement<'_>,
        waits: &[SemaphoreOp<'_>],
        signals: &[SemaphoreOp<'_>],
    ) -> Result<()> {
        self.check_own(&op.shared)?;
        self.submit_inner(
            Some(op.cmd),
            waits,
            signals,
            &[&op.last_use, &op.memory.last_use],
        )
        .map(|_| ())
    }
}

impl VulkanExporter {
    // ----- host handover -----

    /// Records, once, the two queue batches that hand a host-visible, exported allocation
    /// between the host (through its mapping) and the importing API (see [`HostHandover`]).
    pub fn host_handover(&self, memory: &VulkanMemory) -> Result<HostHandover> {
        self.check_own(&memory.shared)?;
        if memory.mapped.is_none() {
            return Err(Error::NotHostVisible);
        }
        let d = self.shared.device();
        let family = self.shared.queue_family;
        let all_memory = vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE;
        let host_access = vk::AccessFlags::HOST_READ | vk::AccessFlags::HOST_WRITE;
        // To the importer: what the host wrote becomes visible to every device-side access,
        // then the buffer is released to the external owner.
        let host_to_device = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::HOST_WRITE)
            .dst_access_mask(all_memory)];
        let (acquire, release) = ownership_barriers(memory, family, host_access, all_memory);
        // To the host: the buffer is taken back from the external owner and every device-side
        // write becomes visible to host reads and writes.
        let device_to_host = [vk::MemoryBarrier::default()
            .src_access_mask(all_memory)
            .dst_access_mask(host_access)];
        let mut op = HostHandover {
            shared: Arc::clone(&self.shared),
            buffer: memory.buffer,
            to_external: vk::CommandBuffer::null(),
            to_host: vk::CommandBuffer::null(),
            last_use: LastUse::default(),
        };
        let state = self.shared.lock();
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(state.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(2);
        // SAFETY: the pool is used under the queue lock, held here.
        let cmds = unsafe { d.allocate_command_buffers(&info) }
            .map_err(vk_err("vkAllocateCommandBuffers"))?;
        op.to_external = cmds.first().copied().unwrap_or_default();
        op.to_host = cmds.get(1).copied().unwrap_or_default();
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::SIMULTANEOUS_USE);
        // SAFETY: recording two fresh command buffers of our pool under its lock; the buffer
        // is live and every barrier array outlives the calls.
        let recorded = unsafe {
            (|| -> Result<()> {
                d.begin_command_buffer(op.to_external, &begin)
                    .map_err(vk_err("vkBeginCommandBuffer"))?;
                d.cmd_pipeline_barrier(
                    op.to_external,
                    vk::PipelineStageFlags::HOST,
                    vk::PipelineStageFlags::ALL_COMMANDS,
                    vk::DependencyFlags::empty(),
                    &host_to_device,
                    &[],
                    &[],
                );
                d.cmd_pipeline_barrier(
                    op.to_external,
                    vk::PipelineStageFlags::ALL_COMMANDS,
                    vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                    vk::DependencyFlags::empty(),
                    &[],
                    &release,
                    &[],
                );
                d.end_command_buffer(op.to_external)
                    .map_err(vk_err("vkEndCommandBuffer"))?;
                d.begin_command_buffer(op.to_host, &begin)
                    .map_err(vk_err("vkBeginCommandBuffer"))?;
                d.cmd_pipeline_barrier(
                    op.to_host,
                    vk::PipelineStageFlags::ALL_COMMANDS,
                    vk::PipelineStageFlags::HOST,
                    vk::DependencyFlags::empty(),
                    &device_to_host,
                    &acquire,
                    &[],
                );
                d.end_command_buffer(op.to_host)
                    .map_err(vk_err("vkEndCommandBuffer"))
            })()
        };
        drop(state);
        recorded?;
        Ok(op)
    }

    fn check_handover(&self, op: &HostHandover, memory: &VulkanMemory) -> Result<()> {
        self.check_own(&op.shared)?;
        self.check_own(&memory.shared)?;
        if op.buffer == memory.buffer {
            Ok(())
        } else {
            Err(Error::HandoverMismatch)
        }
    }

    /// Hands `memory` from the host to the importer after the host wrote it: submits a batch
    /// that waits for `waits`, makes the host's writes visible to device-side access (the
    /// host-to-device memory-domain operation of a queue submission plus a host-write
    /// barrier), releases the buffer to the external owner and then signals `signals`
    /// (asynchronous). Signal the importer's *ready* semaphore here instead of with
    /// [`VulkanSemaphore::signal`]: a host-side signal performs no such operation, and the
    /// device can then read stale cached lines of the allocation.
    pub fn release_host_writes(
        &self,
        op: &HostHandover,
        memory: &VulkanMemory,
        waits: &[SemaphoreOp<'_>],
        signals: &[SemaphoreOp<'_>],
    ) -> Result<()> {
        self.check_handover(op, memory)?;
        self.submit_inner(
            Some(op.to_external),
            waits,
            signals,
            &[&op.last_use, &memory.last_use],
        )
        .map(|_| ())
    }

    /// Hands `memory` from the importer back to the host: submits a batch that waits for
    /// `waits` (the importer's *free* semaphore), acquires the buffer from the external owner
    /// and makes device-side writes visible to the host, then waits on the host until that
    /// batch finished. `Ok(false)` when it did not within `timeout` (the batch stays queued;
    /// the host must not touch the memory then).
    pub fn acquire_for_host(
        &self,
        op: &HostHandover,
        memory: &VulkanMemory,
        waits: &[SemaphoreOp<'_>],
        timeout: Duration,
    ) -> Result<bool> {
        self.check_handover(op, memory)?;
        let value = self.submit_inner(
            Some(op.to_host),
            waits,
            &[],
            &[&op.last_use, &memory.last_use],
        )?;
        self.shared
            .wait_semaphore(self.shared.dev.progress, value, timeout)
    }
}

/// The recorded queue batches that hand a host-visible, exported [`VulkanMemory`] between
/// the host and the importing API (e.g. CUDA), made by [`VulkanExporter::host_handover`].
///
/// Host writes through a mapping reach the device only through a queue submission (Vulkan's
/// host-to-device memory-domain operation); a host-side semaphore signal does not make them
/// visible, and a GPU may keep stale cached lines of system memory. Likewise the host should
/// read what the device wrote only after a batch that made those writes visible to it. The
/// memory types this module maps are host-coherent, so no explicit flush or invalidate of
/// the mapped range is needed on the host side.
pub struct HostHandover {
    shared: Arc<Shared>,
    buffer: vk::Buffer,
    to_external: vk::CommandBuffer,
    to_host: vk::CommandBuffer,
    last_use: LastUse,
}

impl fmt::Debug for HostHandover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostHandover").finish_non_exhaustive()
    }
}

impl Drop for HostHandover {
    fn drop(&mut self) {
        if !self.shared.wait_progress(self.last_use.get(), DROP_WAIT) {
            return; // still pending: leak (the command buffers are freed with the pool)
        }
        let d = self.shared.device();
        let state = self.shared.lock();
        for cmd in [self.to_external, self.to_host] {
            if cmd != vk::CommandBuffer::null() {
                // SAFETY: no pending submission uses the command buffer; the pool is used
                // under its lock.
                unsafe { d.free_command_buffers(state.pool, &[cmd]) };
            }
        }
    }
}

/// Queue-family ownership barriers for an exported buffer: (acquire from the external owner
/// before use, release to it after use). Empty for buffers that are not exported.
fn ownership_barriers(
    memory: &VulkanMemory,
    family: u32,
    acquire_access: vk::AccessFlags,
    release_access: vk::AccessFlags,
) -> (
    Vec<vk::BufferMemoryBarrier<'static>>,
    Vec<vk::BufferMemoryBarrier<'static>>,
) {
    if !memory.exportable {
        return (Vec::new(), Vec::new());
    }
    let base = vk::BufferMemoryBarrier::default()
        .buffer(memory.buffer)
        .offset(0)
        .size(vk::WHOLE_SIZE);
    (
        vec![base
            .src_queue_family_index(vk::QUEUE_FAMILY_EXTERNAL)
            .dst_queue_family_index(family)
            .dst_access_mask(acquire_access)],
        vec![base
            .src_queue_family_index(family)
            .dst_queue_family_index(vk::QUEUE_FAMILY_EXTERNAL)
            .src_access_mask(release_access)],
    )
}

// ---------------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------------

/// Memory allocated and exported once by [`VulkanExporter::export_memory`].
#[derive(Debug)]
pub struct ExportedMemory {
    /// The opaque fd; an importer takes ownership of it.
    pub fd: OwnedFd,
    /// The allocation size: the size the importer must use.
    pub size: u64,
    /// Whether it is a dedicated allocation (CUDA: `CUDA_EXTERNAL_MEMORY_DEDICATED`).
    pub dedicated: bool,
    /// The Vulkan object (keep it alive while the memory is used).
    pub memory: VulkanMemory,
}

/// A buffer and its own device-memory allocation, exportable as an opaque fd.
pub struct VulkanMemory {
    shared: Arc<Shared>,
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    size: u64,
    requested: u64,
    location: MemoryLocation,
    memory_type: u32,
    dedicated: bool,
    exportable: bool,
    /// Start of the persistent host mapping (host-visible memory only).
    mapped: Option<std::ptr::NonNull<u8>>,
    last_use: LastUse,
}

// SAFETY: the mapping pointer is only an address inside a mapping owned by this object, valid
// from any thread. The type is deliberately not `Sync`: host writes go through `&self` (the
// memory is shared with other APIs anyway), so two threads must not hold it at once.
unsafe impl Send for VulkanMemory {}

impl fmt::Debug for VulkanMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanMemory")
            .field("size", &self.size)
            .field("requested", &self.requested)
            .field("location", &self.location)
            .field("memory_type", &self.memory_type)
            .field("dedicated", &self.dedicated)
            .finish_non_exhaustive()
    }
}

fn pick_memory_type(
    props: &vk::PhysicalDeviceMemoryProperties,
    allowed: u32,
    location: MemoryLocation,
) -> Option<u32> {
    let (need, prefer_absent) = match location {
        MemoryLocation::DeviceLocal => (
            vk::MemoryPropertyFlags::DEVICE_LOCAL,
            vk::MemoryPropertyFlags::HOST_VISIBLE,
        ),
        MemoryLocation::HostVisible => (
            vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT,
            vk::MemoryPropertyFlags::DEVICE_LOCAL,
        ),
        MemoryLocation::DeviceLocalHostVisible => (
            vk::MemoryPropertyFlags::DEVICE_LOCAL
                | vk::MemoryPropertyFlags::HOST_VISIBLE
                | vk::MemoryPropertyFlags::HOST_COHERENT,
            vk::MemoryPropertyFlags::empty(),
        ),
        MemoryLocation::HostCached => (
            vk::MemoryPropertyFlags::HOST_VISIBLE
                | vk::MemoryPropertyFlags::HOST_COHERENT
                | vk::MemoryPropertyFlags::HOST_CACHED,
            vk::MemoryPropertyFlags::DEVICE_LOCAL,
        ),
    };
    let count = (props.memory_type_count as usize).min(props.memory_types.len());
    let candidates = || {
        (0..count).filter(move |&i| {
            allowed & (1u32 << i) != 0 && props.memory_types[i].property_flags.contains(need)
        })
    };
    let best = candidates()
        .find(|&i| {
            !props.memory_types[i]
                .property_flags
                .intersects(prefer_absent)
        })
        .or_else(|| candidates().next())?;
    u32::try_from(best).ok()
}

impl VulkanMemory {
    fn create(
        shared: &Arc<Shared>,
        size: u64,
        location: MemoryLocation,
        exportable: bool,
    ) -> Result<Self> {
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        let d = shared.device();
        let usage = vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST
            | vk::BufferUsageFlags::STORAGE_BUFFER;
        let handle = vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD;
        let mut dedicated_only = false;
        if exportable {
            let query = vk::PhysicalDeviceExternalBufferInfo::default()
                .usage(usage)
                .handle_type(handle);
            let mut out = vk::ExternalBufferProperties::default();
            // SAFETY: 1.1 core query on our physical device; structs outlive the call.
            unsafe {
                shared
                    .inst
                    .instance
                    .get_physical_device_external_buffer_properties(
                        shared.physical,
                        &query,
                        &mut out,
                    )
            };
            let features = out.external_memory_properties.external_memory_features;
            if !features.contains(vk::ExternalMemoryFeatureFlags::EXPORTABLE) {
                return Err(Error::NotExportable {
                    what: "buffer memory",
                });
            }
            dedicated_only = features.contains(vk::ExternalMemoryFeatureFlags::DEDICATED_ONLY);
        }
        let mut ext_info = vk::ExternalMemoryBufferCreateInfo::default().handle_types(handle);
        let mut buffer_info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        if exportable {
            buffer_info = buffer_info.push_next(&mut ext_info);
        }
        // SAFETY: valid create info for a live device.
        let buffer =
            unsafe { d.create_buffer(&buffer_info, None) }.map_err(vk_err("vkCreateBuffer"))?;
        let mut this = VulkanMemory {
            shared: Arc::clone(shared),
            buffer,
            memory: vk::DeviceMemory::null(),
            size: 0,
            requested: size,
            location,
            memory_type: 0,
            dedicated: false,
            exportable,
            mapped: None,
            last_use: LastUse::default(),
        };
        // From here `this` owns the buffer: an early return destroys it.
        let mut ded_req = vk::MemoryDedicatedRequirements::default();
        let mut req2 = vk::MemoryRequirements2::default().push_next(&mut ded_req);
        let req_info = vk::BufferMemoryRequirementsInfo2::default().buffer(buffer);
        // SAFETY: 1.1 core query for our live buffer.
        unsafe { d.get_buffer_memory_requirements2(&req_info, &mut req2) };
        let req = req2.memory_requirements;
        let requires_dedicated = ded_req.requires_dedicated_allocation == vk::TRUE;
        let memory_type = pick_memory_type(&shared.memory_props, req.memory_type_bits, location)
            .ok_or(Error::NoMemoryType { location })?;
        let dedicated = exportable && (dedicated_only || requires_dedicated);
        let mut export_info = vk::ExportMemoryAllocateInfo::default().handle_types(handle);
        let mut dedicated_info = vk::MemoryDedicatedAllocateInfo::default().buffer(buffer);
        let mut alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(memory_type);
        if exportable {
            alloc = alloc.push_next(&mut export_info);
        }
        if dedicated {
            alloc = alloc.push_next(&mut dedicated_info);
        }
        // SAFETY: valid allocate info for a live device; the chain outlives the call.
        this.memory =
            unsafe { d.allocate_memory(&alloc, None) }.map_err(vk_err("vkAllocateMemory"))?;
        this.size = req.size;
        this.memory_type = memory_type;
        this.dedicated = dedicated;
        // SAFETY: binding fresh memory of a type allowed by the requirements, at offset 0.
        unsafe { d.bind_buffer_memory(buffer, this.memory, 0) }
            .map_err(vk_err("vkBindBufferMemory"))?;
        if location.is_host_visible() {
            // SAFETY: host-visible memory, mapped once for its whole size.
            let ptr = unsafe {
                d.map_memory(this.memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
            }
            .map_err(vk_err("vkMapMemory"))?;
            this.mapped = std::ptr::NonNull::new(ptr.cast::<u8>());
            if this.mapped.is_none() {
                return Err(Error::Vulkan {
                    call: "vkMapMemory",
                    result: vk::Result::ERROR_MEMORY_MAP_FAILED,
                });
            }
        }
        Ok(this)
    }

    /// The allocation size in bytes (at least the size asked for): import this size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The size that was asked for.
    pub fn requested_size(&self) -> u64 {
        self.requested
    }

    /// Where the memory lives.
    pub fn location(&self) -> MemoryLocation {
        self.location
    }

    /// Whether this is a dedicated allocation (import with `CUDA_EXTERNAL_MEMORY_DEDICATED`).
    pub fn dedicated(&self) -> bool {
        self.dedicated
    }

    /// The index of the Vulkan memory type used.
    pub fn memory_type_index(&self) -> u32 {
        self.memory_type
    }

    /// Exports the memory as a new opaque fd (each call gives a fresh fd).
    pub fn export_fd(&self) -> Result<OwnedFd> {
        if !self.exportable {
            return Err(Error::NotExportable {
                what: "a staging allocation",
            });
        }
        let info = vk::MemoryGetFdInfoKHR::default()
            .memory(self.memory)
            .handle_type(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
        // SAFETY: the memory was allocated with OPAQUE_FD in its export info.
        let fd = unsafe { self.shared.mem_fd.get_memory_fd(&info) }
            .map_err(vk_err("vkGetMemoryFdKHR"))?;
        if fd < 0 {
            return Err(Error::Vulkan {
                call: "vkGetMemoryFdKHR",
                result: vk::Result::ERROR_INVALID_EXTERNAL_HANDLE,
            });
        }
        // SAFETY: a successful vkGetMemoryFdKHR gives a new fd owned by the caller.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::OutOfRange {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    /// Writes `data` at `offset` through the host mapping (host-visible memory only).
    ///
    /// The memory is shared with the GPU and other APIs, so this takes `&self` (like a write
    /// through a shared mapping); the caller orders it against GPU/other-API access with
    /// semaphores. The memory type is host-coherent: no flush is needed.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let base = self.mapped.ok_or(Error::NotHostVisible)?;
        self.check_range(offset, data.len() as u64)?;
        let offset = usize::try_from(offset).map_err(|_| Error::OutOfRange {
            offset,
            len: data.len() as u64,
            size: self.size,
        })?;
        // SAFETY: the range was checked to lie inside the mapping, which lives as long as
        // `self`; `data` is ordinary host memory and cannot overlap the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), base.as_ptr().add(offset), data.len());
        }
        Ok(())
    }

    /// The whole host mapping as one mutable byte slice ([`VulkanMemory::size`] bytes;
    /// host-visible memory only), for a producer that writes in place (a camera frame, say)
    /// instead of copying through [`VulkanMemory::write`].
    ///
    /// # Safety
    /// The memory is shared with the GPU and with every API that imported it. While the
    /// returned slice lives, nothing outside this process's Rust code may read or write the
    /// memory: the caller must have waited (on a semaphore or fence) for all such access that
    /// was queued before, and must not let new access start (signal the semaphore that releases
    /// it) until the slice is gone. Otherwise the bytes can change under a `&mut [u8]`, or the
    /// other side can read a half-written buffer.
    pub unsafe fn host_bytes_mut(&mut self) -> Result<&mut [u8]> {
        let base = self.mapped.ok_or(Error::NotHostVisible)?;
        let len = usize::try_from(self.size).map_err(|_| Error::OutOfRange {
            offset: 0,
            len: self.size,
            size: self.size,
        })?;
        // SAFETY: `base` is the start of a live mapping of `size` bytes owned by `self`, which
        // `&mut self` keeps alive and unaliased on the Rust side for the slice's lifetime; the
        // caller excludes access by other agents (this function's contract).
        Ok(unsafe { std::slice::from_raw_parts_mut(base.as_ptr(), len) })
    }

    /// Reads `out.len()` bytes at `offset` through the host mapping (host-visible memory only).
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let base = self.mapped.ok_or(Error::NotHostVisible)?;
        self.check_range(offset, out.len() as u64)?;
        let offset = usize::try_from(offset).map_err(|_| Error::OutOfRange {
            offset,
            len: out.len() as u64,
            size: self.size,
        })?;
        // SAFETY: the range lies inside the live mapping; `out` cannot overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(base.as_ptr().add(offset), out.as_mut_ptr(), out.len());
        }
        Ok(())
    }

    /// Reads the native-endian `u32` at `offset` (host-visible memory only).
    pub fn read_u32(&self, offset: u64) -> Result<u32> {
        let mut b = [0u8; 4];
        self.read(offset, &mut b)?;
        Ok(u32::from_ne_bytes(b))
    }

    /// Writes a native-endian `u32` at `offset` (host-visible memory only).
    pub fn write_u32(&self, offset: u64, value: u32) -> Result<()> {
        self.write(offset, &value.to_ne_bytes())
    }
}

impl Drop for VulkanMemory {
    fn drop(&mut self) {
        if !self.shared.wait_progress(self.last_use.get(), DROP_WAIT) {
            return; // still in use by the GPU: leak rather than free memory in use
        }
        let d = self.shared.device();
        // SAFETY: no pending submission uses the buffer or memory any more; null handles
        // (from a half-built object) are ignored; freeing mapped memory unmaps it.
        unsafe {
            d.destroy_buffer(self.buffer, None);
            d.free_memory(self.memory, None);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Semaphores
// ---------------------------------------------------------------------------------------------

/// An exportable binary or timeline semaphore.
pub struct VulkanSemaphore {
    shared: Arc<Shared>,
    sem: vk::Semaphore,
    kind: SemaphoreKind,
    last_use: LastUse,
}

impl fmt::Debug for VulkanSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanSemaphore")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl VulkanSemaphore {
    fn create(shared: &Arc<Shared>, kind: SemaphoreKind, initial: u64) -> Result<Self> {
        let handle = vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD;
        let vk_type = match kind {
            SemaphoreKind::Binary => vk::SemaphoreType::BINARY,
            SemaphoreKind::Timeline => vk::SemaphoreType::TIMELINE,
        };
        let initial = if kind == SemaphoreKind::Timeline {
            initial
        } else {
            0
        };
        {
            let mut type_query = vk::SemaphoreTypeCreateInfo::default()
                .semaphore_type(vk_type)
                .initial_value(initial);
            let query = vk::PhysicalDeviceExternalSemaphoreInfo::default()
                .handle_type(handle)
                .push_next(&mut type_query);
            let mut out = vk::ExternalSemaphoreProperties::default();
            // SAFETY: 1.1 core query on our physical device; structs outlive the call.
            unsafe {
                shared
                    .inst
                    .instance
                    .get_physical_device_external_semaphore_properties(
                        shared.physical,
                        &query,
                        &mut out,
                    )
            };
            if !out
                .external_semaphore_features
                .contains(vk::ExternalSemaphoreFeatureFlags::EXPORTABLE)
            {
                return Err(Error::NotExportable {
                    what: match kind {
                        SemaphoreKind::Binary => "a binary semaphore",
                        SemaphoreKind::Timeline => "a timeline semaphore",
                    },
                });
            }
        }
        let mut type_info = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk_type)
            .initial_value(initial);
        let mut export = vk::ExportSemaphoreCreateInfo::default().handle_types(handle);
        let info = vk::SemaphoreCreateInfo::default()
            .push_next(&mut type_info)
            .push_next(&mut export);
        // SAFETY: valid create info for a live device; the chain outlives the call.
        let sem = unsafe { shared.device().create_semaphore(&info, None) }
            .map_err(vk_err("vkCreateSemaphore"))?;
        Ok(Self {
            shared: Arc::clone(shared),
            sem,
            kind,
            last_use: LastUse::default(),
        })
    }

    /// Binary or timeline.
    pub fn kind(&self) -> SemaphoreKind {
        self.kind
    }

    /// Exports the semaphore as a new opaque fd (each call gives a fresh fd).
    pub fn export_fd(&self) -> Result<OwnedFd> {
        let info = vk::SemaphoreGetFdInfoKHR::default()
            .semaphore(self.sem)
            .handle_type(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD);
        // SAFETY: the semaphore was created exportable as OPAQUE_FD.
        let fd = unsafe { self.shared.sem_fd.get_semaphore_fd(&info) }
            .map_err(vk_err("vkGetSemaphoreFdKHR"))?;
        if fd < 0 {
            return Err(Error::Vulkan {
                call: "vkGetSemaphoreFdKHR",
                result: vk::Result::ERROR_INVALID_EXTERNAL_HANDLE,
            });
        }
        // SAFETY: a successful vkGetSemaphoreFdKHR gives a new fd owned by the caller.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn timeline(&self) -> Result<vk::Semaphore> {
        match self.kind {
            SemaphoreKind::Timeline => Ok(self.sem),
            SemaphoreKind::Binary => Err(Error::NotTimeline),
        }
    }

    /// Host signal (`vkSignalSemaphore`): sets the timeline to `value`, which must be larger
    /// than the current value and than any pending signal.
    pub fn signal(&self, value: u64) -> Result<()> {
        let s = self.timeline()?;
        self.shared.signal_semaphore(s, value)
    }

    /// Host wait (`vkWaitSemaphores`) until the timeline reaches `value`; `Ok(false)` when
    /// `timeout` passed first.
    pub fn wait(&self, value: u64, timeout: Duration) -> Result<bool> {
        let s = self.timeline()?;
        self.shared.wait_semaphore(s, value, timeout)
    }

    /// The current timeline value (`vkGetSemaphoreCounterValue`).
    pub fn value(&self) -> Result<u64> {
        let s = self.timeline()?;
        self.shared.semaphore_value(s)
    }
}

impl Drop for VulkanSemaphore {
    fn drop(&mut self) {
        if !self.shared.wait_progress(self.last_use.get(), DROP_WAIT) {
            return; // a pending batch still uses it: leak
        }
        // SAFETY: no pending submission uses the semaphore any more.
        unsafe { self.shared.device().destroy_semaphore(self.sem, None) };
    }
}

// ---------------------------------------------------------------------------------------------
// Counter increment
// ---------------------------------------------------------------------------------------------

/// A recorded compute dispatch that adds 1 to a `u32` in a [`VulkanMemory`]; see
/// [`VulkanExporter::counter_incrementer`].
pub struct CounterIncrement<'m> {
    shared: Arc<Shared>,
    memory: &'m VulkanMemory,
    pool: vk::DescriptorPool,
    cmd: vk::CommandBuffer,
    last_use: LastUse,
}

impl fmt::Debug for CounterIncrement<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CounterIncrement")
            .field("memory", &self.memory)
            .finish_non_exhaustive()
    }
}

impl Drop for CounterIncrement<'_> {
    fn drop(&mut self) {
        if !self.shared.wait_progress(self.last_use.get(), DROP_WAIT) {
            return; // still pending: leak (the pool is freed with the device)
        }
        let d = self.shared.device();
        let state = self.shared.lock();
        // SAFETY: no pending submission uses the command buffer or the descriptor set; the
        // command pool is used under its lock; null handles are ignored.
        unsafe {
            if self.cmd != vk::CommandBuffer::null() {
                d.free_command_buffers(state.pool, &[self.cmd]);
            }
            d.destroy_descriptor_pool(self.pool, None);
        }
    }
}

/// SPIR-V 1.0 compute shader, written by hand for this crate:
///
/// ```text
/// capability Shader; memory model Logical GLSL450; entry point GLCompute %1 "main";
/// local size 1x1x1; %5 = struct { u32 } (BufferBlock, member 0 at offset 0);
/// %7 = Uniform variable of %5 at set 0, binding 0
/// main: %13 = &%7.member0; %14 = load %13; %15 = %14 + 1; store %13 = %15
/// ```
///
/// Word 0 is the magic number, then version 1.0, generator 0, id bound 16, schema 0; every
/// instruction starts with `(word_count << 16) | opcode`.
#[rustfmt::skip]
const INCREMENT_SPIRV: [u32; 99] = [
    0x0723_0203, 0x0001_0000, 0x0000_0000, 0x0000_0010, 0x0000_0000,
    // OpCapability Shader
    0x0002_0011, 0x0000_0001,
    // OpMemoryModel Logical GLSL450
    0x0003_000e, 0x0000_0000, 0x0000_0001,
    // OpEntryPoint GLCompute %1 "main"
    0x0005_000f, 0x0000_0005, 0x0000_0001, 0x6e69_616d, 0x0000_0000,
    // OpExecutionMode %1 LocalSize 1 1 1
    0x0006_0010, 0x0000_0001, 0x0000_0011, 0x0000_0001, 0x0000_0001, 0x0000_0001,
    // OpDecorate %5 BufferBlock
    0x0003_0047, 0x0000_0005, 0x0000_0003,
    // OpMemberDecorate %5 0 Offset 0
    0x0005_0048, 0x0000_0005, 0x0000_0000, 0x0000_0023, 0x0000_0000,
    // OpDecorate %7 DescriptorSet 0
    0x0004_0047, 0x0000_0007, 0x0000_0022, 0x0000_0000,
    // OpDecorate %7 Binding 0
    0x0004_0047, 0x0000_0007, 0x0000_0021, 0x0000_0000,
    // %2 = OpTypeVoid
    0x0002_0013, 0x0000_0002,
    // %3 = OpTypeFunction %2
    0x0003_0021, 0x0000_0003, 0x0000_0002,
    // %4 = OpTypeInt 32 unsigned
    0x0004_0015, 0x0000_0004, 0x0000_0020, 0x0000_0000,
    // %5 = OpTypeStruct %4
    0x0003_001e, 0x0000_0005, 0x0000_0004,
    // %6 = OpTypePointer Uniform %5
    0x0004_0020, 0x0000_0006, 0x0000_0002, 0x0000_0005,
    // %7 = OpVariable %6 Uniform
    0x0004_003b, 0x0000_0006, 0x0000_0007, 0x0000_0002,
    // %8 = OpTypeInt 32 signed
    0x0004_0015, 0x0000_0008, 0x0000_0020, 0x0000_0001,
    // %9 = OpConstant %8 0
    0x0004_002b, 0x0000_0008, 0x0000_0009, 0x0000_0000,
    // %10 = OpConstant %4 1
    0x0004_002b, 0x0000_0004, 0x0000_000a, 0x0000_0001,
    // %11 = OpTypePointer Uniform %4
    0x0004_0020, 0x0000_000b, 0x0000_0002, 0x0000_0004,
    // %1 = OpFunction %2 None %3
    0x0005_0036, 0x0000_0002, 0x0000_0001, 0x0000_0000, 0x0000_0003,
    // %12 = OpLabel
    0x0002_00f8, 0x0000_000c,
    // %13 = OpAccessChain %11 %7 %9
    0x0005_0041, 0x0000_000b, 0x0000_000d, 0x0000_0007, 0x0000_0009,
    // %14 = OpLoad %4 %13
    0x0004_003d, 0x0000_0004, 0x0000_000e, 0x0000_000d,
    // %15 = OpIAdd %4 %14 %10
    0x0005_0080, 0x0000_0004, 0x0000_000f, 0x0000_000e, 0x0000_000a,
    // OpStore %13 %15
    0x0003_003e, 0x0000_000d, 0x0000_000f,
    // OpReturn
    0x0001_00fd,
    // OpFunctionEnd
    0x0001_0038,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spirv_header_and_bound() {
        assert_eq!(INCREMENT_SPIRV[0], 0x0723_0203);
        // Walk the instruction stream: every word count must land exactly on the end.
        let mut i = 5;
        while i < INCREMENT_SPIRV.len() {
            let count = (INCREMENT_SPIRV[i] >> 16) as usize;
            assert!(count > 0);
            i += count;
        }
        assert_eq!(i, INCREMENT_SPIRV.len());
    }

    #[test]
    fn uuid_format() {
        let u = [
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55,
            0x66, 0x77,
        ];
        assert_eq!(format_uuid(&u), "01234567-89ab-cdef-0011-223344556677");
    }

    #[test]
    fn memory_type_choice_prefers_plain_types() {
        let mut props = vk::PhysicalDeviceMemoryProperties {
            memory_type_count: 3,
            ..Default::default()
        };
        props.memory_types[0].property_flags = vk::MemoryPropertyFlags::DEVICE_LOCAL
            | vk::MemoryPropertyFlags::HOST_VISIBLE
            | vk::MemoryPropertyFlags::HOST_COHERENT;
        props.memory_types[1].property_flags = vk::MemoryPropertyFlags::DEVICE_LOCAL;
        props.memory_types[2].property_flags =
            vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        assert_eq!(
            pick_memory_type(&props, 0b111, MemoryLocation::DeviceLocal),
            Some(1)
        );
        assert_eq!(
            pick_memory_type(&props, 0b111, MemoryLocation::HostVisible),
            Some(2)
        );
        // Falls back to the combined type when the plain one is not allowed.
        assert_eq!(
            pick_memory_type(&props, 0b001, MemoryLocation::DeviceLocal),
            Some(0)
        );
        assert_eq!(
            pick_memory_type(&props, 0b011, MemoryLocation::HostVisible),
            Some(0)
        );
        assert_eq!(
            pick_memory_type(&props, 0b111, MemoryLocation::DeviceLocalHostVisible),
            Some(0)
        );
        assert_eq!(
            pick_memory_type(&props, 0b110, MemoryLocation::DeviceLocalHostVisible),
            None
        );
        assert_eq!(
            pick_memory_type(&props, 0b010, MemoryLocation::HostVisible),
            None
        );
        // Cached host memory: only a type with HOST_CACHED qualifies.
        assert_eq!(
            pick_memory_type(&props, 0b111, MemoryLocation::HostCached),
            None
        );
        props.memory_type_count = 4;
        props.memory_types[3].property_flags = vk::MemoryPropertyFlags::HOST_VISIBLE
            | vk::MemoryPropertyFlags::HOST_COHERENT
            | vk::MemoryPropertyFlags::HOST_CACHED;
        assert_eq!(
            pick_memory_type(&props, 0b1111, MemoryLocation::HostCached),
            Some(3)
        );
        // The plain host-visible choice still prefers the first fitting non-device-local type.
        assert_eq!(
            pick_memory_type(&props, 0b1111, MemoryLocation::HostVisible),
            Some(2)
        );
    }

    #[test]
    fn missing_loader_is_a_typed_error() {
        let r = VulkanExporter::with_loader(
            std::path::Path::new("/nonexistent/libvulkan-tegra-interop-test.so.1"),
            [0; 16],
        );
        assert!(matches!(r, Err(Error::LoaderNotFound { .. })), "{r:?}");
    }
}
