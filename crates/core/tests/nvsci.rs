//! NvSci attribute sets: lowering points into the set's storage, decoding reads it back.
#![allow(clippy::unwrap_used)] // tests unwrap on purpose

use tegra_interop_core::nvsci::{
    BufAttr, BufAttrSet, ColorFormat, ColorStd, CompressionType, GpuCache, GpuCompression, GpuId,
    Padding, ScanType, SyncAttr, SyncAttrSet, MAX_PLANES,
};
use tegra_interop_core::sys::cuda::CUuuid;
use tegra_interop_core::sys::nvsci::{
    NvSciBufAttrValAccessPerm, NvSciBufAttrValImageLayoutType, NvSciBufType, NvSciSyncAccessPerm,
    NvSciSyncAttrValPrimitiveType,
};
use tegra_interop_core::ValidationError;

fn image_set() -> BufAttrSet<16> {
    let mut s = BufAttrSet::<16>::new();
    s.set(BufAttr::types(&[NvSciBufType::NvSciBufType_Image]).unwrap())
        .unwrap();
    s.set(BufAttr::Layout(
        NvSciBufAttrValImageLayoutType::NvSciBufImage_PitchLinearType,
    ))
    .unwrap();
    s.set(BufAttr::PlaneCount(2)).unwrap();
    s.set(BufAttr::plane_widths(&[1920, 960]).unwrap()).unwrap();
    s.set(BufAttr::plane_heights(&[1080, 540]).unwrap())
        .unwrap();
    s.set(BufAttr::plane_color_formats(&[ColorFormat::Y8, ColorFormat::U8V8]).unwrap())
        .unwrap();
    s.set(BufAttr::padding(Padding::Top, &[0, 0]).unwrap())
        .unwrap();
    s.set(BufAttr::NeedCpuAccess(true)).unwrap();
    s.set(BufAttr::RequiredPerm(
        NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite,
    ))
    .unwrap();
    s.set(BufAttr::gpu_ids(&[GpuId([9; 16]), GpuId([3; 16])]).unwrap())
        .unwrap();
    s
}

#[test]
fn lowered_pairs_point_into_the_set_and_decode_back() {
    let set = image_set();
    let lowered = set.lower().unwrap();
    assert_eq!(lowered.len(), set.len());
    for (pair, attr) in lowered.as_slice().iter().zip(set.attrs()) {
        assert_eq!(pair.key, attr.key());
        // SAFETY: the pair points into `set`, alive and unchanged here.
        let decoded = unsafe { BufAttr::decode_pair(pair) }.unwrap().unwrap();
        assert_eq!(&decoded, attr);
    }
    let widths = &lowered.as_slice()[3];
    assert_eq!(widths.len, 2 * 4);
    let gpus = &lowered.as_slice()[9];
    assert_eq!(gpus.len, 32);
    let bool_pair = &lowered.as_slice()[7];
    assert_eq!(bool_pair.len, 1);
}

#[test]
fn unset_pair_decodes_to_none() {
    let pair = tegra_interop_core::sys::nvsci::NvSciBufAttrKeyValuePair::default();
    // SAFETY: NULL value.
    assert_eq!(unsafe { BufAttr::decode_pair(&pair) }, Ok(None));
}

#[test]
fn sync_set_round_trip() {
    let mut s = SyncAttrSet::<8>::new();
    s.set(SyncAttr::NeedCpuAccess(false)).unwrap();
    s.set(SyncAttr::RequiredPerm(
        NvSciSyncAccessPerm::NvSciSyncAccessPerm_SignalOnly,
    ))
    .unwrap();
    s.set(SyncAttr::RequireDeterministicFences(true)).unwrap();
    s.set(SyncAttr::WaiterRequireTimestamps(true)).unwrap();
    s.set(
        SyncAttr::primitive_info(&[
            NvSciSyncAttrValPrimitiveType::NvSciSyncAttrValPrimitiveType_Syncpoint,
        ])
        .unwrap(),
    )
    .unwrap();
    s.set(SyncAttr::gpu_ids(&[GpuId([1; 16])]).unwrap())
        .unwrap();
    let lowered = s.lower().unwrap();
    assert_eq!(lowered.as_slice()[1].len, 8); // access perm is a u64
    for (pair, attr) in lowered.as_slice().iter().zip(s.attrs()) {
        assert_eq!(pair.attrKey, attr.key());
        // SAFETY: the pair points into `s`, alive and unchanged here.
        let decoded = unsafe { SyncAttr::decode_pair(pair) }.unwrap().unwrap();
        assert_eq!(&decoded, attr);
    }
}

#[test]
fn gpu_id_from_cuda_uuid() {
    let mut uuid = CUuuid::default();
    for (i, b) in uuid.bytes.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(17) as _;
    }
    let id = GpuId::from_cuda_uuid(&uuid);
    for (i, b) in id.0.iter().enumerate() {
        assert_eq!(*b, (i as u8).wrapping_mul(17));
    }
    assert_eq!(GpuId::from(id.raw()), id);
}

