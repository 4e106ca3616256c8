"""The lines the README shows a PyTorch user, run as written on the CPU (dusk's
interpreter) with NumPy arrays in place of torch tensors, against the NumPy reference: the
README cannot drift from the API."""

import os
import re

import numpy as np

import reference as ref

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
PAGE = 16


def readme_lines():
    text = open(README).read()
    section = text[text.index("## From Python") :]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
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
