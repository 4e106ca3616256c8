//! `dusk._dusk`, the extension module of the Python package `dusk` (see `dusk/__init__.py`
//! for the API, and [`ops`] for each call).

mod context;
mod errors;
mod ops;
mod pipeline;
mod tensor;

use pyo3::prelude::*;

#[pymodule]
fn _dusk(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(ops::quantize_k, m)?)?;
    m.add_function(wrap_pyfunction!(ops::vllm_to_csr, m)?)?;
    m.add_function(wrap_pyfunction!(ops::sglang_to_csr, m)?)?;
    m.add_function(wrap_pyfunction!(ops::bundle_info, m)?)?;
    m.add_function(wrap_pyfunction!(ops::loaded_kernels, m)?)?;
    m.add_function(wrap_pyfunction!(ops::data_ptr, m)?)?;
    m.add_function(wrap_pyfunction!(pipeline::calibrate_ds, m)?)?;
    m.add_class::<ops::SpgemvPlanPy>()?;
    m.add_class::<ops::PrunePlanPy>()?;
    m.add_class::<ops::AttentionPlanPy>()?;
    m.add_class::<pipeline::PipelinePlanPy>()?;
    m.add_class::<tensor::Array>()?;
    m.add("JIT", cfg!(feature = "jit"))?;
    Ok(())
}
