// A frame description is a promise about device memory that `present`
// relies on: building one from a raw device pointer is unsafe.
use tegra_interop_driver::egl::ProducerFrame;

fn main() {
    let _rgba = ProducerFrame::rgba_pitch(0x1000, 64, 16, 256);
    let _nv12 = ProducerFrame::nv12_pitch(0x1000, 0x2000, 64, 16, 64);
}
