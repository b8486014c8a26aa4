// An IPC endpoint hands the driver a raw NvSciIpc endpoint handle, which it
// passes to the NvSci libraries: implementing the trait is a promise.
use tegra_interop_driver::nvsci::{IpcEndpoint, IpcError};

struct Made;

impl IpcEndpoint for Made {
    fn handle(&self) -> u64 {
        0x1234
    }
    fn send(&mut self, _message: &[u8]) -> Result<(), IpcError> {
        Ok(())
    }
    fn recv(&mut self) -> Result<Vec<u8>, IpcError> {
        Ok(Vec::new())
    }
}

fn main() {
    let _ = Made;
}
