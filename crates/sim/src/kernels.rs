//! Kernels the simulator can run: each is a Rust function (a "twin")
//! registered under the name of the CUDA kernel it stands in for, with the
//! C parameter list (the size of each parameter) that kernel has.
//!
//! The simulator refuses what it cannot check. Its NVRTC "compiles" a
//! source only when every `extern "C" __global__` function the source
//! declares is registered with that exact name and parameter list
//! (anything else fails like a compile error, with a log naming the
//! kernel); `cuModuleLoadData` accepts the image that produced, or real
//! PTX, only when each `.entry` is registered (with matching parameter
//! sizes); `cuLaunchKernel` checks the launch dimensions and then runs the
//! Rust function in stream order, over the simulator's memory (device
//! allocations, mapped imports, device-mapped pinned host memory).
//!
//! # Twins see the launch geometry
//!
//! A GPU runs the kernel once per thread of the grid it is launched with,
//! and a thread outside the buffer (or a buffer byte outside the grid) is
//! the kernel's own business. A twin must touch exactly what the GPU
//! would, so that a grid too small for its buffer fails on the simulator
//! as it fails on a GPU. Register it in one of the forms that give it the
//! geometry, written like the CUDA code:
//!
//! - [`Sim::register_block_kernel`](crate::Sim::register_block_kernel): the
//!   body runs once per block of the grid and sees `blockIdx`, `blockDim`,
//!   `gridDim` ([`Block`]); it reads and writes the memory its threads
//!   touch in bulk, so frame-sized work stays fast (a kernel handling 16
//!   bytes per thread covers a 1920x1080 RGBA frame in 2,025 blocks of
//!   256 threads: 2,025 calls). [`Block::indices_x`] and
//!   [`Block::grid_stride_x`] give the index ranges that the usual
//!   `i = blockIdx.x * blockDim.x + threadIdx.x` code visits.
//! - [`Sim::register_thread_kernel`](crate::Sim::register_thread_kernel):
//!   the body runs once per thread and sees `threadIdx` too ([`Thread`]);
//!   the closest to the CUDA code, for small buffers (each access is a
//!   lookup of its allocation).
//!
//! Blocks (and, in the thread form, the threads of a block) run one after
//! another, last to first: the order on a GPU is unspecified, so a twin
//! must not depend on it, and running them backwards keeps one that does
//! from passing by luck. Races between blocks are not detected.
//!
//! The launch-level form, [`Sim::register_kernel`](crate::Sim::register_kernel),
//! runs its body once per launch with the whole grid in [`KernelLaunch`]: it
//! is only as strict as the body, which must itself honour
//! [`KernelLaunch::grid`] and [`KernelLaunch::block`] (touch nothing a
//! thread of that grid would not). Prefer the two forms above.
//!
//! ```
//! use tegra_interop_sim::kernels::KernelSpec;
//! use tegra_interop_sim::Sim;
//!
//! let sim = Sim::new()?;
//! // Stands in for:
//! // extern "C" __global__ void add_one(unsigned char *buf, unsigned long long len) {
//! //     unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
//! //     if (i < len) buf[i] += 1;
//! // }
//! sim.register_block_kernel(KernelSpec::new("add_one", &[8, 8]), |b| {
//!     let (buf, len) = (b.arg_u64(0)?, b.arg_u64(1)?);
//!     // The indices this block's threads compute that pass `i < len`.
//!     for range in b.indices_x(len) {
//!         let mut bytes = vec![0u8; (range.end - range.start) as usize];
//!         b.read(buf + range.start, &mut bytes)?;
//!         for v in &mut bytes {
//!             *v = v.wrapping_add(1);
//!         }
//!         b.write(buf + range.start, &bytes)?;
//!     }
//!     Ok(())
//! });
//! // The same kernel, one call per thread:
//! sim.register_thread_kernel(KernelSpec::new("add_one", &[8, 8]), |t| {
//!     let (buf, len) = (t.arg_u64(0)?, t.arg_u64(1)?);
//!     let i = t.global_x();
//!     if i < len {
//!         let v = t.read_u8(buf + i)?;
//!         t.write_u8(buf + i, v.wrapping_add(1))?;
//!     }
//!     Ok(())
//! });
//! # Ok::<(), tegra_interop_sim::SimError>(())
//! ```

#![deny(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::instance::State;

/// A kernel's name and C parameter list (the size in bytes of each
/// parameter, in order: 8 for a pointer or a 64-bit integer, 4 for `int`,
/// `unsigned int`, `float`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelSpec {
    name: String,
    params: Vec<usize>,
}

