//! How focused each query head's attention is: its temperature and the tokens planted for it.
//!
//! With background keys and query directions of uniform channels in (-1, 1) (variance 1/3),
//! a query `q = scale * u` gives background logits `q . k / sqrt(d)` of standard deviation
//! about `scale / 3`, whatever `head_dim`: `scale` is the head's inverse temperature. A
//! planted token's key is `noise + beta * u`, its logit about `scale * beta * sqrt(d) / 3`
//! (15 at scale 2, beta 2, d 128) above the background's, so a few planted tokens take
//! nearly all of the softmax mass. The budget the oracle top-p (p = 0.95) needs, mean (min
//! to max) over four sequences of seed 1, from `cargo run --release -p dusk-kernels
//! --example synthetic -- --batch 4 --len N --heads 8/1 --profile-seqs 4` (the default
//! layer, one head of each profile):
//!
//! | kind (profile) | at 512 tokens | at 32768 tokens |
//! |---|---|---|
//! | focused (scale 2, 8 / 16 / 32 / 64 planted, strength 2) | 6.8 / 12.5 / 26 / 25 | 7.2 / 12.8 / 25.5 / 50.5 |
//! | peaked (scale 13) | 11.5 (4 to 19) | 242 (82 to 374) |
//! | spread (scale 11) | 7 (2 to 12) | 392 (1 to 1373) |
//! | spread (scale 9) | 22 (7 to 38) | 2802 (2262 to 3110) |
//! | diffuse (scale 6) | 109 (27 to 188) | 12390 (11647 to 12972) |
//!
//! the spread of budgets over the heads of one layer that Twilight's Figure 11 shows in
//! real models (37, 144, 886 and 2707 tokens for four heads of a layer), and as there, a
//! background head's budget varies much from one query to the next. The planted tokens hold
//! 99.8% or more of a focused head's mass at both sizes.

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
    /// 9 to 11, diffuse at 6.
    pub const fn background(scale: f32) -> HeadProfile {
        HeadProfile {
            scale,
            planted: 0,
            strength: 0.0,
        }
    }

    /// The default layer: query heads cycle through eight profiles, so that with GQA groups
    /// of four one group is focused heads with different planted tokens and the next mixes
    /// a peaked, two spread and a diffuse head; with MHA each head is one of the eight. The
    /// focused heads plant 8, 16, 32 and 64 tokens.
    pub fn layer(num_q_heads: usize) -> Vec<HeadProfile> {
        const CYCLE: [HeadProfile; 8] = [
            HeadProfile::focused(16),
            HeadProfile::focused(8),
            HeadProfile::background(13.0),
            HeadProfile::focused(32),
            HeadProfile::background(9.0),
            HeadProfile::focused(64),
            HeadProfile::background(11.0),
            HeadProfile::background(6.0),
        ];
        (0..num_q_heads).map(|i| CYCLE[i % CYCLE.len()]).collect()
    }

    /// The kind of head this is, for reports: `focused` (tokens planted), else by scale
    /// `peaked` (12 and up), `spread` (8 to 12) or `diffuse` (under 8).
    pub fn kind(&self) -> &'static str {
        match self.scale {
            _ if self.planted > 0 => "focused",
            s if s >= 12.0 => "peaked",
            s if s >= 8.0 => "spread",
            _ => "diffuse",
        }
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
        ensure!(
            self.scale.is_finite() && (1..=1023).contains(&self.scale_steps()),
            "heads",
            format!("a scale in [1/16, {MAX_SCALE}] for every head"),
            self.scale,
        );
        ensure!(
            self.strength.is_finite() && (0..=255).contains(&self.strength_steps()),
            "heads",
            format!("a strength in [0, {MAX_STRENGTH}] for every head"),
            self.strength,
        );
        Ok(())
    }
}
