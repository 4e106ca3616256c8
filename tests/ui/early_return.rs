use dusk::kernel;

#[kernel]
fn clamp(x: Ptr<f32>) {
    let v = load(x);
    if v < 0.0 {
        return;
    }
    store(x, v);
}

fn main() {}
