//! EGL images registered with CUDA (`cuGraphicsEGLRegisterImage`,
//! `cuGraphicsResourceGetMappedEglFrame`, `cuGraphicsUnregisterResource`).
//!
//! The simulator has no EGL library: a test makes an image with
//! [`Sim::create_egl_image`](crate::Sim::create_egl_image) (the role
//! `eglCreateImageKHR` plays on a real system) and hands its
//! [`SimEglImage::as_raw`] to the driver. The image's planes live in one
//! memfd; the EGL side writes and reads them through its own mapping, CUDA
//! through the mapping `GetMappedEglFrame` makes, so both see the same bytes.
//!
//! What is modelled, and its source:
//! - after a registration CUDA sees zeros, while the EGL side still sees its
//!   own earlier bytes; the EGL side's first access after the registration
//!   puts those bytes into the shared storage, overwriting whatever CUDA
//!   wrote since; from then on each side sees the other's writes (measured
//!   for a GL texture on an H100, driver 580.159, 2026-11-25,
//!   `probe_first_access_after_registration` in testkit/tests/gpu_egl.rs:
//!   CUDA write, GL read -> GL's old pixels, then CUDA read -> the same;
//!   CUDA read first -> zeros; the H200 run of 2026-11-23 had shown the
//!   zeros). The simulator applies it to every image; an access of the EGL
//!   side is [`SimEglImage::plane`] or [`SimEglImage::plane_mut`];
//! - registration needs a current context; flags are the map-resource flags
//!   (NONE, READ_ONLY, WRITE_DISCARD); anything else, an unknown image or a
//!   NULL out-pointer is refused with INVALID_VALUE (codes chosen: not
//!   measured);
//! - the mapped frame of a simulated image is a *pitch* frame (plane device
//!   pointers, one pitch for all planes, chosen: the H200 gave an *array*
//!   frame for a GL texture, which the simulator does not make); RGBA8 is one
//!   plane of 4 channels, NV12 two planes (Y, then interleaved UV at half
//!   height, 2 channels) with colour format YUV420_SEMIPLANAR;
//! - only index 0 and mip level 0 exist (else INVALID_VALUE, chosen);
//! - the frame's pointers stay valid until the resource is unregistered;
//!   copies through them afterwards are use-after-free diagnostics;
//! - `cuEventCreateFromEGLSync` is not simulated (its table entry stays
//!   `None`, as on the x86_64 driver 580.159, which does not export it:
//!   measured); EGLStreams are in `egl_stream/`.

use super::*;

/// Colour layouts a simulated EGL image can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EglImageFormat {
    /// One plane, 4 bytes per pixel (R, G, B, A).
    Rgba8,
    /// Two planes: Y (1 byte per pixel), then interleaved U/V at half width
    /// and half height (2 bytes per pair).
    Nv12,
}

/// Row pitch alignment of simulated images (chosen).
const PITCH_ALIGN: usize = 256;

/// One plane of an image: where it starts in the image's memory, its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EglPlaneLayout {
    /// Byte offset of the plane in the image's memory.
    pub offset: usize,
    /// Bytes from one row to the next.
    pub pitch: usize,
    /// Rows.
    pub rows: usize,
    /// Bytes of pixel data per row (<= pitch).
    pub row_bytes: usize,
}

/// The simulator's record of an image (the EGL side's object).
#[doc(hidden)]
pub(crate) struct EglImageObj {
    pub(crate) fd: Arc<std::os::fd::OwnedFd>,
    pub(crate) len: usize,
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) format: EglImageFormat,
    pub(crate) planes: Vec<EglPlaneLayout>,
    /// The EGL side's bytes from before the latest registration, which
    /// reach the shared storage at the EGL side's first access after it
    /// (see the module docs).
    pub(crate) egl_side: Option<Vec<u8>>,
}

/// A registered image (`CUgraphicsResource`).
pub(crate) struct EglResObj {
    pub(crate) ctx: u64,
    pub(crate) image: usize,
    /// The device address of the mapping made by GetMappedEglFrame.
    pub(crate) mapped: Option<u64>,
}

fn layout(format: EglImageFormat, width: u32, height: u32) -> Option<Vec<EglPlaneLayout>> {
    let (w, h) = (width as usize, height as usize);
    let pitch_of = |bytes: usize| {
        bytes
            .checked_add(PITCH_ALIGN - 1)
            .map(|b| b & !(PITCH_ALIGN - 1))
    };
    match format {
        EglImageFormat::Rgba8 => {
            let row = w.checked_mul(4)?;
            Some(vec![EglPlaneLayout {
                offset: 0,
                pitch: pitch_of(row)?,
                rows: h,
                row_bytes: row,
            }])
        }
        EglImageFormat::Nv12 => {
            if w % 2 != 0 || h % 2 != 0 {
                return None;
            }
            let pitch = pitch_of(w)?;
            let y_len = pitch.checked_mul(h)?;
            Some(vec![
                EglPlaneLayout {
                    offset: 0,
                    pitch,
                    rows: h,
                    row_bytes: w,
                },
                EglPlaneLayout {
                    offset: y_len,
                    pitch,
                    rows: h / 2,
                    row_bytes: w,
                },
            ])
        }
    }
}

