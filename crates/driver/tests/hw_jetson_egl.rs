//! The JetPack camera path on a Jetson: an `NvBufSurface` (the buffer V4L2,
//! GStreamer, DeepStream and Argus hand around) made into an EGLImage with
//! `NvBufSurfaceMapEglImage` and registered with CUDA through the driver's
//! `egl` module. `libnvbufsurface.so` is opened at run time (dlopen), so
//! nothing links against it.
//!
//! Status: **not run on hardware** (no Jetson is reachable). The structure
//! layouts below were written from the public JetPack `nvbufsurface.h` (the
//! 2019-2023 revision: `NvBufSurfaceCreateParams`, `NvBufSurface`,
//! `NvBufSurfaceParams` with its plane parameters and mapped addresses);
//! `layouts_match_the_header` checks the offsets the code relies on and
//! runs everywhere. On the device:
//!
//! ```sh
//! cargo test -p tegra-interop-driver --test hw_jetson_egl -- --ignored --nocapture
//! ```
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::ffi::c_void;
use std::mem::{offset_of, size_of};

use tegra_interop_driver::egl::{EglAccess, EglFrameType, EglImage};
use tegra_interop_driver::{Backend, Context};

const MAX_PLANES: usize = 4;
/// `NVBUF_COLOR_FORMAT_RGBA` (the 20th value of the enumeration).
const COLOR_RGBA: u32 = 19;
/// `NVBUF_LAYOUT_PITCH`.
const LAYOUT_PITCH: u32 = 0;
/// `NVBUF_MEM_SURFACE_ARRAY` (the only type `NvBufSurfaceMapEglImage` takes).
const MEM_SURFACE_ARRAY: u32 = 4;

/// Allocation parameters of one buffer (`NvBufSurfaceCreateParams`).
#[repr(C)]
#[derive(Default)]
struct CreateParams {
    gpu_id: u32,
    width: u32,
    height: u32,
    size: u32,
    contiguous: bool,
    color_format: u32,
    layout: u32,
    mem_type: u32,
}

/// Per-plane facts of one buffer (`NvBufSurfacePlaneParams`).
#[repr(C)]
struct PlaneParams {
    planes: u32,
    width: [u32; MAX_PLANES],
    height: [u32; MAX_PLANES],
    pitch: [u32; MAX_PLANES],
    offset: [u32; MAX_PLANES],
    size: [u32; MAX_PLANES],
    bytes_per_pixel: [u32; MAX_PLANES],
    reserved: [*mut c_void; 4 * MAX_PLANES],
}

/// CPU and EGL mappings of one buffer (`NvBufSurfaceMappedAddr`).
#[repr(C)]
struct Mapped {
    cpu: [*mut c_void; MAX_PLANES],
    egl_image: *mut c_void,
    reserved: [*mut c_void; 4],
}

/// One buffer of a batch (`NvBufSurfaceParams`).
#[repr(C)]
struct SurfaceParams {
    width: u32,
    height: u32,
    pitch: u32,
    color_format: u32,
    layout: u32,
    dmabuf_fd: u64,
    data_size: u32,
    data: *mut c_void,
    planes: PlaneParams,
    mapped: Mapped,
    extended: *mut c_void,
    reserved: [*mut c_void; 3],
}

/// A batch of buffers (`NvBufSurface`).
#[repr(C)]
struct Surface {
    gpu_id: u32,
    batch: u32,
    filled: u32,
    contiguous: bool,
    mem_type: u32,
    list: *mut SurfaceParams,
    reserved: [*mut c_void; 4],
}

type Create = unsafe extern "C" fn(*mut *mut Surface, u32, *mut CreateParams) -> i32;
type Destroy = unsafe extern "C" fn(*mut Surface) -> i32;
type MemSet = unsafe extern "C" fn(*mut Surface, i32, i32, u8) -> i32;
type MapEgl = unsafe extern "C" fn(*mut Surface, i32) -> i32;

/// The offsets the test relies on, as the header lays them out on a 64-bit
/// target (worked out by hand from the header's fields).
#[test]
#[cfg(target_pointer_width = "64")]
fn layouts_match_the_header() {
    assert_eq!(size_of::<CreateParams>(), 32);
    assert_eq!(offset_of!(CreateParams, mem_type), 28);
    assert_eq!(size_of::<PlaneParams>(), 232);
    assert_eq!(offset_of!(Surface, list), 24);
    assert_eq!(size_of::<Surface>(), 64);
    assert_eq!(offset_of!(SurfaceParams, dmabuf_fd), 24);
    assert_eq!(offset_of!(SurfaceParams, planes), 48);
    assert_eq!(offset_of!(SurfaceParams, mapped), 280);
    assert_eq!(
        offset_of!(SurfaceParams, mapped) + offset_of!(Mapped, egl_image),
        312
    );
    assert_eq!(size_of::<SurfaceParams>(), 384);
}

