"""Chained, stable block hashes for prefix caching.

A block's hash covers its own token ids *and* its parent's hash, so equal hashes mean (up to a
hash collision) equal whole prefixes, not just equal blocks. The hash must be the same in every
process and run, so Python's randomized ``hash()`` is not used: it is BLAKE2b (16-byte digest)
over the parent hash and the token ids packed as little-endian int64.

Only *full* blocks are ever hashed; a partial tail block has no hash. A block holding an image's rows also
hashes the image's content key (``with_extra_keys``): its placeholder ids are the same for every image.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

BlockHash = bytes
"""A block hash: 16 bytes. The first block of a sequence has parent ``None``."""

_DIGEST_SIZE = 16


def hash_block_tokens(parent_hash: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """Hash one full block: ``blake2b(parent_hash or b"" || len || int64 token ids)``.

    Deterministic across processes. The length prefix keeps "no parent" distinct from any parent.
    """
    h = hashlib.blake2b(digest_size=_DIGEST_SIZE)
    if parent_hash is None:
        h.update(b"\x00")
    else:
        h.update(b"\x01" + parent_hash)
    h.update(struct.pack(f"<I{len(token_ids)}q", len(token_ids), *token_ids))
    return h.digest()


def with_extra_keys(block_hash: BlockHash, keys: Sequence[bytes]) -> BlockHash:
    """A block hash that also covers ``keys`` (the content keys of the images whose rows the block holds):
    equal token ids with different images give different hashes, and the chain carries it on."""
    h = hashlib.blake2b(b"\x02" + block_hash, digest_size=_DIGEST_SIZE)
    for k in keys:
        h.update(struct.pack("<I", len(k)) + k)
    return h.digest()


def hash_full_blocks(token_ids: Sequence[int], block_size: int, num_blocks: int | None = None,
                     parent_hash: BlockHash | None = None) -> list[BlockHash]:
    """Chained hashes of the first ``num_blocks`` full blocks of ``token_ids`` (default: all full blocks).

    ``num_blocks`` is clamped to the number of full blocks; the partial tail is never hashed.
    """
    if block_size <= 0:
        raise ValueError(f"block_size: must be > 0, got {block_size}")
    n_full = len(token_ids) // block_size
    n = n_full if num_blocks is None else max(0, min(num_blocks, n_full))
    out: list[BlockHash] = []
    parent = parent_hash
    for i in range(n):
        parent = hash_block_tokens(parent, token_ids[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out
