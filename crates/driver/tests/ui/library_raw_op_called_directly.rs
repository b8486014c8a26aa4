// The first program of issue 23: freeing a made-up NvSciBuf object through
// the public Library trait. The raw operations are crate-private now.
use tegra_interop_driver::nvsci::{BufLib, Library};

fn main() {
    let sim = tegra_interop_sim::Sim::new().unwrap();
    let backend = sim.backend();
    BufLib::obj_free(&backend.table().nvscibuf, 0x1usize as _);
}
