"""dusk: sparse-attention decode kernels for Python engines.

Tensors go in and out without copies: anything with ``__dlpack__`` or
``__cuda_array_interface__`` (PyTorch, CuPy, JAX; NumPy arrays through DLPack on the CPU).
The kernels read and write the caller's memory in place.

Calls follow FlashInfer's plan/run convention: a plan (``SpgemvPlan``, ``PrunePlan``,
``AttentionPlan``, ``PipelinePlan``) is made for a device, ``plan(...)`` checks and uploads host metadata
(int32 CSR: ``kv_indptr``, ``kv_page_indices``, ``kv_last_page_len``; token lists as
indptr/indices) and loads the kernels once; ``run(...)`` checks the tensors it is given
and queues the launches on the caller's stream (``stream=``, else PyTorch's or CuPy's
current stream), allocating nothing and never synchronising, so it can be captured in a
CUDA graph.

- ``quantize_k(k, packed, scale, zero)``: INT4 (or INT8) copy of a paged K cache.
- ``SpgemvPlan``: estimated scores of each query head against its candidate tokens.
- ``PrunePlan``: the fused threshold search (``top_p``, ``top_k``, ``ratio_to_max``,
  ``top_p_bounded``, per-row parameters), scores in, CSR token lists out (the plan's own,
  or the caller's tensors with ``run_into``).
- ``AttentionPlan``: varlen paged decode attention, dense or over head or group lists, over
  a host page table or one the device writes (``device_table=True``).
- ``PipelinePlan``: a whole sparse decode step (Twilight's Select-then-Prune): a selector
  (``"full"``, ``"quest"``, ``"ds"``, ``"sparq"``), pruners, attention; ``replan`` follows
  the next page table keeping the state, ``append`` keeps the cache, the INT4 copy and the
  selector's state current in one launch; ``step`` selects, estimates, prunes and attends.
- ``calibrate_ds(q, k, r=16)``: Double Sparsity's calibration (JSON) from sample queries and
  keys.
- ``vllm_to_csr``, ``sglang_to_csr``: engines' page tables to CSR, on the device.

On the CPU the kernels run through dusk's interpreter (the reference backend; slow, for
tests); on a GPU they come from the ahead-of-time PTX bundle built into the package (no
LLVM or CUDA toolkit needed). Bad input raises ``InvalidArgument`` (a ``ValueError``)
naming the argument, before anything runs.
"""

from ._dusk import (
    JIT,
    Array,
    AttentionPlan,
    PipelinePlan,
    PrunePlan,
    SpgemvPlan,
    bundle_info,
    calibrate_ds,
    data_ptr,
    loaded_kernels,
    quantize_k,
    sglang_to_csr,
    vllm_to_csr,
)
from ._errors import DeviceError, DuskError, InvalidArgument, NotInBundle

__version__ = "0.1.0"

POLICIES = ("top_p", "top_k", "ratio_to_max", "top_p_bounded")


def quantized_k_shapes(k_shape, bits=4):
    """The shapes ``quantize_k`` writes for a K cache of ``k_shape`` (``[num_pages,
    page_size, num_kv_heads, head_dim]``): ``(packed, scale)``; ``zero`` is like
    ``scale``. ``packed`` is uint8, ``scale`` and ``zero`` float16, head-major (``[num_pages,
    num_kv_heads, page_size, ...]``: one KV head's page is one contiguous block)."""
    pages, page_size, heads, head_dim = k_shape
    if bits not in (4, 8):
        raise InvalidArgument(
            f"invalid argument `bits`: expected 4 or 8, found {bits}", "bits", "4 or 8", str(bits)
        )
    return (pages, heads, page_size, head_dim * bits // 8), (pages, heads, page_size)


__all__ = [
    "JIT",
    "POLICIES",
    "Array",
    "AttentionPlan",
    "DeviceError",
    "DuskError",
    "InvalidArgument",
    "NotInBundle",
    "PipelinePlan",
    "PrunePlan",
    "SpgemvPlan",
    "bundle_info",
    "calibrate_ds",
    "data_ptr",
    "loaded_kernels",
    "quantize_k",
    "quantized_k_shapes",
    "sglang_to_csr",
    "vllm_to_csr",
]
