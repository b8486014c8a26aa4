//! What NvSciBuf and NvSciSync share, written once: the module
//! ([`Module`]), attribute lists ([`AttrList`]) and objects ([`Obj`]), with
//! their ownership (reference-counted module, each list and object freed
//! once), reconciliation with conflict keys, allocation and duplication.
//! The per-library differences (entry points, handle and key types, which
//! keys a version knows) are the [`Library`] trait, implemented by
//! [`BufLib`] and [`SyncLib`]; `BufModule` is `Module<BufLib>`, and so on.
//! What only one library has lives in `impl Module<BufLib>` (buf.rs) or
//! `impl Module<SyncLib>` (sync.rs) blocks.
#![allow(unsafe_code)] // calls of pointer-taking entry points, each with its `// SAFETY:` line

use std::fmt;
use std::ptr;
use std::sync::Arc;

use super::version::NvSciVersion;
use super::ReconcileError;
use crate::ffi::call;
use crate::table::{HasLoaderNotes, NvSciBufApi, NvSciSyncApi};
use crate::{Backend, Error};

mod sealed {
    pub trait Sealed {}
}

/// The C types of one NvSci library (sealed: [`BufLib`] and [`SyncLib`]),
/// what the public API names: the handles `as_raw` hands back and the
/// attribute key.
pub trait LibraryTypes: sealed::Sealed + Sized + 'static {
    /// The C module handle.
    type RawModule: Copy + fmt::Debug;
    /// The C attribute-list handle.
    type RawList: Copy + fmt::Debug;
    /// The C object handle.
    type RawObj: Copy + fmt::Debug;
    /// The C attribute key.
    type Key: Copy + PartialEq + fmt::Debug;
    /// `"NvSciBuf"` / `"NvSciSync"`.
    const NAME: &'static str;
}

/// The library's raw operations: entry points called on raw handles, whose
/// soundness rests on the handles being live and owned as the shared types
/// keep them. Crate-private, so that neither `BufLib::obj_free(..)` nor a
/// generic `L::obj_free(..)` over `L: Library` can be written outside this
/// crate (a sealed public trait would stop implementations, not calls).
pub(crate) trait RawOps: LibraryTypes {
    /// The table struct of the library's entry points.
    type Api: HasLoaderNotes + 'static;
    /// The Rust names of the module, list and object types (for `Debug`).
    const TYPE_NAMES: [&'static str; 3];

    fn api(backend: &Backend) -> &Self::Api;
    fn probe_version(api: &Self::Api) -> NvSciVersion;
    fn module_open(api: &Self::Api) -> Result<Self::RawModule, Error>;
    fn module_close(api: &Self::Api, raw: Self::RawModule);
    fn list_create(api: &Self::Api, module: Self::RawModule) -> Result<Self::RawList, Error>;
    fn list_free(api: &Self::Api, raw: Self::RawList);
    fn list_is_null(raw: Self::RawList) -> bool;
    fn list_is_set(api: &Self::Api, raw: Self::RawList, key: Self::Key) -> bool;
    /// Reconciles `lists`; the result and the conflict list (either may be
    /// NULL).
    fn reconcile(
        api: &Self::Api,
        lists: &[Self::RawList],
    ) -> (Result<Self::RawList, Error>, Self::RawList);
    /// Reconciles and allocates; the object and the conflict list.
    fn reconcile_and_alloc(
        api: &Self::Api,
        lists: &[Self::RawList],
    ) -> (Result<Self::RawObj, Error>, Self::RawList);
    fn obj_alloc(api: &Self::Api, list: Self::RawList) -> Result<Self::RawObj, Error>;
    fn obj_free(api: &Self::Api, raw: Self::RawObj);
    fn obj_dup(api: &Self::Api, raw: Self::RawObj) -> Result<Self::RawObj, Error>;
    /// The object's reconciled list (owned by the object).
    fn obj_attr_list(api: &Self::Api, raw: Self::RawObj) -> Result<Self::RawList, Error>;
    /// The keys asked for in a conflict list: the keys the project
    /// describes that `version` knows (and that can be in conflict).
    fn conflict_keys(version: NvSciVersion) -> impl Iterator<Item = Self::Key>;
}

/// One NvSci library as the shared types see it (sealed: [`BufLib`] and
/// [`SyncLib`]). Its C types are [`LibraryTypes`]; its raw operations are
/// a crate-private supertrait, not callable from outside this crate.
// `RawOps` is crate-private on purpose (a bound users cannot name, so they
// cannot call its raw operations); the lint warns about exactly that.
#[allow(private_bounds)]
pub trait Library: RawOps {}

/// The open module and what closes it.
pub(crate) struct ModuleInner<L: Library> {
    pub(crate) backend: Arc<Backend>,
    pub(crate) raw: L::RawModule,
    pub(crate) version: NvSciVersion,
}

// SAFETY: the module handle may be used from any thread: NvSciBuf and
// NvSciSync serialise access to a module internally.
#[allow(unsafe_code)]
unsafe impl<L: Library> Send for ModuleInner<L> {}
// SAFETY: `&ModuleInner` only makes calls the library serialises.
#[allow(unsafe_code)]
unsafe impl<L: Library> Sync for ModuleInner<L> {}

impl<L: Library> Drop for ModuleInner<L> {
    fn drop(&mut self) {
        // Opened by us; every list, object (and fence, wait context) made
        // from it is gone (they hold this Arc); closed once.
        L::module_close(L::api(&self.backend), self.raw);
    }
}

/// An open NvSci module (`NvSciBufModuleOpen` / `NvSciSyncModuleOpen`),
/// shared by reference counting: every list and object (and, for
/// NvSciSync, every fence and wait context) keeps it open.
pub struct Module<L: Library>(pub(crate) Arc<ModuleInner<L>>);

impl<L: Library> Clone for Module<L> {
    fn clone(&self) -> Self {
        Module(Arc::clone(&self.0))
    }
}

impl<L: Library> fmt::Debug for Module<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(L::TYPE_NAMES[0])
            .field("backend", &self.0.backend.name())
            .field("raw", &self.0.raw)
            .field("version", &self.0.version)
            .finish()
    }
}

