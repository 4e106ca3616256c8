use dusk::kernel;

#[kernel]
fn show(x: Ptr<f32>) {
    let v = load(x);
    println!("{:?}", v);
}

fn main() {}
