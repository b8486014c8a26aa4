//! Attribute lists as std code writes them: [`BufAttrs`] / [`SyncAttrs`]
//! (no capacity parameter: room for every key the project describes, each
//! key at most once) with setters taking idiomatic values ([`BufType`],
//! [`ImageLayout`], [`BufPerm`], [`SyncPerm`]) instead of the generated C
//! names. The core's fixed-capacity `BufAttrSet<N>` / `SyncAttrSet<N>`
//! stay for no_std code; every function that takes attributes accepts
//! either, or a slice or `Vec` of attributes ([`BufAttrInput`],
//! [`SyncAttrInput`]).

use tegra_interop_core::nvsci::{BufAttr, BufAttrSet, GpuId, SyncAttr, SyncAttrSet};
use tegra_interop_sys::nvsci::{NvSciBufAttrValImageLayoutType, NvSciBufType, NvSciSyncAccessPerm};

use super::buf::{BufAttrList, BufPerm};
use super::sync::{SyncAttrList, SyncPerm};
use crate::Error;

/// What kind of buffer an NvSciBuf list describes (`Types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BufType {
    /// Plain bytes (`RawBuffer`): size and alignment only.
    RawBuffer,
    /// An image: planes, colour formats, layout.
    Image,
    /// A tensor.
    Tensor,
    /// An array of elements.
    Array,
    /// A pyramid of images.
    Pyramid,
}

impl BufType {
    /// The C value.
    pub fn raw(self) -> NvSciBufType {
        match self {
            BufType::RawBuffer => NvSciBufType::NvSciBufType_RawBuffer,
            BufType::Image => NvSciBufType::NvSciBufType_Image,
            BufType::Tensor => NvSciBufType::NvSciBufType_Tensor,
            BufType::Array => NvSciBufType::NvSciBufType_Array,
            BufType::Pyramid => NvSciBufType::NvSciBufType_Pyramid,
        }
    }
}

/// How an image's pixels are laid out in memory (`Layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageLayout {
    /// Rows one after the other, `pitch` bytes apart.
    PitchLinear,
    /// The GPU's tiled block-linear layout.
    BlockLinear,
}

impl ImageLayout {
    /// The C value.
    pub fn raw(self) -> NvSciBufAttrValImageLayoutType {
        match self {
            ImageLayout::PitchLinear => {
                NvSciBufAttrValImageLayoutType::NvSciBufImage_PitchLinearType
            }
            ImageLayout::BlockLinear => {
                NvSciBufAttrValImageLayoutType::NvSciBufImage_BlockLinearType
            }
        }
    }
}

/// What [`BufAttrs`] and [`SyncAttrs`] share (they differ in their
/// attribute type only).
macro_rules! std_attrs_common {
    ($std:ident, $set:ident, $attr:ident) => {
        impl $std {
            /// No attributes yet.
            pub fn new() -> Self {
                $std($set::new())
            }

            /// Adds any attribute (the core's type), checked by the core's
            /// rules (valid value, an input, each key once).
            pub fn set(&mut self, attr: $attr) -> Result<&mut Self, Error> {
                self.0.set(attr)?;
                Ok(self)
            }

            /// The attributes set so far.
            pub fn attrs(&self) -> &[$attr] {
                self.0.attrs()
            }

            /// How many attributes are set.
            pub fn len(&self) -> usize {
                self.0.len()
            }

            /// `true` when nothing is set.
            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }
        }
    };
}

std_attrs_common!(BufAttrs, BufAttrSet, BufAttr);
std_attrs_common!(SyncAttrs, SyncAttrSet, SyncAttr);

/// Room for every NvSciBuf key the project describes (each at most once).
const BUF_KEYS: usize = super::buf::ALL_KEYS.len();
/// Room for every NvSciSync key the project describes (each at most once).
const SYNC_KEYS: usize = super::sync::ALL_KEYS.len();

/// An NvSciBuf attribute list to be, checked as it is filled (the core's
/// rules: valid values, inputs only, each key once).
///
/// ```
/// use tegra_interop_driver::nvsci::{BufAttrs, BufPerm, BufType};
///
/// let mut wants = BufAttrs::new();
/// wants
///     .types(&[BufType::RawBuffer])?
///     .raw_size(4096)?
///     .need_cpu_access(true)?
///     .required_perm(BufPerm::ReadWrite)?;
/// assert_eq!(wants.len(), 4);
/// // A key set twice is refused.
/// assert!(wants.raw_size(8192).is_err());
/// # Ok::<(), tegra_interop_driver::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct BufAttrs(BufAttrSet<BUF_KEYS>);

impl BufAttrs {
    /// The buffer types (`Types`).
    pub fn types(&mut self, types: &[BufType]) -> Result<&mut Self, Error> {
        let raw: Vec<NvSciBufType> = types.iter().map(|t| t.raw()).collect();
        self.set(BufAttr::types(&raw)?)
    }

    /// Whether the CPU maps the buffer (`NeedCpuAccess`).
    pub fn need_cpu_access(&mut self, yes: bool) -> Result<&mut Self, Error> {
        self.set(BufAttr::NeedCpuAccess(yes))
    }

