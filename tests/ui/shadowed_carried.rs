use dusk::kernel;

#[kernel]
fn total(x: Ptr<f32>, n: i32) {
    let mut acc = 0.0;
    for i in 0..n {
        acc = acc + load(x + i);
        let acc = acc * 2.0;
        store(x + i, acc);
    }
    store(x, acc);
}

fn main() {}