impl<L: Library> Module<L> {
    /// Opens a module (`Nv*ModuleOpen`). The library's version is read first
    /// (see [`version`](Self::version)).
    ///
    /// # Errors
    /// [`Error::NotSupported`] naming the library when it is absent (any
    /// machine but a Jetson / DRIVE, or a simulator without NvSci);
    /// [`Error::NvSci`] when the call fails.
    pub fn open(backend: &Arc<Backend>) -> Result<Self, Error> {
        let api = L::api(backend);
        // The probe makes no call when the library is absent; the open then
        // reports it.
        let version = L::probe_version(api);
        let raw = L::module_open(api)?;
        crate::logging::info!(
            target: crate::logging::NVSCI,
            "{} module opened on backend {:?}: library version {version}",
            L::NAME,
            backend.name()
        );
        Ok(Module(Arc::new(ModuleInner {
            backend: Arc::clone(backend),
            raw,
            version,
        })))
    }

    /// The loaded library's version (probed with
    /// `Nv*CheckVersionCompatibility` when the module was opened). Keys and
    /// entry points it lacks are refused with [`Error::NotInLibraryVersion`]
    /// before any call.
    pub fn version(&self) -> NvSciVersion {
        self.0.version
    }

    pub(crate) fn api(&self) -> &L::Api {
        L::api(&self.0.backend)
    }

    /// The backend it calls through.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.0.backend
    }

    /// The raw module (still owned by this value).
    pub fn as_raw(&self) -> L::RawModule {
        self.0.raw
    }

    pub(crate) fn same(&self, other: &Module<L>) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// A new, empty, unreconciled attribute list (`Nv*AttrListCreate`).
    pub fn empty_attr_list(&self) -> Result<AttrList<L>, Error> {
        let raw = L::list_create(self.api(), self.0.raw)?;
        Ok(AttrList::wrap(self.clone(), raw, false))
    }

    /// The lists' raw handles, refused when there is none or they belong to
    /// different modules.
    fn raw_lists(&self, lists: &[&AttrList<L>]) -> Result<Vec<L::RawList>, Error> {
        if lists.is_empty() || lists.iter().any(|l| !self.same(&l.module)) {
            return Err(Error::Unsupported {
                operation: "NvSci reconciliation",
                reason: "no attribute list given, or lists of different modules",
            });
        }
        Ok(lists.iter().map(|l| l.raw).collect())
    }

    /// The keys set in a conflict list (which is freed).
    fn conflicts(&self, conflict: L::RawList) -> Vec<L::Key> {
        if L::list_is_null(conflict) {
            return Vec::new();
        }
        let list = AttrList::wrap(self.clone(), conflict, false);
        L::conflict_keys(self.0.version)
            .filter(|k| list.is_set(*k))
            .collect()
    }

    /// Frees a conflict list the library handed back with a success.
    fn free_conflict(&self, conflict: L::RawList) {
        if !L::list_is_null(conflict) {
            drop(AttrList::wrap(self.clone(), conflict, false));
        }
    }

    /// Reconciles the participants' lists (`Nv*AttrListReconcile`; for
    /// NvSciSync exactly one signaller and at least one waiter); on failure,
    /// the keys in conflict.
    pub fn reconcile(&self, lists: &[&AttrList<L>]) -> Result<AttrList<L>, ReconcileError<L::Key>> {
        let raws = self.raw_lists(lists)?;
        // `raws` holds live lists of this module (borrowed for the call).
        match L::reconcile(self.api(), &raws) {
            (Ok(out), conflict) => {
                self.free_conflict(conflict);
                Ok(AttrList::wrap(self.clone(), out, true))
            }
            (Err(error), conflict) => Err(ReconcileError {
                error,
                conflicts: self.conflicts(conflict),
            }),
        }
    }

    /// Reconciles and allocates in one call
    /// (`Nv*AttrListReconcileAndObjAlloc`).
    pub fn reconcile_and_alloc(
        &self,
        lists: &[&AttrList<L>],
    ) -> Result<Obj<L>, ReconcileError<L::Key>> {
        let raws = self.raw_lists(lists)?;
        match L::reconcile_and_alloc(self.api(), &raws) {
            (Ok(obj), conflict) => {
                self.free_conflict(conflict);
                Ok(Obj::from_raw(self.clone(), obj))
            }
            (Err(error), conflict) => Err(ReconcileError {
                error,
                conflicts: self.conflicts(conflict),
            }),
        }
    }
}

