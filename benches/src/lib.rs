//! What the benchmark binaries share with the peer scripts (benches/baselines/).
//!
//! - [`pages_file`]: the pages a selector picked, per (sequence, KV head), in the file the
//!   `flashinfer-pages` peer (`pipeline_peers.py`) reads.

pub mod pages_file;