impl KernelSpec {
    /// A kernel named `name` (its `extern "C"` name) with parameters of
    /// `param_sizes` bytes.
    pub fn new(name: &str, param_sizes: &[usize]) -> KernelSpec {
        KernelSpec {
            name: name.to_string(),
            params: param_sizes.to_vec(),
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The parameter sizes.
    pub fn param_sizes(&self) -> &[usize] {
        &self.params
    }
}

/// Why a simulated kernel stopped: what the real GPU would report as an
/// illegal address or a trap. The simulator records it as a diagnostic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFault(String);

impl KernelFault {
    /// A fault with a message.
    pub fn new(message: impl Into<String>) -> KernelFault {
        KernelFault(message.into())
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KernelFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KernelFault {}

/// The Rust body of a simulated kernel in the launch-level form
/// ([`Sim::register_kernel`](crate::Sim::register_kernel)): called once
/// per launch.
pub type KernelFn = dyn Fn(&mut KernelLaunch<'_>) -> Result<(), KernelFault> + Send + Sync;

/// The Rust body of a simulated kernel in the per-block form
/// ([`Sim::register_block_kernel`](crate::Sim::register_block_kernel)):
/// called once per block of the grid.
pub type BlockFn = dyn Fn(&Block<'_>) -> Result<(), KernelFault> + Send + Sync;

/// The Rust body of a simulated kernel in the per-thread form
/// ([`Sim::register_thread_kernel`](crate::Sim::register_thread_kernel)):
/// called once per thread of the grid.
pub type ThreadFn = dyn Fn(&Thread<'_>) -> Result<(), KernelFault> + Send + Sync;

/// The most blocks one launch of a per-block twin may have: the simulator
/// refuses a larger grid at `cuLaunchKernel` (INVALID_VALUE and an
/// `Unimplemented` diagnostic) rather than run for minutes.
pub const MAX_SIMULATED_BLOCKS: u64 = 1 << 24;

/// The most threads one launch of a per-thread twin may have (refused
/// like [`MAX_SIMULATED_BLOCKS`]).
pub const MAX_SIMULATED_THREADS: u64 = 1 << 26;

/// How a registered twin is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    /// Once per launch.
    Launch,
    /// Once per block.
    Block,
    /// Once per thread.
    Thread,
}

impl Form {
    /// Why the simulator will not run a launch of `grid` x `block` in this
    /// form (too many calls), or `None`.
    pub(crate) fn refusal(self, grid: [u32; 3], block: [u32; 3]) -> Option<String> {
        let blocks = Dim3::from(grid).count();
        let threads = blocks.saturating_mul(Dim3::from(block).count());
        match self {
            Form::Launch => None,
            Form::Block => (blocks > MAX_SIMULATED_BLOCKS).then(|| {
                format!(
                    "a grid of {blocks} blocks; the simulator runs per-block twins for at most \
                     {MAX_SIMULATED_BLOCKS} blocks per launch"
                )
            }),
            Form::Thread => (threads > MAX_SIMULATED_THREADS).then(|| {
                format!(
                    "{threads} threads; the simulator runs per-thread twins for at most \
                     {MAX_SIMULATED_THREADS} threads per launch"
                )
            }),
        }
    }
}

/// A registered kernel.
#[derive(Clone)]
pub(crate) struct Registered {
    pub(crate) params: Vec<usize>,
    pub(crate) body: Arc<KernelFn>,
    pub(crate) form: Form,
}

impl Registered {
    /// A launch-level twin.
    pub(crate) fn per_launch(params: Vec<usize>, body: Arc<KernelFn>) -> Registered {
        Registered {
            params,
            body,
            form: Form::Launch,
        }
    }

    /// A per-block twin: the launch runs `body` for every block, last to
    /// first, and stops at the first fault.
    pub(crate) fn per_block(params: Vec<usize>, body: Arc<BlockFn>) -> Registered {
        let run = move |k: &mut KernelLaunch<'_>| -> Result<(), KernelFault> {
            let k: &KernelLaunch<'_> = k;
            let grid = Dim3::from(k.grid);
            for linear in (0..grid.count()).rev() {
                body(&Block {
                    launch: k,
                    idx: grid.index_of(linear),
                })?;
            }
            Ok(())
        };
        Registered {
            params,
            body: Arc::new(run),
            form: Form::Block,
        }
    }

    /// A per-thread twin: the launch runs `body` for every thread of every
    /// block, last to first, and stops at the first fault.
    pub(crate) fn per_thread(params: Vec<usize>, body: Arc<ThreadFn>) -> Registered {
        let run = move |k: &mut KernelLaunch<'_>| -> Result<(), KernelFault> {
            let k: &KernelLaunch<'_> = k;
            let (grid, block) = (Dim3::from(k.grid), Dim3::from(k.block));
            for b in (0..grid.count()).rev() {
                let block_idx = grid.index_of(b);
                for t in (0..block.count()).rev() {
                    body(&Thread {
                        launch: k,
                        block_idx,
                        thread_idx: block.index_of(t),
                    })?;
                }
            }
            Ok(())
        };
        Registered {
            params,
            body: Arc::new(run),
            form: Form::Thread,
        }
    }
}

/// The registry of one simulator.
#[derive(Default)]
pub(crate) struct Registry {
    pub(crate) kernels: HashMap<String, Registered>,
}

/// A launch dimension or index: CUDA's `dim3` / `uint3` (`gridDim`,
/// `blockDim`, `blockIdx`, `threadIdx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Dim3 {
    /// The x component (the fastest-varying one).
    pub x: u32,
    /// The y component.
    pub y: u32,
    /// The z component.
    pub z: u32,
}

impl Dim3 {
    /// `(x, y, z)`.
    pub const fn new(x: u32, y: u32, z: u32) -> Dim3 {
        Dim3 { x, y, z }
    }

    /// `x * y * z`: the number of blocks of a grid or threads of a block.
    pub fn count(self) -> u64 {
        u64::from(self.x) * u64::from(self.y) * u64::from(self.z)
    }

    /// The index whose linear number (x fastest, then y, then z) is
    /// `linear` inside these dimensions.
    fn index_of(self, linear: u64) -> Dim3 {
        let (x, y) = (u64::from(self.x.max(1)), u64::from(self.y.max(1)));
        // Each part is below its u32 dimension, so the casts are exact.
        Dim3 {
            x: (linear % x) as u32,
            y: (linear / x % y) as u32,
            z: (linear / x / y) as u32,
        }
    }
}

impl From<[u32; 3]> for Dim3 {
    fn from(d: [u32; 3]) -> Dim3 {
        Dim3::new(d[0], d[1], d[2])
    }
}

impl fmt::Display for Dim3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {}, {})", self.x, self.y, self.z)
    }
}

