"""Reads the pages file our benchmark writes: the pages a selector picked per (sequence, KV
head), so that the `flashinfer-pages` peer decodes exactly those (DESIGN.md section 10).
The format (benches/src/pages_file.rs writes it), little-endian:

    8 bytes                     b"DUSKPAGE"
    5 x int32                   version (1), batch, num_q_heads, num_kv_heads, page_size
    batch x int32               each sequence's length in tokens
    batch*num_kv_heads+1 int32  indptr: row b * num_kv_heads + h is pages[indptr[r]:indptr[r+1]]
    indptr[-1] x int32          page numbers within the row's sequence (0 = its first), ascending

No torch needed. `python3 pages_file.py FILE` prints the contents as JSON.
"""
import json
import struct
import sys

MAGIC = b"DUSKPAGE"
VERSION = 1


def read(path):
    """The file's contents as a dict (`batch`, `num_q_heads`, `num_kv_heads`, `page_size`,
    `seq_lens`, `indptr`, `pages`; lists of ints), checked like the writer checks them."""
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(MAGIC) or (len(data) - len(MAGIC)) % 4:
        raise ValueError(f"{path}: not a pages file (no {MAGIC!r} magic, or not whole int32s)")
    words = struct.unpack(f"<{(len(data) - len(MAGIC)) // 4}i", data[len(MAGIC):])
    if len(words) < 5 or words[0] != VERSION:
        raise ValueError(f"{path}: version {words[0] if words else None}, this reads {VERSION}")
    batch, hq, hkv, page = words[1:5]
    rows = batch * hkv
    if batch < 1 or hkv < 1 or page < 1 or hq % hkv:
        raise ValueError(f"{path}: batch {batch}, heads {hq}/{hkv}, page {page}")
    at = 5
    seq_lens = list(words[at:at + batch])
    at += batch
    indptr = list(words[at:at + rows + 1])
    at += rows + 1
    if len(indptr) != rows + 1 or indptr[0] != 0:
        raise ValueError(f"{path}: shorter than its header says")
    pages = list(words[at:])
    if len(pages) != indptr[-1] or any(a > b for a, b in zip(indptr, indptr[1:])):
        raise ValueError(f"{path}: {len(pages)} pages, indptr ends at {indptr[-1]}")
    for r in range(rows):
        row = pages[indptr[r]:indptr[r + 1]]
        n = -(-seq_lens[r // hkv] // page)
        if any(p < 0 or p >= n for p in row) or any(a >= b for a, b in zip(row, row[1:])):
            raise ValueError(f"{path}: row {r}: expected ascending pages in 0..{n}")
    return {"batch": batch, "num_q_heads": hq, "num_kv_heads": hkv, "page_size": page,
            "seq_lens": seq_lens, "indptr": indptr, "pages": pages}


if __name__ == "__main__":
    print(json.dumps(read(sys.argv[1])))
