use dusk::kernel;

#[kernel]
fn twice(x: Ptr<f32>) {
    let double = |v| v * 2.0;
    store(x, double(load(x)));
}

fn main() {}
