use dusk::kernel;
use dusk::runtime::Device;
use std::sync::Arc;

#[kernel]
fn add_one<const BLOCK: usize>(x: Ptr<f32>, n: i32) {
    let offs = arange(0, BLOCK);
    let mask = offs < n;
    store(x + offs, load(x + offs, mask) + 1.0, mask);
}

fn main() {
    let dev = Device::cpu();
    let k = dev
        .load_kernel(Arc::new(add_one::build::<64>().unwrap()), None)
        .unwrap();
    let ints = dev.upload(&[1i32, 2, 3]).unwrap();
    add_one::launch::<64>(&dev, &k, [1, 1, 1], &ints, 3).unwrap();
}
