//! Reading what the NvSci libraries point us to: attribute values
//! (`Nv*AttrListGetAttrs`) and export descriptors (`Nv*AttrListIpcExport*`).
//!
//! # Safety
//!
//! The libraries hand back a pointer and a length; the table contract
//! (`Backend::from_table`, point 3) says that many bytes are readable there,
//! for the list's life (values) or until the matching free (descriptors).
//! The values are decoded by the core's `decode_pair` (its own contract:
//! the pair was just filled by the library); descriptors are copied before
//! they are freed, once ([`take_desc`], an `unsafe fn`: its caller vouches
//! for the pointer and length).
#![allow(unsafe_code)]

use std::ffi::c_void;

use super::call;
use crate::Error;

/// Reads one key of a live NvSciBuf list (`NvSciBufAttrListGetAttrs`) and
/// decodes the value the library points to.
pub(crate) fn get_buf_attr(
    api: &crate::table::NvSciBufApi,
    list: tegra_interop_sys::nvsci::NvSciBufAttrList,
    key: tegra_interop_sys::nvsci::NvSciBufAttrKey,
) -> Result<Option<tegra_interop_core::nvsci::BufAttr>, Error> {
    let mut pair = tegra_interop_sys::nvsci::NvSciBufAttrKeyValuePair {
        key,
        value: std::ptr::null(),
        len: 0,
    };
    // SAFETY: `pair` is one local key/value pair, the count passed; the library writes its value
    // pointer and length.
    unsafe { call::NvSciBufAttrListGetAttrs(api, list, &mut pair, 1) }?;
    // SAFETY: the pair was just filled by GetAttrs from a live list (held by
    // the caller) that nobody modifies during this call.
    unsafe { tegra_interop_core::nvsci::BufAttr::decode_pair(&pair) }.map_err(Error::Validation)
}

/// Reads one key of a live NvSciSync list (`NvSciSyncAttrListGetAttrs`) and
/// decodes the value the library points to.
pub(crate) fn get_sync_attr(
    api: &crate::table::NvSciSyncApi,
    list: tegra_interop_sys::nvsci::NvSciSyncAttrList,
    key: tegra_interop_sys::nvsci::NvSciSyncAttrKey,
) -> Result<Option<tegra_interop_core::nvsci::SyncAttr>, Error> {
    let mut pair = tegra_interop_sys::nvsci::NvSciSyncAttrKeyValuePair {
        attrKey: key,
        value: std::ptr::null(),
        len: 0,
    };
    // SAFETY: `pair` is one local key/value pair, the count passed; the library writes its value
    // pointer and length.
    unsafe { call::NvSciSyncAttrListGetAttrs(api, list, &mut pair, 1) }?;
    // SAFETY: as for `get_buf_attr`.
    unsafe { tegra_interop_core::nvsci::SyncAttr::decode_pair(&pair) }.map_err(Error::Validation)
}

/// Copies a library-allocated attribute-list descriptor (`len` bytes at
/// `desc`, from an `Nv*AttrListIpcExport*` call) and frees it with `free`
/// (the library's `Nv*AttrListFreeDesc`, called once; a table without it
/// leaks the descriptor).
///
/// # Safety
/// `desc` must be NULL or point to `len` readable, initialised bytes that
/// stay valid until `free` is called (what a successful export hands back),
/// and must not be freed by anyone else.
pub(crate) unsafe fn take_desc(
    desc: *mut c_void,
    len: usize,
    free: impl FnOnce(*mut c_void) -> Result<(), Error>,
) -> Vec<u8> {
    if desc.is_null() {
        return Vec::new();
    }
    // SAFETY: the caller's promise: `len` readable bytes at `desc`, valid
    // until the free below.
    let bytes = unsafe { std::slice::from_raw_parts(desc.cast::<u8>(), len) }.to_vec();
    let _ = free(desc);
    bytes
}