    /// The permission this participant needs (`RequiredPerm`).
    pub fn required_perm(&mut self, perm: BufPerm) -> Result<&mut Self, Error> {
        self.set(BufAttr::RequiredPerm(perm.raw()))
    }

    /// The GPUs that access the buffer (`GpuId`).
    pub fn gpus(&mut self, gpus: &[GpuId]) -> Result<&mut Self, Error> {
        self.set(BufAttr::gpu_ids(gpus)?)
    }

    /// A raw buffer's size in bytes (`RawBuffer Size`).
    pub fn raw_size(&mut self, bytes: u64) -> Result<&mut Self, Error> {
        self.set(BufAttr::RawSize(bytes))
    }

    /// A raw buffer's alignment in bytes (`RawBuffer Align`).
    pub fn raw_align(&mut self, bytes: u64) -> Result<&mut Self, Error> {
        self.set(BufAttr::RawAlign(bytes))
    }

    /// An image's layout (`Layout`).
    pub fn layout(&mut self, layout: ImageLayout) -> Result<&mut Self, Error> {
        self.set(BufAttr::Layout(layout.raw()))
    }
}

/// An NvSciSync attribute list to be (see [`BufAttrs`]).
///
/// ```
/// use tegra_interop_driver::nvsci::{SyncAttrs, SyncPerm};
///
/// let mut cpu_waiter = SyncAttrs::new();
/// cpu_waiter.need_cpu_access(true)?.required_perm(SyncPerm::WaitOnly)?;
/// let mut deterministic = SyncAttrs::new();
/// deterministic.require_deterministic_fences(true)?;
/// # Ok::<(), tegra_interop_driver::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct SyncAttrs(SyncAttrSet<SYNC_KEYS>);

impl SyncAttrs {
    /// Whether the CPU signals or waits (`NeedCpuAccess`).
    pub fn need_cpu_access(&mut self, yes: bool) -> Result<&mut Self, Error> {
        self.set(SyncAttr::NeedCpuAccess(yes))
    }

    /// What this participant does (`RequiredPerm`).
    pub fn required_perm(&mut self, perm: SyncPerm) -> Result<&mut Self, Error> {
        self.set(SyncAttr::RequiredPerm(NvSciSyncAccessPerm(perm.raw())))
    }

    /// Fences whose values follow from the signal count
    /// (`RequireDeterministicFences`).
    pub fn require_deterministic_fences(&mut self, yes: bool) -> Result<&mut Self, Error> {
        self.set(SyncAttr::RequireDeterministicFences(yes))
    }
}

mod sealed {
    pub trait Sealed {}
}

/// What [`BufModule::attr_list`](super::BufModule::attr_list) and
/// [`BufAttrList::set`] take: [`BufAttrs`], the core's `BufAttrSet<N>`, or
/// a slice or `Vec` of [`BufAttr`] (checked as [`BufAttrs::set`] checks).
pub trait BufAttrInput: sealed::Sealed {
    /// Adds the attributes to `list`.
    #[doc(hidden)]
    fn set_on(&self, list: &mut BufAttrList) -> Result<(), Error>;
}

/// What [`SyncModule::attr_list`](super::SyncModule::attr_list) and
/// [`SyncAttrList::set`] take: [`SyncAttrs`], the core's `SyncAttrSet<N>`,
/// or a slice or `Vec` of [`SyncAttr`].
pub trait SyncAttrInput: sealed::Sealed {
    /// Adds the attributes to `list`.
    #[doc(hidden)]
    fn set_on(&self, list: &mut SyncAttrList) -> Result<(), Error>;
}

macro_rules! attr_inputs {
    ($trait:ident, $list:ident, $std:ident, $set:ident, $attr:ident) => {
        impl sealed::Sealed for $std {}
        impl $trait for $std {
            fn set_on(&self, list: &mut $list) -> Result<(), Error> {
                list.set_from(&self.0)
            }
        }
        impl<const N: usize> sealed::Sealed for $set<N> {}
        impl<const N: usize> $trait for $set<N> {
            fn set_on(&self, list: &mut $list) -> Result<(), Error> {
                list.set_from(self)
            }
        }
        impl sealed::Sealed for [$attr] {}
        impl $trait for [$attr] {
            fn set_on(&self, list: &mut $list) -> Result<(), Error> {
                let mut attrs = $std::new();
                for attr in self {
                    attrs.set(attr.clone())?;
                }
                attrs.set_on(list)
            }
        }
        impl sealed::Sealed for Vec<$attr> {}
        impl $trait for Vec<$attr> {
            fn set_on(&self, list: &mut $list) -> Result<(), Error> {
                self.as_slice().set_on(list)
            }
        }
    };
}

attr_inputs!(BufAttrInput, BufAttrList, BufAttrs, BufAttrSet, BufAttr);
attr_inputs!(
    SyncAttrInput,
    SyncAttrList,
    SyncAttrs,
    SyncAttrSet,
    SyncAttr
);
