//! NvSciBuf: [`BufModule`], [`BufAttrList`], [`BufObj`] and the CUDA import
//! [`NvSciMemory`].
#![allow(unsafe_code)] // calls of pointer-taking entry points, each with its `// SAFETY:` line

use std::ffi::c_void;
use std::ops::Deref;
use std::ptr::{self, NonNull};

use tegra_interop_core::nvsci::{BufAttr, BufAttrSet};
use tegra_interop_core::{
    ArrayDesc, ArrayFormat, MemoryImport, MipmappedArrayMapping, ValidationError,
};
use tegra_interop_sys::nvsci::{
    NvSciBufAttrKey, NvSciBufAttrList, NvSciBufAttrValAccessPerm, NvSciBufObj, NvSciBufType,
};

use super::attrs::BufAttrInput;
use super::common::{AttrList, BufLib, Module, Obj};
use super::version::{self};
use crate::ffi::{self, call};
use crate::{Context, Error, ExternalMemory, MappedArray};

type K = NvSciBufAttrKey;

/// Access a buffer handle grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BufPerm {
    /// `NvSciBufAccessPerm_Readonly`.
    ReadOnly,
    /// `NvSciBufAccessPerm_ReadWrite`.
    ReadWrite,
}

impl BufPerm {
    /// The C value.
    pub fn raw(self) -> NvSciBufAttrValAccessPerm {
        match self {
            BufPerm::ReadOnly => NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_Readonly,
            BufPerm::ReadWrite => NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite,
        }
    }

    /// From the C value (`None` for Auto, Invalid and unknown values).
    pub fn from_raw(raw: NvSciBufAttrValAccessPerm) -> Option<Self> {
        match raw {
            NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_Readonly => Some(BufPerm::ReadOnly),
            NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite => Some(BufPerm::ReadWrite),
            _ => None,
        }
    }
}

/// Every NvSciBuf key the project describes (`BufAttr`), read back from
/// conflict lists (only those the loaded library knows are asked for).
pub(crate) const ALL_KEYS: &[u32] = &[
    0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7, 0x9, 0xa, 0xb, 0x10000, 0x10001, 0x20000, 0x20001, 0x20002,
    0x20003, 0x20004, 0x20005, 0x20006, 0x20007, 0x20008, 0x20009, 0x2000a, 0x2000b, 0x2000c,
    0x2000d, 0x2000e, 0x2000f, 0x20010, 0x20011, 0x20012, 0x20013, 0x20014, 0x20015, 0x20016,
    0x20017,
];

/// An open NvSciBuf module (`NvSciBufModuleOpen`): see [`Module`]. Its
/// [`version`](Module::version) decides which keys are asked for: the GPU
/// cache / coherency / compression keys need 2.8.
pub type BufModule = Module<BufLib>;
/// An NvSciBuf attribute list, freed with `NvSciBufAttrListFree`: see
/// [`AttrList`].
pub type BufAttrList = AttrList<BufLib>;
/// An NvSciBuf object handle, freed with `NvSciBufObjFree`: see [`Obj`].
pub type BufObj = Obj<BufLib>;

impl Module<BufLib> {
    /// Refuses `key` when the loaded library does not know it.
    pub(crate) fn check_key(&self, key: K) -> Result<(), Error> {
        self.0.version.buf_key(key).map_err(|needed| {
            version::too_old(
                version::buf_key_name(key),
                "NvSciBuf",
                needed,
                self.0.version,
            )
        })
    }

    /// A new unreconciled list holding `attrs` (create + `SetAttrs`).
    pub fn attr_list(&self, attrs: &(impl BufAttrInput + ?Sized)) -> Result<BufAttrList, Error> {
        let mut list = self.empty_attr_list()?;
        list.set(attrs)?;
        Ok(list)
    }
}

