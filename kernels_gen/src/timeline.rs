//! Timelines of a launch's programs, for diagnosis: each program writes the GPU's clock
//! (`%globaltimer`, ns) at the points of its work that a kernel names, and its SM, into a
//! record of [`TIMELINE_WORDS`] i64 words, so the host can see where a launch's time goes
//! program by program (when each starts, waits, ends), which event timings of the whole
//! launch cannot say. The attention split and merge ([`crate::attention::SplitConfig`])
//! and the threshold search ([`crate::threshold::SearchConfig`]) keep one as an option.

use dusk_compiler::{DType, KernelBuilder, Value};

/// Words of a program's record.
pub const TIMELINE_WORDS: usize = 8;

/// Opens record `index` of the i64 buffer `timeline`: writes the clock to word 0, the SM
/// to word `sm_word` and zero to the words `zeroed` (those only some programs reach, so a
/// record never shows a clock from an earlier launch). Returns the record's pointer.
pub(crate) fn open_record(
    b: &mut KernelBuilder,
    timeline: Value,
    index: Value,
    sm_word: i32,
    zeroed: &[i32],
) -> Value {
    let at = b.mul_c(index, TIMELINE_WORDS as i64);
    let record = b.add_ptr(timeline, at);
    let now = b.global_timer();
    b.store(record, now);
    let sm = b.sm_id();
    let sm = b.cast(sm, DType::I64);
    let zero = b.i64(0);
    for (word, v) in zeroed.iter().map(|w| (*w, zero)).chain([(sm_word, sm)]) {
        let w = b.i32(word);
        let p = b.add_ptr(record, w);
        b.store(p, v);
    }
    record
}

/// Writes the clock to word `word` of `record` where `after` holds: a branch on the values
/// `after` was computed from, so the clock is read once they have arrived, not when they
/// were asked for.
pub(crate) fn stamp(b: &mut KernelBuilder, record: Value, word: i32, after: Value) {
    b.if_then(after, |b| {
        let now = b.global_timer();
        let w = b.i32(word);
        let p = b.add_ptr(record, w);
        b.store(p, now);
    });
}
