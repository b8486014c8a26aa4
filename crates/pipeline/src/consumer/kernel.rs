//! The consumer's kernels: their CUDA C source ([`KERNEL_SOURCE`]), the
//! host mirror of their test-pattern arithmetic ([`pattern_seed`],
//! [`kernel_pattern_byte`], [`self_check_pattern`]), the launch geometry
//! ([`grid_for`]) and [`Kernels`], the module NVRTC compiled from the
//! source, loaded into one context, through the driver's seam
//! ([`Nvrtc`], [`Module`]): the same calls on a GPU and on the simulator,
//! where the kernels run as their Rust twins (`super::twin`).

use tegra_interop::driver::{Context, Function, Module, Nvrtc};

use crate::error::{DriverResultExt, TransportError};

/// Threads per block of the kernels (a multiple of the warp size).
pub const BLOCK: u32 = 256;

/// Bytes each kernel thread handles per step (one 16-byte vector).
pub const BYTES_PER_THREAD: usize = 16;

/// The alignment the kernels' 16-byte vector accesses need at the start of
/// a frame (checked before every launch: a misaligned frame is an error,
/// not a faulting kernel).
pub const FRAME_ALIGN: u64 = 16;

/// The name NVRTC gives the source in its messages.
const SOURCE_NAME: &str = "tegra_interop_consumer.cu";

/// The check-and-invert kernel for frames in device memory.
pub const CHECK_DEVICE: &str = "check_and_invert";
/// The check-and-invert kernel for frames in memory the CPU also maps.
pub const CHECK_SYSMEM: &str = "check_and_invert_sysmem";
/// The copy kernel from memory the CPU maps into device memory.
pub const COPY_IN: &str = "copy_from_sysmem";
/// The copy kernel from device memory into memory the CPU maps.
pub const COPY_OUT: &str = "copy_to_sysmem";

/// The CUDA C source the consumer compiles with NVRTC when the transport
/// opens.
///
/// `check_and_invert*` do what `process_frame` does on the host: byte `i` of
/// the frame is at `row = i / stride`, `col = i % stride`; it is compared
/// with the test pattern of the frame (the seed bytes `s0`, `s1`, `s2` are the
/// low three bytes of `seed`, see [`pattern_seed`]), counted when different,
/// and inverted. Each thread handles 16 bytes at a time, a warp adds up its
/// counts with shuffles and one lane adds them to the frame's counter with an
/// atomic.
///
/// The `_sysmem` variant and the two copy kernels touch the frame with
/// `ld.global.cv` loads (cached system-memory lines are treated as stale and
/// fetched again) and `st.global.wt` stores (written through to system
/// memory). On the discrete GPU they were tried while frames were still
/// handed over with host-side semaphore operations only, and did not stop
/// the consumer from reading stale bytes (see `gpu.rs`'s module docs and
/// BENCHMARKS-history.md, "The discrete-GPU pipeline, verified"); the fix
/// there was the queue handover. They are kept
/// because they cost nothing measurable on the H200 and do not rely on
/// cached system-memory lines, which is also why the Jetson path, whose
/// frames are NvSciBuf buffers in the DRAM the CPU shares, uses the
/// `_sysmem` variant (not measured on a Jetson).
pub const KERNEL_SOURCE: &str = r#"
typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u32 col_term(u64 col, u32 seed) {
    return (((u32)col & 0xffu) ^ (seed & 0xffu)) + 7u * (u32)(col >> 8);
}

__device__ __forceinline__ u32 row_term(u64 row, u32 seed) {
    return 3u * (((u32)row & 0xffu) ^ ((seed >> 8) & 0xffu))
         + 5u * (u32)(row >> 8) + ((seed >> 16) & 0xffu);
}

template <bool SYS> __device__ __forceinline__ uint4 load16(const uint4 *p) {
    if (SYS) { return __ldcv(p); } else { return *p; }
}
template <bool SYS> __device__ __forceinline__ void store16(uint4 *p, uint4 v) {
    if (SYS) { __stwt(p, v); } else { *p = v; }
}
template <bool SYS> __device__ __forceinline__ unsigned char load1(const unsigned char *p) {
    if (SYS) { return __ldcv(p); } else { return *p; }
}
template <bool SYS> __device__ __forceinline__ void store1(unsigned char *p, unsigned char v) {
    if (SYS) { __stwt(p, v); } else { *p = v; }
}

