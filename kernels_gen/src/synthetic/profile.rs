//! How focused each query head's attention is: its temperature and the tokens planted for it.
//!
//! With background keys and query directions of uniform channels in (-1, 1) (variance 1/3),
//! a query `q = scale * u` gives background logits `q . k / sqrt(d)` of standard deviation
//! about `scale / 3`, whatever `head_dim`: `scale` is the head's inverse temperature. A
//! planted token's key is `noise + beta * u`, its logit about `scale * beta * sqrt(d) / 3`
//! (15 at scale 2, beta 2, d 128) above the background's, so a few planted tokens take
//! nearly all of the softmax mass. Measured with the f64 oracle on the generated cache
//! (kernels_gen/tests/synthetic.rs, and `cargo run --release -p dusk-kernels --example
//! synthetic` at any size), top-p 0.95 keeps about:
//!
//! | kind | profile | at 512 tokens | at 32k tokens |
//! |---|---|---|---|
//! | focused | scale 2, `planted` tokens, beta 2 | most of the planted ones | the same |
//! | peaked | scale 13, none planted | a few percent | hundreds |
//! | spread | scale 9, none planted | a tenth to a quarter | thousands |
//! | diffuse | scale 4, none planted | most tokens | most tokens |
//!
//! the spread of budgets over the heads of one layer that Twilight's Figure 11 shows in
//! real models (37 to 2707 tokens among four heads of a layer).

use crate::error::{ensure, Result};

/// Steps of `scale` and `strength`: both are used as multiples of 1/16, so that every value
/// the generator forms is exact in f32 (see [`super::kernels`]).
pub const STEP: f32 = 1.0 / 16.0;

/// The largest `scale` (1023 steps).
pub const MAX_SCALE: f32 = 1023.0 * STEP;

/// The largest `strength` (255 steps).
pub const MAX_STRENGTH: f32 = 255.0 * STEP;

/// One query head's attention (the same head in every sequence of the batch; the planted
/// positions differ per sequence).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeadProfile {
    /// The inverse temperature: the query is `scale * u`, `u` uniform in (-1, 1) per
    /// channel. Rounded to a multiple of 1/16, in `[1/16, MAX_SCALE]`.
    pub scale: f32,
    /// Tokens planted for this head in each sequence (keys aligned with its query); at most
    /// `len / (2 * group)` in a sequence of `len` tokens.
    pub planted: usize,
    /// How strongly planted keys align: each planted key is `noise + beta * u`, `beta`
    /// drawn per token in `[0.9 * strength, strength]`. Rounded to a multiple of 1/16, in
    /// `[0, MAX_STRENGTH]`.
    pub strength: f32,
}

impl HeadProfile {
    /// A head whose attention `planted` tokens take (scale 2, strength 2).
    pub const fn focused(planted: usize) -> HeadProfile {
        HeadProfile {
            scale: 2.0,
            planted,
            strength: 2.0,
        }
    }

    /// A head with nothing planted, at inverse temperature `scale`: peaked at 13, spread at
    /// 9, diffuse at 4.
    pub const fn background(scale: f32) -> HeadProfile {
        HeadProfile {
            scale,
            planted: 0,
            strength: 0.0,
        }
    }

    /// The default layer: query heads cycle through eight profiles, so that with GQA groups
    /// of four one group is focused heads with different planted tokens and the next mixes
    /// a peaked, a spread and a diffuse head with focused ones; with MHA each head is one of
    /// the eight. The focused heads plant 8, 16, 32 and 64 tokens.
    pub fn layer(num_q_heads: usize) -> Vec<HeadProfile> {
        const CYCLE: [HeadProfile; 8] = [
            HeadProfile::focused(16),
            HeadProfile::focused(8),
            HeadProfile::background(13.0),
            HeadProfile::focused(32),
            HeadProfile::background(9.0),
            HeadProfile::focused(64),
            HeadProfile::background(13.0),
            HeadProfile::background(4.0),
        ];
        (0..num_q_heads).map(|i| CYCLE[i % CYCLE.len()]).collect()
    }

    /// `scale` in steps of 1/16 (what the kernels take).
    pub fn scale_steps(&self) -> i32 {
        (self.scale / STEP).round() as i32
    }

    /// `strength` in steps of 1/16.
    pub fn strength_steps(&self) -> i32 {
        (self.strength / STEP).round() as i32
    }

    pub(crate) fn validate(&self) -> Result<()> {
        ensure(
            self.scale.is_finite() && (1..=1023).contains(&self.scale_steps()),
            "heads",
            format!("a scale in [1/16, {MAX_SCALE}] for every head"),
            self.scale,
        )?;
        ensure(
            self.strength.is_finite() && (0..=255).contains(&self.strength_steps()),
            "heads",
            format!("a strength in [0, {MAX_STRENGTH}] for every head"),
            self.strength,
        )
    }
}