#[test]
fn bool_values_must_be_zero_or_one() {
    use tegra_interop_core::sys::nvsci::NvSciBufAttrKey as K;
    assert_eq!(
        BufAttr::decode(K::NvSciBufGeneralAttrKey_NeedCpuAccess, &[1]),
        Ok(BufAttr::NeedCpuAccess(true))
    );
    assert!(BufAttr::decode(K::NvSciBufGeneralAttrKey_NeedCpuAccess, &[2]).is_err());
    assert!(BufAttr::decode(
        K::NvSciBufImageAttrKey_PlaneWidth,
        &[0; 4 * (MAX_PLANES + 1)]
    )
    .is_err());
}

/// The bytes a lowered pair points at.
fn value_bytes(pair: &tegra_interop_core::sys::nvsci::NvSciBufAttrKeyValuePair) -> Vec<u8> {
    // SAFETY: the pair points into a set that is alive and unchanged in the caller.
    unsafe { core::slice::from_raw_parts(pair.value.cast::<u8>(), pair.len) }.to_vec()
}

#[test]
fn gpu_cache_entries_lower_to_the_packed_17_byte_records() {
    let (a, b) = (GpuId([0xa0; 16]), GpuId([0xb1; 16]));
    let mut s = BufAttrSet::<2>::new();
    s.set(BufAttr::gpu_cache(&[GpuCache::new(a, true), GpuCache::new(b, false)]).unwrap())
        .unwrap();
    let lowered = s.lower().unwrap();
    let pair = &lowered.as_slice()[0];
    assert_eq!(pair.key.0, 9);
    // The real record: {NvSciRmGpuId gpuId; bool cacheability}, packed, 17 bytes per entry.
    let mut want = vec![0xa0; 16];
    want.push(1);
    want.extend_from_slice(&[0xb1; 16]);
    want.push(0);
    assert_eq!(value_bytes(pair), want);
    // SAFETY: as in `value_bytes`.
    let back = unsafe { BufAttr::decode_pair(pair) }.unwrap().unwrap();
    assert_eq!(&back, &s.attrs()[0]);
}

#[test]
fn gpu_compression_entries_lower_to_the_20_byte_records() {
    let id = GpuId(core::array::from_fn(|i| i as u8));
    let mut s = BufAttrSet::<2>::new();
    s.set(
        BufAttr::gpu_compression(&[GpuCompression::new(
            id,
            CompressionType::GENERIC_COMPRESSIBLE,
        )])
        .unwrap(),
    )
    .unwrap();
    let lowered = s.lower().unwrap();
    let pair = &lowered.as_slice()[0];
    assert_eq!(pair.key.0, 11);
    let mut want: Vec<u8> = (0..16).collect();
    want.extend_from_slice(&1u32.to_ne_bytes());
    assert_eq!(value_bytes(pair), want);
    assert_eq!(pair.value as usize % 4, 0, "the records are 4-byte aligned");
    assert!(BufAttrSet::<1>::new()
        .set(BufAttr::gpu_compression(&[GpuCompression::new(id, CompressionType(2))]).unwrap())
        .is_err());
}

#[test]
fn image_enums_lower_to_their_real_values() {
    let mut s = BufAttrSet::<4>::new();
    s.set(BufAttr::ScanType(ScanType::PROGRESSIVE)).unwrap();
    s.set(BufAttr::plane_color_formats(&[ColorFormat::A8B8G8R8]).unwrap())
        .unwrap();
    s.set(BufAttr::plane_color_stds(&[ColorStd::REC709_ER]).unwrap())
        .unwrap();
    let lowered = s.lower().unwrap();
    let bytes: Vec<Vec<u8>> = lowered.as_slice().iter().map(value_bytes).collect();
    assert_eq!(bytes[0], 0u32.to_ne_bytes());
    assert_eq!(bytes[1], 106u32.to_ne_bytes());
    assert_eq!(bytes[2], 4u32.to_ne_bytes());
    assert_eq!(ColorFormat::A8B8G8R8.name(), Some("A8B8G8R8"));
    assert_eq!(ColorFormat(9999).name(), None);
    assert_eq!(ScanType::INTERLACE.0, 1);
}

#[test]
fn output_only_keys_decode_but_are_not_settable() {
    use tegra_interop_core::sys::nvsci::NvSciBufAttrKey as K;
    let mut entry = vec![5u8; 16];
    entry.push(1);
    let out = BufAttr::decode(K::NvSciBufGeneralAttrKey_GpuSwNeedCacheCoherency, &entry).unwrap();
    assert_eq!(
        out,
        BufAttr::GpuSwNeedCacheCoherency(
            heapless::Vec::from_slice(&[GpuCache::new(GpuId([5; 16]), true)]).unwrap()
        )
    );
    assert!(out.is_output_only());
    assert_eq!(
        BufAttrSet::<2>::new().set(out).map(|_| ()),
        Err(ValidationError::OutputOnlyKey { key: 10 })
    );
    assert_eq!(
        SyncAttrSet::<2>::new()
            .set(SyncAttr::MaxPrimitiveValue(u64::from(u32::MAX)))
            .map(|_| ()),
        Err(ValidationError::OutputOnlyKey { key: 9 })
    );
    // A cache entry whose bool is not 0/1, and a length that is not a multiple of 17.
    let mut bad = vec![0u8; 16];
    bad.push(2);
    assert!(BufAttr::decode(K::NvSciBufGeneralAttrKey_EnableGpuCache, &bad).is_err());
    assert!(BufAttr::decode(K::NvSciBufGeneralAttrKey_EnableGpuCache, &[1]).is_err());
}
