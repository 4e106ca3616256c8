use dusk::kernel;

#[kernel]
fn copy(x: Ptr<f32>, y: Ptr<f32>) {
    #[inline]
    for i in 0..4 {
        store(y + i, load(x + i));
    }
}

fn main() {}
