//! NvSci attribute sets: lowering points into the set's storage, decoding reads it back.
#![allow(clippy::unwrap_used)] // tests unwrap on purpose

use tegra_interop_core::nvsci::{
    BufAttr, BufAttrSet, GpuId, Padding, SyncAttr, SyncAttrSet, MAX_PLANES,
};
use tegra_interop_core::sys::cuda::CUuuid;
use tegra_interop_core::sys::nvsci::{
    NvSciBufAttrValAccessPerm, NvSciBufAttrValImageLayoutType, NvSciBufType, NvSciSyncAccessPerm,
    NvSciSyncAttrValPrimitiveType,
};

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
    s.set(BufAttr::plane_color_formats(&[1, 2]).unwrap())
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
    s.set(SyncAttr::NumTimestampSlots(4)).unwrap();
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
