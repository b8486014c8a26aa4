//! [`Module`] (PTX loaded into a context), [`Function`] (one of its
//! kernels) and [`Launch`] (the launch builder).
//!
//! ```
//! use std::time::Duration;
//! use tegra_interop_driver::{
//!     Context, DeviceBuffer, Event, EventFlags, Module, Nvrtc, Stream,
//! };
//! use tegra_interop_sim::{kernels::KernelSpec, Sim};
//!
//! let sim = Sim::new()?;
//! // The Rust twin of the CUDA kernel below, for the simulator: run once
//! // per block of the launch, it touches the bytes that block's threads
//! // (`i = blockIdx.x * blockDim.x + threadIdx.x`, `i < len`) touch.
//! sim.register_block_kernel(KernelSpec::new("add_one", &[8, 8]), |b| {
//!     let (buf, len) = (b.arg_u64(0)?, b.arg_u64(1)?);
//!     for r in b.indices_x(len) {
//!         let mut bytes = vec![0u8; (r.end - r.start) as usize];
//!         b.read(buf + r.start, &mut bytes)?;
//!         bytes.iter_mut().for_each(|v| *v = v.wrapping_add(1));
//!         b.write(buf + r.start, &bytes)?;
//!     }
//!     Ok(())
//! });
//! let backend = sim.backend(); // or Backend::real()?
//! let ctx = Context::new(backend.clone(), 0)?;
//! let stream = Stream::new(&ctx)?;
//! let source = r#"
//! extern "C" __global__ void add_one(unsigned char *buf, unsigned long long len) {
//!     unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
//!     if (i < len) buf[i] += 1;
//! }"#;
//! let ptx = Nvrtc::new(&backend)?.compile(source, "add_one.cu", &[])?;
//! let module = Module::load(&ctx, &ptx)?;
//! let add_one = module.function("add_one")?;
//!
//! let buf = DeviceBuffer::new(&ctx, 1000)?;
//! buf.copy_from_host(0, &[41u8; 1000])?;
//! let done = Event::new(&ctx, EventFlags::NO_TIMING)?;
//! // SAFETY: the kernel takes (pointer, u64) and writes only `len` bytes of
//! // `buf`, which outlives it (we wait for `done` below).
//! unsafe { add_one.launch(4u32, 256u32).arg(&buf).arg(1000u64).launch(&stream) }?;
//! done.record(&stream)?;
//! done.synchronize(Duration::from_secs(10))?;
//! let mut out = [0u8; 1000];
//! buf.copy_to_host(0, &mut out)?;
//! assert!(out.iter().all(|b| *b == 42));
//!
//! // A grid too small for the buffer (2 blocks, 512 threads) leaves the
//! // rest untouched, on the simulator as on a GPU.
//! // SAFETY: as above; the stream is synchronised before `buf` is read.
//! unsafe { add_one.launch(2u32, 256u32).arg(&buf).arg(1000u64).launch(&stream) }?;
//! stream.synchronize()?;
//! buf.copy_to_host(0, &mut out)?;
//! assert!(out[..512].iter().all(|b| *b == 43) && out[512..].iter().all(|b| *b == 42));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![allow(unsafe_code)] // calls of pointer-taking entry points, each with its `// SAFETY:` line

use std::ffi::{c_void, CString};
use std::marker::PhantomData;
use std::ptr;
use std::sync::Arc;

use tegra_interop_core::CuResult;
use tegra_interop_sys::cuda::{CUdeviceptr, CUfunction, CUmodule};

use crate::buffer::DeviceMemory;
use crate::ffi::{call, code, Bind, Current, TryBind};
use crate::owner::{Owned, Release};
use crate::{Backend, Context, Error, Ptx, Stream};

/// PTX (or the simulator's module image) loaded into a context
/// (`cuModuleLoadData`), unloaded (`cuModuleUnload`) when the module and
/// every [`Function`] taken from it are gone. Holds its context.
///
/// `Send + Sync`: a context clone and a C handle the driver lets any thread
/// use; cloning shares the one loaded module.
#[derive(Clone)]
pub struct Module {
    inner: Arc<Owned<ModuleRes>>,
}