/// One launch of a simulated kernel, as its Rust body sees it: the launch
/// dimensions, the argument bytes, and bounds-checked access to the
/// simulator's memory by device address.
pub struct KernelLaunch<'a> {
    pub(crate) name: &'a str,
    pub(crate) grid: [u32; 3],
    pub(crate) block: [u32; 3],
    pub(crate) shared: u32,
    pub(crate) args: &'a [Vec<u8>],
    pub(crate) state: &'a State,
}

impl fmt::Debug for KernelLaunch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelLaunch")
            .field("name", &self.name)
            .field("grid", &self.grid)
            .field("block", &self.block)
            .field("args", &self.args.len())
            .finish()
    }
}

impl KernelLaunch<'_> {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        self.name
    }

    /// Grid dimensions (blocks).
    pub fn grid(&self) -> [u32; 3] {
        self.grid
    }

    /// Block dimensions (threads).
    pub fn block(&self) -> [u32; 3] {
        self.block
    }

    /// Dynamic shared memory per block, in bytes.
    pub fn shared_mem(&self) -> u32 {
        self.shared
    }

    /// The total number of threads of the launch.
    pub fn threads(&self) -> u64 {
        self.grid
            .iter()
            .chain(&self.block)
            .map(|d| u64::from(*d))
            .product()
    }

    /// The bytes of argument `i`.
    pub fn arg_bytes(&self, i: usize) -> Result<&[u8], KernelFault> {
        self.args.get(i).map(Vec::as_slice).ok_or_else(|| {
            KernelFault::new(format!(
                "kernel `{}` has {} parameter(s); argument {i} asked for",
                self.name,
                self.args.len()
            ))
        })
    }

    fn arg_n<const N: usize>(&self, i: usize) -> Result<[u8; N], KernelFault> {
        let b = self.arg_bytes(i)?;
        <[u8; N]>::try_from(b).map_err(|_| {
            KernelFault::new(format!(
                "argument {i} of kernel `{}` has {} byte(s), read as {N}",
                self.name,
                b.len()
            ))
        })
    }

    /// Argument `i` as a 64-bit integer or device pointer (8 bytes).
    pub fn arg_u64(&self, i: usize) -> Result<u64, KernelFault> {
        self.arg_n::<8>(i).map(u64::from_ne_bytes)
    }

    /// Argument `i` as a 32-bit unsigned integer (4 bytes).
    pub fn arg_u32(&self, i: usize) -> Result<u32, KernelFault> {
        self.arg_n::<4>(i).map(u32::from_ne_bytes)
    }

    /// Argument `i` as a 32-bit signed integer (4 bytes).
    pub fn arg_i32(&self, i: usize) -> Result<i32, KernelFault> {
        self.arg_n::<4>(i).map(i32::from_ne_bytes)
    }

    /// Argument `i` as a `float` (4 bytes).
    pub fn arg_f32(&self, i: usize) -> Result<f32, KernelFault> {
        self.arg_n::<4>(i).map(f32::from_ne_bytes)
    }

    fn outside(&self, what: &str, n: usize, addr: u64) -> KernelFault {
        KernelFault::new(format!(
            "kernel `{}` {what} {n} byte(s) at {addr:#x}, outside every live device-accessible \
             allocation (an illegal address on the real GPU)",
            self.name
        ))
    }

    /// Reads `out.len()` bytes at device address `addr`.
    ///
    /// # Errors
    /// A fault when the range is not inside one live device-accessible
    /// allocation (device memory, a mapped import, device-mapped pinned
    /// host memory).
    pub fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), KernelFault> {
        if self.state.live_range(addr, out.len(), false) && self.state.device_read(addr, out) {
            Ok(())
        } else {
            Err(self.outside("read", out.len(), addr))
        }
    }

    /// Writes `data` at device address `addr` (bounds as for [`read`](Self::read)).
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), KernelFault> {
        if self.state.live_range(addr, data.len(), false) && self.state.device_write(addr, data) {
            Ok(())
        } else {
            Err(self.outside("wrote", data.len(), addr))
        }
    }

    /// Reads a byte at `addr`.
    pub fn read_u8(&self, addr: u64) -> Result<u8, KernelFault> {
        let mut b = [0u8; 1];
        self.read(addr, &mut b)?;
        Ok(b[0])
    }

    /// Writes a byte at `addr`.
    pub fn write_u8(&self, addr: u64, v: u8) -> Result<(), KernelFault> {
        self.write(addr, &[v])
    }

    /// Reads a `u32` at `addr`.
    pub fn read_u32(&self, addr: u64) -> Result<u32, KernelFault> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_ne_bytes(b))
    }

    /// Writes a `u32` at `addr`.
    pub fn write_u32(&self, addr: u64, v: u32) -> Result<(), KernelFault> {
        self.write(addr, &v.to_ne_bytes())
    }

    /// Reads a `u64` at `addr`.
    pub fn read_u64(&self, addr: u64) -> Result<u64, KernelFault> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// Writes a `u64` at `addr`.
    pub fn write_u64(&self, addr: u64, v: u64) -> Result<(), KernelFault> {
        self.write(addr, &v.to_ne_bytes())
    }

    /// Adds `v` to the `u64` at `addr` (wrapping) and returns the old
    /// value: CUDA's `atomicAdd` on an `unsigned long long` (twins run one
    /// at a time, so a read and a write are atomic here).
    pub fn atomic_add_u64(&self, addr: u64, v: u64) -> Result<u64, KernelFault> {
        let old = self.read_u64(addr)?;
        self.write_u64(addr, old.wrapping_add(v))?;
        Ok(old)
    }
}

