use dusk::kernel;

// A helper's tuple is checked against its return type, and a tuple is taken apart whole.
#[kernel]
fn bounds(x: Ptr<i32>) -> (i32, i32) {
    let lo = load(x);
    (lo, lo + 1, lo + 2)
}

#[kernel]
fn no_tuple_tail(x: Ptr<i32>) -> (i32, i32) {
    load(x)
}

#[kernel]
fn takes_three(x: Ptr<i32>) {
    let (a, b, c) = pair(x);
    store(x, a + b + c);
}

#[kernel]
fn pair(x: Ptr<i32>) -> (i32, i32) {
    (load(x), load(x + 1))
}

#[kernel]
fn tuple_of_a_builtin(x: Ptr<i32>) {
    let (a, b) = load(x);
    store(x, a + b);
}

#[kernel]
fn tuple_of_another_length(x: Ptr<i32>) {
    let (a, b) = (load(x), 1, 2);
    store(x, a + b);
}

fn main() {}
