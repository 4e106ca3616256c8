//! The pipeline's declaration: which selector, which pruners, which attention, checked as
//! a whole before anything is planned ([`PipelineBuilder::build`]). Shapes come later, with
//! the page table, to [`Pipeline::plan`].

use super::select::{PageSelect, SelectFactory};
use crate::error::{ensure, invalid, Result};
use crate::policies::{top_k, top_p};
use crate::prune::ParamValues;
use crate::selectors::{Budget, Keep, QuestOptions, Selector, QUEST};
use crate::threshold::Policy;
use dusk_compiler::DType;
use std::fmt;
use std::sync::Arc;

/// The select stage: which tokens each (sequence, KV head) offers the pruners.
#[derive(Clone)]
pub enum Select {
    /// Every token of every sequence (Twilight on its own: the pruner sees the whole
    /// context). Without pruners the step is dense attention.
    Full,
    /// Quest: each page scored from the min and max of its keys, `budget` of each
    /// sequence's pages kept (the last always, the first too with `sink`).
    Quest { budget: Budget, sink: bool },
    /// A page selector of one's own ([`Selector`]: its state, update and score kernels),
    /// planned with the shared top-k.
    Pages {
        selector: Selector,
        budget: Budget,
        keep: Keep,
    },
    /// Any other selector: Double Sparsity ([`super::DsSelect`]), SparQ
    /// ([`super::SparqSelect`]), one's own token selector (see [`SelectFactory`]).
    Plugin(Arc<dyn SelectFactory>),
}

/// A pruner: a `#[policy]` and its parameters, in the order the policy declares them.
/// Several pruners run in turn, each over the tokens the one before kept (its weights
/// renormalised over them).
#[derive(Clone, Debug)]
pub struct Prune {
    pub policy: Policy,
    pub params: Vec<ParamValues>,
}

impl Prune {
    pub fn new(policy: &Policy, params: Vec<ParamValues>) -> Prune {
        Prune {
            policy: *policy,
            params,
        }
    }
    /// Twilight's top-p: the fewest heaviest tokens holding `p` of the weight.
    pub fn top_p(p: f64) -> Prune {
        Prune::new(&top_p::POLICY, vec![ParamValues::Uniform(p)])
    }
    /// The `k` heaviest tokens (ties at the cut kept together).
    pub fn top_k(k: usize) -> Prune {
        Prune::new(&top_k::POLICY, vec![ParamValues::Uniform(k as f64)])
    }
}

/// How the kept tokens are attended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attend {
    /// Every token of each sequence (only when no stage narrows them: `Select::Full`
    /// without pruners).
    Dense,
    /// One list per query head (MHA: with one query head a KV head the pruner's lists are
    /// per head).
    HeadVarlen,
    /// One list per KV head, the union of its group's kept tokens (Twilight Appendix
    /// B.2): K and V read once per group. GQA's, and MHA's too.
    GroupVarlen,
}

impl Attend {
    fn name(&self) -> &'static str {
        match self {
            Attend::Dense => "dense",
            Attend::HeadVarlen => "head_varlen",
            Attend::GroupVarlen => "group_varlen",
        }
    }
}

/// Collects a pipeline's stages; [`PipelineBuilder::build`] checks them together.
#[derive(Clone, Default)]
pub struct PipelineBuilder {
    select: Option<Select>,
    prune: Vec<Prune>,
    attend: Option<Attend>,
    sparq_mix: bool,
    bits: Option<u32>,
    dense_below: Option<usize>,
    dtype: Option<DType>,
}

/// A checked pipeline: select, then zero or more pruners (each with the INT4 estimate of
/// its candidates' scores), then attention. [`Pipeline::plan`] sizes it for a cache and a
/// page table.
#[derive(Clone)]
pub struct Pipeline {
    pub(crate) select: Option<Arc<dyn SelectFactory>>,
    pub(crate) prune: Vec<Prune>,
    pub(crate) attend: Attend,
    pub(crate) sparq_mix: bool,
    pub(crate) bits: u32,
    pub(crate) dense_below: usize,
    pub(crate) dtype: DType,
}