struct ModuleRes {
    ctx: Context,
    raw: CUmodule,
}

// SAFETY: a C handle (a plain pointer to the driver's object) and a context
// clone; the CUDA driver API lets any thread use a module.
unsafe impl Send for ModuleRes {}
// SAFETY: `&ModuleRes` only allows calls the driver serialises.
unsafe impl Sync for ModuleRes {}

impl Release for ModuleRes {
    fn release(&mut self) -> Result<(), Error> {
        // Loaded by us, unloaded once, after the last function went (they
        // hold the `Arc`).
        call::cuModuleUnload(TryBind(&self.ctx), self.raw)
    }
    fn backend(&self) -> &Backend {
        self.ctx.backend()
    }
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("context", &self.inner.ctx.id())
            .field("raw", &self.inner.raw)
            .finish()
    }
}

impl Module {
    /// Loads `ptx` into `ctx` (`cuModuleLoadData`; the driver JIT-compiles
    /// PTX for the device).
    pub fn load(ctx: &Context, ptx: &Ptx) -> Result<Module, Error> {
        let mut raw: CUmodule = ptr::null_mut();
        // SAFETY: `raw` is a local the driver writes one module to; the
        // image is a NUL-terminated string alive for the call.
        unsafe { call::cuModuleLoadData(Bind(ctx), &mut raw, ptx.as_c_str().as_ptr().cast()) }?;
        Ok(Module {
            inner: Arc::new(Owned::new(ModuleRes {
                ctx: ctx.clone(),
                raw,
            })),
        })
    }

    /// The context it is loaded in.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The kernel `name` (`cuModuleGetFunction`; an `extern "C"` name).
    /// Where the driver has `cuFuncGetParamInfo` (CUDA 12.4+, and the
    /// simulator), the kernel's parameter sizes are read once here, and
    /// every launch is checked against them before the call.
    ///
    /// # Errors
    /// [`Error::Driver`] (`NOT_FOUND` for a name the module lacks); a name
    /// holding a NUL byte is refused before the call ([`Error::BadLaunch`]).
    pub fn function(&self, name: &str) -> Result<Function, Error> {
        let c_name = CString::new(name).map_err(|_| Error::BadLaunch {
            kernel: name.replace('\0', "\\0"),
            reason: "the kernel name contains a NUL byte".to_string(),
        })?;
        let ctx = &self.inner.ctx;
        let mut raw: CUfunction = ptr::null_mut();
        // SAFETY: `raw` is a local the driver writes one function to; the
        // name is NUL-terminated and alive for the call; the module is live.
        unsafe { call::cuModuleGetFunction(Bind(ctx), &mut raw, self.inner.raw, c_name.as_ptr()) }?;
        let params = param_sizes(ctx, raw)?;
        Ok(Function {
            module: self.clone(),
            raw,
            name: name.to_string(),
            params,
        })
    }

    /// Unloads now (`cuModuleUnload`) and reports the driver's answer.
    ///
    /// # Errors
    /// [`Error::InUse`] while a [`Function`] or a clone of this module is
    /// alive (nothing is unloaded then).
    pub fn destroy(self) -> Result<(), Error> {
        match Arc::try_unwrap(self.inner) {
            Ok(owned) => owned.destroy(),
            Err(inner) => Err(Error::InUse {
                operation: "Module::destroy",
                ctx: inner.ctx.id(),
                holders: Arc::strong_count(&inner) - 1,
            }),
        }
    }
}

