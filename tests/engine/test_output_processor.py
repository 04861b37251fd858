"""The output processor on its own (no model): stop strings across token boundaries, n-groups, logprobs only
when asked, and outputs built from views of append-only lists (a step copies nothing already produced)."""

from __future__ import annotations

import pytest

from hitenter.engine.intake import make_requests
from hitenter.engine.output_processor import OutputProcessor
from hitenter.engine.sampler import StepSample, TokenLogprobs
from hitenter.outputs import Prefix
from hitenter.request import RequestStatus
from hitenter.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tok(tiny_llama_path):
    from hitenter.tokenizer.bpe import Tokenizer

    return Tokenizer.from_gguf(tiny_llama_path)


def _setup(tok, params, rid="r"):
    finished = []
    reqs = make_requests(rid, [5, 6], params, params.max_tokens or 50, frozenset({2}), None)
    by_id = {r.request_id: r for r in reqs}

    def finish(r, status):      # what the engine does: the scheduler ends the request
        finished.append((r, status))
        by_id[r].status = status

    op = OutputProcessor(tok, finish)
    op.add(op.new_group(rid, None, [5, 6], params, reqs))
    return op, reqs, finished


def _ids(tok, text):
    return [tok.encode(c)[0] for c in text]


def _feed(op, req, tokens, lps=None):
    req.output_token_ids.extend(tokens)     # what the scheduler's update does
    return op.process([req.request_id], StepSample([list(tokens)], [lps or [None] * len(tokens)]))


def test_stop_string_across_tokens_and_inside_a_multi_token_step(tok):
    op, (req,), finished = _setup(tok, SamplingParams(stop=["lo w"], max_tokens=50))
    chars = _ids(tok, "hello world")
    texts = []
    for t in chars[:4]:                       # "hell": "l" may still start the stop: held back
        texts.append(_feed(op, req, [t])[0].outputs[0].delta_text)
    out = _feed(op, req, chars[4:9])[0]       # "o wor" in one (speculative) step: the stop ends at "w"
    c = out.outputs[0]
    assert finished == [("r", RequestStatus.FINISHED_STOPPED)]
    assert (c.text, c.stop_reason) == ("hel", "lo w") and "".join(texts) + c.delta_text == "hel"
    assert c.token_ids == chars[:7] and req.output_token_ids == chars[:7]   # tokens after the stop are dropped
    assert out.finished and req.is_finished and "r" not in op.groups


def test_outputs_are_views_not_copies(tok):
    op, (req,), _ = _setup(tok, SamplingParams(max_tokens=50, logprobs=1))
    chars = _ids(tok, "abc")
    lp = lambda t: TokenLogprobs(t, -0.5, 1, [(t, -0.5, 1)])  # noqa: E731
    first = _feed(op, req, chars[:1], [lp(chars[0])])[0].outputs[0]
    assert isinstance(first.__dict__["_lazy_token_ids"], Prefix)       # nothing copied yet
    second = _feed(op, req, chars[1:], [lp(chars[1]), lp(chars[2])])[0].outputs[0]
    assert first.token_ids == chars[:1] and first.text == "a" and len(first.logprobs) == 1
    assert second.token_ids == chars and second.text == "abc" and len(second.logprobs) == 3
    assert second.delta_token_ids == chars[1:] and len(second.delta_logprobs) == 2


def test_logprobs_only_when_asked(tok):
    op, (req,), _ = _setup(tok, SamplingParams(max_tokens=50))
    c = _feed(op, req, _ids(tok, "ab"))[0].outputs[0]
    assert c.logprobs is None and c.delta_logprobs is None


def test_n_group_outputs_and_finish(tok):
    op, reqs, _ = _setup(tok, SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=2))
    a, b = reqs
    a.output_token_ids.append(100)
    b.output_token_ids.append(101)
    outs = op.process([a.request_id, b.request_id], StepSample([[100], [101]], [[None], [None]]))
    assert len(outs) == 1 and [c.token_ids for c in outs[0].outputs] == [[100], [101]]
    a.output_token_ids.append(102)
    a.status = RequestStatus.FINISHED_LENGTH             # the scheduler's max_tokens stop
    outs = op.process([a.request_id], StepSample([[102]], [[None]]))
    assert not outs[0].finished and outs[0].outputs[0].finish_reason == "length"
    b.output_token_ids.append(2)
    b.status = RequestStatus.FINISHED_STOPPED            # EOS: no text for it
    outs = op.process([b.request_id], StepSample([[2]], [[None]]))
    assert outs[0].finished and outs[0].outputs[1].token_ids == [101, 2]
    assert outs[0].request_id == "r" and "r" not in op.groups and not op.seqs


def test_detokenizer_window_keeps_long_outputs_exact(tok):
    """The detokenizer trims emitted text out of its live window: long outputs and late stops stay exact."""
    from hitenter.tokenizer.detokenizer import TRIM_CHARS, IncrementalDetokenizer

    body = "".join(f"word{i} " for i in range(3 * TRIM_CHARS // 6))
    text = body + "the END here"
    d = IncrementalDetokenizer(tok.token_bytes, tok.is_special, SamplingParams(stop=["e END", "zz"]))
    deltas, stop = [], None
    for t in _ids(tok, text):
        out = d.add(t)
        deltas.append(out.text)
        if out.stop_string:
            stop = out.stop_string
            break
    assert stop == "e END" and "".join(deltas) == d.text == body + "th" and d._head
