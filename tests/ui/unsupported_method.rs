use dusk::kernel;

#[kernel]
fn square(x: Ptr<f32>) {
    let v = load(x);
    store(x, v.powi(2));
}

fn main() {}
