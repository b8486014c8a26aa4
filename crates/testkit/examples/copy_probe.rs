//! Copy-mode probe (issue 24, item 8): how fast can CUDA's copy engines move a 1920x1080 RGBA8
//! frame (8,294,400 bytes) between host memory that the Vulkan producer can hand over and a
//! device buffer, compared with pinned CUDA host memory measured in the same run?
//!
//! ```text
//! cargo build --release -p tegra-interop-testkit --features vulkan --example copy_probe
//! ./target/release/examples/copy_probe [--rounds N] [--json OUT.json]
//! ```
//!
//! Figures (each `--rounds` copies, default 200, after 10 untimed ones; median and p90 of the
//! per-copy time from CUDA events around each copy; "in" = host side to a device buffer, "out" =
//! a device buffer to the host side; "both" = one copy in on one stream and one copy out on
//! another at the same time, each timed by its own events; every ratio is against the pinned
//! figure of the same kind measured in this run):
//!
//! - (a) pinned `cuMemHostAlloc` memory: HtoD alone, DtoH alone, both at once (the limit);
//! - (b)/(c) for every host-visible Vulkan memory type that can be exported as an opaque fd:
//!   the allocation imported into CUDA (`cuImportExternalMemory` + mapped buffer) and copied
//!   with `cuMemcpyDtoDAsync`, as the pipeline does; plus the CPU's cost of writing a frame into
//!   the mapping and of reading it back (1 and 4 threads). The pipeline's type today is the
//!   host-cached coherent one; a type without HOST_CACHED is write-combined on NVIDIA;
//! - (d) `cuMemHostRegister_v2` of each such type's host mapping with flags 0,
//!   PORTABLE|DEVICEMAP and PORTABLE|DEVICEMAP|IOMEMORY: the raw `CUresult`, and where it
//!   succeeds the HtoD / DtoH copies from that pointer; the same for anonymous `mmap` memory as
//!   the control;
//! - (e) `VK_EXT_external_memory_host`: pinned `cuMemHostAlloc` memory and anonymous `mmap`
//!   memory imported into Vulkan (`vkGetMemoryHostPointerPropertiesEXT`, then an allocation
//!   with `VkImportMemoryHostPointerInfoEXT` tried on every memory type it allows), a buffer
//!   bound to it, and the pipeline's release batch (host-write barrier + release of the buffer
//!   to `VK_QUEUE_FAMILY_EXTERNAL`) submitted and waited for with a fence, idle and while CUDA
//!   copies run both ways; the same batch on the host-cached exported buffer as the reference;
//!   then the CUDA copies from that host memory once Vulkan imported it.
//!
//! The Vulkan device is the one whose UUID is CUDA device 0's; the queue is of a transfer-only
//! family where there is one (the pipeline's choice). Prints a markdown table; `--json` writes
//! every figure and every raw result as JSON.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::ffi::{c_uint, c_void, CStr};
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use ash::vk;
use libloading::Library;
use serde_json::{json, Value};
use tegra_interop::sys::cuda as sys;
use tegra_interop_testkit::raw_cuda::RawCuda;

const FRAME: usize = 1920 * 1080 * 4;
const WARM: usize = 10;
const PORTABLE: c_uint = 1;
const DEVICEMAP: c_uint = 2;
const IOMEMORY: c_uint = 4;

type RegisterFn = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> sys::CUresult;
type UnregisterFn = unsafe extern "C" fn(*mut c_void) -> sys::CUresult;

macro_rules! load {
    ($lib:expr, $name:ident, $sym:expr) => {{
        // SAFETY: the generated PFN type is the C prototype of this symbol.
        let s = unsafe { $lib.get::<sys::$name>($sym) };
        (*s.expect(stringify!($name))).expect(stringify!($name))
    }};
}

/// The CUDA entry points the probe needs beyond `RawCuda`'s.
struct Cu {
    raw: RawCuda,
    host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> sys::CUresult,
    htod: unsafe extern "C" fn(
        sys::CUdeviceptr,
        *const c_void,
        usize,
        sys::CUstream,
    ) -> sys::CUresult,
    dtoh:
        unsafe extern "C" fn(*mut c_void, sys::CUdeviceptr, usize, sys::CUstream) -> sys::CUresult,
    dtod: unsafe extern "C" fn(
        sys::CUdeviceptr,
        sys::CUdeviceptr,
        usize,
        sys::CUstream,
    ) -> sys::CUresult,
    ev_create: unsafe extern "C" fn(*mut sys::CUevent, c_uint) -> sys::CUresult,
    ev_record: unsafe extern "C" fn(sys::CUevent, sys::CUstream) -> sys::CUresult,
    ev_sync: unsafe extern "C" fn(sys::CUevent) -> sys::CUresult,
    ev_elapsed: unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult,
    mem_alloc: unsafe extern "C" fn(*mut sys::CUdeviceptr, usize) -> sys::CUresult,
    host_dev_ptr: unsafe extern "C" fn(*mut sys::CUdeviceptr, *mut c_void, c_uint) -> sys::CUresult,
    register: Option<RegisterFn>,
    unregister: Option<UnregisterFn>,
    _lib: Library,
}

