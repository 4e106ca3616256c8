//! Compile-fail tests of `#[kernel]`: each case in `tests/ui/` must fail to compile with
//! the committed `.stderr` (regenerate with `TRYBUILD=overwrite`).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
