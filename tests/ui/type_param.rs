use dusk::kernel;

#[kernel]
fn copy<T>(x: Ptr<f32>, out: Ptr<f32>) {
    store(out, load(x));
}

fn main() {}