impl Cu {
    fn load() -> Self {
        let raw = RawCuda::load().expect("libcuda.so.1");
        // SAFETY: opening the CUDA driver library (already open through `raw`).
        let lib = unsafe { Library::new("libcuda.so.1") }.expect("libcuda.so.1");
        // SAFETY: the prototypes are those of the CUDA 12/13 headers for these two symbols.
        let register = unsafe { lib.get::<RegisterFn>(b"cuMemHostRegister_v2\0") }
            .ok()
            .map(|s| *s);
        // SAFETY: as above.
        let unregister = unsafe { lib.get::<UnregisterFn>(b"cuMemHostUnregister\0") }
            .ok()
            .map(|s| *s);
        Self {
            host_alloc: load!(lib, PFN_cuMemHostAlloc, sys::symbols::cuMemHostAlloc),
            htod: load!(lib, PFN_cuMemcpyHtoDAsync, sys::symbols::cuMemcpyHtoDAsync),
            dtoh: load!(lib, PFN_cuMemcpyDtoHAsync, sys::symbols::cuMemcpyDtoHAsync),
            dtod: load!(lib, PFN_cuMemcpyDtoDAsync, sys::symbols::cuMemcpyDtoDAsync),
            ev_create: load!(lib, PFN_cuEventCreate, sys::symbols::cuEventCreate),
            ev_record: load!(lib, PFN_cuEventRecord, sys::symbols::cuEventRecord),
            ev_sync: load!(
                lib,
                PFN_cuEventSynchronize,
                sys::symbols::cuEventSynchronize
            ),
            ev_elapsed: load!(
                lib,
                PFN_cuEventElapsedTime,
                sys::symbols::cuEventElapsedTime
            ),
            mem_alloc: load!(lib, PFN_cuMemAlloc, sys::symbols::cuMemAlloc),
            host_dev_ptr: load!(
                lib,
                PFN_cuMemHostGetDevicePointer,
                sys::symbols::cuMemHostGetDevicePointer
            ),
            register,
            unregister,
            raw,
            _lib: lib,
        }
    }

    fn ok(&self, call: &'static str, r: sys::CUresult) {
        self.raw.check(call, r).unwrap_or_else(|e| panic!("{e}"));
    }

    fn event(&self) -> sys::CUevent {
        let mut e = std::ptr::null_mut();
        // SAFETY: valid out pointer; flags 0 (timing on).
        self.ok("cuEventCreate", unsafe { (self.ev_create)(&mut e, 0) });
        e
    }

    fn device_buffer(&self) -> sys::CUdeviceptr {
        let mut p = 0;
        // SAFETY: valid out pointer.
        self.ok("cuMemAlloc", unsafe { (self.mem_alloc)(&mut p, FRAME) });
        p
    }

    fn pinned(&self, len: usize, flags: c_uint) -> *mut c_void {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        self.ok("cuMemHostAlloc", unsafe {
            (self.host_alloc)(&mut p, len, flags)
        });
        p
    }
}

/// One side of a copy: host memory (HtoD / DtoH) or a device pointer (DtoD).
#[derive(Clone, Copy)]
enum End {
    Host(*mut c_void),
    Dev(sys::CUdeviceptr),
}

/// Streams, events and the two device buffers the copies go to and come from.
struct Rig {
    s_in: sys::CUstream,
    s_out: sys::CUstream,
    ev: [sys::CUevent; 4],
    d_in: sys::CUdeviceptr,
    d_out: sys::CUdeviceptr,
}

#[derive(Clone, Copy, Default)]
struct Stat {
    median: f64,
    p90: f64,
}

