use dusk::kernel;

#[kernel]
fn double(x: Block<Vec<f32>>) -> Block<f32> {
    x * 2.0
}

fn main() {}
