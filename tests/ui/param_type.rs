use dusk::kernel;

#[kernel]
fn scale(x: Vec<f32>, n: i32) {
    let _ = n;
}

fn main() {}