/// The kernel's parameter sizes from `cuFuncGetParamInfo` (index by index
/// until the driver answers `INVALID_VALUE`), or `None` where the table
/// lacks the entry point or the driver answers `NOT_SUPPORTED` (launches
/// are then not checked against the parameters).
fn param_sizes(ctx: &Context, f: CUfunction) -> Result<Option<Vec<usize>>, Error> {
    if ctx.api().cuFuncGetParamInfo.is_none() {
        return Ok(None);
    }
    let mut sizes = Vec::new();
    // A kernel has at most a few thousand bytes of parameters (4 KiB before
    // CUDA 12.1, 32 KiB after): the bound keeps a misbehaving table from
    // looping for ever.
    for index in 0..32_768usize {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: two locals the driver writes one size each to; `f` is a
        // live function of a live module.
        let r = unsafe { code::cuFuncGetParamInfo(Bind(ctx), f, index, &mut offset, &mut size) }?;
        match CuResult::from(r) {
            CuResult::SUCCESS => sizes.push(size),
            CuResult::INVALID_VALUE => return Ok(Some(sizes)),
            CuResult::NOT_SUPPORTED => return Ok(None),
            code => {
                return Err(Error::Driver {
                    call: "cuFuncGetParamInfo",
                    code,
                })
            }
        }
    }
    Ok(Some(sizes))
}

/// One kernel of a [`Module`] (holds the module, so it stays loaded).
///
/// `Send + Sync`: a module clone and a C handle the driver lets any thread
/// use.
pub struct Function {
    module: Module,
    raw: CUfunction,
    name: String,
    params: Option<Vec<usize>>,
}

// SAFETY: a C handle of a loaded module (kept loaded by `module`); the
// driver lets any thread launch a function.
unsafe impl Send for Function {}
// SAFETY: `&Function` only allows launches, which the driver serialises.
unsafe impl Sync for Function {}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Function")
            .field("name", &self.name)
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

/// Grid or block dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dim3 {
    /// x
    pub x: u32,
    /// y
    pub y: u32,
    /// z
    pub z: u32,
}

impl From<u32> for Dim3 {
    fn from(x: u32) -> Dim3 {
        Dim3 { x, y: 1, z: 1 }
    }
}

impl From<(u32, u32)> for Dim3 {
    fn from((x, y): (u32, u32)) -> Dim3 {
        Dim3 { x, y, z: 1 }
    }
}

impl From<(u32, u32, u32)> for Dim3 {
    fn from((x, y, z): (u32, u32, u32)) -> Dim3 {
        Dim3 { x, y, z }
    }
}

/// The launch limits every current CUDA device has (compute capability
/// 5.0 and later; the CUDA programming guide's table of technical
/// specifications): checked before the call.
pub mod limits {
    /// Threads per block.
    pub const MAX_THREADS_PER_BLOCK: u64 = 1024;
    /// Block x and y.
    pub const MAX_BLOCK_XY: u32 = 1024;
    /// Block z.
    pub const MAX_BLOCK_Z: u32 = 64;
    /// Grid x (2^31 - 1).
    pub const MAX_GRID_X: u32 = 0x7fff_ffff;
    /// Grid y and z.
    pub const MAX_GRID_YZ: u32 = 65_535;
    /// Dynamic shared memory without an opt-in attribute (48 KiB).
    pub const MAX_DYNAMIC_SHARED: u32 = 48 * 1024;
}

fn check_dims(grid: Dim3, block: Dim3, shared: u32) -> Result<(), String> {
    use limits::*;
    if [grid.x, grid.y, grid.z, block.x, block.y, block.z].contains(&0) {
        return Err(format!(
            "grid {grid:?} and block {block:?} must be at least 1 in every dimension"
        ));
    }
    if grid.x > MAX_GRID_X || grid.y > MAX_GRID_YZ || grid.z > MAX_GRID_YZ {
        return Err(format!(
            "grid {grid:?} exceeds ({MAX_GRID_X}, {MAX_GRID_YZ}, {MAX_GRID_YZ})"
        ));
    }
    if block.x > MAX_BLOCK_XY || block.y > MAX_BLOCK_XY || block.z > MAX_BLOCK_Z {
        return Err(format!(
            "block {block:?} exceeds ({MAX_BLOCK_XY}, {MAX_BLOCK_XY}, {MAX_BLOCK_Z})"
        ));
    }
    let threads = u64::from(block.x) * u64::from(block.y) * u64::from(block.z);
    if threads > MAX_THREADS_PER_BLOCK {
        return Err(format!(
            "block {block:?} has {threads} threads, more than {MAX_THREADS_PER_BLOCK}"
        ));
    }
    if shared > MAX_DYNAMIC_SHARED {
        return Err(format!(
            "{shared} bytes of dynamic shared memory exceed {MAX_DYNAMIC_SHARED}"
        ));
    }
    Ok(())
}

