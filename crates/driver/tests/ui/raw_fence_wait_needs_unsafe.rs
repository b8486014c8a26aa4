// A raw NvSciSyncFence is C words the NvSci library interprets; waiting on
// one the caller built is unsafe (the driver's `Fence` is the safe way).
use tegra_interop_driver::{ExternalSemaphore, SemaphoreWait};
use tegra_interop_sys::nvsci::NvSciSyncFence;

fn wait_on(sem: &ExternalSemaphore) {
    let forged = NvSciSyncFence { payload: [0x1234; 6] };
    let _ = SemaphoreWait::nvscisync(sem, &forged);
}

fn main() {
    let _ = wait_on;
}
