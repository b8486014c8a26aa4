//! The std attribute types (`BufAttrs`, `SyncAttrs`, idiomatic values) and
//! the inputs every attribute-taking function accepts (std type, the core's
//! fixed-capacity set, a slice, a `Vec`) reach the library as the same
//! key/value pairs.
#![allow(clippy::unwrap_used)] // tests may unwrap

use tegra_interop_core::nvsci::{BufAttr, BufAttrSet, SyncAttr};
use tegra_interop_driver::nvsci::{
    BufAttrs, BufModule, BufPerm, BufType, ImageLayout, SyncAttrs, SyncModule, SyncPerm,
};
use tegra_interop_driver::Error;
use tegra_interop_sim::{Sim, SimConfig};
use tegra_interop_sys::nvsci::{
    NvSciBufAttrKey as K, NvSciBufAttrValAccessPerm, NvSciBufAttrValImageLayoutType, NvSciBufType,
    NvSciSyncAccessPerm, NvSciSyncAttrKey as SK,
};

#[test]
fn idiomatic_values_are_the_c_values() {
    assert_eq!(
        BufType::RawBuffer.raw(),
        NvSciBufType::NvSciBufType_RawBuffer
    );
    assert_eq!(BufType::Image.raw(), NvSciBufType::NvSciBufType_Image);
    assert_eq!(BufType::Tensor.raw(), NvSciBufType::NvSciBufType_Tensor);
    assert_eq!(BufType::Array.raw(), NvSciBufType::NvSciBufType_Array);
    assert_eq!(BufType::Pyramid.raw(), NvSciBufType::NvSciBufType_Pyramid);
    assert_eq!(
        ImageLayout::PitchLinear.raw(),
        NvSciBufAttrValImageLayoutType::NvSciBufImage_PitchLinearType
    );
    assert_eq!(
        ImageLayout::BlockLinear.raw(),
        NvSciBufAttrValImageLayoutType::NvSciBufImage_BlockLinearType
    );
    assert_eq!(
        BufPerm::ReadWrite.raw(),
        NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite
    );
}

#[test]
fn every_input_form_sets_the_same_pairs() {
    let sim = Sim::with_config(SimConfig::tegra()).unwrap();
    let backend = sim.backend();
    let bufs = BufModule::open(&backend).unwrap();

    let mut std_attrs = BufAttrs::new();
    std_attrs
        .types(&[BufType::RawBuffer])
        .unwrap()
        .raw_size(4096)
        .unwrap()
        .required_perm(BufPerm::ReadWrite)
        .unwrap();
    let mut fixed = BufAttrSet::<3>::new();
    fixed
        .set(BufAttr::types(&[NvSciBufType::NvSciBufType_RawBuffer]).unwrap())
        .unwrap()
        .set(BufAttr::RawSize(4096))
        .unwrap()
        .set(BufAttr::RequiredPerm(
            NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite,
        ))
        .unwrap();
    let as_vec: Vec<BufAttr> = std_attrs.attrs().to_vec();

    let lists = [
        bufs.attr_list(&std_attrs).unwrap(),
        bufs.attr_list(&fixed).unwrap(),
        bufs.attr_list(&as_vec).unwrap(),
        bufs.attr_list(as_vec.as_slice()).unwrap(),
    ];
    for list in &lists {
        assert_eq!(
            list.get(K::NvSciBufRawBufferAttrKey_Size).unwrap(),
            Some(BufAttr::RawSize(4096))
        );
        assert_eq!(
            list.get(K::NvSciBufGeneralAttrKey_RequiredPerm).unwrap(),
            Some(BufAttr::RequiredPerm(
                NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite
            ))
        );
    }

    // A slice is checked like the std type: a key twice is refused before
    // any call.
    assert!(sim.call_log().contains(&"NvSciBufAttrListSetAttrs"));
    let before = sim.call_log().len();
    let twice = [BufAttr::RawSize(1), BufAttr::RawSize(2)];
    assert!(matches!(
        bufs.attr_list(&twice[..]),
        Err(Error::Validation(_))
    ));
    let log = sim.call_log();
    assert!(
        !log[before..].contains(&"NvSciBufAttrListSetAttrs"),
        "{:?}",
        &log[before..]
    );
}

#[test]
fn sync_attrs_set_the_idiomatic_permission() {
    let sim = Sim::with_config(SimConfig::tegra()).unwrap();
    let backend = sim.backend();
    let syncs = SyncModule::open(&backend).unwrap();
    let mut cpu = SyncAttrs::new();
    cpu.need_cpu_access(true)
        .unwrap()
        .required_perm(SyncPerm::WaitOnly)
        .unwrap();
    let list = syncs.attr_list(&cpu).unwrap();
    assert_eq!(
        list.get(SK::NvSciSyncAttrKey_RequiredPerm).unwrap(),
        Some(SyncAttr::RequiredPerm(NvSciSyncAccessPerm(1)))
    );
    assert_eq!(
        list.get(SK::NvSciSyncAttrKey_NeedCpuAccess).unwrap(),
        Some(SyncAttr::NeedCpuAccess(true))
    );
}