/// The launch's arguments and memory, for [`Block`] and [`Thread`]: the
/// same accessors as [`KernelLaunch`] has.
macro_rules! launch_access {
    () => {
        /// The launch this call belongs to (grid, block, arguments, memory).
        pub fn launch(&self) -> &KernelLaunch<'k> {
            self.launch
        }

        /// The kernel's name.
        pub fn name(&self) -> &str {
            self.launch.name
        }

        /// `gridDim`: blocks of the grid.
        pub fn grid_dim(&self) -> Dim3 {
            Dim3::from(self.launch.grid)
        }

        /// `blockDim`: threads of each block.
        pub fn block_dim(&self) -> Dim3 {
            Dim3::from(self.launch.block)
        }

        /// `gridDim.x * blockDim.x`: the step of a grid-stride loop over x.
        pub fn grid_threads_x(&self) -> u64 {
            u64::from(self.launch.grid[0]) * u64::from(self.launch.block[0])
        }

        /// Argument `i`'s bytes ([`KernelLaunch::arg_bytes`]).
        pub fn arg_bytes(&self, i: usize) -> Result<&[u8], KernelFault> {
            self.launch.arg_bytes(i)
        }

        /// Argument `i` as a `u64` or pointer ([`KernelLaunch::arg_u64`]).
        pub fn arg_u64(&self, i: usize) -> Result<u64, KernelFault> {
            self.launch.arg_u64(i)
        }

        /// Argument `i` as a `u32` ([`KernelLaunch::arg_u32`]).
        pub fn arg_u32(&self, i: usize) -> Result<u32, KernelFault> {
            self.launch.arg_u32(i)
        }

        /// Argument `i` as an `i32` ([`KernelLaunch::arg_i32`]).
        pub fn arg_i32(&self, i: usize) -> Result<i32, KernelFault> {
            self.launch.arg_i32(i)
        }

        /// Argument `i` as an `f32` ([`KernelLaunch::arg_f32`]).
        pub fn arg_f32(&self, i: usize) -> Result<f32, KernelFault> {
            self.launch.arg_f32(i)
        }

        /// Reads device memory ([`KernelLaunch::read`]).
        pub fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), KernelFault> {
            self.launch.read(addr, out)
        }

        /// Writes device memory ([`KernelLaunch::write`]).
        pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), KernelFault> {
            self.launch.write(addr, data)
        }

        /// Reads a byte ([`KernelLaunch::read_u8`]).
        pub fn read_u8(&self, addr: u64) -> Result<u8, KernelFault> {
            self.launch.read_u8(addr)
        }

        /// Writes a byte ([`KernelLaunch::write_u8`]).
        pub fn write_u8(&self, addr: u64, v: u8) -> Result<(), KernelFault> {
            self.launch.write_u8(addr, v)
        }

        /// Reads a `u32` ([`KernelLaunch::read_u32`]).
        pub fn read_u32(&self, addr: u64) -> Result<u32, KernelFault> {
            self.launch.read_u32(addr)
        }

        /// Writes a `u32` ([`KernelLaunch::write_u32`]).
        pub fn write_u32(&self, addr: u64, v: u32) -> Result<(), KernelFault> {
            self.launch.write_u32(addr, v)
        }

        /// Reads a `u64` ([`KernelLaunch::read_u64`]).
        pub fn read_u64(&self, addr: u64) -> Result<u64, KernelFault> {
            self.launch.read_u64(addr)
        }

        /// Writes a `u64` ([`KernelLaunch::write_u64`]).
        pub fn write_u64(&self, addr: u64, v: u64) -> Result<(), KernelFault> {
            self.launch.write_u64(addr, v)
        }

        /// `atomicAdd` on a `u64` ([`KernelLaunch::atomic_add_u64`]).
        pub fn atomic_add_u64(&self, addr: u64, v: u64) -> Result<u64, KernelFault> {
            self.launch.atomic_add_u64(addr, v)
        }
    };
}

