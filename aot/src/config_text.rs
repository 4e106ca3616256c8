//! One text syntax for kernel configurations, shared by the tuner's reports (`dusk tune`,
//! `dusk bench`), the tuning records' labels and the benchmark binary's `--config`.
//!
//! A configuration is written as `key=value` pairs separated by commas, the keys being
//! the config struct's field names in declaration order, booleans `true` / `false`,
//! element types `f16` / `bf16` / `f32`:
//!
//! ```text
//! block_tokens=64,num_warps=2,min_programs_per_sm=14,tensor_cores=false,tiles=1,l2_prefetch=false
//! ```
//!
//! [`ConfigText::to_text`] writes every field that is *chosen*; fields *fixed by the
//! shape* (the head_dim, page size, GQA group and code width of a [`SpgemvConfig`]; the
//! group of a [`SearchConfig`]) are neither written nor accepted
//! ([`ConfigText::fixed_keys`]): they come from the config the text is applied onto,
//! normally the default for the shape (`SpgemvConfig::new`, `SearchConfig::for_rows`,
//! `AttentionTuning::for_spec`). [`AttentionTuning`] has no such field: every one is
//! written.
//!
//! [`ConfigText::apply_text`] applies any subset of the keys onto a config, so
//! `block_tokens=128,tensor_cores=true` changes those two fields and keeps the others.
//! Whatever it cannot read is an error naming the key or value and what was expected
//! (an unknown or shape-fixed key, a pair without `=`, an empty pair, a key given twice, a
//! value that does not parse); nothing is dropped, and on an error the config is left
//! unchanged. For every config `c` and every config `base` with the same shape-fixed
//! fields, `base.apply_text(&c.to_text())` makes `base == c` (tested on every config of
//! the tuner's spaces).
//!
//! Parsing is all it checks. Whether a config can run is checked where it is used:
//! - [`SpgemvConfig`]: `SpgemvPlan::with_config` (tile sizes, warps, tensor cores against
//!   bits and group), and only the configs compiled into dusk-kernels exist
//!   (`dusk_kernels::spgemv::specialised`, listed by `specialised_configs`; any other
//!   fails `spgemv::build`); [`space::spgemv_fit`](crate::space::spgemv_fit) estimates
//!   whether it fits a multiprocessor.
//! - [`SearchConfig`]: `PrunePlan::with_config` (block, warps, pivots, shared and
//!   histogram against the rows); [`space::search_fit`](crate::space::search_fit).
//! - [`AttentionTuning`]: `AttentionPlan::with_tuning` (tile sizes, warps, chunk, vector
//!   bytes, prefetch, partial type, merge chunks, tensor cores against the group).
//!
//! ```
//! use dusk_aot::config_text::ConfigText;
//! use dusk_kernels::spgemv::SpgemvConfig;
//! let mut c = SpgemvConfig::new(128, 16, 1, 4);
//! assert_eq!(c.to_text(), "block_tokens=64,num_warps=2,min_programs_per_sm=14,tensor_cores=false,tiles=1,l2_prefetch=false");
//! c.apply_text("block_tokens=128,num_warps=4").unwrap();
//! assert_eq!((c.block_tokens, c.num_warps, c.min_programs_per_sm), (128, 4, 14));
//! let err = c.apply_text("block_tokens=128,warps=4").unwrap_err();
//! assert!(err.to_string().starts_with("unknown key `warps` for the spgemv config; valid keys: block_tokens, num_warps"));
//! ```

use dusk_compiler::DType;
use dusk_kernels::attention_ops::AttentionTuning;
use dusk_kernels::spgemv::SpgemvConfig;
use dusk_kernels::threshold::SearchConfig;

