//! The pipelines the main job compares, each declared in a few lines with `pipeline!` (or
//! the builder, where a budget is known only at run time), and what its f64 reference
//! selects with ([`Host`]).

use super::centroid::CENTROID;
use dusk::kernels::pipeline::reference::HostPolicy;
use dusk::kernels::pipeline::{Attend, DsSelect, Pipeline, PipelineBuilder, Select, SparqSelect};
use dusk::kernels::prune::ParamValues;
use dusk::kernels::selectors::{Budget, Keep};
use std::error::Error;
use std::sync::Arc;

/// Twilight's threshold (the paper's for Llama-3).
pub const P: f64 = 0.95;

/// The selectors' conservative budget: a quarter of each sequence (Twilight's B0).
pub const QUARTER: Budget = Budget::Fraction(0.25);

/// How a method's reference selects (the same choices as its pipeline's select stage).
#[derive(Clone)]
pub enum Host {
    Full,
    Quest(Budget),
    /// The centroid selector of `examples/centroid_selector`, with its always-kept pages.
    Centroid(Budget, Keep),
    Ds(DsSelect),
    Sparq(SparqSelect),
}

/// A pipeline of the comparison.
pub struct Method {
    /// The name the table and the plot give it.
    pub name: String,
    pub pipeline: Pipeline,
    pub host: Host,
}

impl Method {
    fn new(name: &str, host: Host, pipeline: Pipeline) -> Method {
        Method {
            name: name.into(),
            pipeline,
            host,
        }
    }

    /// Quest alone at `tokens` tokens a (sequence, KV head): the top-k that Quest+Twilight
    /// is compared with at the same average budget.
    pub fn quest_at(tokens: usize) -> Result<Method, Box<dyn Error>> {
        let budget = Budget::Tokens(tokens);
        let pipeline = PipelineBuilder::new()
            .select(Select::Quest {
                budget,
                sink: false,
            })
            .attend(Attend::GroupVarlen)
            .build()?;
        Ok(Method::new(
            &format!("Quest ({tokens} tokens)"),
            Host::Quest(budget),
            pipeline,
        ))
    }

    /// The pruners as the reference runs them (top-p, the only policy declared here).
    pub fn host_policies(&self) -> Result<Vec<HostPolicy<'static>>, Box<dyn Error>> {
        self.pipeline
            .pruners()
            .iter()
            .map(|p| match (p.policy.name, p.params.as_slice()) {
                ("top_p", [ParamValues::Uniform(p)]) => Ok(HostPolicy::TopP(*p)),
                (name, _) => Err(format!("{}: no host policy for `{name}`", self.name).into()),
            })
            .collect()
    }
}

/// The comparison, in order: dense attention first (the others' errors are measured
/// against its output), then Quest at N/4 alone and with Twilight (p = 0.95), Double
/// Sparsity with Twilight, SparQ with its output mix, Twilight over every token, and the
/// centroid selector of `examples/centroid_selector` with Twilight.
pub fn methods(ds: &DsSelect, sparq: SparqSelect) -> Result<Vec<Method>, Box<dyn Error>> {
    let centroid_keep = Keep { sink: 0, recent: 1 };
    Ok(vec![
        Method::new(
            "Full (dense)",
            Host::Full,
            dusk::pipeline! { select: Full, attend: dense }?,
        ),
        Method::new(
            "Quest",
            Host::Quest(QUARTER),
            dusk::pipeline! { select: Quest(budget = 0.25), attend: group_varlen }?,
        ),
        Method::new(
            "Quest+Twilight",
            Host::Quest(QUARTER),
            dusk::pipeline! {
                select: Quest(budget = 0.25),
                prune: top_p(p = P),
                attend: group_varlen,
            }?,
        ),
        Method::new(
            "DS+Twilight",
            Host::Ds(ds.clone()),
            dusk::pipeline! {
                select: Plugin(Arc::new(ds.clone())),
                prune: top_p(p = P),
                attend: group_varlen,
            }?,
        ),
        Method::new(
            "SparQ",
            Host::Sparq(sparq),
            dusk::pipeline! {
                select: Plugin(Arc::new(sparq)),
                attend: group_varlen(sparq_mix),
            }?,
        ),
        Method::new(
            "Full+Twilight",
            Host::Full,
            dusk::pipeline! { select: Full, prune: top_p(p = P), attend: group_varlen }?,
        ),
        Method::new(
            "Centroid+Twilight",
            Host::Centroid(QUARTER, centroid_keep),
            dusk::pipeline! {
                select: Pages(selector = CENTROID, budget = 0.25, recent = 1),
                prune: top_p(p = P),
                attend: group_varlen,
            }?,
        ),
    ])
}
