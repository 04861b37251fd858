"""llm.trace: the engine's own model, traced. Its logits equal the engine's (same request, max_tokens=1,
atol 1e-3 on logits of magnitude ~20; measured ~3e-5) and its attention probabilities / hidden states equal
HF transformers' ``output_attentions`` / ``output_hidden_states`` loading the same GGUF in fp32 eager
(attentions atol 1e-4; hidden states, final norm and logits atol 2e-3 + rtol 1e-3 elementwise). Measured on
"I went to the bank to deposit money": attentions differ by at most 5e-6 (SmolLM2) / 4e-5 (Qwen2.5-0.5B);
hidden states by 0.039 on values up to 2.4e4 (SmolLM2's massive activations) / 8e-4 on values up to 1.1e3;
logits by 1.6e-4 / 4.7e-5.

The real-model tests are slow (loading the model twice) and skip when transformers or the model is absent.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hitenter.engine.llm_engine import LLMEngine
from hitenter.models.trace import logit_lens, nearest_tokens, trace_forward, trace_with_generation
from hitenter.sampling_params import SamplingParams

MODELS = Path.home() / ".cache" / "hitenter" / "models"
BANK = "I went to the bank to deposit money"
ENGINE_OPTS = dict(max_model_len=128, kv_cache_memory=1 << 24, block_size=16)


def engine_logits(eng: LLMEngine, ids: list[int]) -> torch.Tensor:
    """The engine's raw logits row for the next token after ``ids`` (its playground hook)."""
    rid = eng.add_request(None, ids, SamplingParams(max_tokens=1))
    eng.trace_requests.add(rid)
    while eng.has_unfinished_requests():
        eng.step()
    eng.trace_requests.discard(rid)
    return eng.last_logits.pop(rid)


def check_against_engine(eng: LLMEngine, ids: list[int]) -> None:
    tr = trace_forward(eng.runner.model, ids)
    cfg = eng.model_config
    assert tr.hidden.shape == (cfg.num_layers + 1, len(ids), cfg.hidden_size)
    assert tr.attentions.shape == (cfg.num_layers, cfg.num_heads, len(ids), len(ids))
    assert tr.angles.shape == (len(ids), cfg.head_dim // 2)
    torch.testing.assert_close(tr.attentions.sum(-1), torch.ones(tr.attentions.shape[:-1]))
    assert float(tr.attentions.triu(1).abs().max()) == 0.0          # causal: no look ahead
    torch.testing.assert_close(tr.logits[-1], engine_logits(eng, ids), atol=1e-3, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_trace_equals_the_engine(arch: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(f"tiny_{arch}_path")
    eng = LLMEngine(str(path), **ENGINE_OPTS)
    check_against_engine(eng, [5, 70, 100, 33, 200, 260, 4, 9, 11])


def test_generation_continues_greedily_and_engine_is_untouched(tiny_llama_path: Path) -> None:
    eng = LLMEngine(str(tiny_llama_path), **ENGINE_OPTS)
    before = (eng.step_counter, eng.kv_manager.num_free_blocks)
    tr = trace_with_generation(eng.runner.model, [5, 70, 100], max_new_tokens=4)
    assert len(tr.generated) == 4 and tr.token_ids == [5, 70, 100, *tr.generated]
    assert tr.num_prompt == 3 and tr.attentions.shape[-1] == 7
    assert (eng.step_counter, eng.kv_manager.num_free_blocks) == before
    probs, ids = logit_lens(eng.runner.model, tr.hidden[:, -1])
    assert probs.shape == ids.shape == (eng.model_config.num_layers + 1, 5)
    assert int(ids[-1, 0]) == int(tr.logits[-1].argmax())           # the last layer's lens is the model
    near, sims = nearest_tokens(eng.runner.model, tr.embeddings[0])
    assert near[0] == 5 and math.isclose(sims[0], 1.0, abs_tol=1e-4)


def real_model(name: str) -> Path:
    p = MODELS / f"{name}.gguf"
    if not p.exists():
        pytest.skip(f"{p} is not cached")
    return p


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
def test_real_trace_equals_engine_and_hf(name: str) -> None:
    transformers = pytest.importorskip("transformers", reason="HF transformers is the reference here")
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF")
    path = real_model(name)
    native = LLMEngine(str(path), **ENGINE_OPTS)          # the default format (the GGUF's blocks)
    ids = native.tokenizer.encode(BANK)
    check_against_engine(native, ids)                    # trace == engine in the format it serves
    del native
    eng = LLMEngine(str(path), dtype="float32", **ENGINE_OPTS)   # HF's reference format
    check_against_engine(eng, ids)
    tr = trace_forward(eng.runner.model, ids)
    del eng
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
    ref_attn = torch.stack([a[0] for a in out.attentions])
    torch.testing.assert_close(tr.attentions, ref_attn, atol=1e-4, rtol=0)
    ref_hidden = torch.stack([h[0] for h in out.hidden_states])     # HF's last entry is after the final norm
    torch.testing.assert_close(tr.hidden[:-1], ref_hidden[:-1], atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(tr.final_normed, ref_hidden[-1], atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(tr.logits, out.logits[0], atol=2e-3, rtol=1e-3)


def test_llm_trace_delegates_to_the_engines_model(tiny_llama_path: Path) -> None:
    from hitenter.llm import LLM

    llm = LLM(str(tiny_llama_path), **ENGINE_OPTS)
    tr = llm.trace([5, 70, 100, 33], max_new_tokens=2)
    assert tr.token_ids[:4] == [5, 70, 100, 33] and len(tr.generated) == 2
    torch.testing.assert_close(tr.logits[3], trace_forward(llm.engine.runner.model, [5, 70, 100, 33]).logits[-1])


def test_gemma3_trace_equals_the_engine_and_keeps_the_window(tmp_path: Path) -> None:
    """Gemma 3 (QK-norm, scaled embeddings, local layers with their own RoPE and a sliding window):
    the trace's logits are the engine's, and a local layer's probabilities are 0 outside its window."""
    from hitenter.testing.tiny_gemma import write_tiny_gemma3

    eng = LLMEngine(str(write_tiny_gemma3(tmp_path / "tiny-gemma3.gguf")), **ENGINE_OPTS)
    ids = list(range(5, 25))                                   # 20 tokens: longer than the tiny window
    check_against_engine(eng, ids)
    tr = trace_forward(eng.runner.model, ids)
    local = [i for i, layer in enumerate(eng.runner.model.layers) if layer.window is not None]
    assert local, "the tiny Gemma has local layers"
    w = eng.runner.model.layers[local[0]].window
    assert w < len(ids)
    q, k = torch.meshgrid(torch.arange(len(ids)), torch.arange(len(ids)), indexing="ij")
    assert float(tr.attentions[local[0]][:, q - k >= w].abs().max()) == 0.0