impl Function {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The module it belongs to.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// The sizes of the kernel's parameters, where the driver reports them
    /// (`cuFuncGetParamInfo`).
    pub fn param_sizes(&self) -> Option<&[usize]> {
        self.params.as_deref()
    }

    /// Starts a launch of `grid` blocks of `block` threads; add the
    /// arguments in the kernel's parameter order, then
    /// [`Launch::launch`].
    pub fn launch(&self, grid: impl Into<Dim3>, block: impl Into<Dim3>) -> Launch<'_> {
        Launch {
            function: self,
            grid: grid.into(),
            block: block.into(),
            shared: 0,
            args: Vec::new(),
            _borrows: PhantomData,
        }
    }
}

/// One kernel argument's bytes, 8-aligned storage.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct ArgSlot([u8; 8]);

/// A value that can be passed to a kernel parameter by value: its bytes in
/// the device's (= the host's) byte order. Sealed: integers, floats and
/// device addresses of this crate's buffers.
pub trait KernelArg: sealed::Sealed {
    /// The bytes (at most 8) the parameter receives.
    #[doc(hidden)]
    fn arg_bytes(&self) -> ([u8; 8], usize);
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! scalar_arg {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl KernelArg for $t {
            fn arg_bytes(&self) -> ([u8; 8], usize) {
                let mut out = [0u8; 8];
                let b = self.to_ne_bytes();
                out[..b.len()].copy_from_slice(&b);
                (out, b.len())
            }
        }
    )*};
}
scalar_arg!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

/// A device address passed as a pointer parameter: made from one of this
/// crate's buffers ([`DevicePtr::of`], [`DevicePtr::at`]) or, `unsafe`,
/// from a raw address. Borrows the buffer, so it cannot outlive it while
/// the launch is being built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevicePtr<'a> {
    addr: CUdeviceptr,
    _buffer: PhantomData<&'a ()>,
}

impl<'a> DevicePtr<'a> {
    /// The first byte of `memory`.
    pub fn of(memory: &'a (impl DeviceMemory + ?Sized)) -> DevicePtr<'a> {
        DevicePtr {
            addr: memory.device_ptr(),
            _buffer: PhantomData,
        }
    }

    /// `memory` at byte `offset`, which must leave `len` bytes before the
    /// end (e.g. one slot's counter).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`].
    pub fn at(
        memory: &'a (impl DeviceMemory + ?Sized),
        offset: u64,
        len: u64,
    ) -> Result<DevicePtr<'a>, Error> {
        Ok(DevicePtr {
            addr: memory.device_range(offset, len)?,
            _buffer: PhantomData,
        })
    }

    /// A raw device address (for memory this crate does not own, such as
    /// an EGL frame's planes).
    ///
    /// # Safety
    /// The address must stay valid for whatever the kernel it is passed to
    /// does with it, until that kernel completed.
    pub unsafe fn from_raw(addr: CUdeviceptr) -> DevicePtr<'static> {
        DevicePtr {
            addr,
            _buffer: PhantomData,
        }
    }

    /// The address.
    pub fn addr(&self) -> CUdeviceptr {
        self.addr
    }
}

impl sealed::Sealed for DevicePtr<'_> {}
impl KernelArg for DevicePtr<'_> {
    fn arg_bytes(&self) -> ([u8; 8], usize) {
        self.addr.arg_bytes()
    }
}

