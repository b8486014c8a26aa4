//! EGL interop: an `EGLImageKHR` registered with CUDA
//! (`cuGraphicsEGLRegisterImage`) and its mapped frame
//! (`cuGraphicsResourceGetMappedEglFrame`). This is how an `NvBufSurface`
//! (V4L2, GStreamer, DeepStream on Jetson) or a GL texture reaches CUDA
//! without a copy.
//!
//! The order matters, as measured for a GL texture (H200 2026-11-23, H100
//! 2026-11-25, driver 580.159): for a texture made with its pixels and not
//! used by GL since, CUDA sees zeros after the registration, and GL's first
//! access after the registration puts GL's pixels into the shared storage,
//! overwriting whatever CUDA wrote before it. So: register, let the
//! producer touch (or write) the image, then let CUDA write; from then on
//! each side sees the other's writes. (A texture GL wrote and finished
//! with `glTexSubImage2D` + `glFinish` before the registration is shared at
//! once.) The simulator models the stricter first case for every image.
//!
//! The image itself stays the caller's (made with `eglCreateImageKHR`,
//! destroyed with `eglDestroyImageKHR` after the registration ended). The
//! mapped frame borrows its registration, so its plane pointers cannot be
//! used after [`EglImage::unregister`]: that does not compile.
//!
//! ```
//! # use std::sync::Arc;
//! # use tegra_interop_driver::{Context, egl::{EglAccess, EglColorFormat, EglFrameType, EglImage}};
//! # use tegra_interop_sim::{Sim, egl::EglImageFormat};
//! let sim = Sim::new()?;
//! let ctx = Context::create(sim.backend(), 0, 0)?;
//! // The EGL side (here the simulator's stand-in for eglCreateImageKHR).
//! let mut image = sim.create_egl_image(EglImageFormat::Rgba8, 64, 16).unwrap();
//! // SAFETY: the image is live and outlives the registration.
//! let registered = unsafe { EglImage::register(&ctx, image.as_raw(), EglAccess::ReadWrite)? };
//! // The producer writes after the registration (its first access after
//! // the registration; see above).
//! image.plane_mut(0).unwrap()[..4].copy_from_slice(&[1, 2, 3, 4]);
//! let frame = registered.frame()?;
//! assert_eq!(frame.frame_type(), EglFrameType::Pitch);
//! assert_eq!(frame.color_format(), EglColorFormat::RGBA);
//! let mut first = [0u8; 4];
//! frame.copy_plane_to_host(0, &mut first)?;
//! assert_eq!(first, [1, 2, 3, 4]);
//! registered.unregister()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![allow(unsafe_code)] // calls of pointer-taking entry points, each with its `// SAFETY:` line

use std::fmt;
use std::marker::PhantomData;

use tegra_interop_sys::cuda::{
    CUarray, CUdeviceptr, CUeglColorFormat, CUeglFrame, CUeglFrameType, CUgraphicsResource,
    EGLImageKHR,
};

pub(crate) mod stream;

pub use stream::{
    DisconnectRefused, EglResourceLocation, EglStreamConsumer, EglStreamProducer, ProducerFrame,
    StreamFrame,
};

use crate::ffi::{self, call, Bind, TryBind};
use crate::owner::{Owned, Release};
use crate::{Backend, Context, Error};

/// How CUDA will use a registered image (the map-resource flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum EglAccess {
    /// Read and write (`CU_GRAPHICS_MAP_RESOURCE_FLAGS_NONE`).
    #[default]
    ReadWrite,
    /// CUDA only reads (`..._READ_ONLY`).
    ReadOnly,
    /// CUDA overwrites everything and reads nothing (`..._WRITE_DISCARD`).
    WriteDiscard,
}

impl EglAccess {
    fn raw(self) -> u32 {
        match self {
            EglAccess::ReadWrite => 0,
            EglAccess::ReadOnly => 1,
            EglAccess::WriteDiscard => 2,
        }
    }
}

/// The colour format of an EGL frame (`CUeglColorFormat`): an open set, with
/// names for the common ones.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct EglColorFormat(pub u32);

