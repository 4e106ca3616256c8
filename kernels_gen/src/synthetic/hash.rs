//! The counter-based random numbers every synthetic value is made of, on the host.
//!
//! A value is a function of the seed and of its coordinates alone, never of a generator's
//! state: the device kernels ([`super::kernels`]) compute the same function in the kernel
//! language, so a cache made on the GPU, one made through the interpreter and this host
//! version are equal bit for bit, and any element can be recomputed on its own (the GPU
//! check compares samples of a 2 GiB cache without making it on the host).
//!
//! The mix is Chris Wellons' `lowbias32` (two multiply-xorshift rounds, 32 bits, a
//! bijection with low bias); a tuple `(a, b, c)` is hashed by chaining it,
//! `mix(mix(mix(key ^ a) ^ b) ^ c)`, each stream with a key of its own made from the seed.

/// The second multiplier of `lowbias32`, `0x846c_a68b`, as the i32 the kernels write.
pub const MUL2_I32: i32 = 0x846c_a68bu32 as i32;

/// `lowbias32`: a bijection of 32-bit words whose output bits all depend on every input bit.
pub fn mix(x: u32) -> u32 {
    let x = (x ^ (x >> 16)).wrapping_mul(0x7feb_352d);
    let x = (x ^ (x >> 15)).wrapping_mul(MUL2_I32 as u32);
    x ^ (x >> 16)
}

/// The hash of the pair `(a, b)` in the stream `key`.
pub fn hash2(key: u32, a: u32, b: u32) -> u32 {
    mix(mix(key ^ a) ^ b)
}

/// The hash of the tuple `(a, b, c)` in the stream `key`.
pub fn hash3(key: u32, a: u32, b: u32, c: u32) -> u32 {
    mix(mix(mix(key ^ a) ^ b) ^ c)
}

/// A uniform odd integer in `[-255, 255]` from the low byte of `h`: zero mean, symmetric, and
/// small enough that every sum the generator forms stays exact in f32.
pub fn signed_byte(h: u32) -> i32 {
    2 * (h & 0xFF) as i32 - 255
}

/// The independent streams of one seed: what each is used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// Noise of K, per (sequence, KV head, token, channel).
    KeyNoise = 1,
    /// Noise of V, per (sequence, KV head, token, channel).
    ValueNoise = 2,
    /// The mean of V, per (sequence, KV head, channel).
    ValueMean = 3,
    /// The direction of each query head, per (sequence, query head, channel).
    QueryDirection = 4,
    /// A later decode step's change of a query, per (step, sequence, query head, channel).
    QueryJitter = 5,
    /// The planted tokens' positions and strengths (host only).
    Planted = 6,
    /// The order of the physical pages (host only).
    Pages = 7,
}

/// The key of `stream` under `seed` (both halves of the seed count).
pub fn stream_key(seed: u64, stream: Stream) -> u32 {
    mix(mix(seed as u32 ^ mix(stream as u32)) ^ (seed >> 32) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_is_lowbias32() {
        // Values of lowbias32 from an independent (Python) transcription of the published
        // C function: a changed constant or shift fails here before it changes every cache.
        assert_eq!(mix(0), 0);
        assert_eq!(mix(1), 0x6889_90c0);
        assert_eq!(mix(2), 0xd113_2181);
        assert_eq!(mix(0xdead_beef), 0xe628_c683);
    }

    #[test]
    fn streams_and_seeds_differ() {
        let keys: Vec<u32> = [Stream::KeyNoise, Stream::ValueNoise, Stream::Planted]
            .iter()
            .flat_map(|s| {
                [
                    stream_key(1, *s),
                    stream_key(2, *s),
                    stream_key(1 << 32, *s),
                ]
            })
            .collect();
        for (i, a) in keys.iter().enumerate() {
            assert!(!keys[i + 1..].contains(a), "key {i} repeats");
        }
    }

    #[test]
    fn signed_bytes_are_odd_and_symmetric() {
        assert_eq!(signed_byte(0), -255);
        assert_eq!(signed_byte(0xFF), 255);
        assert_eq!(signed_byte(0x1_0080), 1);
        let sum: i32 = (0..256).map(signed_byte).sum();
        assert_eq!(sum, 0);
    }
}
