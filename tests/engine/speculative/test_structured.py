"""Structured outputs with speculative decoding: drafted tokens are checked against the grammar (each
drafted position masked by the grammar after the drafts before it), rejected ones are rolled back.
Greedy output with drafts equals the output without them, token for token, whatever the proposer;
sampled output still validates against its schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

from hitenter import LLM, SamplingParams
from hitenter.engine.structured import backend_for
from hitenter.sampling_params import StructuredSpec
from hitenter.testing.json_schemas import random_schemas
from hitenter.testing.tiny_model import write_tiny_gguf

PROMPT = 'Example: {"a": 1, "b": "xy", "c": [1, 2]} {"a": 1, "b": "xy"} J'   # prompt lookup finds matches
SCHEMAS = random_schemas(10, seed=3, depth=1, ascii_strings=True)
GUIDED = [StructuredSpec("json_schema", json.dumps(s)) for s in SCHEMAS] + [
    StructuredSpec("regex", "[a-c]{2,6}-[0-9]{1,3}", "guided_regex"),
    StructuredSpec("choice", json.dumps(["alpha beta gamma", "delta"]), "guided_choice")]


@pytest.fixture(autouse=True)
def model_drafts_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The draft-model cases draft with the model alone (no prompt lookup first), so "same" agrees everywhere."""
    monkeypatch.setenv("HITENTER_DRAFT_LOOKUP", "0")


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A draft that agrees with the tiny Qwen2 sometimes (so drafts are accepted and rejected)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("draft") / "one.gguf", arch="qwen2", seed=1, layers=1)


def _params(temperature: float) -> list[SamplingParams]:
    ps = [SamplingParams(temperature=temperature, seed=i, max_tokens=160, structured=g) for i, g in enumerate(GUIDED)]
    return ps + [SamplingParams(temperature=temperature, seed=99, max_tokens=30)] * 2   # unconstrained neighbours


def _valid(out: object, spec: StructuredSpec) -> None:
    text = out.outputs[0].text   # type: ignore[attr-defined]
    assert out.outputs[0].finish_reason == "stop", text   # type: ignore[attr-defined]
    if spec.kind == "json_schema":
        jsonschema.validate(json.loads(text), json.loads(spec.value))
    elif spec.kind == "regex":
        import re
        assert re.fullmatch(spec.value, text), text
    else:
        assert text in json.loads(spec.value), text


def _spec_llm(target: Path, one_layer: Path, which: str) -> LLM:
    opts = {"speculative_method": "ngram"} if which == "ngram" else {
        "speculative_model": str(target if which == "same" else one_layer)}
    return LLM(str(target), num_speculative_tokens=3, **opts)


@pytest.fixture(scope="module")
def greedy_ref(tiny_qwen2_path: Path) -> list[list[int]]:
    """The constrained greedy tokens without drafts (one run for every proposer compared with it)."""
    ps = _params(0.0)
    return [o.outputs[0].token_ids for o in LLM(str(tiny_qwen2_path)).generate([PROMPT] * len(ps), ps)]


@pytest.mark.parametrize("which", ["ngram", "same", "one_layer"])
def test_constrained_greedy_identical_with_drafts(tiny_qwen2_path: Path, one_layer: Path, greedy_ref: list[list[int]],
                                                  which: str) -> None:
    ps = _params(0.0)
    llm = _spec_llm(tiny_qwen2_path, one_layer, which)
    got = llm.generate([PROMPT] * len(ps), ps)
    assert [o.outputs[0].token_ids for o in got] == greedy_ref
    for out, spec in zip(got, GUIDED, strict=False):
        _valid(out, spec)
    stats = [o.extra["spec_decode"] for o in got[:len(GUIDED)]]
    drafted, accepted = sum(s["num_draft_tokens"] for s in stats), sum(s["num_accepted_tokens"] for s in stats)
    assert drafted > 50 and accepted > 0          # the constrained requests did speculate
    if which == "same":
        assert accepted == drafted                # the draft obeys the grammar too: it agrees everywhere
    if which == "one_layer":
        assert accepted < drafted                 # some drafts rejected: the matchers were rolled back
    eng = llm.engine
    assert eng.kv_manager.num_free_blocks == eng.parts.num_blocks


@pytest.mark.parametrize("which", ["ngram", "one_layer"])
def test_constrained_sampling_with_drafts_validates(tiny_qwen2_path: Path, one_layer: Path, which: str) -> None:
    ps = _params(1.0)
    llm = _spec_llm(tiny_qwen2_path, one_layer, which)
    got = llm.generate([PROMPT] * len(ps), ps)
    for out, spec in zip(got, GUIDED, strict=False):
        _valid(out, spec)
    st = llm.engine.spec_decode
    assert st is not None and st.num_draft_tokens > 0 and 0 < st.num_accepted_tokens < st.num_draft_tokens


def _mask(c: object, v: int) -> torch.Tensor:
    bm = torch.zeros(1, (v + 31) // 32, dtype=torch.int32)
    c.fill(bm, 0)   # type: ignore[attr-defined]
    return bm[0]


def test_speculate_and_settle_match_a_fresh_matcher(tiny_qwen2_path: Path) -> None:
    """The masks of the drafted positions and the state after a rollback equal those of an independent
    matcher fed only the accepted tokens."""
    llm = LLM(str(tiny_qwen2_path))
    spec = StructuredSpec("json_schema", json.dumps(SCHEMAS[0]))
    text = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=160, structured=spec))[0].outputs[0].token_ids
    assert len(text) >= 6
    eng = llm.engine
    v = eng.model_config.vocab_size
    backend = backend_for(eng.tokenizer, v)
    bad = next(t for t in range(v) if not bool((_mask(backend.constraint(spec), v)[t // 32] >> (t % 32)) & 1))
    b = next(b for b in range(len(text) - 4) if int(_allowed(backend, spec, text[:b + 1], v).sum()) > 1)
    alt = next(t for t in _allowed(backend, spec, text[:b + 1], v).nonzero().flatten().tolist() if t != text[b + 1])
    c = backend.constraint(spec)
    c.advance(text[:b])
    draft = [text[b], text[b + 1], bad, text[b + 3]]   # the third draft is refused by the grammar
    assert c.legal_prefix(draft) == 2
    masks = c.speculate(draft)
    assert [m is None for m in masks] == [False, False, False, True, True]
    for j in range(3):
        ref = backend.constraint(spec)
        ref.advance(text[:b + j])
        assert torch.equal(masks[j].bits, _mask(ref, v))   # type: ignore[union-attr]
    c.settle(1)                        # one draft accepted, then the target emits another legal token
    c.advance([text[b], alt])
    ref = backend.constraint(spec)
    ref.advance([*text[:b + 1], alt])
    assert torch.equal(_mask(c, v), _mask(ref, v))


def _allowed(backend: object, spec: StructuredSpec, tokens: list[int], v: int) -> torch.Tensor:
    c = backend.constraint(spec)   # type: ignore[attr-defined]
    c.advance(tokens)
    bits = _mask(c, v)
    return ((bits[:, None] >> torch.arange(32, dtype=torch.int32)) & 1).bool().flatten()[:v]