impl EglColorFormat {
    /// 8-bit R, G, B, A.
    pub const RGBA: EglColorFormat = EglColorFormat(CUeglColorFormat::CU_EGL_COLOR_FORMAT_RGBA.0);
    /// 8-bit A, R, G, B.
    pub const ARGB: EglColorFormat = EglColorFormat(CUeglColorFormat::CU_EGL_COLOR_FORMAT_ARGB.0);
    /// 8-bit A, B, G, R.
    pub const ABGR: EglColorFormat = EglColorFormat(CUeglColorFormat::CU_EGL_COLOR_FORMAT_ABGR.0);
    /// NV12: a Y plane and an interleaved U/V plane at half resolution.
    pub const YUV420_SEMIPLANAR: EglColorFormat =
        EglColorFormat(CUeglColorFormat::CU_EGL_COLOR_FORMAT_YUV420_SEMIPLANAR.0);
    /// NV21: a Y plane and an interleaved V/U plane at half resolution
    /// (what a CUDA consumer of an EGLStream acquires for a frame presented
    /// as NV12: measured on an H100, driver 580.159).
    pub const YVU420_SEMIPLANAR: EglColorFormat =
        EglColorFormat(CUeglColorFormat::CU_EGL_COLOR_FORMAT_YVU420_SEMIPLANAR.0);
    /// I420: Y, U and V planes, U and V at half resolution.
    pub const YUV420_PLANAR: EglColorFormat =
        EglColorFormat(CUeglColorFormat::CU_EGL_COLOR_FORMAT_YUV420_PLANAR.0);

    /// The name of a known format.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            EglColorFormat::RGBA => "RGBA",
            EglColorFormat::ARGB => "ARGB",
            EglColorFormat::ABGR => "ABGR",
            EglColorFormat::YUV420_SEMIPLANAR => "YUV420_SEMIPLANAR (NV12)",
            EglColorFormat::YVU420_SEMIPLANAR => "YVU420_SEMIPLANAR (NV21)",
            EglColorFormat::YUV420_PLANAR => "YUV420_PLANAR (I420)",
            _ => return None,
        })
    }
}

impl fmt::Debug for EglColorFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "EglColorFormat::{n}"),
            None => write!(f, "EglColorFormat({})", self.0),
        }
    }
}

/// How a frame's planes are reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EglFrameType {
    /// Planes are pitch-linear device memory ([`EglFrame::plane_ptr`]).
    Pitch,
    /// Planes are CUDA arrays ([`EglFrame::plane_array`]), e.g. a GL
    /// texture (measured on the H200).
    Array,
}

pub(crate) struct ResourceRes {
    ctx: Context,
    raw: CUgraphicsResource,
}

// SAFETY: a `ResourceRes` holds C handles (plain pointers to the driver's
// objects) and a context clone; the CUDA driver API lets any thread use a
// handle (calls that act in a context bind it first), so it may move
// between threads.
#[allow(unsafe_code)]
unsafe impl Send for ResourceRes {}
// SAFETY: `&ResourceRes` only asks for the mapped frame, which the
// driver makes thread-safe.
#[allow(unsafe_code)]
unsafe impl Sync for ResourceRes {}

impl Release for ResourceRes {
    fn release(&mut self) -> Result<(), Error> {
        // Registered by us, unregistered once (`Owned`).
        call::cuGraphicsUnregisterResource(TryBind(&self.ctx), self.raw)
    }

    fn backend(&self) -> &Backend {
        self.ctx.backend()
    }
}

/// An `EGLImageKHR` registered with CUDA; unregistered on drop or with
/// [`unregister`](Self::unregister).
pub struct EglImage {
    res: Owned<ResourceRes>,
}

impl fmt::Debug for EglImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EglImage")
            .field("raw", &self.res.raw)
            .finish()
    }
}

