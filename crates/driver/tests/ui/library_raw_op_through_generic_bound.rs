// A generic bound on the public Library trait does not reach its raw
// operations either (they live in a crate-private supertrait).
use tegra_interop_driver::nvsci::{BufLib, Library, LibraryTypes};
use tegra_interop_driver::Backend;

fn free_any<L: Library>(backend: &Backend, raw: <L as LibraryTypes>::RawObj) {
    let api = L::api(backend);
    L::obj_free(api, raw);
}

fn close_any<L: Library>(backend: &Backend, raw: <L as LibraryTypes>::RawModule) {
    L::module_close(L::api(backend), raw);
}

fn main() {
    let sim = tegra_interop_sim::Sim::new().unwrap();
    free_any::<BufLib>(&sim.backend(), 0x1usize as _);
    close_any::<BufLib>(&sim.backend(), 0x1usize as _);
}
