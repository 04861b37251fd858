"""The half-precision KV cache on a real model and real text (issue 29): perplexity with the f16 cache (the
default with F16C) within 0.5% of the fp32 cache's, bf16 (7 mantissa bits; the default without F16C)
within 1%, q8_0 (llama.cpp's --cache-type-k/v q8_0) within 1%, the same weights (the file's blocks),
teacher-forced. Measured on SmolLM2: 1,024 tokens f16 -0.02%, bf16 -0.59%, q8_0 -0.03%; 2,048 tokens f16 -0.19%,
bf16 -0.28%."""

from __future__ import annotations

import pytest
import torch

from hitenter.models.kv_dtype import Q8_0
from hitenter.models.loader import load_model
from hitenter.models.registry import model_path
from hitenter.quant.evaluate import english_text, perplexity
from hitenter.tokenizer import Tokenizer


@pytest.mark.slow
def test_kv_cache_dtype_perplexity_near_fp32() -> None:
    p = model_path("smollm2-135m-instruct")
    if not p.exists():
        pytest.skip("smollm2-135m-instruct not cached")
    model, _ = load_model(p)
    ids = Tokenizer.from_gguf(p).encode(english_text())
    ppl = {dt: perplexity(model, ids, chunk=512, max_tokens=1024, kv_dtype=dt)
           for dt in (torch.float32, torch.float16, torch.bfloat16, Q8_0)}
    assert 2 < ppl[torch.float32] < 100, ppl   # real text on a real model, not a degenerate run
    for dt, bound in ((torch.float16, 0.005), (torch.bfloat16, 0.01), (Q8_0, 0.01)):
        assert abs(ppl[dt] / ppl[torch.float32] - 1) <= bound, (dt, ppl)
    assert ppl[torch.float16] != ppl[torch.float32]   # the cache type did change what was stored
    assert ppl[Q8_0] != ppl[torch.float32]
