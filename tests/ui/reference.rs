use dusk::kernel;

#[kernel]
fn alias(x: Ptr<f32>) {
    let v = load(x);
    let r = &v;
    store(x, r);
}

fn main() {}
