"""The embedding and reranking families (hitenter/testing/tiny_encoders.py) against llama.cpp's own pooled
embeddings and rerank scores on the same files (tests/goldens/encoders/, scripts/make_encoder_goldens.py:
llama-cpp-python 0.3.36 in embedding mode, F32 weights and KV cache, the file's pooling, not normalized).

Tolerance: max |hitenter - llama.cpp| <= TOL * max |llama.cpp| over all sequences and outputs. nomic-bert and
the qwen3 embedder / reranker (SiLU) agree to float rounding (~1e-6). bert and gemma-embedding run GELU, which
ggml's CPU backend evaluates through an fp16 table (GGML_GELU_FP16: input rounded to fp16, result read as
fp16; see tests/models/families/test_llama_cpp_logits.py): against an exact tanh-GELU llama.cpp sits ~5e-4
away, so those get TOL_FP16_GELU, and `test_fp16_gelu_explains_the_gap` shows that with ggml's table
emulated the gap falls ~10x (to the odd element whose fp16 rounding flips).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from hitenter.errors import ModelLoadError
from hitenter.models.attention import AttentionMetadata, allocate_kv_caches
from hitenter.models.encoder import EncoderModel
from hitenter.models.loader import load_model
from hitenter.testing.paths import GOLDENS
from hitenter.testing.tiny_encoders import ENCODERS, write_tiny_encoder

TOL = 1e-5
TOL_FP16_GELU = 2e-3
FP16_GELU = ("bert", "bert_rank", "bert_rank_xlmr", "nomic-bert-moe", "gemma-embedding")
_EXACT_GELU = F.gelu


def _golden(family: str) -> dict[str, np.ndarray]:
    path = GOLDENS / "encoders" / f"{family}.npz"
    if not path.is_file():
        pytest.fail(f"{path} missing: run scripts/make_encoder_goldens.py {family}")
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _split(flat: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    out, s = [], 0
    for n in lengths.tolist():
        out.append(flat[s:s + n].tolist())
        s += n
    return out


def _tiny(family: str, gold: dict[str, np.ndarray], tmp_path: Path) -> Path:
    path = write_tiny_encoder(tmp_path / f"{family}.gguf", family, seed=int(gold["seed"]))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(gold["gguf_sha256"]), (
        f"write_tiny_encoder({family!r}) no longer writes the golden's file: run scripts/make_encoder_goldens.py")
    return path


def pooled(model: torch.nn.Module, seqs: list[list[int]]) -> torch.Tensor:
    """The model's pooled outputs, one sequence per forward (decoders: on a fresh fp32 cache)."""
    if isinstance(model, EncoderModel):
        return model.embed_sequences(seqs)
    cfg, bs, outs = model.config, 16, []
    for s in seqs:
        nb = -(-len(s) // bs)
        meta = AttentionMetadata(query_start_loc=[0, len(s)], seq_lens=[len(s)], block_tables=[list(range(nb))],
                                 slot_mapping=torch.arange(len(s)), block_size=bs)
        hidden = model(torch.tensor(s), torch.arange(len(s)), meta, allocate_kv_caches(cfg, nb, bs, torch.float32))
        outs.append(model.pooler(hidden, [len(s)]))
    return torch.cat(outs)


def _worst(ours: torch.Tensor, ref: np.ndarray) -> float:
    assert tuple(ours.shape) == ref.shape
    return float(np.abs(ours.double().numpy() - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("family", ENCODERS)
def test_pooled_match_llama_cpp(family: str, tmp_path: Path) -> None:
    gold = _golden(family)
    model = load_model(_tiny(family, gold, tmp_path), dtype="float32")[0]
    worst = _worst(pooled(model, _split(gold["ids"], gold["lengths"])), gold["pooled"])
    tol = TOL_FP16_GELU if family in FP16_GELU else TOL
    print(f"{family}: max |diff| / max |llama.cpp| = {worst:.1e}")
    assert worst <= tol


def _ggml_gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """ggml's CPU GELU: tanh-GELU of the input rounded to fp16, the result rounded to fp16, exact past +-10."""
    y = _EXACT_GELU(x.half().float(), approximate="tanh").half().float()
    return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))


@pytest.mark.slow
@pytest.mark.parametrize("family", FP16_GELU)
def test_fp16_gelu_explains_the_gap(family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gold = _golden(family)
    model = load_model(_tiny(family, gold, tmp_path), dtype="float32")[0]
    seqs = _split(gold["ids"], gold["lengths"])
    exact = _worst(pooled(model, seqs), gold["pooled"])
    monkeypatch.setattr(F, "gelu", _ggml_gelu)
    emulated = _worst(pooled(model, seqs), gold["pooled"])
    print(f"{family}: exact GELU {exact:.1e}, ggml's fp16 GELU {emulated:.1e}")
    assert emulated <= 1.5e-4 and emulated < exact / 4


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "nomic-bert", "nomic-bert-moe", "gemma-embedding"])
def test_packed_sequences_are_independent(family: str, tmp_path: Path) -> None:
    """Sequences packed into one forward give each sequence's lone result (bidirectional attention stays
    within a sequence; the window and positions restart with it)."""
    gold = _golden(family)
    model = load_model(_tiny(family, gold, tmp_path), dtype="float32")[0]
    seqs = _split(gold["ids"], gold["lengths"]) + [[5, 6, 7, 8, 9, 10, 11]] * 2
    together = model.embed_sequences(seqs)
    alone = torch.cat([model.embed_sequences([s]) for s in seqs])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["bert_rank_xlmr", "nomic-bert-moe"])