impl EglImage {
    /// Registers `image` with CUDA in `ctx` (`cuGraphicsEGLRegisterImage`).
    /// Let the EGL side access the image once before CUDA writes it (see
    /// the module docs: measured). The registration is mapped for as long
    /// as it lives (cudaEGL.h: no map or unmap is needed; on a Jetson the
    /// mapping cannot be undone), so this type offers no map/unmap: take
    /// frames with [`frame`](Self::frame) and end the mapping with
    /// [`unregister`](Self::unregister).
    ///
    /// # Safety
    /// `image` must be a live `EGLImageKHR` of an EGL display that this
    /// process's CUDA driver can reach, and stay alive (not destroyed with
    /// `eglDestroyImageKHR`) until this registration ends.
    #[allow(unsafe_code)]
    pub unsafe fn register(
        ctx: &Context,
        image: EGLImageKHR,
        access: EglAccess,
    ) -> Result<EglImage, Error> {
        if image.is_null() {
            return Err(Error::Unsupported {
                operation: "EglImage::register",
                reason: "the EGLImage is NULL (EGL_NO_IMAGE_KHR): eglCreateImageKHR failed?",
            });
        }
        let mut raw: CUgraphicsResource = std::ptr::null_mut();
        // SAFETY: `raw` is a local the driver writes one resource handle to; `image` is the
        // caller's live EGLImage (`register`'s contract).
        unsafe { call::cuGraphicsEGLRegisterImage(Bind(ctx), &mut raw, image, access.raw()) }?;
        Ok(EglImage {
            res: Owned::new(ResourceRes {
                ctx: ctx.clone(),
                raw,
            }),
        })
    }

    /// The frame CUDA sees (`cuGraphicsResourceGetMappedEglFrame`, index 0,
    /// mip level 0). It borrows the registration: its pointers are valid
    /// only while the image is registered.
    pub fn frame(&self) -> Result<EglFrame<'_>, Error> {
        let mut raw = CUeglFrame::default();
        // SAFETY: `raw` is a local frame the driver writes whole; the resource is this live
        // registration.
        unsafe {
            call::cuGraphicsResourceGetMappedEglFrame(
                Bind(&self.res.ctx),
                &mut raw,
                self.res.raw,
                0,
                0,
            )
        }?;
        Ok(EglFrame {
            raw,
            ctx: &self.res.ctx,
            _image: PhantomData,
        })
    }

    /// The raw resource (still owned by this value).
    pub fn as_raw(&self) -> CUgraphicsResource {
        self.res.raw
    }

    /// Unregisters now (`cuGraphicsUnregisterResource`) and reports the
    /// driver's answer.
    pub fn unregister(self) -> Result<(), Error> {
        self.res.destroy()
    }
}

/// The frame of a registered [`EglImage`].
#[derive(Clone, Copy)]
pub struct EglFrame<'a> {
    raw: CUeglFrame,
    ctx: &'a Context,
    _image: PhantomData<&'a EglImage>,
}

impl fmt::Debug for EglFrame<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EglFrame")
            .field("type", &self.frame_type())
            .field("width", &self.width())
            .field("height", &self.height())
            .field("pitch", &self.pitch())
            .field("planes", &self.plane_count())
            .field("color_format", &self.color_format())
            .finish()
    }
}

impl<'a> EglFrame<'a> {
    /// A frame the driver filled in, valid while `'a` lasts.
    pub(crate) fn from_raw(raw: CUeglFrame, ctx: &'a Context) -> EglFrame<'a> {
        EglFrame {
            raw,
            ctx,
            _image: PhantomData,
        }
    }
}

impl EglFrame<'_> {
    /// Pitch-linear memory or CUDA arrays.
    pub fn frame_type(&self) -> EglFrameType {
        if self.raw.frameType == CUeglFrameType::CU_EGL_FRAME_TYPE_PITCH {
            EglFrameType::Pitch
        } else {
            EglFrameType::Array
        }
    }

    /// Width in pixels.
    pub fn width(&self) -> u32 {
        self.raw.width
    }

    /// Height in pixels.
    pub fn height(&self) -> u32 {
        self.raw.height
    }

    /// Depth (1 for 2D images).
    pub fn depth(&self) -> u32 {
        self.raw.depth
    }

