//! Instance set-up helpers: extensions, device description, loader, enumeration.

use super::*;

pub(super) fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

pub(super) fn required_extensions(api_version: u32) -> Vec<&'static CStr> {
    let mut v = vec![
        khr::external_memory_fd::NAME,
        khr::external_semaphore_fd::NAME,
    ];
    if api_version < vk::API_VERSION_1_2 {
        v.push(khr::timeline_semaphore::NAME);
    }
    v
}

pub(super) fn describe_device(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
) -> Result<DeviceInfo> {
    // SAFETY: `pd` was enumerated from `instance`.
    let props = unsafe { instance.get_physical_device_properties(pd) };
    let mut id = vk::PhysicalDeviceIDProperties::default();
    let mut driver = vk::PhysicalDeviceDriverProperties::default();
    let has_driver_props = props.api_version >= vk::API_VERSION_1_2;
    {
        let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut id);
        if has_driver_props {
            props2 = props2.push_next(&mut driver);
        }
        // SAFETY: Vulkan 1.1 core query (the instance is 1.1+); the chained structs live
        // across the call.
        unsafe { instance.get_physical_device_properties2(pd, &mut props2) };
    }
    // SAFETY: `pd` was enumerated from `instance`.
    let exts = unsafe { instance.enumerate_device_extension_properties(pd) }
        .map_err(vk_err("vkEnumerateDeviceExtensionProperties"))?;
    let missing_extensions = required_extensions(props.api_version.min(REQUESTED_API))
        .into_iter()
        .filter(|want| {
            !exts
                .iter()
                .any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == *want))
        })
        .map(|want| want.to_str().unwrap_or("(non-UTF-8 extension name)"))
        .collect();
    let (driver_name, driver_info) = if has_driver_props {
        (
            c_chars_to_string(&driver.driver_name),
            c_chars_to_string(&driver.driver_info),
        )
    } else {
        (String::new(), String::new())
    };
    Ok(DeviceInfo {
        name: c_chars_to_string(&props.device_name),
        device_uuid: id.device_uuid,
        driver_uuid: id.driver_uuid,
        vendor_id: props.vendor_id,
        device_id: props.device_id,
        api_version: props.api_version,
        driver_version: props.driver_version,
        driver_name,
        driver_info,
        missing_extensions,
    })
}

/// Opens the system's Vulkan loader (`libvulkan.so.1`).
pub(super) fn load_system_entry() -> Result<ash::Entry> {
    // SAFETY: opening the system's Vulkan loader runs its library initialisers; the loader is
    // designed to be opened this way, by any process.
    unsafe { ash::Entry::load() }.map_err(|e| Error::LoaderNotFound {
        reason: e.to_string(),
    })
}

/// Opens the library at `loader` as the Vulkan loader.
///
/// # Safety
/// The library must be sound to load and trust as a Vulkan loader (see
/// [`VulkanExporter::with_loader`]).
pub(super) unsafe fn load_entry_from(loader: &std::path::Path) -> Result<ash::Entry> {
    // SAFETY: a loader the caller vouches for (this function's contract).
    unsafe { ash::Entry::load_from(loader) }.map_err(|e| Error::LoaderNotFound {
        reason: e.to_string(),
    })
}

pub(super) fn enumerate(inst: &InstanceOwner) -> Result<Vec<(vk::PhysicalDevice, DeviceInfo)>> {
    // SAFETY: plain enumeration on a live instance.
    let pds = unsafe { inst.instance.enumerate_physical_devices() }
        .map_err(vk_err("vkEnumeratePhysicalDevices"))?;
    pds.into_iter()
        .map(|pd| describe_device(&inst.instance, pd).map(|i| (pd, i)))
        .collect()
}