/// One block of a launch, as a per-block twin sees it: `blockIdx`,
/// `blockDim`, `gridDim`, the arguments and the memory.
pub struct Block<'k> {
    launch: &'k KernelLaunch<'k>,
    idx: Dim3,
}

impl fmt::Debug for Block<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block")
            .field("name", &self.launch.name)
            .field("block_idx", &self.idx)
            .field("grid", &self.launch.grid)
            .field("block", &self.launch.block)
            .finish()
    }
}

impl<'k> Block<'k> {
    launch_access!();

    /// `blockIdx`: this block's index in the grid.
    pub fn block_idx(&self) -> Dim3 {
        self.idx
    }

    /// `blockIdx.x * blockDim.x`: the x index of this block's thread 0 in
    /// the usual `blockIdx.x * blockDim.x + threadIdx.x`.
    pub fn first_x(&self) -> u64 {
        u64::from(self.idx.x) * u64::from(self.launch.block[0])
    }

    /// Every `threadIdx` of the block, x fastest, then y, then z.
    pub fn threads(&self) -> impl Iterator<Item = Dim3> {
        let dim = self.block_dim();
        (0..dim.count()).map(move |t| dim.index_of(t))
    }

    /// The indices `i = blockIdx.x * blockDim.x + threadIdx.x` of this
    /// block's threads that pass `i < n`, as ranges: what code without a
    /// loop (`if (i < n) ...`) touches. Threads that differ only in
    /// `threadIdx.y` / `.z` compute the same `i`, so the range comes once
    /// per such row of threads (`blockDim.y * blockDim.z` times), as that
    /// code would run it on a GPU.
    pub fn indices_x(&self, n: u64) -> IndexRanges {
        IndexRanges::new(self, n, None)
    }

    /// The indices this block's threads visit in a grid-stride loop
    /// `for (i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)`,
    /// as ranges in loop order (once per row of threads, as for
    /// [`indices_x`](Self::indices_x)).
    pub fn grid_stride_x(&self, n: u64) -> IndexRanges {
        IndexRanges::new(self, n, Some(self.grid_threads_x()))
    }
}

/// The ranges of x indices a block's threads visit
/// ([`Block::indices_x`], [`Block::grid_stride_x`]); each range has at most
/// `blockDim.x` indices and ends at `n` at the latest.
#[derive(Debug, Clone)]
pub struct IndexRanges {
    first: u64,
    width: u64,
    step: Option<u64>,
    n: u64,
    rows: u64,
    next: Option<u64>,
}

impl IndexRanges {
    fn new(b: &Block<'_>, n: u64, step: Option<u64>) -> IndexRanges {
        let dim = b.block_dim();
        IndexRanges::of(b.first_x(), dim, n, step)
    }

    /// The ranges from `first` (`blockIdx.x * blockDim.x`) for a block of
    /// `dim` threads, below `n`, with a grid-stride `step` or none.
    fn of(first: u64, dim: Dim3, n: u64, step: Option<u64>) -> IndexRanges {
        IndexRanges {
            first,
            width: u64::from(dim.x),
            step,
            n,
            rows: u64::from(dim.y) * u64::from(dim.z),
            next: Some(first),
        }
    }
}

impl Iterator for IndexRanges {
    type Item = std::ops::Range<u64>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.rows > 0 {
            match self.next {
                Some(start) if start < self.n && self.width > 0 => {
                    let end = start.saturating_add(self.width).min(self.n);
                    self.next = self.step.and_then(|s| start.checked_add(s));
                    return Some(start..end);
                }
                _ => {
                    self.rows -= 1;
                    self.next = Some(self.first);
                }
            }
        }
        None
    }
}