template <bool SYS>
__device__ __forceinline__ void check_and_invert_body(unsigned char *buf, u64 len, u64 stride,
                                                      u32 seed, u64 *mismatches) {
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 threads = (u64)gridDim.x * blockDim.x;
    const u64 vectors = len / 16;
    u32 count = 0;
    uint4 *v = (uint4 *)buf;
    for (u64 i = tid; i < vectors; i += threads) {
        uint4 w = load16<SYS>(v + i);
        u32 words[4] = {w.x, w.y, w.z, w.w};
        u64 off = i * 16;
        u64 row = off / stride;
        u64 col = off - row * stride;
        u32 rt = row_term(row, seed);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            u32 word = words[k];
            u32 out = 0;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                u32 have = (word >> (8 * b)) & 0xffu;
                u32 want = (col_term(col, seed) + rt) & 0xffu;
                count += (have != want);
                out |= ((~have) & 0xffu) << (8 * b);
                col++;
                if (col == stride) {
                    col = 0;
                    row++;
                    rt = row_term(row, seed);
                }
            }
            words[k] = out;
        }
        store16<SYS>(v + i, make_uint4(words[0], words[1], words[2], words[3]));
    }
    const u64 tail = len - vectors * 16;
    if (tid < tail) {
        u64 off = vectors * 16 + tid;
        u64 row = off / stride;
        u64 col = off - row * stride;
        u32 have = load1<SYS>(buf + off);
        u32 want = (col_term(col, seed) + row_term(row, seed)) & 0xffu;
        count += (have != want);
        store1<SYS>(buf + off, (unsigned char)(~have));
    }
    for (int o = 16; o > 0; o >>= 1) {
        count += __shfl_down_sync(0xffffffffu, count, o);
    }
    if ((threadIdx.x & 31u) == 0 && count != 0) {
        atomicAdd(mismatches, (u64)count);
    }
}

/* The frame in device memory (copy-based variant). */
extern "C" __global__ void check_and_invert(unsigned char *buf, u64 len, u64 stride,
                                            u32 seed, u64 *mismatches) {
    check_and_invert_body<false>(buf, len, stride, seed, mismatches);
}

/* The frame in imported host memory (zero-copy variant). */
extern "C" __global__ void check_and_invert_sysmem(unsigned char *buf, u64 len, u64 stride,
                                                   u32 seed, u64 *mismatches) {
    check_and_invert_body<true>(buf, len, stride, seed, mismatches);
}

/* Copies `len` bytes; SRC_SYS / DST_SYS say which side is imported host memory. */
template <bool SRC_SYS, bool DST_SYS>
__device__ __forceinline__ void copy_body(unsigned char *dst, const unsigned char *src, u64 len) {
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 threads = (u64)gridDim.x * blockDim.x;
    const u64 vectors = len / 16;
    for (u64 i = tid; i < vectors; i += threads) {
        store16<DST_SYS>((uint4 *)dst + i, load16<SRC_SYS>((const uint4 *)src + i));
    }
    const u64 tail = len - vectors * 16;
    if (tid < tail) {
        u64 off = vectors * 16 + tid;
        store1<DST_SYS>(dst + off, load1<SRC_SYS>(src + off));
    }
}

extern "C" __global__ void copy_from_sysmem(unsigned char *dst, const unsigned char *src, u64 len) {
    copy_body<true, false>(dst, src, len);
}

extern "C" __global__ void copy_to_sysmem(unsigned char *dst, const unsigned char *src, u64 len) {
    copy_body<false, true>(dst, src, len);
}
"#;

/// The splitmix64 finaliser that `TestPattern` uses to turn a frame index
/// into its seed (the formula is documented on `TestPattern`).
const fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The kernel's `seed` argument for `frame`: the pattern's seed bytes `s0`,
/// `s1`, `s2` in its low three bytes.
pub fn pattern_seed(frame: u64) -> u32 {
    (splitmix64(frame) & 0x00ff_ffff) as u32
}

/// The byte the kernel expects at (`row`, `col`) for `seed`: the same
/// arithmetic as [`KERNEL_SOURCE`], on the host (checked against
/// `TestPattern` in the tests and once per open).
pub fn kernel_pattern_byte(seed: u32, row: u64, col: u64) -> u8 {
    let col_term =
        ((col as u32 & 0xff) ^ (seed & 0xff)).wrapping_add(7u32.wrapping_mul((col >> 8) as u32));
    let row_term = 3u32
        .wrapping_mul((row as u32 & 0xff) ^ ((seed >> 8) & 0xff))
        .wrapping_add(5u32.wrapping_mul((row >> 8) as u32))
        .wrapping_add((seed >> 16) & 0xff);
    (col_term.wrapping_add(row_term) & 0xff) as u8
}

/// Checks the kernel's pattern arithmetic against `TestPattern` for a few
/// frames and positions; a mismatch means the kernel would report every
/// frame as corrupt.
pub fn self_check_pattern(stride: usize, rows: usize) -> Result<(), TransportError> {
    use crate::camera::TestPattern;
    for frame in [0u64, 1, 2, 255, 1 << 20, u64::MAX] {
        let p = TestPattern::new(frame, stride);
        let seed = pattern_seed(frame);
        for (row, col) in [
            (0, 0),
            (0, stride.saturating_sub(1)),
            (rows / 2, stride / 2),
            (rows.saturating_sub(1), stride.saturating_sub(1)),
            (300, 700),
        ] {
            if kernel_pattern_byte(seed, row as u64, col as u64) != p.byte(row, col) {
                return Err(TransportError::refused(format!(
                    "the kernel's test-pattern arithmetic disagrees with TestPattern at frame {frame}, row {row}, column {col}"
                )));
            }
        }
    }
    Ok(())
}

