//! Runs the crate's examples as tests, so `cargo test` checks what the
//! docs show (`cargo run -p tegra-interop-sim --example user_kernel` runs
//! the same code as a program).
#![allow(clippy::unwrap_used)]

#[allow(dead_code)] // the example's `main` is not called here
#[path = "../examples/user_kernel.rs"]
mod user_kernel;

#[test]
fn user_kernel_reads_back_every_frame_brightened() {
    assert_eq!(user_kernel::run(user_kernel::covering_grid()).unwrap(), 0);
}

/// The same program with a grid one block short in each direction: the
/// twin leaves the last columns and rows as the producer wrote them, as a
/// GPU would, and the program's own check catches every frame.
#[test]
fn user_kernel_with_a_grid_too_small_fails_its_check() {
    let (x, y) = user_kernel::covering_grid();
    assert_eq!(user_kernel::run((x - 1, y)).unwrap(), 3);
    assert_eq!(user_kernel::run((x, y - 1)).unwrap(), 3);
}
