use dusk::kernel;

#[kernel]
fn copy(x: Ptr<f32>, y: Ptr<f32>, n: i32) {
    #[unroll]
    for i in 0..n {
        store(y + i, load(x + i));
    }
}

fn main() {}