fn stat(mut v: Vec<f64>) -> Stat {
    if v.is_empty() {
        return Stat::default();
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    Stat {
        median: at(0.5),
        p90: at(0.9),
    }
}

/// The four figures of one host side: in alone, out alone, in and out at once.
#[derive(Clone, Copy, Default)]
struct Figures {
    in_alone: Stat,
    out_alone: Stat,
    both_in: Stat,
    both_out: Stat,
    both_max: Stat,
}

impl Cu {
    fn copy_in(&self, rig: &Rig, src: End, s: sys::CUstream) {
        // SAFETY: both sides are FRAME bytes of live memory that outlive the synchronisation
        // that follows every round.
        let r = unsafe {
            match src {
                End::Host(p) => (self.htod)(rig.d_in, p, FRAME, s),
                End::Dev(p) => (self.dtod)(rig.d_in, p, FRAME, s),
            }
        };
        self.ok("copy in", r);
    }

    fn copy_out(&self, rig: &Rig, dst: End, s: sys::CUstream) {
        // SAFETY: as in `copy_in`.
        let r = unsafe {
            match dst {
                End::Host(p) => (self.dtoh)(p, rig.d_out, FRAME, s),
                End::Dev(p) => (self.dtod)(p, rig.d_out, FRAME, s),
            }
        };
        self.ok("copy out", r);
    }

    fn elapsed_us(&self, a: sys::CUevent, b: sys::CUevent) -> f64 {
        let mut ms = 0f32;
        // SAFETY: plain calls on live events.
        self.ok("cuEventSynchronize", unsafe { (self.ev_sync)(b) });
        // SAFETY: as above; valid out pointer.
        self.ok("cuEventElapsedTime", unsafe {
            (self.ev_elapsed)(&mut ms, a, b)
        });
        f64::from(ms) * 1000.0
    }

    fn record(&self, e: sys::CUevent, s: sys::CUstream) {
        // SAFETY: live event and stream.
        self.ok("cuEventRecord", unsafe { (self.ev_record)(e, s) });
    }

    fn measure(&self, rig: &Rig, src: End, dst: End, rounds: usize) -> Figures {
        let [e0, e1, e2, e3] = rig.ev;
        let one = |f: &dyn Fn(sys::CUstream)| {
            let mut v = Vec::with_capacity(rounds);
            for i in 0..rounds + WARM {
                self.record(e0, rig.s_in);
                f(rig.s_in);
                self.record(e1, rig.s_in);
                let us = self.elapsed_us(e0, e1);
                if i >= WARM {
                    v.push(us);
                }
            }
            stat(v)
        };
        let in_alone = one(&|s| self.copy_in(rig, src, s));
        let out_alone = one(&|s| self.copy_out(rig, dst, s));
        let (mut a, mut b, mut m) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..rounds + WARM {
            self.record(e0, rig.s_in);
            self.record(e2, rig.s_out);
            self.copy_in(rig, src, rig.s_in);
            self.copy_out(rig, dst, rig.s_out);
            self.record(e1, rig.s_in);
            self.record(e3, rig.s_out);
            let x = self.elapsed_us(e0, e1);
            let y = self.elapsed_us(e2, e3);
            if i >= WARM {
                a.push(x);
                b.push(y);
                m.push(x.max(y));
            }
        }
        Figures {
            in_alone,
            out_alone,
            both_in: stat(a),
            both_out: stat(b),
            both_max: stat(m),
        }
    }

    /// Registers `len` bytes at `p`; the raw result code.
    fn try_register(&self, p: *mut c_void, len: usize, flags: c_uint) -> u32 {
        match self.register {
            // SAFETY: `p..p+len` is a live host mapping of this process; unregistered below.
            Some(f) => unsafe { f(p, len, flags) }.0,
            None => u32::MAX,
        }
    }

    fn unregister(&self, p: *mut c_void) -> u32 {
        match self.unregister {
            // SAFETY: `p` was registered by `try_register`.
            Some(f) => unsafe { f(p) }.0,
            None => u32::MAX,
        }
    }

    /// The device address of device-mapped host memory (pinned or registered with DEVICEMAP);
    /// `None` where the driver refuses.
    fn dev_ptr(&self, p: *mut c_void) -> Option<sys::CUdeviceptr> {
        let mut d = 0;
        // SAFETY: valid out pointer; `p` is live host memory.
        let r = unsafe { (self.host_dev_ptr)(&mut d, p, 0) };
        (r.0 == 0).then_some(d)
    }

    fn code_name(&self, code: u32) -> String {
        if code == u32::MAX {
            return "entry point missing".into();
        }
        match self.raw.check("", sys::CUresult(code)) {
            Ok(()) => "CUDA_SUCCESS".into(),
            Err(e) => e.name,
        }
    }
}

fn fig_json(f: &Figures, pinned: &Figures) -> Value {
    let r = |a: Stat, b: Stat| {
        if b.median > 0.0 {
            a.median / b.median
        } else {
            0.0
        }
    };
    json!({
        "in_alone": {"median_us": f.in_alone.median, "p90_us": f.in_alone.p90, "vs_pinned": r(f.in_alone, pinned.in_alone)},
        "out_alone": {"median_us": f.out_alone.median, "p90_us": f.out_alone.p90, "vs_pinned": r(f.out_alone, pinned.out_alone)},
        "both_in": {"median_us": f.both_in.median, "p90_us": f.both_in.p90, "vs_pinned": r(f.both_in, pinned.both_in)},
        "both_out": {"median_us": f.both_out.median, "p90_us": f.both_out.p90, "vs_pinned": r(f.both_out, pinned.both_out)},
        "both_max": {"median_us": f.both_max.median, "p90_us": f.both_max.p90, "vs_pinned": r(f.both_max, pinned.both_max),
                     "frames_per_s_bound": if f.both_max.median > 0.0 { 1e6 / f.both_max.median } else { 0.0 }},
    })
}

fn fig_rows(label: &str, f: &Figures, pinned: &Figures) -> String {
    let row = |what: &str, a: Stat, b: Stat| {
        format!(
            "| {label} | {what} | {:.1} | {:.1} | {:.2} |\n",
            a.median,
            a.p90,
            if b.median > 0.0 {
                a.median / b.median
            } else {
                0.0
            }
        )
    };
    row("in alone", f.in_alone, pinned.in_alone)
        + &row("out alone", f.out_alone, pinned.out_alone)
        + &row("both: in", f.both_in, pinned.both_in)
        + &row("both: out", f.both_out, pinned.both_out)
        + &row("both: max of the two", f.both_max, pinned.both_max)
}

// ---- CPU access -------------------------------------------------------------------------------

/// Median microseconds to write a frame into `p` and to read it back, with `threads` threads.
fn cpu_cost(p: *mut u8, threads: usize, rounds: usize) -> (f64, f64) {
    let src: Vec<u8> = (0..FRAME).map(|i| (i * 7 + 3) as u8).collect();
    let mut dst = vec![0u8; FRAME];
    let chunk = FRAME / threads;
    let addr = p as usize;
    let mut w = Vec::new();
    let mut r = Vec::new();
    for i in 0..rounds + 2 {
        let t = Instant::now();
        std::thread::scope(|s| {
            for (k, part) in src.chunks(chunk).enumerate() {
                s.spawn(move || {
                    // SAFETY: each thread writes its own disjoint part of the FRAME-byte
                    // mapping at `addr`, which outlives the scope.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            part.as_ptr(),
                            (addr as *mut u8).add(k * chunk),
                            part.len(),
                        );
                    }
                });
            }
        });
        let wt = t.elapsed().as_secs_f64() * 1e6;
        let t = Instant::now();
        std::thread::scope(|s| {
            for (k, part) in dst.chunks_mut(chunk).enumerate() {
                s.spawn(move || {
                    // SAFETY: each thread reads its own part of the live mapping.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            (addr as *const u8).add(k * chunk),
                            part.as_mut_ptr(),
                            part.len(),
                        );
                    }
                });
            }
        });
        let rt = t.elapsed().as_secs_f64() * 1e6;
        if i >= 2 {
            w.push(wt);
            r.push(rt);
        }
    }
    assert_eq!(
        src, dst,
        "the mapping gave back other bytes than were written"
    );
    (stat(w).median, stat(r).median)
}

