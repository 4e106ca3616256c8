//! Analyses and transformations over the tile IR, run in order before code generation.

pub mod axis;
pub mod fuse;
pub mod layout;
