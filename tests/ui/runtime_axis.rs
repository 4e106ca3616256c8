use dusk::kernel;

#[kernel]
fn reduce<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, axis: i32) {
    let v = load(x + arange(0, BLOCK));
    store(out, sum(v, axis));
}

fn main() {}