// ---- Vulkan -----------------------------------------------------------------------------------

struct Vk {
    _entry: ash::Entry,
    instance: ash::Instance,
    pd: vk::PhysicalDevice,
    device: ash::Device,
    queue: vk::Queue,
    family: u32,
    pool: vk::CommandPool,
    fence: vk::Fence,
    props: vk::PhysicalDeviceMemoryProperties,
    mem_fd: ash::khr::external_memory_fd::Device,
    host_ext: Option<(ash::ext::external_memory_host::Device, u64)>,
}

/// A Vulkan buffer and its memory (exported or imported), mapped where host-visible.
struct VkBuf {
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    size: u64,
    dedicated: bool,
    mapped: *mut c_void,
}

impl Vk {
    fn open(uuid: [u8; 16]) -> Self {
        // SAFETY: loading the system's Vulkan loader.
        let entry = unsafe { ash::Entry::load() }.expect("libvulkan.so.1");
        let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_2);
        // SAFETY: valid create info.
        let instance = unsafe {
            entry.create_instance(
                &vk::InstanceCreateInfo::default().application_info(&app),
                None,
            )
        }
        .expect("vkCreateInstance");
        // SAFETY: live instance.
        let pds = unsafe { instance.enumerate_physical_devices() }.expect("devices");
        let pd = pds
            .into_iter()
            .find(|&pd| {
                let mut id = vk::PhysicalDeviceIDProperties::default();
                let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut id);
                // SAFETY: 1.1 core query on an enumerated device.
                unsafe { instance.get_physical_device_properties2(pd, &mut p2) };
                id.device_uuid == uuid
            })
            .expect("no Vulkan device with the CUDA device's UUID");
        // SAFETY: enumerated device.
        let exts = unsafe { instance.enumerate_device_extension_properties(pd) }.expect("exts");
        let has = |n: &CStr| {
            exts.iter()
                .any(|e| e.extension_name_as_c_str().is_ok_and(|x| x == n))
        };
        let host_ok = has(ash::ext::external_memory_host::NAME);
        // SAFETY: enumerated device.
        let families = unsafe { instance.get_physical_device_queue_family_properties(pd) };
        let transfer_only = families.iter().position(|f| {
            f.queue_flags.contains(vk::QueueFlags::TRANSFER)
                && !f
                    .queue_flags
                    .intersects(vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE)
        });
        let family = transfer_only
            .or_else(|| {
                families
                    .iter()
                    .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
            })
            .expect("a queue family") as u32;
        let mut names = vec![ash::khr::external_memory_fd::NAME.as_ptr()];
        if host_ok {
            names.push(ash::ext::external_memory_host::NAME.as_ptr());
        }
        let prio = [1.0f32];
        let qinfo = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(family)
            .queue_priorities(&prio)];
        // SAFETY: valid create info; the extensions were listed by the device.
        let device = unsafe {
            instance.create_device(
                pd,
                &vk::DeviceCreateInfo::default()
                    .queue_create_infos(&qinfo)
                    .enabled_extension_names(&names),
                None,
            )
        }
        .expect("vkCreateDevice");
        // SAFETY: the queue created above.
        let queue = unsafe { device.get_device_queue(family, 0) };
        // SAFETY: valid create infos on a live device.
        let pool = unsafe {
            device.create_command_pool(
                &vk::CommandPoolCreateInfo::default()
                    .queue_family_index(family)
                    .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER),
                None,
            )
        }
        .expect("pool");
        // SAFETY: as above.
        let fence =
            unsafe { device.create_fence(&vk::FenceCreateInfo::default(), None) }.expect("fence");
        // SAFETY: enumerated device.
        let props = unsafe { instance.get_physical_device_memory_properties(pd) };
        let mem_fd = ash::khr::external_memory_fd::Device::new(&instance, &device);
        let host_ext = host_ok.then(|| {
            let mut hp = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
            let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut hp);
            // SAFETY: 1.1 core query with the extension's struct chained.
            unsafe { instance.get_physical_device_properties2(pd, &mut p2) };
            (
                ash::ext::external_memory_host::Device::new(&instance, &device),
                hp.min_imported_host_pointer_alignment,
            )
        });
        Self {
            _entry: entry,
            instance,
            pd,
            device,
            queue,
            family,
            pool,
            fence,
            props,
            mem_fd,
            host_ext,
        }
    }

    fn type_flags(&self, i: u32) -> vk::MemoryPropertyFlags {
        self.props.memory_types[i as usize].property_flags
    }

    fn buffer(&self, size: u64, handle: vk::ExternalMemoryHandleTypeFlags) -> vk::Buffer {
        let mut ext = vk::ExternalMemoryBufferCreateInfo::default().handle_types(handle);
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(
                vk::BufferUsageFlags::TRANSFER_SRC
                    | vk::BufferUsageFlags::TRANSFER_DST
                    | vk::BufferUsageFlags::STORAGE_BUFFER,
            )
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .push_next(&mut ext);
        // SAFETY: valid create info.
        unsafe { self.device.create_buffer(&info, None) }.expect("vkCreateBuffer")
    }

    /// An exportable (opaque fd), mapped allocation of memory type `ty`, as the pipeline makes
    /// its frames; `None` when the type does not fit the buffer.
    fn exported(&self, ty: u32) -> Option<VkBuf> {
        let handle = vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD;
        let buffer = self.buffer(FRAME as u64, handle);
        let mut ded = vk::MemoryDedicatedRequirements::default();
        let mut req2 = vk::MemoryRequirements2::default().push_next(&mut ded);
        // SAFETY: live buffer.
        unsafe {
            self.device.get_buffer_memory_requirements2(
                &vk::BufferMemoryRequirementsInfo2::default().buffer(buffer),
                &mut req2,
            );
        }
        let req = req2.memory_requirements;
        if req.memory_type_bits & (1 << ty) == 0 {
            // SAFETY: unused buffer.
            unsafe { self.device.destroy_buffer(buffer, None) };
            return None;
        }
        let mut q = vk::ExternalBufferProperties::default();
        // SAFETY: 1.1 core query.
        unsafe {
            self.instance
                .get_physical_device_external_buffer_properties(
                    self.pd,
                    &vk::PhysicalDeviceExternalBufferInfo::default()
                        .usage(
                            vk::BufferUsageFlags::TRANSFER_SRC
                                | vk::BufferUsageFlags::TRANSFER_DST
                                | vk::BufferUsageFlags::STORAGE_BUFFER,
                        )
                        .handle_type(handle),
                    &mut q,
                );
        }
        let dedicated = ded.requires_dedicated_allocation == vk::TRUE
            || q.external_memory_properties
                .external_memory_features
                .contains(vk::ExternalMemoryFeatureFlags::DEDICATED_ONLY);
        let mut export = vk::ExportMemoryAllocateInfo::default().handle_types(handle);
        let mut dinfo = vk::MemoryDedicatedAllocateInfo::default().buffer(buffer);
        let mut alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(ty)
            .push_next(&mut export);
        if dedicated {
            alloc = alloc.push_next(&mut dinfo);
        }
        // SAFETY: valid allocate info; the chain outlives the call.
        let memory = unsafe { self.device.allocate_memory(&alloc, None) }.ok()?;
        // SAFETY: fresh memory of an allowed type, host-visible (the caller checked).
        let mapped = unsafe {
            self.device
                .bind_buffer_memory(buffer, memory, 0)
                .expect("bind");
            self.device
                .map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
                .expect("map")
        };
        Some(VkBuf {
            buffer,
            memory,
            size: req.size,
            dedicated,
            mapped,
        })
    }

    fn export_fd(&self, b: &VkBuf) -> OwnedFd {
        let info = vk::MemoryGetFdInfoKHR::default()
            .memory(b.memory)
            .handle_type(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
        // SAFETY: exportable memory.
        let fd = unsafe { self.mem_fd.get_memory_fd(&info) }.expect("vkGetMemoryFdKHR");
        // SAFETY: a new fd owned by us.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    /// The pipeline's release batch on `buffer`: host-write barrier, then the buffer released
    /// to `VK_QUEUE_FAMILY_EXTERNAL`.
    fn release_batch(&self, buffer: vk::Buffer) -> vk::CommandBuffer {
        // SAFETY: our pool, used from this thread only.
        let cmd = unsafe {
            self.device.allocate_command_buffers(
                &vk::CommandBufferAllocateInfo::default()
                    .command_pool(self.pool)
                    .level(vk::CommandBufferLevel::PRIMARY)
                    .command_buffer_count(1),
            )
        }
        .expect("command buffer")[0];
        let all = vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE;
        let host = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::HOST_WRITE)
            .dst_access_mask(all)];
        let release = [vk::BufferMemoryBarrier::default()
            .buffer(buffer)
            .offset(0)
            .size(vk::WHOLE_SIZE)
            .src_queue_family_index(self.family)
            .dst_queue_family_index(vk::QUEUE_FAMILY_EXTERNAL)
            .src_access_mask(all)];
        // SAFETY: recording a fresh command buffer with live objects.
        unsafe {
            let d = &self.device;
            d.begin_command_buffer(
                cmd,
                &vk::CommandBufferBeginInfo::default()
                    .flags(vk::CommandBufferUsageFlags::SIMULTANEOUS_USE),
            )
            .expect("begin");
            d.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::HOST,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::DependencyFlags::empty(),
                &host,
                &[],
                &[],
            );
            d.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                vk::DependencyFlags::empty(),
                &[],
                &release,
                &[],
            );
            d.end_command_buffer(cmd).expect("end");
        }
        cmd
    }

    /// Submits `cmd` with the fence and waits; microseconds from submit to the fence.
    fn run_batch(&self, cmd: vk::CommandBuffer) -> Result<f64, vk::Result> {
        let cmds = [cmd];
        let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
        let t = Instant::now();
        // SAFETY: live queue, recorded command buffer, unsignalled fence.
        unsafe {
            self.device.queue_submit(self.queue, &submit, self.fence)?;
            self.device
                .wait_for_fences(&[self.fence], true, 10_000_000_000)?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6;
        // SAFETY: the fence is signalled and not in use.
        unsafe { self.device.reset_fences(&[self.fence])? };
        Ok(us)
    }

    /// Imports host memory at `p` (`len` bytes) into Vulkan: the raw results and, where one
    /// type worked, the buffer bound to it.
    fn import_host(&self, p: *mut c_void, len: u64) -> (Value, Option<VkBuf>) {
        let Some((ext, _)) = &self.host_ext else {
            return (json!({"supported": false}), None);
        };
        let handle = vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;
        let mut props = vk::MemoryHostPointerPropertiesEXT::default();
        // SAFETY: live device; `p` is a live host allocation of ours; valid out struct.
        let r = unsafe {
            (ext.fp().get_memory_host_pointer_properties_ext)(
                self.device.handle(),
                handle,
                p,
                &mut props,
            )
        };
        let mut out = json!({
            "supported": true,
            "vkGetMemoryHostPointerPropertiesEXT": format!("{r:?} ({})", r.as_raw()),
            "memory_type_bits": props.memory_type_bits,
        });
        if r != vk::Result::SUCCESS {
            return (out, None);
        }
        let buffer = self.buffer(len, handle);
        // SAFETY: live buffer.
        let req = unsafe { self.device.get_buffer_memory_requirements(buffer) };
        out["buffer_memory_type_bits"] = json!(req.memory_type_bits);
        out["buffer_size_required"] = json!(req.size);
        let mut tries = Vec::new();
        let mut found = None;
        for ty in 0..self.props.memory_type_count {
            if props.memory_type_bits & (1 << ty) == 0 {
                continue;
            }
            let mut import = vk::ImportMemoryHostPointerInfoEXT::default()
                .handle_type(handle)
                .host_pointer(p);
            let alloc = vk::MemoryAllocateInfo::default()
                .allocation_size(len)
                .memory_type_index(ty)
                .push_next(&mut import);
            // SAFETY: valid allocate info; `p` outlives the import (freed after it).
            let res = unsafe { self.device.allocate_memory(&alloc, None) };
            let mut t = json!({
                "type": ty,
                "flags": format!("{:?}", self.type_flags(ty)),
                "vkAllocateMemory": match &res { Ok(_) => "SUCCESS".to_string(), Err(e) => format!("{e:?} ({})", e.as_raw()) },
            });
            if let Ok(memory) = res {
                let bound = req.memory_type_bits & (1 << ty) != 0 && req.size <= len;
                let b = if bound {
                    // SAFETY: memory of an allowed type, big enough (checked).
                    unsafe { self.device.bind_buffer_memory(buffer, memory, 0) }
                } else {
                    Err(vk::Result::ERROR_UNKNOWN)
                };
                t["vkBindBufferMemory"] = json!(format!("{b:?}"));
                if b.is_ok() && found.is_none() {
                    found = Some(VkBuf {
                        buffer,
                        memory,
                        size: len,
                        dedicated: false,
                        mapped: p,
                    });
                } else {
                    // SAFETY: unused memory.
                    unsafe { self.device.free_memory(memory, None) };
                }
            }
            tries.push(t);
        }
        out["allocations"] = json!(tries);
        if found.is_none() {
            // SAFETY: unbound, unused buffer.
            unsafe { self.device.destroy_buffer(buffer, None) };
        }
        (out, found)
    }
}

