//! What the seam's contract refuses at compile time (issue 23): a
//! `Backend` over an arbitrary table outside `unsafe`
//! (`backend_from_table_needs_unsafe`); the NvSci `Library` trait's raw
//! operations, called on a library type or through a generic bound
//! (`library_raw_op_*`: they are a crate-private supertrait); frame
//! descriptions from raw device pointers outside `unsafe`
//! (`producer_frame_needs_unsafe`); `same_description` on raw fd numbers
//! (`same_description_takes_borrowed_fds`); an `IpcEndpoint` (which hands
//! the driver a raw endpoint handle) implemented without `unsafe impl`
//! (`ipc_endpoint_needs_unsafe_impl`); a wait on a raw NvSciSync fence the
//! caller built (`raw_fence_wait_needs_unsafe`).
//!
//! What stays a compile error now that handles hold their context (and
//! mappings their memory) by `Arc`: every `destroy` consumes its handle, so
//! use after destroy and double destroy (which crash the real driver) do not
//! compile (tests/ui/).
//!
//! No longer compile errors, because they can no longer happen at all:
//! a handle outliving its context, a mapping outliving its memory (each
//! holds what it depends on; the cases `memory_outlives_context`,
//! `stream_outlives_context` and `mapping_outlives_memory` were removed).
//! Now run-time refusals ([`Error::InUse`], tested in `tests/holders.rs`):
//! destroying or resetting a context while handles of it live, destroying
//! memory while a mapping of it lives (the cases
//! `context_destroyed_while_borrowed` and `context_reset_while_borrowed`
//! were removed).
//!
//! [`Error::InUse`]: tegra_interop_driver::Error::InUse
#![allow(clippy::unwrap_used)] // tests may unwrap

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