/// An EGL image made by the simulator (the EGL side): hand
/// [`as_raw`](Self::as_raw) to CUDA; read and write its planes with
/// [`plane`](Self::plane) / [`plane_mut`](Self::plane_mut).
pub struct SimEglImage {
    inner: Arc<Instance>,
    handle: usize,
    region: Region,
    /// The address of the image's first byte in `region`.
    base: usize,
    planes: Vec<EglPlaneLayout>,
}

impl std::fmt::Debug for SimEglImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimEglImage")
            .field("handle", &self.handle)
            .field("planes", &self.planes)
            .finish()
    }
}

impl SimEglImage {
    /// The handle CUDA gets (`EGLImageKHR`).
    pub fn as_raw(&self) -> EGLImageKHR {
        self.handle as EGLImageKHR
    }

    /// The planes' layout.
    pub fn planes(&self) -> &[EglPlaneLayout] {
        &self.planes
    }

    /// The bytes of plane `i` (all its rows, pitch included). An access of
    /// the EGL side: the first one after a registration first puts the EGL
    /// side's earlier bytes into the shared storage (see the module docs).
    pub fn plane(&self, i: usize) -> Option<&[u8]> {
        self.egl_side_access();
        let p = self.planes.get(i)?;
        self.region.bytes(self.base + p.offset, p.pitch * p.rows)
    }

    /// The bytes of plane `i`, writable (an access of the EGL side, as
    /// [`plane`](Self::plane)).
    pub fn plane_mut(&mut self, i: usize) -> Option<&mut [u8]> {
        self.egl_side_access();
        let p = *self.planes.get(i)?;
        self.region
            .bytes_mut(self.base + p.offset, p.pitch * p.rows)
    }

    /// The EGL side's first access after a registration: its bytes from
    /// before the registration replace the shared storage's (CUDA's
    /// writes since the registration are lost), as measured.
    fn egl_side_access(&self) {
        let pending = self
            .inner
            .lock_state()
            .egl_images
            .get_mut(&self.handle)
            .and_then(|img| img.egl_side.take());
        if let Some(bytes) = pending {
            self.region.write_at(self.base, &bytes);
        }
    }
}

impl Drop for SimEglImage {
    /// `eglDestroyImageKHR`: an image still registered with CUDA is a
    /// misuse (what the real driver does then is not known).
    fn drop(&mut self) {
        let inst = &self.inner;
        let registered = {
            let mut st = inst.lock_state();
            st.egl_images.remove(&self.handle);
            st.egl_resources.values().any(|r| r.image == self.handle)
        };
        if registered {
            inst.diag(
                None,
                "eglDestroyImageKHR",
                D::Misuse,
                "an EGL image destroyed while still registered with CUDA (unregister first)".into(),
            );
        }
        let _ = &self.region;
    }
}

static NEXT_IMAGE: AtomicUsize = AtomicUsize::new(0x1e9a_0000);

impl crate::Sim {
    /// Makes an EGL image of `width` x `height` pixels in `format` (the
    /// simulator's stand-in for `eglCreateImageKHR`); `None` for a size of 0,
    /// an odd NV12 size or memory that cannot be had.
    pub fn create_egl_image(
        &self,
        format: EglImageFormat,
        width: u32,
        height: u32,
    ) -> Option<SimEglImage> {
        if width == 0 || height == 0 {
            return None;
        }
        let planes = layout(format, width, height)?;
        let len = planes.last().map(|p| p.offset + p.pitch * p.rows)?;
        let fd = shm::memfd(c"tegra-interop-sim:egl-image", len as u64).ok()?;
        let (region, base) = Region::map_file(fd.as_fd(), len as u64, 0, len).ok()?;
        let handle = NEXT_IMAGE.fetch_add(0x100, Ordering::Relaxed);
        self.inner.lock_state().egl_images.insert(
            handle,
            EglImageObj {
                fd: Arc::new(fd),
                len,
                width,
                height,
                format,
                planes: planes.clone(),
                egl_side: None,
            },
        );
        Some(SimEglImage {
            inner: Arc::clone(&self.inner),
            handle,
            region,
            base: base as usize,
            planes,
        })
    }
}

