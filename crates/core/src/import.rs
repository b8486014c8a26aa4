//! The import front end external memory and external semaphores share: one validated
//! descriptor type, [`Import<K>`](Import), over the kind of handle it imports.
//! [`MemoryImport`](crate::MemoryImport) is `Import<MemoryHandleKind>` and
//! [`SemaphoreImport`](crate::SemaphoreImport) is `Import<SemaphoreHandleKind>`: the handle
//! checks (fd not negative, the Win32 handle/name rule, object not NULL, handle matching the
//! kind), the fd accessors and `with_fd` are written once here; what only memory has (size,
//! flags, `DEDICATED`) lives in `impl Import<MemoryHandleKind>` (memory.rs).

use core::ffi::c_void;
use core::fmt;

use crate::error::ValidationError;
use facts::{HandleClass, HandleParts};

/// The per-kind facts, out of the public API (they write C descriptors).
pub(crate) mod facts {
    use core::ffi::c_void;
    use core::fmt;

    /// Which of the three handle shapes a kind is imported from.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum HandleClass {
        /// A POSIX file descriptor.
        Fd,
        /// A Win32 handle or name; KMT kinds take a handle and no name.
        Win32 {
            /// The kind is a KMT kind.
            kmt: bool,
        },
        /// A library object (`NvSciBufObj`, `NvSciSyncObj`).
        Object,
    }

    impl HandleClass {
        /// The class of a kind that answers these three questions (an fd kind, a Win32
        /// kind, a KMT kind); a kind that is neither fd nor Win32 takes an object.
        pub fn of(fd: bool, win32: bool, kmt: bool) -> Self {
            if fd {
                Self::Fd
            } else if win32 {
                Self::Win32 { kmt }
            } else {
                Self::Object
            }
        }
    }

    /// A handle of either import, as the shared checks see it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum HandleParts {
        /// A file descriptor.
        Fd(i32),
        /// A Win32 handle and/or name.
        Win32 {
            /// The handle (NULL when importing by name).
            handle: *mut c_void,
            /// The name (NULL when importing by handle).
            name: *const c_void,
        },
        /// A library object.
        Object(*const c_void),
    }

    /// What memory and semaphore imports differ in.
    pub trait ImportFacts: Copy + PartialEq + fmt::Debug {
        /// The C descriptor (`CUDA_EXTERNAL_MEMORY_HANDLE_DESC`, ...).
        type Desc: Copy;
        /// The handle enum users build ([`MemoryHandle`](crate::MemoryHandle), ...).
        type Handle: Copy + fmt::Debug;
        /// The import type's name, for `Debug`.
        const TYPE_NAME: &'static str;
        /// Which handle shape this kind takes.
        fn class(self) -> HandleClass;
        /// The handle's shape and values.
        fn parts(handle: Self::Handle) -> HandleParts;
        /// The handle naming fd `fd`.
        fn fd_handle(fd: i32) -> Self::Handle;
        /// A zeroed descriptor with this kind's type set.
        fn blank_desc(self) -> Self::Desc;
        /// Writes the descriptor's handle union.
        fn write_handle(desc: &mut Self::Desc, parts: HandleParts);
        /// The descriptor fields `Debug` shows beyond kind and handle.
        fn debug_fields(_desc: &Self::Desc, _out: &mut fmt::DebugStruct<'_, '_>) {}
    }
}

/// The facts of one kind type: its C descriptor, its handle enum (fd, Win32 and object
/// variants) and the name of the descriptor's object field. The two C descriptors are
/// distinct generated types with the same field names, so this is written as a macro;
/// `$extra` items (a `debug_fields`) complete the impl.
macro_rules! import_facts {
    (
        $kind:ty, $desc:ident, $handle:ident :: $object:ident, $field:ident, $name:literal
        $(, $extra:item)*
    ) => {
        impl $crate::import::ImportKind for $kind {}

        impl $crate::import::facts::ImportFacts for $kind {
            type Desc = $desc;
            type Handle = $handle;
            const TYPE_NAME: &'static str = $name;

            fn class(self) -> $crate::import::facts::HandleClass {
                $crate::import::facts::HandleClass::of(self.is_fd(), self.is_win32(), self.is_kmt())
            }

            fn parts(handle: $handle) -> $crate::import::facts::HandleParts {
                use $crate::import::facts::HandleParts;
                match handle {
                    $handle::Fd(fd) => HandleParts::Fd(fd),
                    $handle::Win32 { handle, name } => HandleParts::Win32 { handle, name },
                    $handle::$object(obj) => HandleParts::Object(obj),
                }
            }

            fn fd_handle(fd: i32) -> $handle {
                $handle::Fd(fd)
            }

            fn blank_desc(self) -> $desc {
                $desc {
                    type_: self.raw(),
                    ..Default::default()
                }
            }

            fn write_handle(desc: &mut $desc, parts: $crate::import::facts::HandleParts) {
                use $crate::import::facts::HandleParts;
                match parts {
                    HandleParts::Fd(fd) => desc.handle.fd = fd,
                    HandleParts::Win32 { handle, name } => {
                        desc.handle.win32.handle = handle;
                        desc.handle.win32.name = name;
                    }
                    HandleParts::Object(obj) => desc.handle.$field = obj,
                }
            }

            $($extra)*
        }
    };
}
pub(crate) use import_facts;

