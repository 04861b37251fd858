"""A reply cut by max_tokens between the bytes of one character: the output processor never shows U+FFFD,
streamed or final; the incomplete character is dropped (detokenizer.py's contract) and the token ids stay."""

from __future__ import annotations

from hitenter.engine.intake import make_requests
from hitenter.engine.output_processor import OutputProcessor
from hitenter.engine.sampler import StepSample
from hitenter.request import RequestStatus
from hitenter.sampling_params import SamplingParams
from hitenter.tokenizer.bpe import Tokenizer


def test_length_cut_inside_a_character_drops_its_bytes(tiny_llama_path) -> None:  # type: ignore[no-untyped-def]
    tok = Tokenizer.from_gguf(tiny_llama_path)
    byte_id = {b: next(i for i in range(tok.vocab_size) if tok.token_bytes(i) == bytes([b])) for b in range(256)}
    ids = [byte_id[b] for b in "añ世".encode()][:-1]          # the cut falls inside 世 (3 bytes, 2 generated)
    params = SamplingParams(max_tokens=len(ids))
    (req,) = make_requests("r", [5, 6], params, len(ids), frozenset({2}), None)
    op = OutputProcessor(tok, lambda r, status: None)
    op.add(op.new_group("r", None, [5, 6], params, [req]))
    deltas = []
    for k, t in enumerate(ids):
        req.output_token_ids.append(t)
        if k == len(ids) - 1:
            req.status = RequestStatus.FINISHED_LENGTH       # what the scheduler does at max_tokens
        (out,) = op.process(["r"], StepSample([[t]], [[None]]))
        deltas.append(out.outputs[0].delta_text)
    final = out.outputs[0]
    assert final.finish_reason == "length" and final.token_ids == ids
    assert final.text == "".join(deltas) == "añ" and "\ufffd" not in final.text