/// Why a configuration text could not be applied. Each message is one sentence naming the
/// offending pair, key or value and what was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigTextError {
    /// Nothing (or only spaces) between two commas, or before or after a comma.
    #[error("pair {index} of `{text}` is empty: the {family} config is written as key=value pairs separated by commas")]
    EmptyPair {
        family: &'static str,
        text: String,
        /// 1-based.
        index: usize,
    },
    /// An item without `=`, or with nothing before it.
    #[error("`{pair}` is not a key=value pair; the keys of the {family} config are {keys}")]
    NotAPair {
        family: &'static str,
        pair: String,
        keys: String,
    },
    /// A key that is no field of the config.
    #[error("unknown key `{key}` for the {family} config; valid keys: {keys}")]
    UnknownKey {
        family: &'static str,
        key: String,
        keys: String,
    },
    /// A field of the config that the shape fixes (see [`ConfigText::fixed_keys`]).
    #[error("key `{key}` is fixed by the shape, not set in the text of the {family} config; valid keys: {keys}")]
    FixedKey {
        family: &'static str,
        key: String,
        keys: String,
    },
    /// A key given more than once.
    #[error("key `{key}` is given twice in `{text}`")]
    DuplicateKey { key: String, text: String },
    /// A value that does not parse as the key's type.
    #[error("value `{value}` of key `{key}` does not parse: {key} takes {expected}")]
    BadValue {
        key: String,
        value: String,
        expected: &'static str,
    },
}

/// A kernel configuration written as and read from `key=value` text (see the module).
pub trait ConfigText: Sized {
    /// The family in messages: `spgemv`, `search` or `attention`.
    const FAMILY: &'static str;

    /// The keys [`to_text`](ConfigText::to_text) writes and
    /// [`apply_text`](ConfigText::apply_text) accepts, in order, each with a one-line
    /// description (for `--help` texts).
    fn keys() -> &'static [(&'static str, &'static str)];

    /// Fields of the struct fixed by the shape: neither written nor accepted.
    fn fixed_keys() -> &'static [&'static str];

    /// Every chosen field as `key=value`, separated by commas, in the order of
    /// [`keys`](ConfigText::keys).
    fn to_text(&self) -> String;

    /// Applies `key=value` overrides onto `self` (an empty text changes nothing). Parses
    /// only: see the module for where a config is validated. On an error `self` is
    /// unchanged.
    fn apply_text(&mut self, text: &str) -> Result<(), ConfigTextError>;

    /// `self` with `text` applied.
    fn with_text(mut self, text: &str) -> Result<Self, ConfigTextError> {
        self.apply_text(text)?;
        Ok(self)
    }

    /// The keys as help text: one line each, `  key  description`, aligned.
    fn keys_help() -> String {
        let keys = Self::keys();
        let width = keys.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        keys.iter()
            .map(|(k, d)| format!("  {k:<width$}  {d}\n"))
            .collect()
    }
}

/// A field's value type: how it is written and read.
trait Value: Sized {
    /// What a value must be, for messages.
    const EXPECTED: &'static str;
    fn write(&self) -> String;
    fn read(s: &str) -> Option<Self>;
}

impl Value for usize {
    const EXPECTED: &'static str = "an unsigned integer";
    fn write(&self) -> String {
        self.to_string()
    }
    fn read(s: &str) -> Option<Self> {
        s.parse().ok()
    }
}

impl Value for u32 {
    const EXPECTED: &'static str = "an unsigned integer below 2^32";
    fn write(&self) -> String {
        self.to_string()
    }
    fn read(s: &str) -> Option<Self> {
        s.parse().ok()
    }
}

impl Value for bool {
    const EXPECTED: &'static str = "`true` or `false`";
    fn write(&self) -> String {
        self.to_string()
    }
    fn read(s: &str) -> Option<Self> {
        match s {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        }
    }
}

/// Element types of configs (partial outputs): the floating-point ones.
impl Value for DType {
    const EXPECTED: &'static str = "an element type, `f16`, `bf16` or `f32`";
    fn write(&self) -> String {
        self.name().to_string()
    }
    fn read(s: &str) -> Option<Self> {
        match s {
            "f16" => Some(DType::F16),
            "bf16" => Some(DType::BF16),
            "f32" => Some(DType::F32),
            _ => None,
        }
    }
}

fn parse_value<T: Value>(key: &str, value: &str) -> Result<T, ConfigTextError> {
    T::read(value).ok_or_else(|| ConfigTextError::BadValue {
        key: key.to_string(),
        value: value.to_string(),
        expected: T::EXPECTED,
    })
}