    /// Bytes from one row to the next (pitch frames).
    pub fn pitch(&self) -> u32 {
        self.raw.pitch
    }

    /// Planes (1 for RGBA, 2 for NV12, 3 for I420).
    pub fn plane_count(&self) -> u32 {
        self.raw.planeCount
    }

    /// Channels of the first plane's pixels.
    pub fn channels(&self) -> u32 {
        self.raw.numChannels
    }

    /// The colour format.
    pub fn color_format(&self) -> EglColorFormat {
        EglColorFormat(self.raw.eglColorFormat.0)
    }

    /// The device address of plane `i` of a pitch frame.
    pub fn plane_ptr(&self, i: usize) -> Option<CUdeviceptr> {
        if self.frame_type() != EglFrameType::Pitch || i >= self.plane_count() as usize {
            return None;
        }
        ffi::egl_plane_words(&self.raw)
            .get(i)
            .map(|w| *w as CUdeviceptr)
    }

    /// The CUDA array of plane `i` of an array frame.
    pub fn plane_array(&self, i: usize) -> Option<CUarray> {
        if self.frame_type() != EglFrameType::Array || i >= self.plane_count() as usize {
            return None;
        }
        ffi::egl_plane_words(&self.raw)
            .get(i)
            .map(|w| *w as CUarray)
    }

    /// Bytes of plane `i` of a pitch frame, as far as the frame describes
    /// them: `pitch` times the plane's rows (NV12's second plane and I420's
    /// chroma planes have half the rows).
    pub fn plane_len(&self, i: usize) -> Option<usize> {
        self.plane_ptr(i)?;
        let rows = match (self.color_format(), i) {
            (
                EglColorFormat::YUV420_SEMIPLANAR
                | EglColorFormat::YVU420_SEMIPLANAR
                | EglColorFormat::YUV420_PLANAR,
                1..,
            ) => self.height().div_ceil(2),
            _ => self.height(),
        };
        (self.pitch() as usize).checked_mul(rows as usize)
    }

    fn plane_range(&self, i: usize, len: usize) -> Result<CUdeviceptr, Error> {
        let (Some(ptr), Some(have)) = (self.plane_ptr(i), self.plane_len(i)) else {
            return Err(Error::Unsupported {
                operation: "EglFrame plane copy",
                reason:
                    "no such plane, or not a pitch frame (array planes are copied with cuMemcpy3D)",
            });
        };
        if len > have {
            return Err(Error::OutOfBounds {
                offset: 0,
                len: len as u64,
                size: have as u64,
            });
        }
        Ok(ptr)
    }

    /// Bytes per row of the single plane of an array frame: width x
    /// channels x element size (from `cuFormat`).
    fn array_row_bytes(&self) -> Result<usize, Error> {
        use tegra_interop_sys::cuda::CUarray_format as F;
        let elem = match self.raw.cuFormat {
            F::CU_AD_FORMAT_UNSIGNED_INT8 | F::CU_AD_FORMAT_SIGNED_INT8 => 1,
            F::CU_AD_FORMAT_UNSIGNED_INT16
            | F::CU_AD_FORMAT_SIGNED_INT16
            | F::CU_AD_FORMAT_HALF => 2,
            F::CU_AD_FORMAT_UNSIGNED_INT32
            | F::CU_AD_FORMAT_SIGNED_INT32
            | F::CU_AD_FORMAT_FLOAT => 4,
            _ => {
                return Err(Error::Unsupported {
                    operation: "EglFrame array copy",
                    reason: "the array's element format is not a plain 8/16/32-bit one",
                })
            }
        };
        if self.plane_count() != 1 {
            return Err(Error::Unsupported {
                operation: "EglFrame array copy",
                reason: "array frames with several planes (YUV) are not copied by this helper yet",
            });
        }
        Ok(self.width() as usize * self.channels() as usize * elem)
    }