/// One thread of a launch, as a per-thread twin sees it: `threadIdx`,
/// `blockIdx`, `blockDim`, `gridDim`, the arguments and the memory.
pub struct Thread<'k> {
    launch: &'k KernelLaunch<'k>,
    block_idx: Dim3,
    thread_idx: Dim3,
}

impl fmt::Debug for Thread<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Thread")
            .field("name", &self.launch.name)
            .field("block_idx", &self.block_idx)
            .field("thread_idx", &self.thread_idx)
            .finish()
    }
}

impl<'k> Thread<'k> {
    launch_access!();

    /// `blockIdx`: the index of this thread's block.
    pub fn block_idx(&self) -> Dim3 {
        self.block_idx
    }

    /// `threadIdx`: this thread's index in its block.
    pub fn thread_idx(&self) -> Dim3 {
        self.thread_idx
    }

    /// `blockIdx.x * blockDim.x + threadIdx.x`, computed in 64 bits.
    pub fn global_x(&self) -> u64 {
        u64::from(self.block_idx.x) * u64::from(self.launch.block[0]) + u64::from(self.thread_idx.x)
    }
}

// ------------------------------------------------ the NVRTC stand-in's parser

/// One `__global__` function a source declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Declared {
    pub(crate) name: String,
    pub(crate) params: Vec<usize>,
}

/// Removes `//` and `/* */` comments (string literals in kernels sources
/// are rare; a `//` inside one would be cut, which only makes the check
/// stricter).
fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |i| &r[i..]);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map_or("", |i| &r[i + 2..]);
            out.push(' ');
        } else {
            let ch = rest.chars().next().unwrap_or(' ');
            out.push(ch);
            rest = &rest[ch.len_utf8()..];
        }
    }
    out
}

/// The size of a C scalar type name, after typedefs.
fn scalar_size(ty: &str, typedefs: &HashMap<String, usize>) -> Option<usize> {
    let words: Vec<&str> = ty
        .split_whitespace()
        .filter(|w| !matches!(*w, "const" | "volatile" | "__restrict__" | "restrict"))
        .collect();
    let joined = words.join(" ");
    let size = match joined.as_str() {
        "char" | "signed char" | "unsigned char" | "bool" | "int8_t" | "uint8_t" => 1,
        "short" | "short int" | "unsigned short" | "unsigned short int" | "signed short"
        | "int16_t" | "uint16_t" => 2,
        "int" | "signed" | "unsigned" | "signed int" | "unsigned int" | "int32_t" | "uint32_t"
        | "float" => 4,
        "long"
        | "long int"
        | "unsigned long"
        | "unsigned long int"
        | "signed long"
        | "long long"
        | "long long int"
        | "unsigned long long"
        | "unsigned long long int"
        | "signed long long"
        | "int64_t"
        | "uint64_t"
        | "size_t"
        | "double"
        | "uintptr_t"
        | "intptr_t"
        | "ptrdiff_t" => 8,
        other => return typedefs.get(other).copied(),
    };
    Some(size)
}

/// `typedef <scalar type> <name>;` lines, resolved in order.
fn typedefs(src: &str) -> HashMap<String, usize> {
    let mut map = HashMap::new();
    for stmt in src.split(';') {
        let s = stmt.trim();
        let Some(rest) = s.strip_prefix("typedef ") else {
            continue;
        };
        let mut words: Vec<&str> = rest.split_whitespace().collect();
        let Some(name) = words.pop() else { continue };
        if name.contains('*') || words.iter().any(|w| w.contains('*')) {
            map.insert(name.trim_start_matches('*').to_string(), 8);
            continue;
        }
        if let Some(size) = scalar_size(&words.join(" "), &map) {
            map.insert(name.to_string(), size);
        }
    }
    map
}

/// The size of one parameter declaration (`const unsigned char *buf`).
fn param_size(decl: &str, typedefs: &HashMap<String, usize>) -> Result<usize, String> {
    let decl = decl.trim();
    if decl.contains('*') {
        return Ok(8);
    }
    if decl.contains('&') || decl.contains('[') {
        return Err(format!(
            "parameter `{decl}`: references and arrays are not modelled"
        ));
    }
    let mut words: Vec<&str> = decl.split_whitespace().collect();
    if words.len() < 2 {
        return Err(format!("parameter `{decl}` has no name"));
    }
    words.pop();
    scalar_size(&words.join(" "), typedefs).ok_or_else(|| {
        format!(
            "parameter `{decl}`: the simulator does not know the size of type `{}`",
            words.join(" ")
        )
    })
}