/// An NvSci attribute list (unreconciled, reconciled or a conflict list),
/// freed with `Nv*AttrListFree`.
pub struct AttrList<L: Library> {
    pub(crate) module: Module<L>,
    pub(crate) raw: L::RawList,
    pub(crate) reconciled: bool,
}

// SAFETY: the list handle may be used from any thread (the library
// serialises calls on one object); the module is `Send + Sync`.
#[allow(unsafe_code)]
unsafe impl<L: Library> Send for AttrList<L> {}
// SAFETY: `&AttrList` only reads; mutation needs `&mut`.
#[allow(unsafe_code)]
unsafe impl<L: Library> Sync for AttrList<L> {}

impl<L: Library> fmt::Debug for AttrList<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(L::TYPE_NAMES[1])
            .field("raw", &self.raw)
            .field("reconciled", &self.reconciled)
            .finish()
    }
}

impl<L: Library> AttrList<L> {
    pub(crate) fn wrap(module: Module<L>, raw: L::RawList, reconciled: bool) -> Self {
        AttrList {
            module,
            raw,
            reconciled,
        }
    }

    /// The raw list (still owned by this value).
    pub fn as_raw(&self) -> L::RawList {
        self.raw
    }

    /// The module.
    pub fn module(&self) -> &Module<L> {
        &self.module
    }

    /// `true` for the result of a reconciliation (or an imported reconciled
    /// list).
    pub fn is_reconciled(&self) -> bool {
        self.reconciled
    }

    /// Whether `key` has a value in the list (no error: `false` when it
    /// cannot be read).
    pub(crate) fn is_set(&self, key: L::Key) -> bool {
        L::list_is_set(self.module.api(), self.raw, key)
    }

    /// Allocates an object from this reconciled list (`Nv*ObjAlloc`).
    pub fn alloc(&self) -> Result<Obj<L>, Error> {
        if !self.reconciled {
            return Err(Error::Unsupported {
                operation: "AttrList::alloc",
                reason: "the list is not reconciled",
            });
        }
        let raw = L::obj_alloc(self.module.api(), self.raw)?;
        Ok(Obj::from_raw(self.module.clone(), raw))
    }
}

impl<L: Library> Drop for AttrList<L> {
    fn drop(&mut self) {
        // Created by or handed to us by the library; freed once.
        L::list_free(self.module.api(), self.raw);
    }
}

/// An NvSci object handle (a buffer or a sync object), freed with
/// `Nv*ObjFree`; CUDA imports hold their own handle.
pub struct Obj<L: Library> {
    pub(crate) module: Module<L>,
    pub(crate) raw: L::RawObj,
}

// SAFETY: the object handle may be used from any thread (the library
// serialises calls on one object); the module is `Send + Sync`.
#[allow(unsafe_code)]
unsafe impl<L: Library> Send for Obj<L> {}
// SAFETY: `&Obj` only reads attributes and makes fences, imports and dups,
// which the library makes thread-safe.
#[allow(unsafe_code)]
unsafe impl<L: Library> Sync for Obj<L> {}

impl<L: Library> fmt::Debug for Obj<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(L::TYPE_NAMES[2])
            .field("raw", &self.raw)
            .finish()
    }
}