/// Reads one key of a live list (`NvSciBufAttrListGetAttrs`). The library
/// refuses output-only keys on unreconciled lists and input-only keys
/// (`RequiredPerm`) on reconciled ones: refused here first.
fn get_attr(
    module: &BufModule,
    list: NvSciBufAttrList,
    reconciled: bool,
    key: K,
) -> Result<Option<BufAttr>, Error> {
    module.check_key(key)?;
    if reconciled && BufAttr::is_input_only_key(key) {
        return Err(Error::Unsupported {
            operation: "NvSciBufAttrListGetAttrs",
            reason: "RequiredPerm is input-only: a reconciled list has ActualPerm instead",
        });
    }
    if !reconciled && BufAttr::is_output_only_key(key) {
        return Err(Error::Unsupported {
            operation: "NvSciBufAttrListGetAttrs",
            reason: "an output-only key is only in reconciled lists",
        });
    }
    // `list` is live (held by the caller).
    ffi::get_buf_attr(module.api(), list, key)
}

impl AttrList<BufLib> {
    /// Adds `attrs` (`NvSciBufAttrListSetAttrs`); checked by the core first.
    ///
    /// A key the loaded library does not know is refused before the call
    /// ([`Error::NotInLibraryVersion`]).
    pub fn set(&mut self, attrs: &(impl BufAttrInput + ?Sized)) -> Result<(), Error> {
        attrs.set_on(self)
    }

    /// [`set`](Self::set) for the core's fixed-capacity set.
    pub(crate) fn set_from<const N: usize>(&mut self, attrs: &BufAttrSet<N>) -> Result<(), Error> {
        for attr in attrs.attrs() {
            self.module.check_key(attr.key())?;
        }
        let mut pairs = attrs.lower()?;
        if pairs.is_empty() {
            return Ok(());
        }
        // SAFETY: `pairs` is a slice of `pairs.len()` pairs, the count passed, pointing into
        // `attrs`, which outlives the call; the library only reads them; the list is live and ours
        // (`&mut`).
        unsafe {
            call::NvSciBufAttrListSetAttrs(
                self.module.api(),
                self.raw,
                pairs.as_mut_ptr(),
                pairs.len(),
            )
        }
    }

    /// The value of `key`, if set (`NvSciBufAttrListGetAttrs`).
    pub fn get(&self, key: K) -> Result<Option<BufAttr>, Error> {
        get_attr(&self.module, self.raw, self.reconciled, key)
    }
}

/// One image plane, as the reconciled attribute list describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImagePlane {
    /// Plane index.
    pub index: usize,
    /// Width in pixels.
    pub width: u32,
    /// Height in rows.
    pub height: u32,
    /// Bytes per row (`PlanePitch`).
    pub pitch: u32,
    /// Byte offset of the plane in the buffer (`PlaneOffset`).
    pub offset: u64,
    /// Bits per pixel (`PlaneBitsPerPixel`).
    pub bits_per_pixel: u32,
    /// Channels per pixel (`PlaneChannelCount`).
    pub channels: u8,
    /// Bytes the plane occupies (`PlaneAlignedSize`).
    pub aligned_size: u64,
}

impl ImagePlane {
    /// The CUDA array descriptor of this plane: `width x height`, the
    /// channel count, and an unsigned-integer format of
    /// `bits_per_pixel / channels` bits (8, 16 or 32). Use
    /// [`array_desc_as`](Self::array_desc_as) for float or signed planes.
    pub fn array_desc(&self) -> Result<ArrayDesc, Error> {
        let channels = u32::from(self.channels);
        let bits = self
            .bits_per_pixel
            .checked_div(channels)
            .filter(|b| b * channels == self.bits_per_pixel);
        let format = match bits {
            Some(8) => ArrayFormat::U8,
            Some(16) => ArrayFormat::U16,
            Some(32) => ArrayFormat::U32,
            _ => {
                return Err(Error::Unsupported {
                    operation: "ImagePlane::array_desc",
                    reason: "the plane's bits per channel are not 8, 16 or 32",
                })
            }
        };
        self.array_desc_as(format)
    }