/// Every `__global__` function of `src` with its parameter sizes, or the
/// compile log lines saying what the simulator cannot check.
pub(crate) fn declared_kernels(src: &str) -> (Vec<Declared>, Vec<String>) {
    let src = strip_comments(src);
    let types = typedefs(&src);
    let mut found = Vec::new();
    let mut log = Vec::new();
    let mut from = 0;
    while let Some(i) = src[from..].find("__global__") {
        let at = from + i;
        from = at + "__global__".len();
        // The declaration starts after the previous `;`, `}` or `{`.
        let start = src[..at].rfind([';', '}', '{']).map_or(0, |p| p + 1);
        let head = &src[start..at];
        let after = &src[from..];
        let Some(open) = after.find('(') else {
            log.push("a `__global__` declaration without a parameter list".to_string());
            break;
        };
        let Some(close) = after[open..].find(')') else {
            log.push("a `__global__` declaration without a closing parenthesis".to_string());
            break;
        };
        let sig = after[..open].trim();
        let name = sig.split_whitespace().last().unwrap_or("").to_string();
        let params_text = &after[open + 1..open + close];
        if !head.contains("extern \"C\"") && !extern_c_block(&src, at) {
            log.push(format!(
                "kernel `{name}` is not `extern \"C\"`: its symbol would be mangled; the simulator \
                 finds kernels only by their C name"
            ));
            continue;
        }
        if head.contains("template") {
            log.push(format!("kernel `{name}` is a template: not modelled"));
            continue;
        }
        let mut params = Vec::new();
        let text = params_text.trim();
        if !(text.is_empty() || text == "void") {
            for p in text.split(',') {
                match param_size(p, &types) {
                    Ok(s) => params.push(s),
                    Err(e) => log.push(format!("kernel `{name}`: {e}")),
                }
            }
        }
        found.push(Declared { name, params });
    }
    (found, log)
}

