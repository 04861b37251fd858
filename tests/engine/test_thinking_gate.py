"""The thinking gate (hitenter/engine/thinking_gate.py): a reasoning budget closes the thinking section by
forcing its end tag after exactly N tokens inside it, and a forced grammar waits for the section to close.

Unit checks on made-up ids, then the real engine on a tiny random qwen3 model whose vocabulary has
``<think>`` / ``</think>`` as single tokens and whose template (Qwen3.5's) opens ``<think>`` in the prompt:
the end tag is the N+1-th token (its logit pushed to -100 so the model never closes on its own), alone and
in a batch with other budgets, greedy and seeded sampling, with n-gram speculation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hitenter import LLM, SamplingParams
from hitenter.engine.thinking_gate import ThinkingGate, allowed_tokens, prompt_opens
from hitenter.sampling_params import StructuredSpec, ThinkingSpec
from hitenter.testing.tiny_families import write_tiny_family
from hitenter.testing.tiny_thinking import add_thinking_tokenizer

V = 64
S, E = (50,), (51,)


def _run(gate: ThinkingGate, tokens: list[int]) -> list[int | None]:
    """The forced token before each of ``tokens`` (None: free), feeding them in."""
    out = []
    for t in tokens:
        out.append(gate.forced())
        gate.advance([t])
    return out


def test_budget_forces_end_after_exactly_n_tokens_inside() -> None:
    gate = ThinkingGate(ThinkingSpec(S, E, budget=3), [1, 2, 50], V)     # the prompt opened it
    assert _run(gate, [7, 8, 9]) == [None, None, None]
    assert gate.forced() == 51 and allowed_tokens(gate).nonzero().flatten().tolist() == [51]
    gate.advance([51])
    assert gate.forced() is None and gate.terminated


def test_section_opened_by_the_reply_and_a_natural_close() -> None:
    gate = ThinkingGate(ThinkingSpec(S, E, budget=2), [1, 2], V)
    assert _run(gate, [3, 4, 50, 9, 10]) == [None] * 5      # 3, 4 before the section are not counted
    assert gate.forced() == 51
    gate = ThinkingGate(ThinkingSpec(S, E, budget=2), [1, 2], V)
    _run(gate, [50, 9, 51, 5, 6, 7, 50, 8, 9, 10])          # closed within budget; a second <think> is text
    assert gate.forced() is None


def test_multi_token_tags_and_force_sequence() -> None:
    spec = ThinkingSpec((10, 11), (12, 13), force=(12, 13, 14), budget=1)
    assert prompt_opens(spec, [10, 11, 5]) and not prompt_opens(spec, [10, 11, 12, 13])
    gate = ThinkingGate(spec, [9], V)
    assert _run(gate, [10, 11, 5]) == [None, None, None]
    assert _run(gate, [12, 13, 14]) == [12, 13, 14]
    assert gate.terminated


def test_budget_zero_forces_at_once() -> None:
    gate = ThinkingGate(ThinkingSpec(S, E, budget=0), [50], V)
    assert gate.forced() == 51


def test_refused_token_leaves_state() -> None:
    gate = ThinkingGate(ThinkingSpec(S, E, budget=0), [50], V)
    gate.advance([7])                   # outside the mask: ignored
    assert gate.forced() == 51


def test_speculation_matches_plain_advancing() -> None:
    """legal_prefix / speculate / settle leave the gate where feeding the accepted tokens leaves it."""
    spec = ThinkingSpec(S, E, budget=2)
    gate = ThinkingGate(spec, [50], V)
    assert gate.legal_prefix([3, 4, 51, 6]) == 4 and gate.legal_prefix([3, 4, 5]) == 2
    masks = gate.speculate([3, 4, 51])
    assert [m is None for m in masks] == [True, True, False, True]
    gate.settle(1)                         # 3 accepted, 4 and 51 rejected; the step emits 3 and its own token
    gate.advance([3, 9])
    assert gate.forced() == 51
    ref = ThinkingGate(spec, [50], V)
    ref.advance([3, 9])
    assert ref.state == gate.state


@pytest.fixture(scope="module")
def thinking_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_family(tmp_path_factory.mktemp("think") / "think.gguf", "qwen3", tokenizer=add_thinking_tokenizer)


@pytest.fixture(scope="module")
def thinking_llm(thinking_path: Path) -> LLM:
    return LLM(str(thinking_path))


def _setup(llm: LLM) -> tuple[list[int], int, int]:
    tok = llm.engine.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": "Hello world"}], tokenize=True, enable_thinking=True)
    s, e = tok.encode("<think>", add_bos=False), tok.encode("</think>", add_bos=False)
    assert len(s) == len(e) == 1 and tok.decode(ids[-2:]) == "<think>\n"     # the template opened it
    return ids, s[0], e[0]


def _params(s: int, e: int, budget: int, **kw: object) -> SamplingParams:
    return SamplingParams(max_tokens=16, logit_bias={e: -100}, thinking=ThinkingSpec((s,), (e,), budget=budget),
                          **kw)  # type: ignore[arg-type]


@pytest.mark.slow
def test_real_engine_forces_end_tag_at_exactly_n(thinking_llm: LLM) -> None:
    ids, s, e = _setup(thinking_llm)
    budgets = [0, 1, 4, 9]
    plain = thinking_llm.generate([ids], [SamplingParams(max_tokens=16, temperature=0, logit_bias={e: -100})])
    assert e not in plain[0].outputs[0].token_ids          # unbounded, the model never closes
    for kw in ({"temperature": 0.0}, {"temperature": 1.0, "seed": 7}):
        alone = [thinking_llm.generate([ids], [_params(s, e, n, **kw)])[0].outputs[0].token_ids for n in budgets]
        for n, toks in zip(budgets, alone, strict=True):
            assert toks.index(e) == n, (n, toks)
            assert toks[:n] == [t for t in toks[:n] if t != e]
        batch = thinking_llm.generate([ids] * (len(budgets) + 1),
                                      [_params(s, e, n, **kw) for n in budgets] + [SamplingParams(max_tokens=16, **kw)])
        assert [o.outputs[0].token_ids for o in batch[:-1]] == alone     # batch invariant
    greedy = [thinking_llm.generate([ids], [_params(s, e, n, temperature=0.0)])[0].outputs[0].token_ids for n in budgets]
    assert greedy[2][:4] == plain[0].outputs[0].token_ids[:4]             # before the budget: the model's own tokens


@pytest.mark.slow
def test_real_engine_with_ngram_drafts_gives_the_same_tokens(thinking_llm: LLM, thinking_path: Path) -> None:
    ids, s, e = _setup(thinking_llm)
    ps = [_params(s, e, n, temperature=0.0) for n in (2, 5, 8)] + [_params(s, e, 3, temperature=1.0, seed=3)]
    ref = [o.outputs[0].token_ids for o in thinking_llm.generate([ids] * 4, ps)]
    spec = LLM(str(thinking_path), speculative_method="ngram", num_speculative_tokens=3)
    got = spec.generate([ids] * 4, ps)
    assert [o.outputs[0].token_ids for o in got] == ref
    assert sum(o.extra["spec_decode"]["num_draft_tokens"] for o in got) > 0      # drafts were checked
    assert [r.index(e) for r in ref] == [2, 5, 8, 3]


@pytest.mark.slow
def test_real_engine_grammar_waits_for_the_section_to_close(thinking_llm: LLM) -> None:
    """A forced JSON grammar with thinking open: the section runs to its budget, closes, then the JSON."""
    ids, s, e = _setup(thinking_llm)
    sp = SamplingParams(max_tokens=40, temperature=0, logit_bias={e: -100}, thinking=ThinkingSpec((s,), (e,), budget=3),
                        structured=StructuredSpec("json_schema", json.dumps(
                            {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]})))
    out = thinking_llm.generate([ids], [sp])[0].outputs[0]
    assert out.token_ids.index(e) == 3
    body = out.text.split("</think>", 1)[1]
    assert out.finish_reason == "stop" and isinstance(json.loads(body)["a"], bool), body


def test_tags_found_by_their_bytes_however_spelled() -> None:
    """With the vocabulary's bytes the gate finds an end tag the model wrote byte by byte (not as the
    tag's own token), and a prompt that opened the section with it spelled so."""
    vocab = {i: bytes([i]) for i in range(256)} | {300: b"<think>", 301: b"</think>"}
    spec = ThinkingSpec((300,), (301,), budget=20)
    spelled = list(b"</think>")
    gate = ThinkingGate(spec, [65, 300], 302, token_bytes=vocab.__getitem__)
    gate.advance([104, 105, *spelled])
    assert gate.state.phase == "done" and gate.forced() is None
    assert prompt_opens(spec, [65, *list(b"<think>"), 10], vocab.__getitem__)
    assert not prompt_opens(spec, [65, 300, *spelled, 10], vocab.__getitem__)
    by_ids = ThinkingGate(spec, [65, 300], 302)          # without the bytes only the ids count
    by_ids.advance([104, 105, *spelled])
    assert by_ids.state.phase == "think"
