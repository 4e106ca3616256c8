//! Twilight's pipeline end to end, on the device and with no host sync between the stages:
//! a selector's candidates (a random half of each sequence's pages, as Quest would give),
//! INT4 scores of every query head over them (`spgemv_quant`), the top-p pruner over those
//! scores with the group's union of kept tokens (GQA 4), and varlen paged decode attention
//! over the kept tokens, reading the pruner's lists where they lie. The output is checked
//! against an f64 reference of attention over the same kept tokens, and the kept sets
//! against the sort-based top-p oracle of the exact scores' estimates.

use dusk::compiler::DType;
use dusk::kernels::attention_ops::{AttentionMode, AttentionPlan, AttentionSpec};
use dusk::kernels::ops::{Dusk, SpgemvPlan};
use dusk::kernels::paged::{KvShape, PageTable, TokenLists};
use dusk::kernels::policies::top_p;
use dusk::kernels::prune::{ParamValues, PrunePlan};
use dusk::kernels::reference;
use half::f16;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// What one run kept and how close the output was.
pub struct Report {
    pub candidates: usize,
    pub kept: usize,
    pub rel_error: f64,
}

/// Runs the pipeline on sequences of `seq_lens` tokens (pages of 16, 8 KV heads, 32 query
/// heads, head_dim 128), top-p `p`.
pub fn run(
    dusk: &Dusk,
    seq_lens: &[usize],
    p: f64,
    seed: u64,
) -> Result<Report, Box<dyn std::error::Error>> {
    let dev = dusk.device();
    let mut rng = SmallRng::seed_from_u64(seed);
    let (num_q_heads, num_kv_heads, head_dim, page_size) = (32, 8, 128, 16);
    let group = num_q_heads / num_kv_heads;
    let pages = PageTable::pages_needed(seq_lens, page_size);
    let table = PageTable::from_lengths(seq_lens, page_size, (0..pages as i32).rev().collect())?;
    let kv = KvShape {
        num_pages: pages.max(1),
        page_size,
        num_kv_heads,
        head_dim,
    };
    let rand_f16 = |rng: &mut SmallRng, n: usize, s: f32| -> Vec<f16> {
        (0..n)
            .map(|_| f16::from_f32(rng.random_range(-s..s)))
            .collect()
    };
    let k_host = rand_f16(&mut rng, kv.elements(), 1.0);
    let v_host = rand_f16(&mut rng, kv.elements(), 1.0);
    let q_host = rand_f16(&mut rng, seq_lens.len() * num_q_heads * head_dim, 8.0);
    let (k, v, q) = (
        dev.upload(&k_host)?,
        dev.upload(&v_host)?,
        dev.upload(&q_host)?,
    );

    // Select: a random half of each sequence's pages per KV head (the last page always).
    let mut chosen = vec![];
    for &n in seq_lens {
        let np = n.div_ceil(page_size);
        for _ in 0..num_kv_heads {
            let mut ps: Vec<usize> = (0..np)
                .filter(|i| *i + 1 == np || rng.random_bool(0.5))
                .collect();
            ps.sort();
            chosen.push(ps);
        }
    }
    let cand = TokenLists::from_pages(&table, page_size, num_kv_heads, &chosen);

    // Estimate: INT4 scores of every query head over its KV head's candidates.
    let qk = dusk.quantize_k(&k, kv, 4)?;
    let spgemv = SpgemvPlan::new(dusk, kv, num_q_heads, 4, &table, &cand)?;
    let mut scores = dev.alloc::<f32>(spgemv.num_scores().max(1))?;
    spgemv.run(dusk, &q, &qk, &mut scores)?;

    // Prune: top-p per query head, the group's union per KV head.
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut prune = PrunePlan::new(
        dusk,
        &top_p::POLICY,
        &cand,
        group,
        scale,
        &[ParamValues::Uniform(p)],
    )?;
    prune.run(dusk, &scores)?;

    // Attend: group varlen over the pruner's lists, copied on the device into the plan's.
    let spec = AttentionSpec {
        kv,
        batch: seq_lens.len(),
        num_q_heads,
        mode: AttentionMode::GroupVarlen,
        max_tokens: cand.max_row_len().max(1),
        sm_scale: Some(scale),
        sparq: false,
        dtype: DType::F16,
    };
    let attn = AttentionPlan::new(dusk, spec)?;
    let mut meta = attn.device_meta(
        dusk,
        &table,
        dev.alloc::<i32>(prune.sel_indptr().len())?,
        dev.alloc::<i32>(prune.sel_indices().len())?,
    )?;
    let (ip, ix) = meta.lists_mut().ok_or("group lists")?;
    ip.copy_from(prune.sel_indptr())?;
    ix.copy_from(prune.sel_indices())?;
    let rows = seq_lens.len() * num_q_heads;
    let mut out = dev.alloc::<f16>(rows * head_dim)?;
    let mut lse = dev.alloc::<f32>(rows)?;
    attn.run(dusk, &q, &k, &v, &meta, None, &mut out, &mut lse)?;

    // Check, on the host: each KV head's kept set against the union of its query heads'
    // oracle sets (over the scores the pruner saw), then attention over the kept tokens.
    let s_host = scores.download()?;
    let sel_ip = prune.sel_indptr().download()?;
    let sel = prune.sel_indices().download()?;
    let mut lists = vec![];
    for r in 0..cand.rows() {
        let row = cand.row(r);
        let start = cand.indptr[r] as usize;
        let n = row.len();
        let (mut union, mut unsure) = (vec![false; n], vec![false; n]);
        for g in 0..group {
            let s = &s_host[start * group + g * n..][..n];
            let w = reference::softmax(s, scale as f64);
            let (o, a) = (
                reference::top_p_oracle(&w, p),
                reference::top_p_ambiguous(&w, p),
            );
            for j in 0..n {
                union[j] |= o[j];
                unsure[j] |= a[j];
            }
        }
        let kept: Vec<i32> = sel[sel_ip[r] as usize..sel_ip[r + 1] as usize].to_vec();
        let mut is_kept = vec![false; n];
        for t in &kept {
            let j = row
                .binary_search(t)
                .map_err(|_| format!("row {r}: {t} is no candidate"))?;
            is_kept[j] = true;
        }
        // Equal to the oracle but where float rounding may place the cut either way.
        if let Some(j) = (0..n).find(|j| is_kept[*j] != union[*j] && !unsure[*j]) {
            return Err(format!(
                "candidate row {r}: token {} kept {}, oracle {}",
                row[j], is_kept[j], union[j]
            )
            .into());
        }
        lists.push(kept);
    }
    let per_q: Vec<Vec<i32>> = (0..rows)
        .map(|qr| lists[(qr / num_q_heads) * num_kv_heads + (qr % num_q_heads) / group].clone())
        .collect();
    let f = |x: &[f16]| x.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
    let (want, _) = reference::attention(
        &f(&q_host),
        &f(&k_host),
        &f(&v_host),
        num_q_heads,
        &kv,
        &table,
        &per_q,
        scale as f64,
        None,
    );
    let got = f(&out.download()?);
    Ok(Report {
        candidates: cand.indices.len(),
        kept: lists.iter().map(|l| l.len()).sum(),
        rel_error: reference::rel_error(&got, &want),
    })
}
