"""PyTorch tensors on the CPU, read through torch's own accessors as CUDA tensors are: in
place, their layout checked (a contiguous tensor's strides taken from its shape, any other's
from torch), with the same results as NumPy arrays. Skipped where torch is missing (CI)."""

import numpy as np
import pytest

import dusk
from test_errors import quantize_args, raises_arg
from test_ops import vllm_reference

torch = pytest.importorskip("torch")

PAGE = 16


def test_torch_tensors_are_read_in_place():
    x = torch.zeros(1000, dtype=torch.float16)
    assert dusk.data_ptr(x) == x.data_ptr()
    assert dusk.data_ptr(x[10:]) == x[10:].data_ptr()


def test_quantize_k_on_torch_tensors_equals_numpy():
    k, packed, scale, zero = quantize_args()
    k = np.random.default_rng(5).standard_normal(k.shape).astype(np.float16)
    dusk.quantize_k(k, packed, scale, zero)
    outputs = (np.full_like(packed, 7), np.zeros_like(scale), np.zeros_like(zero))
    tk, tp, ts, tz = (torch.tensor(a) for a in (k, *outputs))
    dusk.quantize_k(tk, tp, ts, tz)
    for want, got in ((packed, tp), (scale, ts), (zero, tz)):
        np.testing.assert_array_equal(want, got.numpy())


def test_layout_of_torch_tensors_is_checked():
    _, packed, scale, zero = (torch.tensor(a) for a in quantize_args())
    # Every other element of a wider tensor, and a transposed one: the right shapes, not
    # C-contiguous.
    wide = torch.ones((2, PAGE, 2, 128), dtype=torch.float16)
    e = raises_arg("k", dusk.quantize_k, wide[..., ::2], packed, scale, zero)
    assert "C-contiguous" in str(e)
    swapped = torch.ones((2, 2, PAGE, 64), dtype=torch.float16).transpose(1, 2)
    assert not swapped.is_contiguous()
    e = raises_arg("k", dusk.quantize_k, swapped, packed, scale, zero)
    assert "C-contiguous" in str(e)
    # A size-1 dimension's stride does not matter: such a tensor is contiguous.
    one = torch.ones((1, PAGE, 2, 64), dtype=torch.float16)
    one = one.as_strided(one.shape, (7, 128, 64, 1))
    p1, s1, z1 = (torch.zeros((1, *t.shape[1:]), dtype=t.dtype) for t in (packed, scale, zero))
    dusk.quantize_k(one, p1, s1, z1)


def test_strided_rows_of_a_torch_block_table():
    rng = np.random.default_rng(9)
    batch, max_blocks, page_size, num_pages = 5, 12, 16, 300
    persistent = torch.tensor(rng.integers(0, num_pages, (8, max_blocks + 4)).astype(np.int32))
    block_table = persistent[:batch, :max_blocks]  # rows spaced apart: a strided view
    assert not block_table.is_contiguous()
    seq_lens = torch.tensor([0, 16, 17, 191, max_blocks * 16 + 30], dtype=torch.int32)
    kv_indptr = torch.full((batch + 1,), -1, dtype=torch.int32)
    kv_page_indices = torch.full((batch * max_blocks,), -1, dtype=torch.int32)
    kv_last_page_len = torch.full((batch,), -1, dtype=torch.int32)
    dusk.vllm_to_csr(
        block_table, seq_lens, kv_indptr, kv_page_indices, kv_last_page_len,
        page_size=page_size, num_pages=num_pages,
    )
    ip, pages, last = vllm_reference(block_table.numpy(), seq_lens.numpy(), page_size, num_pages)
    np.testing.assert_array_equal(kv_indptr.numpy(), ip)
    np.testing.assert_array_equal(kv_page_indices[: ip[-1]].numpy(), pages)
    np.testing.assert_array_equal(kv_last_page_len.numpy(), last)
