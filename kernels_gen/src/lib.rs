//! dusk-kernels: the stock kernels, written with the builder, and their host entry points.

pub mod quantize;
pub mod spgemv;