impl<L: Library> Obj<L> {
    pub(crate) fn from_raw(module: Module<L>, raw: L::RawObj) -> Self {
        Obj { module, raw }
    }

    /// The raw object (still owned by this value).
    pub fn as_raw(&self) -> L::RawObj {
        self.raw
    }

    /// The module.
    pub fn module(&self) -> &Module<L> {
        &self.module
    }

    /// Another handle to the same object (`Nv*ObjDup`).
    pub fn dup(&self) -> Result<Obj<L>, Error> {
        let raw = L::obj_dup(self.module.api(), self.raw)?;
        Ok(Obj::from_raw(self.module.clone(), raw))
    }

    /// The object's reconciled attribute list, owned by the object (never
    /// freed by us).
    pub(crate) fn raw_attr_list(&self) -> Result<L::RawList, Error> {
        L::obj_attr_list(self.module.api(), self.raw)
    }
}

impl<L: Library> Drop for Obj<L> {
    fn drop(&mut self) {
        // Our handle, freed once.
        L::obj_free(self.module.api(), self.raw);
    }
}

/// The two libraries' entry points, written once: `$p` is the C prefix.
macro_rules! library {
    (
        $lib:ident, $doc:literal, $api:ty, $field:ident, $name:literal, $types:expr,
        module: $module:ty, list: $list:ty, obj: $obj:ty, key: $key:ty,
        open: $open:ident, close: $close:ident, check: $check:ident,
        create: $create:ident, free: $free:ident, get: $get:ident, pair: $pair:expr,
        reconcile: $reconcile:ident, reconcile_alloc: $reconcile_alloc:ident,
        alloc: $alloc:ident, obj_free: $obj_free:ident, dup: $dup:ident,
        obj_list: $obj_list:ident, conflict_keys: $keys:expr,
    ) => {
        #[doc = $doc]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $lib {}

        impl sealed::Sealed for $lib {}

        impl LibraryTypes for $lib {
            type RawModule = $module;
            type RawList = $list;
            type RawObj = $obj;
            type Key = $key;
            const NAME: &'static str = $name;
        }

        impl Library for $lib {}

        impl RawOps for $lib {
            type Api = $api;
            const TYPE_NAMES: [&'static str; 3] = $types;

            fn api(backend: &Backend) -> &$api {
                &backend.table().$field
            }

            fn probe_version(api: &$api) -> NvSciVersion {
                super::version::probe(api.$check.is_some(), |major, minor| {
                    let mut ok = false;
                    // SAFETY: `ok` is a local the library writes one `bool` to.
                    unsafe { call::$check(api, major, minor, &mut ok) }.is_ok() && ok
                })
            }

            fn module_open(api: &$api) -> Result<$module, Error> {
                let mut raw: $module = ptr::null_mut();
                // SAFETY: `raw` is a local the library writes one module handle to.
                unsafe { call::$open(api, &mut raw) }?;
                Ok(raw)
            }

            fn module_close(api: &$api, raw: $module) {
                // A table without the entry leaks the module.
                let _ = call::$close(api, raw);
            }

            fn list_create(api: &$api, module: $module) -> Result<$list, Error> {
                let mut raw: $list = ptr::null_mut();
                // SAFETY: `raw` is a local the library writes one list handle to.
                unsafe { call::$create(api, module, &mut raw) }?;
                Ok(raw)
            }

            fn list_free(api: &$api, raw: $list) {
                let _ = call::$free(api, raw);
            }

            fn list_is_null(raw: $list) -> bool {
                raw.is_null()
            }

            fn list_is_set(api: &$api, raw: $list, key: $key) -> bool {
                let mut pair = ($pair)(key);
                // SAFETY: `pair` is one local pair, the count passed; the list is live.
                unsafe { call::$get(api, raw, &mut pair, 1) }.is_ok()
                    && !pair.value.is_null()
                    && pair.len > 0
            }

            fn reconcile(api: &$api, lists: &[$list]) -> (Result<$list, Error>, $list) {
                let mut out: $list = ptr::null_mut();
                let mut conflict: $list = ptr::null_mut();
                // SAFETY: `lists` is a slice of `lists.len()` live list handles, the count passed;
                // `out` and `conflict` are locals the library writes one handle each to.
                let called = unsafe {
                    call::$reconcile(api, lists.as_ptr(), lists.len(), &mut out, &mut conflict)
                };
                (called.map(|()| out), conflict)
            }

            fn reconcile_and_alloc(api: &$api, lists: &[$list]) -> (Result<$obj, Error>, $list) {
                let mut obj: $obj = ptr::null_mut();
                let mut conflict: $list = ptr::null_mut();
                // SAFETY: `lists` is a slice of `lists.len()` live list handles, the count passed;
                // `obj` and `conflict` are locals the library writes one handle each to.
                let called = unsafe {
                    call::$reconcile_alloc(
                        api,
                        lists.as_ptr(),
                        lists.len(),
                        &mut obj,
                        &mut conflict,
                    )
                };
                (called.map(|()| obj), conflict)
            }

            fn obj_alloc(api: &$api, list: $list) -> Result<$obj, Error> {
                let mut raw: $obj = ptr::null_mut();
                // SAFETY: `raw` is a local the library writes one object handle to.
                unsafe { call::$alloc(api, list, &mut raw) }?;
                Ok(raw)
            }

            fn obj_free(api: &$api, raw: $obj) {
                let _ = call::$obj_free(api, raw);
            }

            fn obj_dup(api: &$api, raw: $obj) -> Result<$obj, Error> {
                let mut out: $obj = ptr::null_mut();
                // SAFETY: `out` is a local the library writes one object handle to.
                unsafe { call::$dup(api, raw, &mut out) }?;
                Ok(out)
            }

            fn obj_attr_list(api: &$api, raw: $obj) -> Result<$list, Error> {
                let mut list: $list = ptr::null_mut();
                // SAFETY: `list` is a local the library writes one list handle to (owned by the
                // object).
                unsafe { call::$obj_list(api, raw, &mut list) }?;
                Ok(list)
            }

            fn conflict_keys(version: NvSciVersion) -> impl Iterator<Item = $key> {
                ($keys)(version)
            }
        }
    };
}

use tegra_interop_core::nvsci::BufAttr;
use tegra_interop_sys::nvsci::{
    NvSciBufAttrKey, NvSciBufAttrKeyValuePair, NvSciBufAttrList, NvSciBufModule, NvSciBufObj,
    NvSciSyncAttrKey, NvSciSyncAttrKeyValuePair, NvSciSyncAttrList, NvSciSyncModule, NvSciSyncObj,
};

library! {
    BufLib, "NvSciBuf (`libnvscibuf.so.1`): buffers.", NvSciBufApi, nvscibuf, "NvSciBuf",
    ["BufModule", "BufAttrList", "BufObj"],
    module: NvSciBufModule, list: NvSciBufAttrList, obj: NvSciBufObj, key: NvSciBufAttrKey,
    open: NvSciBufModuleOpen, close: NvSciBufModuleClose, check: NvSciBufCheckVersionCompatibility,
    create: NvSciBufAttrListCreate, free: NvSciBufAttrListFree, get: NvSciBufAttrListGetAttrs,
    pair: |key| NvSciBufAttrKeyValuePair { key, value: ptr::null(), len: 0 },
    reconcile: NvSciBufAttrListReconcile, reconcile_alloc: NvSciBufAttrListReconcileAndObjAlloc,
    alloc: NvSciBufObjAlloc, obj_free: NvSciBufObjFree, dup: NvSciBufObjDup,
    obj_list: NvSciBufObjGetAttrList,
    conflict_keys: |version: NvSciVersion| super::buf::ALL_KEYS.iter().map(|k| NvSciBufAttrKey(*k)).filter(
        move |k| version.buf_key(*k).is_ok() && !BufAttr::is_output_only_key(*k)
    ),
}

library! {
    SyncLib, "NvSciSync (`libnvscisync.so.1`): sync objects and fences.", NvSciSyncApi,
    nvscisync, "NvSciSync", ["SyncModule", "SyncAttrList", "SyncObj"],
    module: NvSciSyncModule, list: NvSciSyncAttrList, obj: NvSciSyncObj, key: NvSciSyncAttrKey,
    open: NvSciSyncModuleOpen, close: NvSciSyncModuleClose,
    check: NvSciSyncCheckVersionCompatibility,
    create: NvSciSyncAttrListCreate, free: NvSciSyncAttrListFree, get: NvSciSyncAttrListGetAttrs,
    pair: |key| NvSciSyncAttrKeyValuePair { attrKey: key, value: ptr::null(), len: 0 },
    reconcile: NvSciSyncAttrListReconcile, reconcile_alloc: NvSciSyncAttrListReconcileAndObjAlloc,
    alloc: NvSciSyncObjAlloc, obj_free: NvSciSyncObjFree, dup: NvSciSyncObjDup,
    obj_list: NvSciSyncObjGetAttrList,
    conflict_keys: |version: NvSciVersion| super::sync::ALL_KEYS.iter().map(|k| NvSciSyncAttrKey(*k)).filter(
        move |k| version.sync_key(*k).is_ok()
    ),
}
