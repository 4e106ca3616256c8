"""Type stubs for dusk's compiled module (python/src/*.rs); python/tests/test_stubs.py
checks them against the built module. The runtime docstrings are the reference."""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Sequence, TypedDict, Union, final

# A tensor: anything with `__dlpack__` or `__cuda_array_interface__` (torch, CuPy, JAX;
# NumPy on the CPU). No common protocol fits them all, hence Any.
_TensorLike = Any
# Host metadata (indptr, page indices, ...): an int32 tensor of rank 1, or ints.
_IntsLike = Union[_TensorLike, Sequence[int]]
# "cpu", "cuda", "cuda:N", a CUDA ordinal, or anything whose str() is one (torch.device).
_Device = Union[str, int, Any]
# A CUstream address, a torch.cuda.Stream or a CuPy stream; None: the current stream.
_Stream = Optional[Union[int, Any]]
# A policy parameter: one number, or one per query row (a sequence or a host array).
_ParamValue = Union[float, Sequence[float], _TensorLike]
# A policy's parameters: by name, or in the policy's order (one alone may be a number).
_Params = Union[Mapping[str, _ParamValue], Sequence[_ParamValue], float]

__all__ = [
    "JIT",
    "Array",
    "AttentionPlan",
    "PipelinePlan",
    "PrunePlan",
    "SpgemvPlan",
    "bundle_info",
    "calibrate_ds",
    "data_ptr",
    "loaded_kernels",
    "quantize_k",
    "sglang_to_csr",
    "vllm_to_csr",
]

class _BundleInfo(TypedDict):
    """What `bundle_info()` returns."""

    arch: str
    ptx_isa: str
    generator: str
    dir: str
    kernels: list[str]

JIT: bool