    /// The descriptor with an explicit element format (its channel size
    /// must match the plane's bits per channel).
    pub fn array_desc_as(&self, format: ArrayFormat) -> Result<ArrayDesc, Error> {
        let channels = u32::from(self.channels);
        if u64::from(self.bits_per_pixel) != format.channel_bytes() * 8 * u64::from(channels) {
            return Err(Error::Unsupported {
                operation: "ImagePlane::array_desc_as",
                reason: "the format's channel size does not match the plane's bits per pixel",
            });
        }
        Ok(ArrayDesc::new_2d(
            self.width as usize,
            self.height as usize,
            format,
            channels,
        )?)
    }

    /// The mipmapped-array mapping of this plane: its descriptor at its
    /// offset, one level (NvSciBuf memory allows only one).
    pub fn mapping(&self) -> Result<MipmappedArrayMapping, Error> {
        Ok(MipmappedArrayMapping::new(
            self.offset,
            self.array_desc()?,
            1,
        ))
    }
}

fn missing(operation: &'static str, reason: &'static str) -> Error {
    Error::Unsupported { operation, reason }
}

impl Obj<BufLib> {
    /// Another handle with at most `perm` (`NvSciBufObjDupWithReducePerm`).
    pub fn dup_with_reduced_perm(&self, perm: BufPerm) -> Result<BufObj, Error> {
        let mut raw: NvSciBufObj = ptr::null_mut();
        // SAFETY: `raw` is a local the library writes one object handle to.
        unsafe {
            call::NvSciBufObjDupWithReducePerm(self.module.api(), self.raw, perm.raw(), &mut raw)
        }?;
        Ok(BufObj::from_raw(self.module.clone(), raw))
    }

    /// The value of `key` in the object's reconciled attribute list.
    pub fn attr(&self, key: K) -> Result<Option<BufAttr>, Error> {
        let list = self.raw_attr_list()?;
        get_attr(&self.module, list, true, key)
    }

    fn attrs(&self, keys: &[K]) -> Result<Vec<Option<BufAttr>>, Error> {
        let list = self.raw_attr_list()?;
        keys.iter()
            .map(|k| get_attr(&self.module, list, true, *k))
            .collect()
    }

    /// The buffer types (`Types`).
    pub fn types(&self) -> Result<Vec<NvSciBufType>, Error> {
        match self.attr(K::NvSciBufGeneralAttrKey_Types)? {
            Some(BufAttr::Types(t)) => Ok(t.to_vec()),
            _ => Err(missing("BufObj::types", "the reconciled list has no Types")),
        }
    }

    /// The size in bytes, from the object's attributes: `RawBuffer Size`
    /// for a raw buffer, `Image Size` for an image (only the keys of the
    /// buffer's own `Types` are read).
    pub fn size(&self) -> Result<u64, Error> {
        let types = self.types()?;
        let has = |t: NvSciBufType| types.contains(&t);
        let raw = if has(NvSciBufType::NvSciBufType_RawBuffer) {
            match self.attr(K::NvSciBufRawBufferAttrKey_Size)? {
                Some(BufAttr::RawSize(s)) => Some(s),
                _ => None,
            }
        } else {
            None
        };
        let image = if has(NvSciBufType::NvSciBufType_Image) {
            match self.attr(K::NvSciBufImageAttrKey_Size)? {
                Some(BufAttr::ImageSize(s)) => Some(s),
                _ => None,
            }
        } else {
            None
        };
        raw.max(image).ok_or_else(|| {
            missing(
                "BufObj::size",
                "the reconciled list has neither RawBuffer Size nor Image Size",
            )
        })
    }

