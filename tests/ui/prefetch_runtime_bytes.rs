use dusk::kernel;

#[kernel]
fn warm<const BLOCK: usize>(x: Ptr<f32>, bytes: i32) {
    prefetch_l2(x + arange(0, BLOCK) * 32, bytes);
}

fn main() {}