/// Blocks of [`BLOCK`] threads for a frame of `len` bytes: one
/// [`BYTES_PER_THREAD`]-byte vector per thread, at least 1 and at most
/// 2^20 blocks (the kernels loop over the rest).
pub fn grid_for(len: usize) -> u32 {
    let vectors = len.div_ceil(BYTES_PER_THREAD);
    u32::try_from(vectors.div_ceil(BLOCK as usize).clamp(1, 1 << 20)).unwrap_or(1 << 20)
}

/// Where the frame a check-and-invert kernel works on lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameMemory {
    /// Device-local memory: `check_and_invert`, plain loads and stores.
    Device,
    /// Memory the CPU also maps (imported host memory, NvSciBuf buffers on
    /// a Jetson): `check_and_invert_sysmem`, loads that fetch again and
    /// write-through stores.
    System,
}

/// Which copy kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyKernel {
    /// `copy_from_sysmem`: from memory the CPU maps into device memory.
    FromSystem,
    /// `copy_to_sysmem`: from device memory into memory the CPU maps.
    ToSystem,
}

/// The consumer's kernels, compiled from [`KERNEL_SOURCE`] with NVRTC and
/// loaded into one context (the module stays loaded while any of them is
/// alive).
#[derive(Debug)]
pub struct Kernels {
    device: Function,
    sysmem: Function,
    copy_in: Function,
    copy_out: Function,
}

impl Kernels {
    /// Compiles [`KERNEL_SOURCE`] with the backend's NVRTC (on the
    /// simulator: its registry of twins, see `super::twin::register`) and
    /// loads it into `ctx`.
    pub fn compile(ctx: &Context) -> Result<Kernels, TransportError> {
        let nvrtc = Nvrtc::new(ctx.backend()).during("loading NVRTC for the consumer kernel")?;
        let ptx = nvrtc
            .compile(KERNEL_SOURCE, SOURCE_NAME, &[])
            .during("NVRTC compiling the consumer kernel")?;
        let module = Module::load(ctx, &ptx).during("loading the consumer kernel")?;
        let get = |name: &'static str| {
            module
                .function(name)
                .during(format!("finding consumer kernel `{name}`"))
        };
        Ok(Kernels {
            device: get(CHECK_DEVICE)?,
            sysmem: get(CHECK_SYSMEM)?,
            copy_in: get(COPY_IN)?,
            copy_out: get(COPY_OUT)?,
        })
    }

    /// The check-and-invert kernel for frames in `memory`.
    pub fn check_and_invert(&self, memory: FrameMemory) -> &Function {
        match memory {
            FrameMemory::System => &self.sysmem,
            FrameMemory::Device => &self.device,
        }
    }

    /// A copy kernel.
    pub fn copy(&self, which: CopyKernel) -> &Function {
        match which {
            CopyKernel::FromSystem => &self.copy_in,
            CopyKernel::ToSystem => &self.copy_out,
        }
    }
}

/// Checks that a frame's device address suits the kernels' 16-byte vector
/// accesses.
pub fn check_aligned(ptr: u64, what: &'static str) -> Result<(), TransportError> {
    if ptr.is_multiple_of(FRAME_ALIGN) {
        Ok(())
    } else {
        Err(TransportError::refused(format!(
            "{what}: device address {ptr:#x} is not {FRAME_ALIGN}-byte aligned, which the kernel's vector accesses need"
        )))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::camera::TestPattern;

    #[test]
    fn kernel_pattern_matches_test_pattern() {
        for stride in [1usize, 3, 64, 300, 7680] {
            for frame in [0u64, 1, 7, 1000, u64::MAX - 1] {
                let p = TestPattern::new(frame, stride);
                let seed = pattern_seed(frame);
                for row in [0usize, 1, 255, 256, 1079, 4095] {
                    for col in (0..stride).step_by(stride.div_ceil(97)) {
                        assert_eq!(
                            kernel_pattern_byte(seed, row as u64, col as u64),
                            p.byte(row, col),
                            "frame {frame} stride {stride} row {row} col {col}"
                        );
                    }
                }
            }
        }
        self_check_pattern(7680, 1080).unwrap();
    }

    #[test]
    fn grid_covers_the_frame_within_limits() {
        assert_eq!(grid_for(0), 1);
        assert_eq!(grid_for(1), 1);
        assert_eq!(grid_for(BLOCK as usize * BYTES_PER_THREAD), 1);
        assert_eq!(grid_for(BLOCK as usize * BYTES_PER_THREAD + 1), 2);
        // 1920x1080 RGBA8: 518400 vectors of 16 bytes, 2025 blocks.
        assert_eq!(grid_for(1920 * 1080 * 4), 2025);
        assert_eq!(grid_for(usize::MAX), 1 << 20);
    }

    #[test]
    fn the_source_has_every_entry_point_the_module_loads() {
        for name in [
            "check_and_invert",
            "check_and_invert_sysmem",
            "copy_from_sysmem",
            "copy_to_sysmem",
        ] {
            assert!(
                KERNEL_SOURCE.contains(&format!("extern \"C\" __global__ void {name}(")),
                "{name}"
            );
        }
    }
}