    /// The alignment in bytes (`RawBuffer Align` or `Image Alignment`, the
    /// keys of the buffer's own `Types`).
    pub fn alignment(&self) -> Result<u64, Error> {
        let types = self.types()?;
        let raw = if types.contains(&NvSciBufType::NvSciBufType_RawBuffer) {
            match self.attr(K::NvSciBufRawBufferAttrKey_Align)? {
                Some(BufAttr::RawAlign(a)) => Some(a),
                _ => None,
            }
        } else {
            None
        };
        let image = if types.contains(&NvSciBufType::NvSciBufType_Image) {
            match self.attr(K::NvSciBufImageAttrKey_Alignment)? {
                Some(BufAttr::ImageAlignment(a)) => Some(a),
                _ => None,
            }
        } else {
            None
        };
        raw.max(image)
            .ok_or_else(|| missing("BufObj::alignment", "the reconciled list has no alignment"))
    }

    /// This handle's permission (`ActualPerm`).
    pub fn actual_perm(&self) -> Result<BufPerm, Error> {
        match self.attr(K::NvSciBufGeneralAttrKey_ActualPerm)? {
            Some(BufAttr::ActualPerm(p)) => {
                BufPerm::from_raw(p).ok_or(Error::Validation(ValidationError::InvalidPerm {
                    raw: u64::from(p.0),
                }))
            }
            _ => Err(missing(
                "BufObj::actual_perm",
                "the reconciled list has no ActualPerm",
            )),
        }
    }

    /// The image planes (`PlaneCount` and the per-plane output keys).
    pub fn image_planes(&self) -> Result<Vec<ImagePlane>, Error> {
        let keys = [
            K::NvSciBufImageAttrKey_PlaneCount,
            K::NvSciBufImageAttrKey_PlaneWidth,
            K::NvSciBufImageAttrKey_PlaneHeight,
            K::NvSciBufImageAttrKey_PlanePitch,
            K::NvSciBufImageAttrKey_PlaneOffset,
            K::NvSciBufImageAttrKey_PlaneBitsPerPixel,
            K::NvSciBufImageAttrKey_PlaneChannelCount,
            K::NvSciBufImageAttrKey_PlaneAlignedSize,
        ];
        let v = self.attrs(&keys)?;
        let no = || {
            missing(
                "BufObj::image_planes",
                "the reconciled list lacks an image plane key",
            )
        };
        let count = match v.first() {
            Some(Some(BufAttr::PlaneCount(n))) => *n as usize,
            _ => return Err(no()),
        };
        macro_rules! planes {
            ($i:expr, $variant:ident) => {
                match v.get($i) {
                    Some(Some(BufAttr::$variant(p))) if p.len() == count => p.clone(),
                    _ => return Err(no()),
                }
            };
        }
        let (w, h, pitch, off) = (
            planes!(1, PlaneWidth),
            planes!(2, PlaneHeight),
            planes!(3, PlanePitch),
            planes!(4, PlaneOffset),
        );
        let (bpp, ch, size) = (
            planes!(5, PlaneBitsPerPixel),
            planes!(6, PlaneChannelCount),
            planes!(7, PlaneAlignedSize),
        );
        Ok((0..count)
            .map(|i| ImagePlane {
                index: i,
                width: w[i],
                height: h[i],
                pitch: pitch[i],
                offset: off[i],
                bits_per_pixel: bpp[i],
                channels: ch[i],
                aligned_size: size[i],
            })
            .collect())
    }

    /// The CPU address of the buffer (`NvSciBufObjGetCpuPtr`; needs
    /// `NeedCpuAccess` and a read-write handle). Reading or writing through
    /// it is `unsafe`: the GPU and other processes may access the same
    /// bytes, so the caller orders accesses with fences.
    pub fn cpu_ptr(&self) -> Result<NonNull<u8>, Error> {
        let mut p: *mut c_void = ptr::null_mut();
        // SAFETY: `p` is a local the library writes one pointer to.
        unsafe { call::NvSciBufObjGetCpuPtr(self.module.api(), self.raw, &mut p) }?;
        NonNull::new(p.cast()).ok_or(Error::NvSci {
            call: "NvSciBufObjGetCpuPtr",
            code: tegra_interop_core::NvSciError::BAD_ADDRESS,
        })
    }

