"""The lines the README shows a PyTorch user, run as written on the CPU (dusk's
interpreter) with NumPy arrays in place of torch tensors, against the NumPy reference: the
README cannot drift from the API."""

import os
import re

import numpy as np

import dusk
import reference as ref

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
PAGE = 16


def readme_lines(i=0):
    text = open(README).read()
    section = text[text.index("## From Python") :]
    block = re.findall(r"```python\n(.*?)```", section, re.S)[i]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_readme_lines_run_as_written():
    lines = readme_lines()
    assert len(lines) <= 5, lines
    rng = np.random.default_rng(11)
    seq_lens = [21, 40]
    kv_indptr, kv_page_indices, kv_last_page_len, num_pages = ref.random_table(rng, seq_lens, PAGE)
    shape = (num_pages, PAGE, 8, 128)
    k_cache = rng.standard_normal(shape).astype(np.float16)
    v_cache = rng.standard_normal(shape).astype(np.float16)
    q = rng.standard_normal((len(seq_lens), 32, 128)).astype(np.float16)
    out = np.full(q.shape, np.nan, np.float16)
    scope = dict(q=q, k_cache=k_cache, v_cache=v_cache, out=out, kv_indptr=kv_indptr,
                 kv_page_indices=kv_page_indices, kv_last_page_len=kv_last_page_len)
    exec("\n".join(lines), scope)
    rows = lambda b, h: np.arange(seq_lens[b])  # noqa: E731
    want, _ = ref.attention(q, k_cache, v_cache, kv_indptr, kv_page_indices, kv_last_page_len, PAGE, rows, 128**-0.5)
    np.testing.assert_allclose(out.astype(np.float64), want, atol=2e-2)


def test_readme_pipeline_lines_run_as_written():
    # The pipeline's lines with NumPy arrays: q.device is the CPU's name for the package.
    lines = [line.replace("q.device", '"cpu"') for line in readme_lines(1)]
    assert len(lines) == 5, lines
    rng = np.random.default_rng(12)
    seq_lens = [16 * 9 + 1, 16 * 4 + 1]
    kv_indptr, kv_page_indices, kv_last_page_len, num_pages = ref.random_table(rng, seq_lens, PAGE)
    shape = (num_pages, PAGE, 8, 128)
    k_cache = rng.standard_normal(shape).astype(np.float16)
    v_cache = rng.standard_normal(shape).astype(np.float16)
    q = rng.standard_normal((len(seq_lens), 32, 128)).astype(np.float16)
    k_new = rng.standard_normal((len(seq_lens), 8, 128)).astype(np.float16)
    v_new = rng.standard_normal(k_new.shape).astype(np.float16)
    out = np.full(q.shape, np.nan, np.float16)
    scope = dict(dusk=dusk, q=q, k_cache=k_cache, v_cache=v_cache, out=out,
                 k_new=k_new, v_new=v_new, kv_indptr=kv_indptr,
                 kv_page_indices=kv_page_indices, kv_last_page_len=kv_last_page_len)
    exec("\n".join(lines), scope)
    pipe = scope["pipe"]
    ip = np.from_dlpack(pipe.sel_indptr)
    kept = np.from_dlpack(pipe.sel_indices)
    for b, n in enumerate(seq_lens):
        page = kv_page_indices[kv_indptr[b + 1] - 1]
        np.testing.assert_array_equal(k_cache[page, (n - 1) % PAGE], k_new[b])
        for h in range(8):  # the new token is in every row's lists (its page is always kept)
            assert n - 1 in kept[ip[b * 8 + h] : ip[b * 8 + h + 1]]
    rows = lambda b, h: kept[ip[b * 8 + h // 4] : ip[b * 8 + h // 4 + 1]]  # noqa: E731
    want, _ = ref.attention(q, k_cache, v_cache, kv_indptr, kv_page_indices, kv_last_page_len, PAGE, rows, 128**-0.5)
    np.testing.assert_allclose(out.astype(np.float64), want, atol=2e-2)
