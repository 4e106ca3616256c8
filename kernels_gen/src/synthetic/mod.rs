//! A seeded synthetic long-context decode batch: a paged f16 K/V cache, queries, and the
//! attention structure sparse attention is about (Twilight Sections 3 and 5, Figure 11).
//!
//! Per query head a temperature (focused heads where a few planted tokens take nearly all
//! of the softmax mass, diffuse heads where it spreads over most tokens) and tokens planted
//! for it (keys aligned with its query), different for every query head of a GQA group, so
//! the heads of a group disagree. From a few hundred tokens (the tests, through the
//! interpreter) to the paper's shape (32k tokens, batch 32, 8 KV heads, head_dim 128: 2 GiB
//! each of K and V), made on the device by kernels in the kernel language: every value is a
//! counter-based hash of the seed and its coordinates, so the GPU, the interpreter and the
//! host reference give the same bits.
//!
//! - [`spec`]: [`SyntheticSpec`], what to make (checked: typed errors naming the field).
//! - [`profile`]: [`HeadProfile`], one head's temperature and planted tokens; the default
//!   layer.
//! - [`planted`]: which tokens are planted for which head ([`Planted`]).
//! - [`hash`]: the counter-based random numbers (`lowbias32`), on the host.
//! - [`kernels`]: the kernels (cache, planted keys, queries).
//! - [`generate`]: [`SyntheticCache::generate`], [`write_cache`], [`write_queries`].
//! - [`mod@reference`]: the same values on the host, element by element or whole.
//! - [`analysis`]: the attention a batch gives, in f64 (weights, top-p budgets).
//!
//! README.md in this folder has the formulas and an example.

pub mod analysis;
pub mod generate;
pub mod hash;
pub mod kernels;
pub mod planted;
pub mod profile;
pub mod reference;
pub mod spec;

pub use generate::{write_cache, write_queries, SyntheticCache};
pub use planted::{PlantIndex, Planted, PlantedToken};
pub use profile::HeadProfile;
pub use spec::SyntheticSpec;
