//! Packing each row's staged kept positions into one CSR list.

use dusk_compiler::{CompileError, DType, Kernel, KernelBuilder};

/// Builds the kernel that packs each row's staged positions into one CSR list. Parameters:
/// `budget` (i32 per row), `cand_indptr` (i32, where each row's staged positions start),
/// `staged` (i32), `sel_indptr` (i32, rows + 1), `sel_indices` (i32). A
/// program per row sums the budgets before it (rows are few: 2048 budgets are 8 KB).
pub fn build_pack(num_warps: u32) -> Result<Kernel, CompileError> {
    const TILE: usize = 1024;
    let mut b = KernelBuilder::new(&format!("threshold_pack_w{num_warps}"));
    b.set_num_warps(num_warps);
    let budget = b.param_ptr("budget", DType::I32);
    let indptr = b.param_ptr("cand_indptr", DType::I32);
    let staged = b.param_ptr("staged", DType::I32);
    let sel_indptr = b.param_ptr("sel_indptr", DType::I32);
    let sel_indices = b.param_ptr("sel_indices", DType::I32);

    let row = b.program_id(0);
    let zero = b.i32(0);
    let tile = b.i32(TILE as i32);
    let before = b.for_range(zero, row, tile, &[zero], |b, t0, c| {
        let offs = b.arange(0, TILE as i64);
        let idx = b.add(offs, t0);
        let m = b.lt(idx, row);
        let p = b.add_ptr(budget, idx);
        let zero = b.i32(0);
        let v = b.load_masked(p, Some(m), Some(zero));
        let s = b.sum(v, 0);
        vec![b.add(c[0], s)]
    })[0];
    let pb = b.add_ptr(budget, row);
    let count = b.load(pb);
    let ps = b.add_ptr(indptr, row);
    let start = b.load(ps);
    let start64 = b.cast(start, DType::I64);
    let src_row = b.add_ptr(staged, start64);
    let before64 = b.cast(before, DType::I64);
    let dst_row = b.add_ptr(sel_indices, before64);
    b.for_range(zero, count, tile, &[], |b, t0, _| {
        let offs = b.arange(0, TILE as i64);
        let idx = b.add(offs, t0);
        let m = b.lt(idx, count);
        let src = b.add_ptr(src_row, idx);
        let v = b.load_masked(src, Some(m), None);
        let dst = b.add_ptr(dst_row, idx);
        b.store_masked(dst, v, Some(m));
        vec![]
    });
    let one = b.i32(1);
    let next = b.add(row, one);
    let pe = b.add_ptr(sel_indptr, next);
    let end = b.add(before, count);
    b.store(pe, end);
    let first = b.eq(row, zero);
    b.if_then(first, |b| {
        let zero = b.i32(0);
        b.store(sel_indptr, zero);
    });
    b.finish()
}
