use dusk::kernel;

#[kernel]
fn first<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>) {
    let v = load(x + arange(0, BLOCK));
    store(out, v[0]);
}

fn main() {}
