use dusk::kernel;

#[kernel(warps = 8)]
fn noop(x: Ptr<f32>) {
    store(x, load(x));
}

fn main() {}
