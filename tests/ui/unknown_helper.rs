use dusk::kernel;

#[kernel]
fn uses_helper(x: Ptr<f32>) {
    let v = load(x);
    store(x, softplus(v));
}

fn main() {}
