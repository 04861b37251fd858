"""Chunked local attention (Llama 4's RoPE layers, llama.cpp's LLAMA_SWA_TYPE_CHUNKED): a query at position p
sees the keys from the start of its chunk, floor(p / chunk) * chunk, up to p.

`chunk_view(attn, chunk)` states that as ordinary causal attention: each sequence's rows are cut where they
cross a chunk boundary, and each piece becomes a sequence of its own whose keys start at its chunk's first
position (its block table from that block on, its length and kernel rows counted from there). The rows keep
their order and slots, so paged_attention (its GEMM path and both native kernels) runs on the view unchanged,
and a row's result still depends only on its position and its keys."""

from __future__ import annotations

from hitenter.models.attention import AttentionMetadata


def chunk_view(attn: AttentionMetadata, chunk: int) -> AttentionMetadata:
    """The metadata of `attn`'s rows attending within their chunks (module docstring); `attn` itself when no
    sequence reaches past its first chunk. ValueError unless chunk is a multiple of the block size."""
    if all(n <= chunk for n in attn.seq_lens):
        return attn
    bs = attn.block_size
    if chunk % bs:
        raise ValueError(f"chunked attention: the chunk ({chunk}) must be a multiple of the block size ({bs})")
    qsl, lens, tables, kf, df = [0], [], [], [], []
    for i, seq_len in enumerate(attn.seq_lens):
        p = seq_len - (attn.query_start_loc[i + 1] - attn.query_start_loc[i])
        while p < seq_len:
            c0 = p // chunk * chunk
            end = min(seq_len, c0 + chunk)
            qsl.append(qsl[-1] + end - p)
            lens.append(end - c0)
            tables.append(attn.block_tables[i][c0 // bs:])
            if attn.kernel_from is not None:
                kf.append(attn.kernel_from[i] - c0)
            if attn.decode_from is not None:
                df.append(attn.decode_from[i] - c0)
            p = end
    return AttentionMetadata(qsl, lens, tables, attn.slot_mapping, bs, attn.workspace,
                             kf if attn.kernel_from is not None else None,
                             df if attn.decode_from is not None else None, attn.use_kernel)