/// An RGBA surface filled with one value by the NvBufSurface library, made
/// into an EGLImage, registered with CUDA: CUDA must see the value. What
/// the frame looks like (pitch or block-linear array) is printed.
#[test]
#[ignore = "needs a Jetson with JetPack (libnvbufsurface, CUDA); run with --ignored on hardware"]
fn hw_nvbufsurface_egl_image_reaches_cuda() {
    // SAFETY: loading the JetPack library runs its initialisers, which is
    // what every JetPack program does.
    let lib = ["libnvbufsurface.so.1.0.0", "libnvbufsurface.so"]
        .iter()
        .find_map(|n| unsafe { libloading::Library::new(*n) }.ok())
        .expect("libnvbufsurface.so not found: a Jetson with JetPack is needed");
    // SAFETY: the symbols have the prototypes the header gives them.
    let (create, destroy, memset, map_egl, unmap_egl) = unsafe {
        (
            *lib.get::<Create>(b"NvBufSurfaceCreate\0").unwrap(),
            *lib.get::<Destroy>(b"NvBufSurfaceDestroy\0").unwrap(),
            *lib.get::<MemSet>(b"NvBufSurfaceMemSet\0").unwrap(),
            *lib.get::<MapEgl>(b"NvBufSurfaceMapEglImage\0").unwrap(),
            *lib.get::<MapEgl>(b"NvBufSurfaceUnMapEglImage\0").unwrap(),
        )
    };
    let backend = Backend::real().unwrap();
    let ctx = Context::new(backend.clone(), 0).unwrap();
    ctx.bind().unwrap();
    let (w, h) = (640u32, 480u32);
    let mut params = CreateParams {
        width: w,
        height: h,
        color_format: COLOR_RGBA,
        layout: LAYOUT_PITCH,
        mem_type: MEM_SURFACE_ARRAY,
        ..CreateParams::default()
    };
    let mut surf: *mut Surface = std::ptr::null_mut();
    // SAFETY: valid out-pointer and parameters; one buffer.
    let r = unsafe { create(&mut surf, 1, &mut params) };
    assert_eq!(r, 0, "NvBufSurfaceCreate");
    // SAFETY: the surface just made; buffer 0, every plane.
    let r = unsafe { memset(surf, 0, -1, 0x42) };
    assert_eq!(r, 0, "NvBufSurfaceMemSet");
    // SAFETY: as above; the EGLImage lands in buffer 0's mapped addresses.
    let r = unsafe { map_egl(surf, 0) };
    assert_eq!(r, 0, "NvBufSurfaceMapEglImage");
    // SAFETY: the library filled `list` with one buffer's parameters.
    let (image, pitch) = unsafe {
        let p = &*(*surf).list;
        (p.mapped.egl_image, p.pitch)
    };
    assert!(!image.is_null(), "no EGLImage in mappedAddr.eglImage");
    println!("surface: {w}x{h}, pitch {pitch}");
    {
        // SAFETY: the EGLImage lives until NvBufSurfaceUnMapEglImage below,
        // after the registration ended.
        let reg = unsafe { EglImage::register(&ctx, image, EglAccess::ReadWrite) }.unwrap();
        let f = reg.frame().unwrap();
        println!("frame: {f:?}");
        assert_eq!((f.width(), f.height()), (w, h));
        let mut first = vec![0u8; (w * 4) as usize];
        if f.frame_type() == EglFrameType::Pitch {
            f.copy_plane_to_host(0, &mut first).unwrap();
        } else {
            let mut all = vec![0u8; (w * h * 4) as usize];
            f.copy_plane_to_host(0, &mut all).unwrap();
            let n = first.len();
            first.copy_from_slice(&all[..n]);
        }
        assert!(
            first.iter().all(|b| *b == 0x42),
            "CUDA sees the library's fill"
        );
        reg.unregister().unwrap();
    }
    // SAFETY: buffer 0's EGLImage, no longer registered; then the surface.
    unsafe {
        assert_eq!(unmap_egl(surf, 0), 0, "NvBufSurfaceUnMapEglImage");
        assert_eq!(destroy(surf), 0, "NvBufSurfaceDestroy");
    }
    assert!(backend.take_drop_errors().is_empty());
}
