//! The C layouts the core fills match the documented sizes (LP64 targets).
#![cfg(target_pointer_width = "64")]
#![allow(clippy::unwrap_used)] // tests unwrap on purpose

use core::mem::{offset_of, size_of};

use tegra_interop_core::sys::cuda::*;
use tegra_interop_core::sys::nvsci::NvSciBufAttrKeyValuePair;

#[test]
fn sizes_and_offsets_match_the_facts() {
    assert_eq!(size_of::<CUDA_EXTERNAL_MEMORY_HANDLE_DESC>(), 104);
    assert_eq!(offset_of!(CUDA_EXTERNAL_MEMORY_HANDLE_DESC, size), 24);
    assert_eq!(offset_of!(CUDA_EXTERNAL_MEMORY_HANDLE_DESC, flags), 32);
    assert_eq!(size_of::<CUDA_EXTERNAL_MEMORY_BUFFER_DESC>(), 88);
    assert_eq!(size_of::<CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC>(), 120);
    assert_eq!(
        offset_of!(CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC, numLevels),
        48
    );
    assert_eq!(size_of::<CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC>(), 96);
    assert_eq!(size_of::<CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS>(), 144);
    assert_eq!(offset_of!(CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS, flags), 72);
    assert_eq!(size_of::<CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS>(), 144);
    assert_eq!(offset_of!(CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS, flags), 72);
    assert_eq!(size_of::<NvSciBufAttrKeyValuePair>(), 24);
}