pub(crate) fn cuGraphicsEGLRegisterImage(
    c: &Call,
    out: CMut<CUgraphicsResource>,
    image: Handle<EGLImageKHR>,
    flags: c_uint,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let ctx = current_ctx(c, &st)?;
        if out.is_null() || flags > 2 {
            return Err(INVALID_VALUE);
        }
        let Some(img) = st.egl_images.get(&(image.addr())) else {
            c.diag(
                D::UnknownHandle,
                format!(
                    "{:#x} is not an EGL image of this simulator (Sim::create_egl_image)",
                    image.addr()
                ),
            );
            return Err(INVALID_VALUE);
        };
        // Measured (see the module docs): CUDA sees zeros until the EGL
        // side's first access after the registration, which brings the EGL
        // side's earlier bytes (kept here) into the shared storage.
        let (fd, len) = (Arc::clone(&img.fd), img.len);
        let (region, p) =
            Region::map_file(fd.as_fd(), len as u64, 0, len).map_err(|_| OUT_OF_MEMORY)?;
        let mut before = vec![0u8; len];
        if !region.read_at(p as usize, &mut before) {
            return Err(OUT_OF_MEMORY);
        }
        region.fill_at(p as usize, 0, len);
        drop(region);
        if let Some(img) = st.egl_images.get_mut(&(image.addr())) {
            img.egl_side = Some(before);
        }
        let h = new_handle(Tag::GraphicsResource);
        st.egl_resources.insert(
            h,
            EglResObj {
                ctx,
                image: image.addr(),
                mapped: None,
            },
        );
        out.write(h as CUgraphicsResource);
        Ok(())
    })();
    done(r)
}

fn resource(c: &Call, st: &State, res: Handle<CUgraphicsResource>) -> R<u64> {
    let h = res.addr() as u64;
    if st.egl_resources.contains_key(&h) {
        return Ok(h);
    }
    if st.gone.contains_key(&h) {
        return Err(not_live(
            c,
            st,
            "graphics resource",
            h,
            false,
            INVALID_HANDLE,
        ));
    }
    c.diag(
        D::UnknownHandle,
        format!("{h:#x} is not a registered graphics resource"),
    );
    Err(INVALID_HANDLE)
}

pub(crate) fn cuGraphicsResourceGetMappedEglFrame(
    c: &Call,
    frame: CMut<CUeglFrame>,
    res: Handle<CUgraphicsResource>,
    index: c_uint,
    mip: c_uint,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        if let Some(f) = held_frame(&st, res.addr() as u64) {
            // A frame acquired from an EGLStream (see egl_stream.rs).
            if index != 0 || mip != 0 {
                return Err(INVALID_VALUE);
            }
            return put(frame, f);
        }
        let h = resource(c, &st, res)?;
        if frame.is_null() || index != 0 || mip != 0 {
            return Err(INVALID_VALUE);
        }
        let (ctx, image, mapped) = {
            let r = &st.egl_resources[&h];
            (r.ctx, r.image, r.mapped)
        };
        let Some(img) = st.egl_images.get(&image) else {
            c.diag(
                D::UseAfterDestroy,
                "the registered EGL image was destroyed".into(),
            );
            return Err(INVALID_VALUE);
        };
        let (fd, len) = (Arc::clone(&img.fd), img.len);
        let (width, height, format, planes) =
            (img.width, img.height, img.format, img.planes.clone());
        let base = match mapped {
            Some(b) => b,
            None => {
                let (region, p) =
                    Region::map_file(fd.as_fd(), len as u64, 0, len).map_err(|_| OUT_OF_MEMORY)?;
                let b = st.add_allocation(p, ctx, len, AllocKind::Mapped, region);
                if let Some(r) = st.egl_resources.get_mut(&h) {
                    r.mapped = Some(b);
                }
                b
            }
        };
        let mut f = CUeglFrame::default();
        let mut ptrs = [core::ptr::null_mut::<c_void>(); 3];
        for (slot, p) in ptrs.iter_mut().zip(&planes) {
            *slot = (base + p.offset as u64) as usize as *mut c_void;
        }
        f.frame.pPitch = ptrs;
        f.width = width;
        f.height = height;
        f.depth = 1;
        f.pitch = planes.first().map_or(0, |p| p.pitch as u32);
        f.planeCount = planes.len() as u32;
        f.frameType = CUeglFrameType::CU_EGL_FRAME_TYPE_PITCH;
        f.cuFormat = CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8;
        match format {
            EglImageFormat::Rgba8 => {
                f.numChannels = 4;
                f.eglColorFormat = CUeglColorFormat::CU_EGL_COLOR_FORMAT_RGBA;
            }
            EglImageFormat::Nv12 => {
                f.numChannels = 2;
                f.eglColorFormat = CUeglColorFormat::CU_EGL_COLOR_FORMAT_YUV420_SEMIPLANAR;
            }
        }
        frame.write(f);
        Ok(())
    })();
    done(r)
}

pub(crate) fn cuGraphicsUnregisterResource(c: &Call, res: Handle<CUgraphicsResource>) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let h = resource(c, &st, res)?;
        if let Some(r) = st.egl_resources.remove(&h) {
            if let Some(b) = r.mapped {
                st.allocations.remove(&b);
                st.gone.insert(b, GoneWhy::Destroyed);
            }
        }
        st.gone.insert(h, GoneWhy::Destroyed);
        Ok(())
    })();
    done(r)
}