/// The kind of handle an import takes: [`MemoryHandleKind`](crate::MemoryHandleKind) or
/// [`SemaphoreHandleKind`](crate::SemaphoreHandleKind) (sealed).
pub trait ImportKind: facts::ImportFacts {}

/// Checks a Win32 handle/name pair against the kind's rule.
fn check_win32(
    kmt: bool,
    handle: *const c_void,
    name: *const c_void,
) -> Result<(), ValidationError> {
    if kmt {
        if !name.is_null() {
            return Err(ValidationError::Win32KmtName);
        }
        if handle.is_null() {
            return Err(ValidationError::NullHandle);
        }
        return Ok(());
    }
    match (handle.is_null(), name.is_null()) {
        (false, false) => Err(ValidationError::Win32HandleAndName),
        (true, true) => Err(ValidationError::Win32NoHandleOrName),
        _ => Ok(()),
    }
}

/// A validated import: the exact C descriptor, with its kind and handle kept for later checks.
/// Use it as [`MemoryImport`](crate::MemoryImport) or
/// [`SemaphoreImport`](crate::SemaphoreImport).
pub struct Import<K: ImportKind> {
    pub(crate) desc: K::Desc,
    kind: K,
    handle: K::Handle,
}

impl<K: ImportKind> Clone for Import<K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K: ImportKind> Copy for Import<K> {}

impl<K: ImportKind> Import<K> {
    /// The shared checks and the descriptor: the handle must have the kind's shape, an fd
    /// must not be negative, a Win32 pair must follow the kind's rule, an object must not be
    /// NULL. Flags and reserved words start zero.
    pub(crate) fn describe(kind: K, handle: K::Handle) -> Result<Self, ValidationError> {
        let parts = K::parts(handle);
        match (kind.class(), parts) {
            (HandleClass::Fd, HandleParts::Fd(fd)) => {
                if fd < 0 {
                    return Err(ValidationError::NegativeFd { fd });
                }
            }
            (HandleClass::Win32 { kmt }, HandleParts::Win32 { handle, name }) => {
                check_win32(kmt, handle.cast_const(), name)?;
            }
            (HandleClass::Object, HandleParts::Object(obj)) => {
                if obj.is_null() {
                    return Err(ValidationError::NullHandle);
                }
            }
            _ => return Err(ValidationError::HandleKindMismatch),
        }
        let mut desc = kind.blank_desc();
        K::write_handle(&mut desc, parts);
        Ok(Self { desc, kind, handle })
    }

    /// The C descriptor, ready for `cuImportExternalMemory` / `cuImportExternalSemaphore`.
    pub fn raw(&self) -> &K::Desc {
        &self.desc
    }

    /// The handle kind.
    pub fn kind(&self) -> K {
        self.kind
    }

    /// The handle.
    pub fn handle(&self) -> K::Handle {
        self.handle
    }

    /// The fd, for fd kinds.
    pub fn fd(&self) -> Option<i32> {
        match K::parts(self.handle) {
            HandleParts::Fd(fd) => Some(fd),
            _ => None,
        }
    }

    /// The same import (kind, and for memory size and flags) naming another fd number, for
    /// example a duplicate of the original. Refuses non-fd kinds (`HandleKindMismatch`) and
    /// negative numbers (`NegativeFd`), like the constructors.
    pub fn with_fd(mut self, fd: i32) -> Result<Self, ValidationError> {
        if self.kind.class() != HandleClass::Fd {
            return Err(ValidationError::HandleKindMismatch);
        }
        if fd < 0 {
            return Err(ValidationError::NegativeFd { fd });
        }
        K::write_handle(&mut self.desc, HandleParts::Fd(fd));
        self.handle = K::fd_handle(fd);
        Ok(self)
    }
}

impl<K: ImportKind> fmt::Debug for Import<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct(K::TYPE_NAME);
        out.field("kind", &self.kind).field("handle", &self.handle);
        K::debug_fields(&self.desc, &mut out);
        out.finish()
    }
}