@final
class Array:
    """A view of memory dusk owns (a plan's outputs), read in place through DLPack."""

    def __dlpack__(
        self,
        *,
        stream: Optional[Any] = None,
        max_version: Optional[tuple[int, int]] = None,
        dl_device: Optional[tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule over the memory (no copy)."""

    def __dlpack_device__(self) -> tuple[int, int]:
        """`(device type, device id)`: (1, 0) for the CPU, (2, ordinal) for CUDA."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface (version 3), for arrays on a GPU."""

    @property
    def shape(self) -> tuple[int, ...]:
        """The dimensions."""

    @property
    def dtype(self) -> str:
        """The element type's NumPy name (`int32`, `float32`, ...)."""

    @property
    def device(self) -> str:
        """`cpu` or `cuda:N`."""

    @property
    def data_ptr(self) -> int:
        """The address of the first element (host or device)."""

    def __len__(self) -> int: ...
    def __repr__(self) -> str: ...

@final
class SpgemvPlan:
    """Estimated scores of each query head against its candidates, from the INT4 K copy."""

    def __new__(cls, device: _Device) -> SpgemvPlan:
        """A plan for `device` (`"cpu"`, `"cuda"`, `"cuda:N"`, a `torch.device`)."""

    def plan(
        self,
        kv_indptr: _IntsLike,
        kv_page_indices: _IntsLike,
        kv_last_page_len: _IntsLike,
        cand_indptr: _IntsLike,
        cand_indices: _IntsLike,
        *,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        num_pages: int,
        page_size: int = 16,
        bits: int = 4,
        graph_launch: bool = False,
    ) -> None:
        """Checks and uploads the page table and the candidates; loads the kernels."""

    @property
    def num_scores(self) -> int:
        """Length of the float32 `scores` a run writes: candidates times the group."""

    @property
    def device(self) -> str:
        """The plan's device, `cpu` or `cuda:N`."""

    def run(
        self,
        q: _TensorLike,
        packed: _TensorLike,
        scale: _TensorLike,
        zero: _TensorLike,
        scores: _TensorLike,
        *,
        stream: _Stream = None,
    ) -> None:
        """Scores `q` against the candidates of the quantized cache into `scores`."""

@final
class PrunePlan:
    """The fused threshold search: scores in, the kept candidates out as CSR token lists."""

    def __new__(cls, device: _Device) -> PrunePlan:
        """A plan for `device` (`"cpu"`, `"cuda"`, `"cuda:N"`, a `torch.device`)."""

    def plan(
        self,
        cand_indptr: _IntsLike,
        cand_indices: _IntsLike,
        *,
        policy: str = "top_p",
        params: Optional[_Params] = None,
        group: int = 1,
        sm_scale: float = 1.0,
    ) -> None:
        """Plans `policy` over the candidates' rows (host CSR token lists)."""

    def set_params(self, params: _Params) -> None:
        """Replaces the policy's parameters."""

    @property
    def num_scores(self) -> int:
        """Scores the search reads: candidates times the group."""

    @property
    def device(self) -> str:
        """The plan's device, `cpu` or `cuda:N`."""

    def run(self, scores: _TensorLike, *, stream: _Stream = None) -> None:
        """Searches every query row of `scores`; writes the kept lists to the plan's outputs."""

    def run_into(
        self,
        scores: _TensorLike,
        sel_indptr: _TensorLike,
        sel_indices: _TensorLike,
        *,
        stream: _Stream = None,
    ) -> None:
        """As `run`, with the kept lists written to the caller's int32 tensors."""

    @property
    def sel_indptr(self) -> Array:
        """int32 `[rows + 1]`: where each row's kept positions start."""

    @property
    def sel_indices(self) -> Array:
        """int32 `[max(nnz, 1)]`: the kept positions, ascending within each row."""

    @property
    def budgets(self) -> Array:
        """int32 `[rows]`: kept candidates per row."""

    @property
    def kept_mass(self) -> Array:
        """float32 `[rows * group]`: the weight each query row kept."""

    @property
    def flags(self) -> Array:
        """int32 `[rows * group]`: 1 where a query row's scores held NaN or infinity."""

@final
class AttentionPlan:
    """Varlen paged decode attention: dense, or over token lists per query or KV head."""

    def __new__(cls, device: _Device) -> AttentionPlan:
        """A plan for `device` (`"cpu"`, `"cuda"`, `"cuda:N"`, a `torch.device`)."""

    def plan(
        self,
        kv_indptr: _IntsLike,
        kv_page_indices: _IntsLike,
        kv_last_page_len: _IntsLike,
        *,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        num_pages: int,
        mode: str = "dense",
        sel_indptr: Optional[_IntsLike] = None,
        sel_indices: Optional[_IntsLike] = None,
        device_lists: bool = False,
        device_table: bool = False,
        max_tokens: Optional[int] = None,
        sm_scale: Optional[float] = None,
        dtype: Optional[Union[str, Any]] = None,
        fused_merge: bool = False,
        graph_launch: bool = True,
    ) -> None:
        """Plans attention over a paged cache whose pages the int32 CSR metadata gives."""

    @property
    def device(self) -> str:
        """The plan's device, `cpu` or `cuda:N`."""

    def run(
        self,
        q: _TensorLike,
        k_cache: _TensorLike,
        v_cache: _TensorLike,
        out: _TensorLike,
        lse: Optional[_TensorLike] = None,
        *,
        stream: _Stream = None,
    ) -> None:
        """Attention of `q` over `k_cache`, `v_cache` into `out` (and `lse` if given)."""

@final
class PipelinePlan:
    """A whole sparse decode step (Select-then-Prune): selector, pruners, attention."""

    def __new__(
        cls,
        device: _Device,
        *,
        select: str = "quest",
        budget: Union[int, float, None] = None,
        sink: Union[bool, int, None] = None,
        recent: int = 0,
        calibration: Union[str, os.PathLike[str], None] = None,
        r: Optional[int] = None,
        block_size: Optional[int] = 256,
        sparq_mix: Optional[bool] = None,
        prune: Optional[Sequence[tuple[str, _Params]]] = None,
        attend: str = "group_varlen",
        bits: int = 4,
        dense_below: Optional[int] = None,
    ) -> PipelinePlan:
        """A pipeline for `device`, its arguments checked as a whole now."""

    def plan(
        self,
        kv_indptr: _IntsLike,
        kv_page_indices: _IntsLike,
        kv_last_page_len: _IntsLike,
        *,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        num_pages: int,
        page_size: int = 16,
        device_table: bool = False,
        max_tokens: Optional[int] = None,
    ) -> None:
        """Plans the pipeline over a paged cache: sizes every buffer, loads every kernel."""

    @property
    def device(self) -> str:
        """The plan's device, `cpu` or `cuda:N`."""

    def prepare(
        self,
        k_cache: _TensorLike,
        v_cache: Optional[_TensorLike] = None,
        *,
        stream: _Stream = None,
    ) -> None:
        """Fills the INT4 copy of K and the selector's state from the cache."""

    def replan(
        self,
        kv_indptr: _IntsLike,
        kv_page_indices: _IntsLike,
        kv_last_page_len: _IntsLike,
    ) -> None:
        """The same pipeline over the next page table, keeping the INT4 copy and state."""

    def append(
        self,
        k_new: _TensorLike,
        v_new: _TensorLike,
        k_cache: _TensorLike,
        v_cache: _TensorLike,
        *,
        stream: _Stream = None,
    ) -> None:
        """Writes one token per sequence into the caches, the INT4 copy and the selector."""

    def step(
        self,
        q: _TensorLike,
        k_cache: _TensorLike,
        v_cache: _TensorLike,
        out: _TensorLike,
        lse: Optional[_TensorLike] = None,
        *,
        stream: _Stream = None,
    ) -> None:
        """One decode step: select, estimate, prune, attend into `out`."""

    def budgets(self) -> list[int]:
        """Tokens attention read in the last step, per (sequence, KV head) (a download)."""

    @property
    def is_dense(self) -> bool:
        """Whether the step is dense attention alone."""

    @property
    def candidate_indptr(self) -> list[int]:
        """The candidates' row offsets (host ints)."""

    @property
    def selection(self) -> Optional[Array]:
        """int32: Quest's selected positions after the last step; None without a selector."""

    @property
    def sel_indptr(self) -> Optional[Array]:
        """int32: where each row of attention's lists starts; None when the step is dense."""

    @property
    def sel_indices(self) -> Optional[Array]:
        """int32: the positions attention read in the last step; None when dense."""

def quantize_k(
    k: _TensorLike,
    packed: _TensorLike,
    scale: _TensorLike,
    zero: _TensorLike,
    *,
    stream: _Stream = None,
) -> None:
    """Writes the INT4 (or INT8) head-major copy of a paged float16 K cache."""

def vllm_to_csr(
    block_table: _TensorLike,
    seq_lens: _TensorLike,
    kv_indptr: _TensorLike,
    kv_page_indices: _TensorLike,
    kv_last_page_len: _TensorLike,
    *,
    page_size: int,
    num_pages: int,
    stream: _Stream = None,
) -> None:
    """Converts vLLM's block table to dusk's CSR page table, on the device."""

def sglang_to_csr(
    req_to_token: _TensorLike,
    req_pool_indices: _TensorLike,
    seq_lens: _TensorLike,
    kv_indptr: _TensorLike,
    kv_page_indices: _TensorLike,
    kv_last_page_len: _TensorLike,
    *,
    num_pages: int,
    page_size: int = 1,
    stream: _Stream = None,
) -> None:
    """Converts SGLang's request-to-token table to dusk's CSR page table, on the device."""

def bundle_info() -> _BundleInfo:
    """The built-in (or DUSK_BUNDLE's) kernel bundle: its target and kernel names."""

def loaded_kernels(device: _Device) -> list[tuple[str, str]]:
    """Kernels loaded on `device` so far, each (name, "bundle" | "jit" | "interpreter")."""

def data_ptr(tensor: _TensorLike) -> int:
    """The address dusk reads and writes for `tensor` (host or device)."""

def calibrate_ds(q: _TensorLike, k: _TensorLike, *, r: int = 16) -> str:
    """Double Sparsity's calibration (JSON text) from sample queries and keys on the host."""