    /// The read-only CPU address (`NvSciBufObjGetConstCpuPtr`).
    pub fn const_cpu_ptr(&self) -> Result<NonNull<u8>, Error> {
        let mut p: *const c_void = ptr::null();
        // SAFETY: `p` is a local the library writes one pointer to.
        unsafe { call::NvSciBufObjGetConstCpuPtr(self.module.api(), self.raw, &mut p) }?;
        NonNull::new(p.cast_mut().cast()).ok_or(Error::NvSci {
            call: "NvSciBufObjGetConstCpuPtr",
            code: tegra_interop_core::NvSciError::BAD_ADDRESS,
        })
    }

    /// Writes back CPU caches for `[offset, offset + len)`
    /// (`NvSciBufObjFlushCpuCacheRange`).
    pub fn flush_cpu_cache_range(&self, offset: u64, len: u64) -> Result<(), Error> {
        // The library checks the range.
        call::NvSciBufObjFlushCpuCacheRange(self.module.api(), self.raw, offset, len)
    }

    /// Imports the buffer into `ctx` as CUDA external memory (`NVSCIBUF`)
    /// with the size read from the object, never from the caller. The
    /// import holds its own handle to the object ([`BufObj::dup`]).
    pub fn import_cuda(&self, ctx: &Context) -> Result<NvSciMemory, Error> {
        let size = self.size()?;
        let obj = self.dup()?;
        let import = MemoryImport::nvscibuf(obj.raw.cast_const().cast(), size)?;
        // `obj` is a live NvSciBufObj (held by the returned value, and until
        // the end of this call) and `size` is its own size.
        let memory = ExternalMemory::import_desc(ctx, &import)?;
        Ok(NvSciMemory { memory, obj })
    }
}

/// An NvSciBuf object imported into a CUDA context: the external memory
/// (through `Deref`, so `map_buffer` / `map_whole` work) plus its own
/// handle to the object. Dropping it destroys the import, then frees the
/// handle.
pub struct NvSciMemory {
    memory: ExternalMemory,
    obj: BufObj,
}

impl std::fmt::Debug for NvSciMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvSciMemory")
            .field("memory", &self.memory)
            .field("obj", &self.obj)
            .finish()
    }
}

impl Deref for NvSciMemory {
    type Target = ExternalMemory;
    fn deref(&self) -> &Self::Target {
        &self.memory
    }
}

impl NvSciMemory {
    /// The object it was imported from.
    pub fn object(&self) -> &BufObj {
        &self.obj
    }

    /// Maps image plane `index` as a CUDA mipmapped array of one level,
    /// the descriptor derived from the plane's attributes
    /// ([`ImagePlane::mapping`]).
    pub fn map_plane(&self, index: usize) -> Result<MappedArray, Error> {
        let planes = self.obj.image_planes()?;
        let plane =
            planes
                .get(index)
                .ok_or(Error::Validation(ValidationError::IndexOutOfRange {
                    index,
                    len: planes.len(),
                }))?;
        self.memory.map_mipmapped_array(plane.mapping()?)
    }

    /// Maps plane `index` with an explicit element format.
    pub fn map_plane_as(&self, index: usize, format: ArrayFormat) -> Result<MappedArray, Error> {
        let planes = self.obj.image_planes()?;
        let plane =
            planes
                .get(index)
                .ok_or(Error::Validation(ValidationError::IndexOutOfRange {
                    index,
                    len: planes.len(),
                }))?;
        let mapping = MipmappedArrayMapping::new(plane.offset, plane.array_desc_as(format)?, 1);
        self.memory.map_mipmapped_array(mapping)
    }

    /// Destroys the import now (`cuDestroyExternalMemory`) and reports the
    /// driver's answer; the object handle is freed afterwards.
    pub fn destroy(self) -> Result<(), Error> {
        let NvSciMemory { memory, obj } = self;
        let r = memory.destroy();
        drop(obj);
        r
    }
}
