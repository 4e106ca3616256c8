use dusk::kernel;

#[kernel]
fn pick(x: Ptr<f32>, n: i32) {
    let v = load(x);
    let w = match n {
        0 => v,
        _ => -v,
    };
    store(x, w);
}

fn main() {}