impl<T: DeviceMemory> sealed::Sealed for &T {}
impl<T: DeviceMemory> KernelArg for &T {
    fn arg_bytes(&self) -> ([u8; 8], usize) {
        self.device_ptr().arg_bytes()
    }
}

/// A kernel launch being built: arguments are copied into the builder's
/// own storage, which lives until [`Launch::launch`] returns (the driver
/// copies them during the call). Buffers passed by reference stay borrowed
/// until then.
#[must_use = "a launch does nothing until `launch` is called"]
pub struct Launch<'a> {
    function: &'a Function,
    grid: Dim3,
    block: Dim3,
    shared: u32,
    args: Vec<(ArgSlot, usize)>,
    _borrows: PhantomData<&'a ()>,
}

impl std::fmt::Debug for Launch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch")
            .field("kernel", &self.function.name)
            .field("grid", &self.grid)
            .field("block", &self.block)
            .field("shared", &self.shared)
            .field("args", &self.args.len())
            .finish()
    }
}

impl<'a> Launch<'a> {
    /// Bytes of dynamic shared memory per block (default 0).
    pub fn shared_mem(mut self, bytes: u32) -> Self {
        self.shared = bytes;
        self
    }

    /// Appends the next argument, by value.
    pub fn arg(mut self, value: impl KernelArg + 'a) -> Self {
        let (bytes, len) = value.arg_bytes();
        self.args.push((ArgSlot(bytes), len));
        self
    }

    /// Launches on `stream` (`cuLaunchKernel`); returns once queued.
    ///
    /// Checked before the call: the launch dimensions against
    /// [`limits`], and, where the function knows its parameter sizes, the
    /// argument count and each argument's size.
    ///
    /// # Safety
    /// The kernel runs arbitrary device code on the arguments: they must be
    /// what its C parameters expect; every address it is given must stay
    /// valid for what it does with it until it completed; and until then
    /// nothing reads or writes (host views of pinned memory included) the
    /// bytes it writes, nor writes the bytes it reads (see
    /// [`crate::buffer`]).
    ///
    /// # Errors
    /// [`Error::BadLaunch`] before the call; [`Error::Unsupported`] for a
    /// stream of another context; [`Error::Driver`].
    pub unsafe fn launch(mut self, stream: &Stream) -> Result<(), Error> {
        let f = self.function;
        let bad = |reason: String| Error::BadLaunch {
            kernel: f.name.clone(),
            reason,
        };
        check_dims(self.grid, self.block, self.shared).map_err(bad)?;
        if let Some(sizes) = &f.params {
            if sizes.len() != self.args.len() {
                return Err(bad(format!(
                    "{} argument(s) given, the kernel has {} parameter(s)",
                    self.args.len(),
                    sizes.len()
                )));
            }
            for (i, ((_, given), want)) in self.args.iter().zip(sizes).enumerate() {
                if given != want {
                    return Err(bad(format!(
                        "argument {i} has {given} byte(s), the parameter {want}"
                    )));
                }
            }
        }
        if !stream.context().same(f.module.context()) {
            return Err(Error::Unsupported {
                operation: "Launch::launch",
                reason: "the stream belongs to another context than the kernel's module",
            });
        }
        // The argument bytes stay where the builder put them (`self.args`,
        // owned by this call); `params` points into them.
        let mut params: Vec<*mut c_void> = self
            .args
            .iter_mut()
            .map(|(s, _)| s.0.as_mut_ptr().cast::<c_void>())
            .collect();
        let (g, b) = (self.grid, self.block);
        // SAFETY: `params` holds one pointer per argument, each to 8-aligned
        // storage holding the argument's bytes (`self.args`), alive until the
        // call returns (the driver copies them during the call); `extra` is
        // NULL. What the kernel then does is the caller's promise (above).
        unsafe {
            call::cuLaunchKernel(
                Current(stream.context()),
                f.raw,
                g.x,
                g.y,
                g.z,
                b.x,
                b.y,
                b.z,
                self.shared,
                stream.as_raw(),
                params.as_mut_ptr(),
                ptr::null_mut(),
            )
        }
    }
}