impl PipelineBuilder {
    pub fn new() -> PipelineBuilder {
        PipelineBuilder::default()
    }
    /// The select stage (required).
    pub fn select(mut self, select: Select) -> Self {
        self.select = Some(select);
        self
    }
    /// Appends a pruner (zero or more, run in order).
    pub fn prune(mut self, prune: Prune) -> Self {
        self.prune.push(prune);
        self
    }
    /// The attention (required).
    pub fn attend(mut self, attend: Attend) -> Self {
        self.attend = Some(attend);
        self
    }
    /// Mix the output with the running mean of V by SparQ's `alpha` (needs a selector that
    /// makes them: SparQ's).
    pub fn sparq_mix(mut self, on: bool) -> Self {
        self.sparq_mix = on;
        self
    }
    /// Bits of the K copy the estimate reads: 4 (Twilight's choice, the default) or 8.
    pub fn bits(mut self, bits: u32) -> Self {
        self.bits = Some(bits);
        self
    }
    /// Sequences of at most `tokens` tokens skip selection and pruning and are attended
    /// densely. By default the selector's budget when it is a token count
    /// (`Budget::Tokens`), else none.
    pub fn dense_below(mut self, tokens: usize) -> Self {
        self.dense_below = Some(tokens);
        self
    }
    /// The element type of q, K, V and the output (f16, the default: the INT4 copy and the
    /// selectors' kernels read f16).
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// Checks the composition: a selector and an attention given, dense attention only
    /// where nothing narrows the tokens, SparQ's mix only with a selector that makes it,
    /// every pruner's parameters (their count, and uniform values against the policy's
    /// `#[check]`s; per-row values are checked at plan time), the bits and the dtype.
    pub fn build(self) -> Result<Pipeline> {
        let select = self.select.ok_or_else(|| {
            invalid(
                "select",
                "a select stage (Full, Quest, Pages or Plugin)",
                "none",
            )
        })?;
        let attend = self.attend.ok_or_else(|| {
            invalid(
                "attend",
                "an attention (Dense, HeadVarlen or GroupVarlen)",
                "none",
            )
        })?;
        let select: Option<Arc<dyn SelectFactory>> = match select {
            Select::Full => None,
            Select::Quest { budget, sink } => Some(Arc::new(PageSelect {
                selector: QUEST,
                budget,
                keep: QuestOptions { sink }.keep(),
            })),
            Select::Pages {
                selector,
                budget,
                keep,
            } => Some(Arc::new(PageSelect {
                selector,
                budget,
                keep,
            })),
            Select::Plugin(f) => Some(f),
        };
        let narrowed = select.is_some() || !self.prune.is_empty();
        ensure!(
            attend != Attend::Dense || !narrowed,
            "attend",
            "HeadVarlen or GroupVarlen: the selector or a pruner narrows the tokens, which \
             dense attention would ignore",
            "Dense",
        );
        let mixes = select.as_ref().is_some_and(|s| s.makes_sparq_mix());
        ensure!(
            !self.sparq_mix || mixes,
            "sparq_mix",
            "a selector that makes SparQ's output mix (SparQ's)",
            match &select {
                Some(s) => format!("selector `{}`", s.name()),
                None => "Full".into(),
            },
        );
        ensure!(
            !self.sparq_mix || self.prune.is_empty(),
            "sparq_mix",
            "no pruner after SparQ: its alpha weighs SparQ's own selection, of which a \
             pruner would attend to fewer tokens",
            format!("{} pruners", self.prune.len()),
        );
        if let Some(b) = &select {
            b.budget().validate()?;
        }
        let bits = self.bits.unwrap_or(4);
        ensure!(matches!(bits, 4 | 8), "bits", "4 or 8", bits);
        let dtype = self.dtype.unwrap_or(DType::F16);
        ensure!(
            dtype == DType::F16,
            "dtype",
            "f16 (the INT4 copy and the selectors' kernels read f16)",
            dtype.name(),
        );
        for p in &self.prune {
            check_params(p)?;
        }
        let dense_below = self
            .dense_below
            .unwrap_or(match select.as_ref().map(|s| s.budget()) {
                Some(Budget::Tokens(t)) => t,
                _ => 0,
            });
        Ok(Pipeline {
            select,
            prune: self.prune,
            attend,
            sparq_mix: self.sparq_mix,
            bits,
            dense_below,
            dtype,
        })
    }
}

/// A pruner's parameter count, and its uniform values against the policy's checks.
fn check_params(p: &Prune) -> Result<()> {
    let spec = p.policy.params;
    ensure!(
        p.params.len() == spec.len(),
        "params",
        format!(
            "{} values for policy `{}` ({})",
            spec.len(),
            p.policy.name,
            spec.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
        ),
        p.params.len(),
    );
    for (s, v) in spec.iter().zip(&p.params) {
        if let ParamValues::Uniform(x) = v {
            let integral = s.dtype != DType::I32 || x.fract() == 0.0;
            ensure!(
                integral && (s.check)(*x),
                "params",
                format!(
                    "`{}` of policy `{}` with {}",
                    s.name, p.policy.name, s.expected
                ),
                x,
            );
        }
    }
    Ok(())
}

impl Pipeline {
    /// The pruners, in order.
    pub fn pruners(&self) -> &[Prune] {
        &self.prune
    }
    pub fn attend(&self) -> Attend {
        self.attend
    }
    /// Sequences of at most this many tokens are attended densely.
    pub fn dense_below(&self) -> usize {
        self.dense_below
    }
    pub fn bits(&self) -> u32 {
        self.bits
    }
}

impl fmt::Display for Pipeline {
    /// The stages in order, e.g. `select quest (Fraction(0.25)) -> estimate (INT4) ->
    /// prune top_p(p = 0.95) -> attend group_varlen`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.select {
            Some(s) => write!(f, "select {} ({:?})", s.name(), s.budget())?,
            None => write!(f, "select full")?,
        }
        for p in &self.prune {
            let params: Vec<String> = p
                .policy
                .params
                .iter()
                .zip(&p.params)
                .map(|(s, v)| match v {
                    ParamValues::Uniform(x) => format!("{} = {x}", s.name),
                    ParamValues::PerRow(_) => format!("{} per row", s.name),
                })
                .collect();
            write!(
                f,
                " -> estimate (INT{}) -> prune {}({})",
                self.bits,
                p.policy.name,
                params.join(", ")
            )?;
        }
        write!(f, " -> attend {}", self.attend.name())?;
        if self.sparq_mix {
            write!(f, " (SparQ mix)")?;
        }
        Ok(())
    }
}
