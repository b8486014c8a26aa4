// `same_description` compares open descriptors; it takes borrowed fds, not
// raw numbers that may name nothing (or someone else's file) by then.
use std::os::fd::AsRawFd;

fn main() {
    let file = std::fs::File::open("/dev/null").unwrap();
    let _ = tegra_interop_driver::error::same_description(file.as_raw_fd(), 7);
}