    /// A whole-plane copy between the single array of an array frame and
    /// host memory (`cuMemcpy3D`, synchronous); `to_host` picks the direction.
    fn copy_array(&self, host: *mut u8, len: usize, to_host: bool) -> Result<(), Error> {
        use tegra_interop_sys::cuda::{CUmemorytype, CUDA_MEMCPY3D};
        let row = self.array_row_bytes()?;
        let rows = self.height() as usize;
        let whole = row * rows;
        if len != whole {
            return Err(Error::OutOfBounds {
                offset: 0,
                len: len as u64,
                size: whole as u64,
            });
        }
        let array = self.plane_array(0).ok_or(Error::Unsupported {
            operation: "EglFrame array copy",
            reason: "not an array frame",
        })?;
        let mut m = CUDA_MEMCPY3D {
            WidthInBytes: row,
            Height: rows,
            Depth: 1,
            ..CUDA_MEMCPY3D::default()
        };
        if to_host {
            m.srcMemoryType = CUmemorytype::CU_MEMORYTYPE_ARRAY;
            m.srcArray = array;
            m.dstMemoryType = CUmemorytype::CU_MEMORYTYPE_HOST;
            m.dstHost = host.cast();
            m.dstPitch = row;
        } else {
            m.srcMemoryType = CUmemorytype::CU_MEMORYTYPE_HOST;
            m.srcHost = host.cast_const().cast();
            m.srcPitch = row;
            m.dstMemoryType = CUmemorytype::CU_MEMORYTYPE_ARRAY;
            m.dstArray = array;
        }
        // SAFETY: `m` is a local descriptor the driver only reads: the array is the registered
        // image's (live while this frame is) and the host side holds `row * rows` bytes (checked
        // above).
        unsafe { call::cuMemcpy3D(Bind(self.ctx), &m) }
    }

    /// Copies plane `i` to the host (synchronous): the first `dst.len()`
    /// bytes of a pitch plane (`cuMemcpyDtoH`), or the whole single plane of
    /// an array frame, rows packed (`cuMemcpy3D`; `dst` must be exactly
    /// width x channels x element size x height bytes).
    pub fn copy_plane_to_host(&self, i: usize, dst: &mut [u8]) -> Result<(), Error> {
        if self.frame_type() == EglFrameType::Array && i == 0 {
            return self.copy_array(dst.as_mut_ptr(), dst.len(), true);
        }
        let src = self.plane_range(i, dst.len())?;
        // SAFETY: `dst` is a writable slice of `dst.len()` bytes, the length passed; `src..src+len`
        // lies inside the plane of the registered image (`plane_range`).
        unsafe { call::cuMemcpyDtoH(Bind(self.ctx), dst.as_mut_ptr().cast(), src, dst.len()) }
    }

    /// Copies `src` into plane `i` and returns when the bytes have landed:
    /// the start of a pitch plane (`cuMemcpyHtoD`), or the whole single
    /// plane of an array frame (`cuMemcpy3D`, as for
    /// [`copy_plane_to_host`](Self::copy_plane_to_host)), then
    /// `cuStreamSynchronize` on the legacy default stream the copy used.
    ///
    /// A copy from pageable host memory may return once the source is
    /// staged (CUDA's memcpy synchronisation rules); measured on an H100
    /// (driver 580.159, GL texture, 2026-11-25): GL read the texture right
    /// after the copy returned and did not see the bytes, so the EGL side
    /// would otherwise read stale pixels.
    pub fn copy_plane_from_host(&self, i: usize, src: &[u8]) -> Result<(), Error> {
        if self.frame_type() == EglFrameType::Array && i == 0 {
            // The copy only reads through this pointer (host -> array).
            self.copy_array(src.as_ptr().cast_mut(), src.len(), false)?;
        } else {
            let dst = self.plane_range(i, src.len())?;
            // SAFETY: `src` is a readable slice of `src.len()` bytes, the length passed;
            // `dst..dst+len` lies inside the plane of the registered image (`plane_range`).
            unsafe { call::cuMemcpyHtoD(Bind(self.ctx), dst, src.as_ptr().cast(), src.len()) }?;
        }
        // The NULL stream is the legacy default stream of the bound
        // context, the stream both copies used.
        call::cuStreamSynchronize(Bind(self.ctx), std::ptr::null_mut())
    }
}
