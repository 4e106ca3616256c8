use dusk::kernel;

#[kernel]
fn misspelt<const BLOCK: usize>(x: Ptr<f32>) {
    let offs = arnage(0, BLOCK);
    let v = laod(x + offs);
    store(x + offs, v.sqtr());
}

fn main() {}