fn key_list<C: ConfigText>() -> String {
    C::keys()
        .iter()
        .map(|(k, _)| *k)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `text`'s pairs, each key as the table of `C` spells it: every pair well formed, every
/// key chosen (not fixed) and given once. Spaces around keys and values are ignored.
fn pairs<'t, C: ConfigText>(
    text: &'t str,
) -> Result<Vec<(&'static str, &'t str)>, ConfigTextError> {
    let mut out: Vec<(&'static str, &'t str)> = vec![];
    if text.trim().is_empty() {
        return Ok(out);
    }
    for (i, item) in text.split(',').enumerate() {
        let item = item.trim();
        if item.is_empty() {
            return Err(ConfigTextError::EmptyPair {
                family: C::FAMILY,
                text: text.to_string(),
                index: i + 1,
            });
        }
        let (key, value) = match item.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => (k.trim(), v.trim()),
            _ => {
                return Err(ConfigTextError::NotAPair {
                    family: C::FAMILY,
                    pair: item.to_string(),
                    keys: key_list::<C>(),
                })
            }
        };
        let Some(&(key, _)) = C::keys().iter().find(|(k, _)| *k == key) else {
            let family = C::FAMILY;
            let (key, keys) = (key.to_string(), key_list::<C>());
            return Err(if C::fixed_keys().contains(&key.as_str()) {
                ConfigTextError::FixedKey { family, key, keys }
            } else {
                ConfigTextError::UnknownKey { family, key, keys }
            });
        };
        if out.iter().any(|(k, _)| *k == key) {
            return Err(ConfigTextError::DuplicateKey {
                key: key.to_string(),
                text: text.to_string(),
            });
        }
        out.push((key, value));
    }
    Ok(out)
}

/// Implements [`ConfigText`] for a config struct: its shape-fixed fields, then its chosen
/// fields (in declaration order) with their descriptions. Every field of the struct must
/// be named in one list (`to_text` destructures the struct without `..`).
macro_rules! config_text {
    (
        $ty:ident, $family:literal,
        fixed: [$($fixed:ident),* $(,)?],
        keys: [$($key:ident: $desc:literal),* $(,)?] $(,)?
    ) => {
        impl ConfigText for $ty {
            const FAMILY: &'static str = $family;

            fn keys() -> &'static [(&'static str, &'static str)] {
                &[$((stringify!($key), $desc)),*]
            }

            fn fixed_keys() -> &'static [&'static str] {
                &[$(stringify!($fixed)),*]
            }

            fn to_text(&self) -> String {
                let $ty { $($fixed: _,)* $($key),* } = self;
                let parts: Vec<String> = vec![
                    $(format!("{}={}", stringify!($key), Value::write($key))),*
                ];
                parts.join(",")
            }

            fn apply_text(&mut self, text: &str) -> Result<(), ConfigTextError> {
                let mut next = *self;
                for (key, value) in pairs::<Self>(text)? {
                    match key {
                        $(stringify!($key) => next.$key = parse_value(key, value)?,)*
                        _ => unreachable!("`pairs` returns keys of the table only"),
                    }
                }
                *self = next;
                Ok(())
            }
        }
    };
}

config_text! {
    SpgemvConfig, "spgemv",
    fixed: [head_dim, page_size, group, bits],
    keys: [
        block_tokens: "candidate tokens a program scores (a power of two, 16 to 512)",
        num_warps: "warps a program (1, 2, 4, 8 or 16)",
        min_programs_per_sm: "programs per SM asked of ptxas, which caps the registers (0: none)",
        tensor_cores: "score on the tensor cores (mma; 4-bit codes, groups of 2 to 8) instead of dp2a",
        tiles: "tiles of block_tokens a program scores, each step loading the next one's key rows ahead of this one's dot (1: one; more needs tensor_cores)",
        l2_prefetch: "with tiles > 1: each step brings the next tile's codes into L2",
    ],
}

