use dusk::kernel;

// A type parameter is an element type: no bounds, before the const generics, the element
// of a pointer or a block (not a scalar parameter).
#[kernel]
fn bounded<T: Copy>(x: Ptr<T>) {
    store(x, load(x));
}

#[kernel]
fn late<const N: usize, T>(x: Ptr<T>) {
    store(x, load(x));
}

#[kernel]
fn scalar_of_t<T>(x: Ptr<T>, a: T) {
    store(x, load(x) * a);
}

fn main() {}