/// Anonymous, page-aligned host memory (`mmap`), unmapped on drop.
struct Anon(*mut c_void, usize);

impl Anon {
    fn new(len: usize) -> Self {
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        Self(p, len)
    }
}

impl Drop for Anon {
    fn drop(&mut self) {
        // SAFETY: our mapping, no longer used.
        unsafe { libc::munmap(self.0, self.1) };
    }
}

fn round_up(n: u64, a: u64) -> u64 {
    n.div_ceil(a.max(1)) * a.max(1)
}

fn main() {
    let mut rounds = 200usize;
    let mut json_path = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--rounds N")
            }
            "--json" => json_path = args.next(),
            other => json_path = Some(other.to_string()),
        }
    }
    let cu = Cu::load();
    let version = cu.raw.init().expect("cuInit");
    let dev = cu.raw.device(0).expect("device 0");
    let name = cu.raw.device_name(dev).expect("name");
    let uuid = cu.raw.device_uuid(dev).expect("uuid");
    let _ctx = cu.raw.primary_context(dev).expect("context");
    let rig = Rig {
        s_in: cu.raw.stream().expect("stream"),
        s_out: cu.raw.stream().expect("stream"),
        ev: [cu.event(), cu.event(), cu.event(), cu.event()],
        d_in: cu.device_buffer(),
        d_out: cu.device_buffer(),
    };
    let mut report = json!({
        "device": name, "cuda_driver_version": version, "frame_bytes": FRAME, "rounds": rounds,
    });
    let mut table = String::from(
        "| source | figure | median us | p90 us | median / pinned |\n|---|---|---:|---:|---:|\n",
    );
    println!("copy_probe: {name}, CUDA driver {version}, {FRAME} bytes per frame, {rounds} copies per figure");

    // (a) pinned.
    let pin_in = cu.pinned(FRAME, PORTABLE | DEVICEMAP);
    let pin_out = cu.pinned(FRAME, PORTABLE | DEVICEMAP);
    let pinned = cu.measure(&rig, End::Host(pin_in), End::Host(pin_out), rounds);
    table += &fig_rows("(a) pinned cuMemHostAlloc", &pinned, &pinned);
    report["a_pinned"] = fig_json(&pinned, &pinned);
    // The same memory through its device address (cuMemcpyDtoDAsync, as the pipeline's
    // `Stream::copy_async` copies): does the driver still take the host-copy path?
    if let (Some(da), Some(db)) = (cu.dev_ptr(pin_in), cu.dev_ptr(pin_out)) {
        let g = cu.measure(&rig, End::Dev(da), End::Dev(db), rounds);
        table += &fig_rows("(a2) pinned via device address (DtoD)", &g, &pinned);
        report["a_pinned_dtod"] = fig_json(&g, &pinned);
    }
    let (w1, r1) = cpu_cost(pin_in.cast(), 1, 20);
    let (w4, r4) = cpu_cost(pin_in.cast(), 4, 20);
    report["a_pinned"]["cpu_us"] =
        json!({"write_1t": w1, "read_1t": r1, "write_4t": w4, "read_4t": r4});

    // (b) / (c) / (d): every host-visible Vulkan memory type, exported and imported.
    let vkx = Vk::open(uuid);
    let mut types = Vec::new();
    let mut reference_buffer = None;
    for ty in 0..vkx.props.memory_type_count {
        let flags = vkx.type_flags(ty);
        if !flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE) {
            continue;
        }
        let label = format!("type {ty} {flags:?}");
        let (Some(a), Some(b)) = (vkx.exported(ty), vkx.exported(ty)) else {
            types.push(json!({"type": ty, "flags": format!("{flags:?}"), "exportable": false}));
            continue;
        };
        let import = |buf: &VkBuf| {
            let mem = cu
                .raw
                .import_memory_fd(vkx.export_fd(buf), buf.size, buf.dedicated)?;
            cu.raw.map_buffer(mem, 0, buf.size)
        };
        let (pa, pb) = match (import(&a), import(&b)) {
            (Ok(pa), Ok(pb)) => (pa, pb),
            (ra, rb) => {
                let why = format!("{:?} / {:?}", ra.err(), rb.err());
                println!("{label}: the CUDA import failed: {why}");
                types.push(json!({"type": ty, "flags": format!("{flags:?}"), "exportable": true, "cuda_import_error": why}));
                continue;
            }
        };
        let f = cu.measure(&rig, End::Dev(pa), End::Dev(pb), rounds);
        let kind = if flags.contains(vk::MemoryPropertyFlags::HOST_CACHED) {
            "(b) imported host-cached"
        } else if flags.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL) {
            "(c') imported device-local host-visible"
        } else {
            "(c) imported write-combined"
        };
        table += &fig_rows(&format!("{kind}, {label}"), &f, &pinned);
        let (w1, r1) = cpu_cost(a.mapped.cast(), 1, 20);
        let (w4, r4) = cpu_cost(a.mapped.cast(), 4, 20);
        let mut entry = json!({
            "type": ty, "flags": format!("{flags:?}"), "kind": kind, "exportable": true,
            "allocation_size": a.size, "dedicated": a.dedicated,
            "imported_dtod": fig_json(&f, &pinned),
            "cpu_us": {"write_1t": w1, "read_1t": r1, "write_4t": w4, "read_4t": r4},
        });
        println!(
            "{kind}, {label}: CPU write {w1:.0} us / read {r1:.0} us (1 thread), {w4:.0} / {r4:.0} (4 threads)"
        );
        // (d) register the mapping with CUDA.
        let mut regs = Vec::new();
        for flags in [0, PORTABLE | DEVICEMAP, PORTABLE | DEVICEMAP | IOMEMORY] {
            let ra = cu.try_register(a.mapped, a.size as usize, flags);
            let rb = cu.try_register(b.mapped, b.size as usize, flags);
            let mut r = json!({"flags": flags, "result": ra, "result_name": cu.code_name(ra), "result_second": rb});
            println!(
                "(d) cuMemHostRegister_v2({label} mapping, flags {flags}) = {ra} {}",
                cu.code_name(ra)
            );
            if ra == 0 && rb == 0 {
                let g = cu.measure(&rig, End::Host(a.mapped), End::Host(b.mapped), rounds);
                table += &fig_rows(
                    &format!("(d) registered mapping flags {flags}, {label}"),
                    &g,
                    &pinned,
                );
                r["copies"] = fig_json(&g, &pinned);
                if let (Some(da), Some(db)) = (cu.dev_ptr(a.mapped), cu.dev_ptr(b.mapped)) {
                    let g = cu.measure(&rig, End::Dev(da), End::Dev(db), rounds);
                    table += &fig_rows(
                        &format!("(d2) registered mapping flags {flags} via device address (DtoD), {label}"),
                        &g,
                        &pinned,
                    );
                    r["copies_dtod"] = fig_json(&g, &pinned);
                }
            }
            if ra == 0 {
                r["unregister"] = json!(cu.unregister(a.mapped));
            }
            if rb == 0 {
                cu.unregister(b.mapped);
            }
            regs.push(r);
        }
        entry["register"] = json!(regs);
        types.push(entry);
        if kind.starts_with("(b)") && reference_buffer.is_none() {
            reference_buffer = Some(a.buffer);
        }
        // `a` and `b` are never freed: CUDA imported them; they live until the process ends.
    }
    report["vulkan_types"] = json!(types);

    // (d) control: anonymous memory registered.
    // Rounded to the Vulkan host-pointer import alignment, so that (e) can import it too.
    let host_len = round_up(
        FRAME as u64,
        vkx.host_ext.as_ref().map_or(4096, |(_, a)| (*a).max(4096)),
    ) as usize;
    let an_a = Anon::new(host_len);
    let an_b = Anon::new(host_len);
    let ra = cu.try_register(an_a.0, host_len, PORTABLE | DEVICEMAP);
    let rb = cu.try_register(an_b.0, host_len, PORTABLE | DEVICEMAP);
    let mut anon = json!({"result": ra, "result_name": cu.code_name(ra)});
    if ra == 0 && rb == 0 {
        let g = cu.measure(&rig, End::Host(an_a.0), End::Host(an_b.0), rounds);
        table += &fig_rows("(d0) registered anonymous mmap", &g, &pinned);
        anon["copies"] = fig_json(&g, &pinned);
    }

    // (e) host memory imported into Vulkan.
    let batch = |label: &str, buffer: vk::Buffer| -> (Value, String) {
        let cmd = vkx.release_batch(buffer);
        let mut idle = Vec::new();
        let mut busy = Vec::new();
        for i in 0..rounds + WARM {
            match vkx.run_batch(cmd) {
                Ok(us) if i >= WARM => idle.push(us),
                Ok(_) => {}
                Err(e) => return (json!({"error": format!("{e:?}")}), String::new()),
            }
        }
        for i in 0..rounds / 4 + 2 {
            // Copies both ways queued first, so the batch meets the copy engines busy.
            for _ in 0..2 {
                cu.copy_in(&rig, End::Host(pin_in), rig.s_in);
                cu.copy_out(&rig, End::Host(pin_out), rig.s_out);
            }
            std::thread::sleep(Duration::from_micros(50));
            let r = vkx.run_batch(cmd);
            cu.raw.sync(rig.s_in).expect("sync");
            cu.raw.sync(rig.s_out).expect("sync");
            match r {
                Ok(us) if i >= 2 => busy.push(us),
                Ok(_) => {}
                Err(e) => return (json!({"error": format!("{e:?}")}), String::new()),
            }
        }
        let (i, b) = (stat(idle), stat(busy));
        let rows = format!(
            "| {label} | release batch, idle (submit to fence) | {:.1} | {:.1} | - |\n| {label} | release batch, copies running | {:.1} | {:.1} | - |\n",
            i.median, i.p90, b.median, b.p90
        );
        (
            json!({"idle": {"median_us": i.median, "p90_us": i.p90}, "busy": {"median_us": b.median, "p90_us": b.p90}}),
            rows,
        )
    };
    let mut e = json!({});
    if let Some(buf) = reference_buffer {
        let (v, rows) = batch("(b) host-cached exported", buf);
        e["reference_batch_host_cached_exported"] = v;
        table += &rows;
    }
    if let Some((_, align)) = &vkx.host_ext {
        let align = *align;
        e["min_imported_host_pointer_alignment"] = json!(align);
        let len = round_up(FRAME as u64, align.max(4096));
        // Pinned memory imported into Vulkan.
        let ph_a = cu.pinned(len as usize, PORTABLE | DEVICEMAP);
        let ph_b = cu.pinned(len as usize, PORTABLE | DEVICEMAP);
        let (ja, ba) = vkx.import_host(ph_a, len);
        let (_jb, bb) = vkx.import_host(ph_b, len);
        e["pinned_import"] = ja;
        if let (Some(ba), Some(_bb)) = (&ba, &bb) {
            let (v, rows) = batch("(e) pinned imported into Vulkan", ba.buffer);
            e["pinned_import"]["batch"] = v;
            table += &rows;
            let g = cu.measure(&rig, End::Host(ph_a), End::Host(ph_b), rounds);
            table += &fig_rows("(e) pinned, imported into Vulkan", &g, &pinned);
            e["pinned_import"]["copies"] = fig_json(&g, &pinned);
        }
        println!("(e) pinned import: {}", e["pinned_import"]);
        // Anonymous memory imported into Vulkan (registered with CUDA above).
        let (ja, ba) = vkx.import_host(an_a.0, host_len as u64);
        e["anon_import"] = ja;
        if let Some(ba) = &ba {
            let (v, rows) = batch("(e) anonymous mmap imported into Vulkan", ba.buffer);
            e["anon_import"]["batch"] = v;
            table += &rows;
            if ra == 0 && rb == 0 {
                let g = cu.measure(&rig, End::Host(an_a.0), End::Host(an_b.0), rounds);
                table += &fig_rows(
                    "(e) registered anonymous, imported into Vulkan",
                    &g,
                    &pinned,
                );
                e["anon_import"]["copies"] = fig_json(&g, &pinned);
            }
        }
        println!("(e) anonymous import: {}", e["anon_import"]);
        // `ba` / `bb` are never freed either (no Drop): they live until the process ends.
        // The pinned host memory stays allocated until the process ends (Vulkan imports it).
    } else {
        e["supported"] = json!(false);
        println!("(e) VK_EXT_external_memory_host: not offered by the device");
    }
    std::mem::forget((an_a, an_b)); // registered / imported: live until the process ends
    report["d0_registered_anonymous"] = anon;
    report["e_external_memory_host"] = e;
    report["vulkan_queue_family"] = json!(vkx.family);
    report["vulkan_memory_types"] = json!((0..vkx.props.memory_type_count)
        .map(|i| format!(
            "{i}: {:?} heap {}",
            vkx.type_flags(i),
            vkx.props.memory_types[i as usize].heap_index
        ))
        .collect::<Vec<_>>());
    println!("\n{table}");
    let p = pinned.both_max.median;
    println!(
        "pinned both-at-once bound: {:.0} frames/s (max of the two copies' medians {p:.1} us)",
        if p > 0.0 { 1e6 / p } else { 0.0 }
    );
    report["table_markdown"] = json!(table);
    if let Some(path) = json_path {
        std::fs::write(&path, serde_json::to_string_pretty(&report).expect("json"))
            .expect("write the JSON file");
        println!("JSON written to {path}");
    }
}
