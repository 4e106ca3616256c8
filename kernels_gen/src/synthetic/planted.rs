//! Which tokens are planted for which query head, drawn on the host from the seed.
//!
//! Per sequence and query head, `planted` distinct positions (at most `len / (2 * group)`:
//! a group's planted tokens never fill more than half a sequence), never shared with another query head of the same GQA group: a planted
//! key is aligned with one head's query, so the heads of a group disagree about which tokens
//! matter. Each planted token has its own strength, in `[0.9, 1] * strength` of its head.

use super::hash::{hash3, stream_key, Stream};
use super::spec::SyntheticSpec;
use std::collections::{HashMap, HashSet};

/// One planted token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlantedToken {
    pub seq: usize,
    pub q_head: usize,
    /// The token's position in its sequence.
    pub pos: usize,
    /// Its key's alignment `beta`, in steps of 1/16.
    pub strength_steps: i32,
}

/// The planted tokens by `(seq, kv_head, pos)`: `(q_head, strength_steps)`.
pub type PlantIndex = HashMap<(usize, usize, usize), (usize, i32)>;

/// Every planted token of a batch, ordered by (sequence, query head, position).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planted {
    pub tokens: Vec<PlantedToken>,
}

impl Planted {
    /// The planted tokens of `spec` (assumed valid).
    pub fn draw(spec: &SyntheticSpec) -> Planted {
        let key = stream_key(spec.seed, Stream::Planted);
        let group = spec.group();
        let mut tokens = vec![];
        for (b, &len) in spec.seq_lens.iter().enumerate() {
            for h in 0..spec.num_kv_heads {
                let mut taken = HashSet::new();
                for qh in h * group..(h + 1) * group {
                    let profile = spec.heads[qh];
                    let count = profile.planted.min(len / (2 * group));
                    let top = profile.strength_steps();
                    let spread = top / 10 + 1;
                    let id = (b * spec.num_q_heads + qh) as u32;
                    let mut mine = vec![];
                    // Draw positions until `count` distinct free ones: at most half the
                    // sequence is ever taken, so each draw is free with odds of 1/2 or more.
                    let mut attempt = 0u32;
                    while mine.len() < count {
                        let h = hash3(key, id, attempt, 0);
                        attempt += 1;
                        let pos = ((h as u64 * len as u64) >> 32) as usize;
                        if taken.insert(pos) {
                            let s = hash3(key, id, attempt, 1) % spread as u32;
                            mine.push(PlantedToken {
                                seq: b,
                                q_head: qh,
                                pos,
                                strength_steps: top - s as i32,
                            });
                        }
                    }
                    mine.sort_by_key(|t| t.pos);
                    tokens.extend(mine);
                }
            }
        }
        Planted { tokens }
    }

    /// The positions planted for query head `q_head` of sequence `seq`, ascending.
    pub fn positions(&self, seq: usize, q_head: usize) -> Vec<usize> {
        self.tokens
            .iter()
            .filter(|t| t.seq == seq && t.q_head == q_head)
            .map(|t| t.pos)
            .collect()
    }

    /// The tokens by `(seq, kv_head, pos)`, KV heads of `group` query heads each.
    pub fn by_token(&self, group: usize) -> PlantIndex {
        self.tokens
            .iter()
            .map(|t| {
                (
                    (t.seq, t.q_head / group, t.pos),
                    (t.q_head, t.strength_steps),
                )
            })
            .collect()
    }

    /// The tokens as the plant kernel reads them: `[seq, pos, q_head, strength_steps]` per
    /// token, i32.
    pub fn packed(&self) -> Vec<i32> {
        self.tokens
            .iter()
            .flat_map(|t| {
                [
                    t.seq as i32,
                    t.pos as i32,
                    t.q_head as i32,
                    t.strength_steps,
                ]
            })
            .collect()
    }
}
