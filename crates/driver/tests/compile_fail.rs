//! The lifetimes make the driver's crash cases compile errors: use after
//! destroy, double destroy, mappings outliving their memory, handles
//! outliving their context, and destroying or resetting a context while
//! handles of it live.
#![allow(clippy::unwrap_used)] // tests may unwrap

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