def test_unigram_text_ids_match_llama_cpp(family: str, tmp_path: Path) -> None:
    """The unigram ("t5") vocabularies (XLM-R's kind) tokenize TEXTS as llama.cpp does (<s> ... </s>), and
    a rerank pair as llama-server formats it."""
    from hitenter.testing.tiny_encoders import TEXTS
    from hitenter.tokenizer import Tokenizer, UgmTokenizer

    gold = _golden(family)
    tok = Tokenizer.from_gguf(_tiny(family, gold, tmp_path))
    assert isinstance(tok, UgmTokenizer)
    assert [tok.encode(t, parse_special=False) for t in TEXTS] == _split(gold["text_ids"], gold["text_lengths"])
    from hitenter.server.serving_rerank import rerank_tokens
    from hitenter.testing.tiny_encoders import DOCS, QUERY

    pairs = [rerank_tokens(tok, None, QUERY, d) for d in DOCS]      # <s> query </s> document </s>
    assert pairs == _split(gold["rerank_ids"], gold["rerank_lengths"])


def test_moe_every_other_layer_only(tmp_path: Path) -> None:
    """nomic-bert-moe: experts on layer 1 (llama.cpp's i % 2 == 1), a dense GELU FFN on layer 0."""
    gold = _golden("nomic-bert-moe")
    model = load_model(_tiny("nomic-bert-moe", gold, tmp_path), dtype="float32")[0]
    assert [layer.moe is not None for layer in model.layers] == [False, True]
    assert model.layers[1].moe.top_k == 2 and not model.layers[1].moe.norm_topk


def test_quantized_projections_stay_close(tmp_path: Path) -> None:
    """Q8_0 layer projections (the native block kernels) stay near the F32 model's pooled vectors."""
    gold = _golden("nomic-bert")
    seqs = _split(gold["ids"], gold["lengths"])
    q8 = load_model(write_tiny_encoder(tmp_path / "q8.gguf", "nomic-bert", quant="Q8_0"))[0]
    f32 = load_model(_tiny("nomic-bert", gold, tmp_path), dtype="float32")[0]
    a, b = q8.embed_sequences(seqs), f32.embed_sequences(seqs)
    cos = F.cosine_similarity(a, b, dim=-1)
    assert float(cos.min()) > 0.999


def test_unknown_pooling_type_is_refused() -> None:
    from hitenter.models.gguf import model_config_from_metadata

    values = {"general.architecture": "bert", "bert.pooling_type": 9, "bert.embedding_length": 64,
              "bert.attention.head_count": 4, "bert.feed_forward_length": 128, "bert.block_count": 2,
              "bert.context_length": 128, "bert.attention.layer_norm_epsilon": 1e-12, "bert.vocab_size": 10}
    with pytest.raises(ModelLoadError, match="pooling_type"):
        model_config_from_metadata(values)


def test_other_moe_layer_steps_are_refused() -> None:
    from hitenter.models.gguf import model_config_from_metadata

    a = "nomic-bert-moe"
    values = {"general.architecture": a, f"{a}.embedding_length": 64, f"{a}.attention.head_count": 4,
              f"{a}.feed_forward_length": 128, f"{a}.block_count": 4, f"{a}.context_length": 128,
              f"{a}.attention.layer_norm_epsilon": 1e-5, f"{a}.vocab_size": 10, f"{a}.expert_count": 4,
              f"{a}.expert_used_count": 2, f"{a}.moe_every_n_layers": 2}
    cfg = model_config_from_metadata(values)
    assert [cfg.layer_has_experts(i) for i in range(4)] == [False, True, False, True]
    with pytest.raises(ModelLoadError, match="moe_every_n_layers 3"):
        model_config_from_metadata({**values, f"{a}.moe_every_n_layers": 3})
