use dusk::kernel;

#[kernel]
fn scale_in_place(x: Ptr<f32>, a: f32) {
    store(x, load(x) * a);
}

#[kernel]
fn uses_result(x: Ptr<f32>) {
    let v = load(x);
    store(x, scale_in_place(x, v));
}

fn main() {}
