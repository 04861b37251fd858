"""The fused layer's row-wise glue (norms, QK-norm, RoPE, the cache write, GLU, post-norms, residual adds)
runs on the step's threads for steps of at least 16 rows (kernels/csrc/layer/decode_layer.c, PAR_ROWS) and on
one thread below that. A row's arithmetic must not depend on which: a 96-token prompt's logits are the
same bits in one step as in steps of 6 rows (one thread) and of 28 and 56 rows, on 2 threads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hitenter.kernels import native_available
from hitenter.models.loader import load_model
from hitenter.testing.model_runs import sequence_logits as fused_logits
from hitenter.testing.tiny_gemma import write_tiny_gemma3
from hitenter.testing.tiny_model import write_tiny_gguf

pytestmark = pytest.mark.skipif(not native_available(), reason="no native kernels (no C compiler)")

N = 96


def _logits(model: torch.nn.Module, ids: list[int], chunks: tuple[int, ...]) -> torch.Tensor:
    """Logits of every row, the prompt cut into steps at `chunks`; every row fused, the last a generation row."""
    return fused_logits(model, ids, 0, len(ids) - 1, chunks)


@pytest.mark.parametrize("kind", ["q4_1_llama", "q8_gemma3"])
def test_threaded_glue_same_bits(kind: str, tmp_path: Path) -> None:
    path = (write_tiny_gguf(tmp_path / "m.gguf", arch="llama", quant="Q4_1", seed=3) if kind == "q4_1_llama"
            else write_tiny_gemma3(tmp_path / "m.gguf", quant="Q8_0", seed=8))
    model, cfg = load_model(path)
    ids = torch.randint(3, cfg.vocab_size, (N,), generator=torch.Generator().manual_seed(4)).tolist()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        whole = _logits(model, ids, ())              # one 96-row step: the glue on 2 threads
        cut = _logits(model, ids, (6, 12, 40))       # steps of 6 and 6 rows (one thread), 28 and 56
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(whole, cut)
