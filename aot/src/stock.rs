//! The stock kernels of the committed bundle (`kernels_gen/bundle/`): a few representative
//! configurations of each family, head_dim 128, pages of 16 tokens, 4-bit K codes.
//!
//! | name | kernel | grid |
//! |---|---|---|
//! | `quantize_k4_d128` | [`quantize`](dusk_kernels::quantize), 16 rows a program | `ceil(num_rows / 16)` |
//! | `spgemv_prepare_q_d128_b4` | query to 15-bit fixed point | `q_rows` |
//! | `spgemv_quant_dp2a_d128_g1_b4_t64_w2_o14` | SpGEMV, MHA default (`dp2a`) | `rows, ceil(max_row_len / 64)` |
//! | `spgemv_quant_mma_d128_g4_b4_t64_w2_o0` | SpGEMV, GQA 4 default (tensor cores) | `rows, ceil(max_row_len / 64)` |
//! | `threshold_top_p_b8192_g1_w16` | top-p search, rows up to 8192 candidates | `rows` |
//!
//! `rows` is the number of candidate rows (batch x KV heads), `max_row_len` the longest.

use crate::bundle::{factor, BundleKernel};
use crate::Result;
use dusk_kernels::policies::top_p;
use dusk_kernels::quantize::{self, QuantizeConfig};
use dusk_kernels::spgemv::{self, SpgemvConfig};
use dusk_kernels::threshold::{self, SearchConfig};
use serde_json::{json, Map, Value};

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The bundle name of a `spgemv_quant` configuration.
pub fn spgemv_name(c: &SpgemvConfig) -> String {
    format!(
        "spgemv_quant_{}_d{}_g{}_b{}_t{}_w{}_o{}",
        if c.tensor_cores { "mma" } else { "dp2a" },
        c.head_dim,
        c.group,
        c.bits,
        c.block_tokens,
        c.num_warps,
        c.min_programs_per_sm
    )
}

/// A `spgemv_quant` configuration as JSON (the manifest's `config`, tuning records).
pub fn spgemv_config_json(c: &SpgemvConfig) -> Value {
    json!({
        "head_dim": c.head_dim, "page_size": c.page_size, "group": c.group, "bits": c.bits,
        "block_tokens": c.block_tokens, "num_warps": c.num_warps,
        "min_programs_per_sm": c.min_programs_per_sm, "tensor_cores": c.tensor_cores,
    })
}

/// The scoring kernel of `cfg` as a bundle entry.
pub fn spgemv_kernel(cfg: &SpgemvConfig) -> Result<BundleKernel> {
    Ok(BundleKernel {
        name: spgemv_name(cfg),
        family: "spgemv_quant".into(),
        kernel: spgemv::build(cfg)?,
        inputs: vec!["rows".into(), "max_row_len".into()],
        grid: [
            vec![factor("rows", 1)],
            vec![factor("max_row_len", cfg.block_tokens)],
            vec![],
        ],
        config: obj(spgemv_config_json(cfg)),
    })
}

/// The kernels of the stock bundle, in manifest order.
pub fn kernels() -> Result<Vec<BundleKernel>> {
    let qcfg = QuantizeConfig::new(128, 4);
    let mha = SpgemvConfig::new(128, 16, 1, 4);
    let gqa = SpgemvConfig::new(128, 16, 4, 4);
    let search = SearchConfig::for_rows(8192, 1);
    let mut out = vec![
        BundleKernel {
            name: "quantize_k4_d128".into(),
            family: "quantize_k".into(),
            kernel: quantize::build(&qcfg)?,
            inputs: vec![],
            grid: [vec![factor("num_rows", qcfg.block_rows)], vec![], vec![]],
            config: obj(json!({"head_dim": 128, "bits": 4, "block_rows": qcfg.block_rows})),
        },
        BundleKernel {
            name: "spgemv_prepare_q_d128_b4".into(),
            family: "spgemv_prepare_q".into(),
            kernel: spgemv::build_prepare_q(&mha)?,
            inputs: vec!["q_rows".into()],
            grid: [vec![factor("q_rows", 1)], vec![], vec![]],
            config: obj(json!({"head_dim": 128, "bits": 4})),
        },
    ];
    out.push(spgemv_kernel(&mha)?);
    out.push(spgemv_kernel(&gqa)?);
    let policy = &top_p::POLICY;
    out.push(BundleKernel {
        name: threshold::search_name(policy, &search),
        family: "threshold_search".into(),
        kernel: threshold::build(policy, &search)?,
        inputs: vec!["rows".into()],
        grid: [vec![factor("rows", 1)], vec![], vec![]],
        config: obj(json!({
            "policy": policy.name, "block": search.block, "group": search.group,
            "num_warps": search.num_warps, "stream": search.stream,
        })),
    });
    Ok(out)
}