/// Whether position `at` lies inside an `extern "C" { ... }` block.
fn extern_c_block(src: &str, at: usize) -> bool {
    let mut from = 0;
    while let Some(i) = src[from..at].find("extern \"C\"") {
        let p = from + i + "extern \"C\"".len();
        from = p;
        let rest = src[p..at].trim_start();
        if rest.starts_with('{') {
            let open = p + src[p..].find('{').unwrap_or(0);
            let mut depth = 0i32;
            for (j, ch) in src[open..].char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            if open + j > at {
                                return true;
                            }
                            break;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    false
}

/// The `.entry` points of a PTX text (real or the simulator's image) with
/// their parameter sizes (from each `.param` line's type or byte array).
pub(crate) fn ptx_entries(ptx: &str) -> Vec<Declared> {
    let mut out = Vec::new();
    let mut rest = ptx;
    while let Some(i) = rest.find(".entry") {
        let after = &rest[i + ".entry".len()..];
        let name: String = after
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '$')
            .collect();
        let mut params = Vec::new();
        let (body, next) = match (after.find('('), after.find(')')) {
            (Some(o), Some(c)) if o < c && after[..o].trim() == name => {
                (&after[o + 1..c], &after[c..])
            }
            _ => ("", after),
        };
        for line in body.split(',') {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            params.push(ptx_param_size(line));
        }
        if !name.is_empty() {
            out.push(Declared { name, params });
        }
        rest = next;
    }
    out
}

/// The size of one PTX `.param` declaration; 0 when it cannot be read
/// (never matches a registered size, so the load is refused).
fn ptx_param_size(line: &str) -> usize {
    let array = line
        .find('[')
        .and_then(|o| line[o + 1..].find(']').map(|c| &line[o + 1..o + 1 + c]))
        .and_then(|n| n.trim().parse::<usize>().ok());
    let unit = if line.contains(".u64")
        || line.contains(".s64")
        || line.contains(".b64")
        || line.contains(".f64")
    {
        8
    } else if line.contains(".u32")
        || line.contains(".s32")
        || line.contains(".b32")
        || line.contains(".f32")
    {
        4
    } else if line.contains(".u16")
        || line.contains(".s16")
        || line.contains(".b16")
        || line.contains(".f16")
    {
        2
    } else if line.contains(".u8") || line.contains(".s8") || line.contains(".b8") {
        1
    } else {
        0
    };
    unit * array.unwrap_or(1)
}

/// The simulator's module image for `kernels`: PTX-shaped text whose
/// `.entry` lines name each kernel with its parameters (not real PTX; the
/// first line says so).
pub(crate) fn module_image(kernels: &[Declared]) -> String {
    let mut s = String::from(
        "// tegra-interop simulator module image: made by its NVRTC stand-in, not real PTX.\n\
         .version 8.0\n.target sim\n.address_size 64\n",
    );
    for k in kernels {
        s.push_str(&format!("\n.visible .entry {}(\n", k.name));
        let params: Vec<String> = k
            .params
            .iter()
            .enumerate()
            .map(|(i, size)| match size {
                8 => format!("\t.param .u64 {}_param_{i}", k.name),
                4 => format!("\t.param .u32 {}_param_{i}", k.name),
                2 => format!("\t.param .u16 {}_param_{i}", k.name),
                1 => format!("\t.param .u8 {}_param_{i}", k.name),
                n => format!("\t.param .align 8 .b8 {}_param_{i}[{n}]", k.name),
            })
            .collect();
        s.push_str(&params.join(",\n"));
        s.push_str("\n)\n{\n\tret;\n}\n");
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ranges(first: u64, dim: Dim3, n: u64, step: Option<u64>) -> Vec<(u64, u64)> {
        IndexRanges::of(first, dim, n, step)
            .map(|r| (r.start, r.end))
            .collect()
    }

    #[test]
    fn index_ranges_follow_the_cuda_index_arithmetic() {
        let d = Dim3::new(256, 1, 1);
        // Block 1 of 256 threads: indices 256..512, cut at n.
        assert_eq!(ranges(256, d, 1000, None), [(256, 512)]);
        assert_eq!(ranges(256, d, 300, None), [(256, 300)]);
        assert_eq!(ranges(256, d, 256, None), []);
        // Grid-stride over 3 blocks (step 768): 256..512, 1024..1280, 1792..1800.
        assert_eq!(
            ranges(256, d, 1800, Some(768)),
            [(256, 512), (1024, 1280), (1792, 1800)]
        );
        // A 2-D block over 1-D code: each row of threads computes the same
        // indices, so each range comes once per row (2 x 3 rows).
        assert_eq!(ranges(0, Dim3::new(4, 2, 3), 10, None), vec![(0, 4); 6]);
        // Overflow of the loop index ends the loop.
        assert_eq!(
            ranges(u64::MAX - 1, Dim3::new(4, 1, 1), u64::MAX, Some(u64::MAX)),
            [(u64::MAX - 1, u64::MAX)]
        );
    }

    #[test]
    fn dim3_linear_indices_run_x_fastest() {
        let d = Dim3::new(3, 2, 2);
        assert_eq!(d.count(), 12);
        let all: Vec<Dim3> = (0..d.count()).map(|i| d.index_of(i)).collect();
        assert_eq!(all[0], Dim3::new(0, 0, 0));
        assert_eq!(all[1], Dim3::new(1, 0, 0));
        assert_eq!(all[3], Dim3::new(0, 1, 0));
        assert_eq!(all[6], Dim3::new(0, 0, 1));
        assert_eq!(all[11], Dim3::new(2, 1, 1));
        let distinct: std::collections::HashSet<Dim3> = all.into_iter().collect();
        assert_eq!(distinct.len(), 12);
    }

    #[test]
    fn forms_refuse_launches_past_their_limits() {
        let big = [u32::try_from(MAX_SIMULATED_BLOCKS + 1).unwrap(), 1, 1];
        assert!(Form::Block.refusal(big, [1, 1, 1]).is_some());
        assert!(Form::Launch.refusal(big, [1, 1, 1]).is_none());
        assert!(Form::Block.refusal([2025, 1, 1], [256, 1, 1]).is_none());
        assert!(Form::Thread
            .refusal([1 << 17, 1, 1], [1024, 1, 1])
            .is_some());
        assert!(Form::Thread.refusal([32_400, 1, 1], [1024, 1, 1]).is_none());
    }

    #[test]
    fn declared_kernels_read_names_and_sizes_with_typedefs() {
        let src = r#"
            typedef unsigned long long u64;
            typedef unsigned int u32;
            /* a comment __global__ void fake(int a) */
            extern "C" __global__ void k(unsigned char *buf, u64 len, u32 seed, u64 *out) {}
            extern "C" {
                __global__ void inner(float x, int y) {}
            }
            template <bool S> __device__ void helper(int x) {}
        "#;
        let (k, log) = declared_kernels(src);
        assert!(log.is_empty(), "{log:?}");
        assert_eq!(k.len(), 2);
        assert_eq!(k[0].name, "k");
        assert_eq!(k[0].params, [8, 8, 4, 8]);
        assert_eq!(k[1].name, "inner");
        assert_eq!(k[1].params, [4, 4]);
    }

    #[test]
    fn mangled_or_unknown_types_are_logged() {
        let (_, log) = declared_kernels("__global__ void k(int a) {}");
        assert!(log[0].contains("extern \"C\""), "{log:?}");
        let (_, log) = declared_kernels("extern \"C\" __global__ void k(mystery a) {}");
        assert!(log[0].contains("mystery"), "{log:?}");
    }

    #[test]
    fn the_image_round_trips_through_the_ptx_reader() {
        let k = vec![
            Declared {
                name: "a".into(),
                params: vec![8, 4, 16],
            },
            Declared {
                name: "b".into(),
                params: vec![],
            },
        ];
        assert_eq!(ptx_entries(&module_image(&k)), k);
    }

    #[test]
    fn real_ptx_entries_are_read() {
        let ptx = ".visible .entry add_one(\n\t.param .u64 add_one_param_0,\n\t.param .u64 add_one_param_1\n)\n{\n ret;\n}\n";
        assert_eq!(
            ptx_entries(ptx),
            [Declared {
                name: "add_one".into(),
                params: vec![8, 8]
            }]
        );
    }
}