config_text! {
    SearchConfig, "search",
    fixed: [group],
    keys: [
        block: "candidates a program holds: the whole row, or with stream one tile (a power of two, 1024 to 8192)",
        num_warps: "warps a program (a power of two up to 32, with block >= 128 x num_warps)",
        stream: "stream the row in tiles of block (rows of any length) instead of holding it in registers",
        pivots: "points each search step tries (1 to 4)",
        shared: "with stream: the weights staged in shared memory (rows of up to 8192 / group candidates)",
        histogram: "with stream: the first step from a histogram of the weights",
        recompute: "with stream, not shared: the weights recomputed from the scores every pass instead of kept in a work buffer",
        prefetch: "with stream: each tile's loads preceded by an L2 prefetch of the tile two on",
        backoff_ns: "nanoseconds a row waiting for earlier rows' budgets sleeps between reads (0: none)",
        min_programs_per_sm: "programs per SM asked of ptxas, which caps the registers (0: none)",
        timeline: "with stream, for diagnosis: a timeline record per row (an extra kernel parameter)",
        split_heads: "with stream and a group: a program a query head, the row's last one writing the union",
    ],
}

config_text! {
    AttentionTuning, "attention",
    fixed: [],
    keys: [
        block_tokens: "tokens a step of the split kernel (a power of two, 8 to 128)",
        num_warps: "warps a program (1, 2, 4, 8 or 16)",
        chunk_tokens: "tokens a work item, a multiple of block_tokens (token lists: the shortest segment)",
        vector_bytes: "bytes of a K or V row each thread reads (16 or 32)",
        prefetch: "tiles of K and V in flight ahead of the one computed (1 or 2)",
        min_programs_per_sm: "programs per SM asked of ptxas (0: none; at most 32)",
        stages: "tensor cores: K and V staged through this many tiles of shared memory by cp.async (0: through registers; 2 to 6)",
        l2_prefetch: "K and V of one more tile brought into L2 a step early",
        tensor_cores: "scores and P.V on the tensor cores (groups of 2 to 8, block_tokens=8, num_warps=1)",
        chunk_fastest: "a row's chunks next to each other in the grid (dense and padded)",
        list_programs: "token lists: programs of the split grid (0: as many as fit at once)",
        row_tokens: "token lists: entries' worth of time a program pays to start a piece of a row",
        fused_merge: "token lists: the last piece of a row merges it, instead of a merge launch",
        row_signals: "token lists with a merge launch: a row merged as soon as its pieces are in",
        partial_dtype: "element type of the split's partial outputs (f32, f16 or bf16)",
        stream_kv: "K and V read as a stream the caches evict first",
        merge_chunks: "partial results the merge combines a step (a power of two up to 64)",
        timeline: "token lists, for diagnosis: each program's clocks and SM recorded",
    ],
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spgemv() -> SpgemvConfig {
        SpgemvConfig::new(128, 16, 4, 4)
    }

    /// Every field off its default.
    fn attention() -> AttentionTuning {
        AttentionTuning {
            block_tokens: 16,
            num_warps: 4,
            chunk_tokens: 256,
            vector_bytes: 32,
            prefetch: 2,
            min_programs_per_sm: 3,
            stages: 4,
            l2_prefetch: true,
            tensor_cores: false,
            chunk_fastest: true,
            list_programs: 264,
            row_tokens: 16,
            fused_merge: true,
            row_signals: false,
            partial_dtype: DType::F32,
            stream_kv: false,
            merge_chunks: 16,
            timeline: true,
        }
    }

    #[test]
    fn writes_every_chosen_field_in_order() {
        assert_eq!(
            spgemv().to_text(),
            "block_tokens=64,num_warps=4,min_programs_per_sm=0,tensor_cores=true,tiles=16,\
             l2_prefetch=true"
        );
        assert_eq!(
            SearchConfig::for_rows(32768, 1).to_text(),
            "block=2048,num_warps=4,stream=true,pivots=1,shared=false,histogram=true,\
             recompute=true,prefetch=true,backoff_ns=0,min_programs_per_sm=0,timeline=false,\
             split_heads=false"
        );
        let t = AttentionTuning {
            block_tokens: 8,
            num_warps: 1,
            chunk_tokens: 512,
            vector_bytes: 16,
            prefetch: 1,
            min_programs_per_sm: 0,
            stages: 0,
            l2_prefetch: false,
            tensor_cores: true,
            chunk_fastest: false,
            list_programs: 0,
            row_tokens: 24,
            fused_merge: false,
            row_signals: true,
            partial_dtype: DType::BF16,
            stream_kv: true,
            merge_chunks: 8,
            timeline: false,
        };
        assert_eq!(
            t.to_text(),
            "block_tokens=8,num_warps=1,chunk_tokens=512,vector_bytes=16,prefetch=1,\
             min_programs_per_sm=0,stages=0,l2_prefetch=false,tensor_cores=true,chunk_fastest=false,\
             list_programs=0,row_tokens=24,fused_merge=false,row_signals=true,\
             partial_dtype=bf16,stream_kv=true,merge_chunks=8,timeline=false"
        );
    }

    #[test]
    fn text_keys_are_the_table_in_order() {
        fn check<C: ConfigText>(c: &C) {
            let text = c.to_text();
            let keys: Vec<&str> = text
                .split(',')
                .map(|p| p.split_once('=').unwrap().0)
                .collect();
            let table: Vec<&str> = C::keys().iter().map(|(k, _)| *k).collect();
            assert_eq!(keys, table);
            for (k, d) in C::keys() {
                assert!(!d.is_empty() && !d.contains('\n'), "{k}");
                assert!(!C::fixed_keys().contains(k), "{k}");
            }
        }
        check(&spgemv());
        check(&SearchConfig::for_rows(4096, 2));
        check(&attention());
    }

    #[test]
    fn overrides_change_only_their_fields() {
        let mut c = spgemv();
        c.apply_text(" block_tokens = 128 , tensor_cores=false")
            .unwrap();
        let want = SpgemvConfig {
            block_tokens: 128,
            tensor_cores: false,
            ..spgemv()
        };
        assert_eq!(c, want);
        c.apply_text("").unwrap();
        c.apply_text("  ").unwrap();
        assert_eq!(c, want);
        let a = attention()
            .with_text("partial_dtype=f16,merge_chunks=64")
            .unwrap();
        assert_eq!(
            a,
            AttentionTuning {
                partial_dtype: DType::F16,
                merge_chunks: 64,
                ..attention()
            }
        );
    }

    #[test]
    fn errors_name_the_key_or_value_and_leave_the_config_unchanged() {
        let base = spgemv();
        let cases: Vec<(&str, ConfigTextError, &str)> = vec![
            (
                "block_tokens=128,,num_warps=4",
                ConfigTextError::EmptyPair {
                    family: "spgemv",
                    text: "block_tokens=128,,num_warps=4".into(),
                    index: 2,
                },
                "pair 2 of `block_tokens=128,,num_warps=4` is empty: the spgemv config is written as key=value pairs separated by commas",
            ),
            (
                "block_tokens=128,",
                ConfigTextError::EmptyPair {
                    family: "spgemv",
                    text: "block_tokens=128,".into(),
                    index: 2,
                },
                "pair 2 of `block_tokens=128,` is empty: the spgemv config is written as key=value pairs separated by commas",
            ),
            (
                "block_tokens=128,tensor_cores",
                ConfigTextError::NotAPair {
                    family: "spgemv",
                    pair: "tensor_cores".into(),
                    keys: "block_tokens, num_warps, min_programs_per_sm, tensor_cores, tiles, l2_prefetch".into(),
                },
                "`tensor_cores` is not a key=value pair; the keys of the spgemv config are block_tokens, num_warps, min_programs_per_sm, tensor_cores, tiles, l2_prefetch",
            ),
            (
                "=4",
                ConfigTextError::NotAPair {
                    family: "spgemv",
                    pair: "=4".into(),
                    keys: "block_tokens, num_warps, min_programs_per_sm, tensor_cores, tiles, l2_prefetch".into(),
                },
                "`=4` is not a key=value pair; the keys of the spgemv config are block_tokens, num_warps, min_programs_per_sm, tensor_cores, tiles, l2_prefetch",
            ),
            (
                "block_tokens=128,warps=4",
                ConfigTextError::UnknownKey {
                    family: "spgemv",
                    key: "warps".into(),
                    keys: "block_tokens, num_warps, min_programs_per_sm, tensor_cores, tiles, l2_prefetch".into(),
                },
                "unknown key `warps` for the spgemv config; valid keys: block_tokens, num_warps, min_programs_per_sm, tensor_cores, tiles, l2_prefetch",
            ),
            (
                "group=8",
                ConfigTextError::FixedKey {
                    family: "spgemv",
                    key: "group".into(),
                    keys: "block_tokens, num_warps, min_programs_per_sm, tensor_cores, tiles, l2_prefetch".into(),
                },
                "key `group` is fixed by the shape, not set in the text of the spgemv config; valid keys: block_tokens, num_warps, min_programs_per_sm, tensor_cores, tiles, l2_prefetch",
            ),
            (
                "num_warps=4,block_tokens=32,num_warps=8",
                ConfigTextError::DuplicateKey {
                    key: "num_warps".into(),
                    text: "num_warps=4,block_tokens=32,num_warps=8".into(),
                },
                "key `num_warps` is given twice in `num_warps=4,block_tokens=32,num_warps=8`",
            ),
            (
                "block_tokens=128,num_warps=four",
                ConfigTextError::BadValue {
                    key: "num_warps".into(),
                    value: "four".into(),
                    expected: "an unsigned integer below 2^32",
                },
                "value `four` of key `num_warps` does not parse: num_warps takes an unsigned integer below 2^32",
            ),
            (
                "block_tokens=-64",
                ConfigTextError::BadValue {
                    key: "block_tokens".into(),
                    value: "-64".into(),
                    expected: "an unsigned integer",
                },
                "value `-64` of key `block_tokens` does not parse: block_tokens takes an unsigned integer",
            ),
            (
                "tensor_cores=1",
                ConfigTextError::BadValue {
                    key: "tensor_cores".into(),
                    value: "1".into(),
                    expected: "`true` or `false`",
                },
                "value `1` of key `tensor_cores` does not parse: tensor_cores takes `true` or `false`",
            ),
            (
                "num_warps=",
                ConfigTextError::BadValue {
                    key: "num_warps".into(),
                    value: "".into(),
                    expected: "an unsigned integer below 2^32",
                },
                "value `` of key `num_warps` does not parse: num_warps takes an unsigned integer below 2^32",
            ),
        ];
        for (text, want, message) in cases {
            let mut c = base;
            let err = c.apply_text(text).unwrap_err();
            assert_eq!(err, want, "{text}");
            assert_eq!(err.to_string(), message, "{text}");
            assert_eq!(c, base, "{text}: changed on an error");
        }
        let err = attention().with_text("partial_dtype=i32").unwrap_err();
        assert_eq!(
            err.to_string(),
            "value `i32` of key `partial_dtype` does not parse: partial_dtype takes an element type, `f16`, `bf16` or `f32`"
        );
        let err = SearchConfig::for_rows(4096, 1)
            .with_text("group=2")
            .unwrap_err();
        assert!(matches!(err, ConfigTextError::FixedKey { .. }), "{err}");
        assert!(err
            .to_string()
            .ends_with("min_programs_per_sm, timeline, split_heads"));
    }

    #[test]
    fn keys_help_has_a_line_a_key() {
        let help = SpgemvConfig::keys_help();
        assert_eq!(help.lines().count(), 6);
        assert!(
            help.starts_with("  block_tokens         candidate tokens"),
            "{help}"
        );
        assert_eq!(AttentionTuning::keys_help().lines().count(), 18);
        assert_eq!(SearchConfig::keys_help().lines().count(), 12);
    }

    fn round_trips<C: ConfigText + Copy + PartialEq + std::fmt::Debug>(space: &[C]) {
        let mut seen = std::collections::HashSet::new();
        for c in space {
            let text = c.to_text();
            assert!(
                seen.insert(text.clone()),
                "two configs of a space write {text}"
            );
            for base in space {
                assert_eq!(base.with_text(&text), Ok(*c), "{text} onto {base:?}");
            }
        }
    }

    #[test]
    fn every_spgemv_config_of_the_spaces_round_trips() {
        let mut shapes: Vec<(usize, usize, u32)> = dusk_kernels::spgemv::specialised_configs()
            .iter()
            .map(|c| (c.head_dim, c.group, c.bits))
            .collect();
        shapes.dedup();
        assert!(shapes.len() > 10);
        for (d, g, b) in shapes {
            let space = crate::space::spgemv(d, g, b);
            round_trips(&space);
            let default = SpgemvConfig::new(d, 16, g, b);
            for c in &space {
                assert_eq!(default.with_text(&c.to_text()), Ok(*c));
                assert_eq!(crate::spgemv_tune::label(c), c.to_text());
            }
        }
    }

    #[test]
    fn every_search_config_of_the_spaces_round_trips() {
        for group in [1, 2, 4, 8, 16] {
            for len in [1, 1000, 2048, 4096, 8192, 8193, 32768, 131072] {
                let space = crate::space::search(len, group);
                round_trips(&space);
                let default = SearchConfig::for_rows(len, group);
                for c in &space {
                    assert_eq!(default.with_text(&c.to_text()), Ok(*c));
                    assert_eq!(crate::search_tune::label(c), c.to_text());
                }
            }
        }
    }

    #[test]
    fn every_attention_config_of_the_spaces_round_trips() {
        use crate::attention_tune::{label, AttentionShape};
        use crate::space::Limits;
        for batch in [1, 8, 32] {
            for (num_q_heads, num_kv_heads) in [(32, 32), (32, 8), (32, 4), (64, 8)] {
                for head_dim in [64, 128, 256] {
                    for context in [1000, 8192, 131072] {
                        for num_sms in [132, 78] {
                            let shape = AttentionShape {
                                batch,
                                num_q_heads,
                                num_kv_heads,
                                head_dim,
                                context,
                            };
                            let (kept, pruned) = shape.space(&Limits::H100, num_sms);
                            let mut space = kept;
                            space.extend(pruned.into_iter().map(|(t, _)| t));
                            round_trips(&space);
                            for t in &space {
                                assert_eq!(attention().with_text(&t.to_text()), Ok(*t));
                                assert_eq!(label(t), t.to_text());
                            }
                        }
                    }
                }
            }
        }
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        fn dtype() -> impl Strategy<Value = DType> {
            prop_oneof![Just(DType::F16), Just(DType::BF16), Just(DType::F32)]
        }

        fn spgemv() -> impl Strategy<Value = SpgemvConfig> {
            (
                (any::<usize>(), any::<usize>(), any::<usize>(), any::<u32>()),
                (any::<usize>(), any::<u32>(), any::<u32>(), any::<bool>()),
                (any::<usize>(), any::<bool>()),
            )
                .prop_map(
                    |((head_dim, page_size, group, bits), (bt, w, o, tc), (tiles, l2))| {
                        SpgemvConfig {
                            head_dim,
                            page_size,
                            group,
                            bits,
                            block_tokens: bt,
                            num_warps: w,
                            min_programs_per_sm: o,
                            tensor_cores: tc,
                            tiles,
                            l2_prefetch: l2,
                        }
                    },
                )
        }

        fn search() -> impl Strategy<Value = SearchConfig> {
            (
                (any::<usize>(), any::<usize>(), any::<u32>(), any::<u32>()),
                (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
                (any::<bool>(), any::<bool>(), any::<u32>(), any::<u32>()),
                any::<bool>(),
            )
                .prop_map(
                    |(
                        (block, group, num_warps, pivots),
                        (stream, shared, histogram, recompute),
                        (prefetch, timeline, backoff_ns, o),
                        split_heads,
                    )| {
                        SearchConfig {
                            block,
                            group,
                            num_warps,
                            stream,
                            pivots,
                            shared,
                            histogram,
                            recompute,
                            prefetch,
                            backoff_ns,
                            min_programs_per_sm: o,
                            timeline,
                            split_heads,
                        }
                    },
                )
        }

        fn attention() -> impl Strategy<Value = AttentionTuning> {
            (
                (any::<usize>(), any::<u32>(), any::<usize>(), any::<u32>()),
                (any::<usize>(), any::<u32>(), any::<bool>(), any::<bool>()),
                (any::<bool>(), any::<u32>(), any::<u32>(), any::<bool>()),
                (
                    any::<bool>(),
                    dtype(),
                    any::<bool>(),
                    any::<usize>(),
                    any::<bool>(),
                    any::<usize>(),
                ),
            )
                .prop_map(|(a, b, c, d)| AttentionTuning {
                    block_tokens: a.0,
                    num_warps: a.1,
                    chunk_tokens: a.2,
                    vector_bytes: a.3,
                    prefetch: b.0,
                    min_programs_per_sm: b.1,
                    stages: d.5,
                    l2_prefetch: b.2,
                    tensor_cores: b.3,
                    chunk_fastest: c.0,
                    list_programs: c.1,
                    row_tokens: c.2,
                    fused_merge: c.3,
                    row_signals: d.0,
                    partial_dtype: d.1,
                    stream_kv: d.2,
                    merge_chunks: d.3,
                    timeline: d.4,
                })
        }

        /// The pairs of `text` chosen by `mask` (bit i: pair i), in the order `order` gives.
        fn some_pairs(text: &str, mask: u32, order: &[usize]) -> String {
            let pairs: Vec<&str> = text.split(',').collect();
            order
                .iter()
                .map(|&i| i % pairs.len())
                .filter(|&i| mask & (1 << i) != 0)
                .fold(vec![], |mut v: Vec<usize>, i| {
                    if !v.contains(&i) {
                        v.push(i);
                    }
                    v
                })
                .into_iter()
                .map(|i| pairs[i])
                .collect::<Vec<_>>()
                .join(",")
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

            #[test]
            fn spgemv_round_trips(c in spgemv(), base in spgemv()) {
                let base = SpgemvConfig {
                    head_dim: c.head_dim, page_size: c.page_size, group: c.group, bits: c.bits,
                    ..base
                };
                prop_assert_eq!(base.with_text(&c.to_text()), Ok(c));
            }

            #[test]
            fn search_round_trips(c in search(), base in search()) {
                let base = SearchConfig { group: c.group, ..base };
                prop_assert_eq!(base.with_text(&c.to_text()), Ok(c));
            }

            #[test]
            fn attention_round_trips(c in attention(), base in attention()) {
                prop_assert_eq!(base.with_text(&c.to_text()), Ok(c));
            }

            /// Any subset of a config's pairs, in any order, sets exactly those fields: the
            /// result's text has the subset's pairs and the base's others.
            #[test]
            fn some_pairs_set_just_their_fields(
                c in attention(),
                base in attention(),
                mask in any::<u32>(),
                order in proptest::collection::vec(0usize..17, 0..40),
            ) {
                let subset = some_pairs(&c.to_text(), mask, &order);
                let got = base.with_text(&subset).unwrap().to_text();
                let given: Vec<&str> = subset.split(',').filter(|p| !p.is_empty()).collect();
                for (mine, theirs) in got.split(',').zip(base.to_text().split(',')) {
                    let key = mine.split_once('=').unwrap().0;
                    match given.iter().find(|p| p.split_once('=').unwrap().0 == key) {
                        Some(p) => prop_assert_eq!(mine, *p),
                        None => prop_assert_eq!(mine, theirs),
                    }
                }
            }

            /// Any text is applied or refused with an error; nothing panics, and a refused
            /// text changes nothing.
            #[test]
            fn any_text_is_applied_or_refused(
                text in "[a-z_=,0-9 ]{0,40}|((block_tokens|num_warps|tensor_cores|group|x)=(1|true|f16|)[, ]{0,2}){0,4}",
                base in spgemv(),
            ) {
                let mut c = base;
                if c.apply_text(&text).is_err() {
                    prop_assert_eq!(c, base);
                }
            }
        }
    }
}
