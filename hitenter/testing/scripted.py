"""A scripted EngineClient for server tests: it "generates" a given text, pushed through the real
tokenizer and the real incremental detokenizer, so a surface sees exactly the outputs a model writing
that text would give it (special tokens, skip_special_tokens, stop strings, max_tokens, the
end-of-generation set).

- ``family_tokenizer(family)``: the tiny test vocabulary (tiny_model.py: bytes + a few merges) with a
  family's markers added as single tokens of the family's own token types and its end-of-generation
  tokens, and the family's real chat template (tests/data/templates/). No family GGUF is needed.
- ``ScriptedClient(tokenizer, script)``: ``script(prompt_text, params)`` is the reply's text; it is
  encoded with special tokens parsed (a marker is its one token), then emitted one token per step.
  A request with a structured constraint (a forced tool call) or a thinking section for the engine
  runs its tokens through the engine's own constraint (thinking_gate.constraint_for) and fails loudly
  when it refuses one: the script must be writable under it. Where a thinking budget forces the end
  tag, the forced tokens are emitted instead and the script resumes after its own end tag.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hitenter.engine.scheduler import SchedulerStats
from hitenter.engine.snapshot import EngineSnapshot
from hitenter.engine.structured import new_bitmask
from hitenter.engine.thinking_gate import ThinkingGate, constraint_for
from hitenter.outputs import CompletionOutput, RequestMetricsSnapshot, RequestOutput
from hitenter.sampling_params import SamplingParams
from hitenter.server.engine_client import Handle, ModelInfo
from hitenter.testing.tiny_model import tiny_vocab
from hitenter.tokenizer.bpe import Tokenizer
from hitenter.tokenizer.detokenizer import IncrementalDetokenizer

CONTROL, USER_DEFINED = 3, 4
TEMPLATES = Path(__file__).resolve().parents[2] / "tests" / "data" / "templates"

# family -> (template file, [(marker, token type)], eos marker, extra end-of-generation markers)
FAMILIES: dict[str, tuple[str, list[tuple[str, int]], str, list[str]]] = {
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", [("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL),
              ("<think>", USER_DEFINED), ("</think>", USER_DEFINED), ("<tool_call>", USER_DEFINED),
              ("</tool_call>", USER_DEFINED)], "<|im_end|>", []),
    "qwen3_coder": ("Qwen3-Coder.jinja", [("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL),
                    ("<tool_call>", USER_DEFINED), ("</tool_call>", USER_DEFINED)], "<|im_end|>", []),
    "deepseek_r1": ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", [
        ("<｜begin▁of▁sentence｜>", CONTROL), ("<｜end▁of▁sentence｜>", CONTROL), ("<｜User｜>", USER_DEFINED),
        ("<｜Assistant｜>", USER_DEFINED), ("<think>", USER_DEFINED), ("</think>", USER_DEFINED)],
        "<｜end▁of▁sentence｜>", []),
    "smollm3": ("HuggingFaceTB-SmolLM3-3B.jinja", [("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL),
                ("<think>", USER_DEFINED), ("</think>", USER_DEFINED), ("<tool_call>", USER_DEFINED),
                ("</tool_call>", USER_DEFINED)], "<|im_end|>", []),
    "llama3": ("meta-llama-Llama-3.1-8B-Instruct.jinja", [
        ("<|begin_of_text|>", CONTROL), ("<|start_header_id|>", CONTROL), ("<|end_header_id|>", CONTROL),
        ("<|eot_id|>", CONTROL), ("<|eom_id|>", CONTROL), ("<|python_tag|>", CONTROL)], "<|eot_id|>", []),
    "mistral": ("Mistral-Small-3.2-24B-Instruct-2506.jinja", [
        ("<s>", CONTROL), ("</s>", CONTROL), ("[INST]", CONTROL), ("[/INST]", CONTROL),
        ("[SYSTEM_PROMPT]", CONTROL), ("[/SYSTEM_PROMPT]", CONTROL), ("[AVAILABLE_TOOLS]", CONTROL),
        ("[/AVAILABLE_TOOLS]", CONTROL), ("[TOOL_CALLS]", CONTROL), ("[ARGS]", CONTROL), ("[CALL_ID]", CONTROL),
        ("[TOOL_RESULTS]", CONTROL), ("[TOOL_CONTENT]", CONTROL), ("[/TOOL_RESULTS]", CONTROL)], "</s>", []),
    "granite": ("ibm-granite-granite-3.3-2B-Instruct.jinja", [
        ("<|start_of_role|>", CONTROL), ("<|end_of_role|>", CONTROL), ("<|end_of_text|>", CONTROL),
        ("<|tool_call|>", CONTROL), ("<think>", USER_DEFINED), ("</think>", USER_DEFINED),
        ("<response>", USER_DEFINED), ("</response>", USER_DEFINED)], "<|end_of_text|>", []),
    "gpt_oss": ("openai-gpt-oss-120b.jinja", [
        ("<|startoftext|>", CONTROL), ("<|start|>", CONTROL), ("<|channel|>", CONTROL), ("<|message|>", CONTROL),
        ("<|end|>", CONTROL), ("<|return|>", CONTROL), ("<|call|>", CONTROL), ("<|constrain|>", CONTROL)],
        "<|return|>", ["<|call|>"]),
    "gemma4": ("google-gemma-4-31B-it.jinja", [
        ("<bos>", CONTROL), ("<eos>", CONTROL), ("<|turn>", CONTROL), ("<turn|>", CONTROL), ("<|think|>", CONTROL),
        ("<|channel>", CONTROL), ("<channel|>", CONTROL), ("<|tool>", CONTROL), ("<tool|>", CONTROL),
        ("<|tool_call>", CONTROL), ("<tool_call|>", CONTROL), ("<|tool_response>", CONTROL),
        ("<tool_response|>", CONTROL), ('<|"|>', CONTROL)], "<turn|>", []),
    "glm": ("GLM-4.6.jinja", [
        ("[gMASK]", CONTROL), ("<sop>", CONTROL), ("<|system|>", CONTROL), ("<|user|>", CONTROL),
        ("<|assistant|>", CONTROL), ("<|observation|>", CONTROL), ("<|endoftext|>", CONTROL),
        ("<think>", USER_DEFINED), ("</think>", USER_DEFINED), ("<tool_call>", USER_DEFINED),
        ("</tool_call>", USER_DEFINED), ("<arg_key>", USER_DEFINED), ("</arg_key>", USER_DEFINED),
        ("<arg_value>", USER_DEFINED), ("</arg_value>", USER_DEFINED), ("<tool_response>", USER_DEFINED),
        ("</tool_response>", USER_DEFINED)], "<|user|>", ["<|observation|>", "<|endoftext|>"]),
}


def family_tokenizer(family: str) -> Tokenizer:
    """The tiny vocabulary with ``family``'s markers and end-of-generation tokens, and its chat template."""
    template_file, marks, eos, more_eog = FAMILIES[family]
    tokens, types, merges = tiny_vocab()
    tokens, types = tokens[3:], types[3:]          # the tiny vocabulary's own ChatML specials go
    base = len(tokens)
    tokens += [m for m, _ in marks]
    types += [t for _, t in marks]
    md: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": base + [m for m, _ in marks].index(eos),
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": (TEMPLATES / template_file).read_text(),
    }
    if more_eog:
        md["tokenizer.ggml.eot_token_id"] = base + [m for m, _ in marks].index(more_eog[0])
    if len(more_eog) > 1:
        md["tokenizer.ggml.eom_token_id"] = base + [m for m, _ in marks].index(more_eog[1])
    return Tokenizer.from_gguf(md)


Script = Callable[[str, SamplingParams], str]


def _allows(gate: Any, token: int) -> bool:
    bm = new_bitmask(1, gate.vocab_size)
    gate.fill(bm, 0)
    return bool((int(bm[0, token // 32]) >> (token % 32)) & 1)


def _gated(script: list[int], gate: Any, params: SamplingParams) -> Iterator[int]:
    """The script's tokens as a model under a thinking budget writes them: where the engine forces the
    end tag, the forced tokens come instead, and the script resumes after its own end tag (its
    remaining thoughts are never written)."""
    i = 0
    while i < len(script):
        want = gate.forced() if isinstance(gate, ThinkingGate) else None
        if want is None or script[i] == want:
            yield script[i]
            i += 1
            continue
        end = params.thinking.end if params.thinking is not None else ()
        j = next((k + len(end) for k in range(i, len(script)) if tuple(script[k:k + len(end)]) == end), i)
        i = j
        while (want := gate.forced()) is not None:
            yield want


def _info(vocab_size: int) -> ModelInfo:
    return ModelInfo("scripted", vocab_size, 64, 1, 1, 1, 64, 8192, 8192, 16, 1024, 0, 2048, 0, None)


class ScriptedClient:
    """An EngineClient whose replies are ``script``'s texts (see the module docstring). ``prompts``
    keeps every prompt it was given, as text (special tokens written out)."""

    def __init__(self, tokenizer: Tokenizer, script: Script) -> None:
        self._tokenizer, self.script = tokenizer, script
        self.info = _info(tokenizer.vocab_size)
        self.prompts: list[str] = []
        self.params: list[SamplingParams] = []
        self._ids = itertools.count()

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def is_alive(self) -> bool:
        return True

    @property
    def inspector(self) -> Any:
        raise NotImplementedError("the scripted client has no engine to inspect")

    async def add(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None) -> Handle:
        rid = request_id or f"scripted-{next(self._ids)}"
        text = self._tokenizer.decode(prompt_ids)
        self.prompts.append(text)
        self.params.append(params)
        reply = self._tokenizer.encode(self.script(text, params), add_bos=False)
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        for out in self._outputs(rid, prompt_ids, params, reply):
            queue.put_nowait(out)
        return rid, queue

    def _outputs(self, rid: str, prompt_ids: list[int], params: SamplingParams, reply: list[int]) -> list[RequestOutput]:
        tok = self._tokenizer
        detok = IncrementalDetokenizer(tok.token_bytes, tok.is_special, params)
        gate = constraint_for(params, prompt_ids, tok, tok.vocab_size)
        outs, ids, text, t0 = [], [], "", time.monotonic()
        limit = params.max_tokens if params.max_tokens is not None else len(reply) + 1
        finish, stop_reason = None, None
        for t in _gated(reply + [tok.eos_token_id], gate, params):
            if gate is not None and not gate.terminated:
                assert _allows(gate, t), f"the constraint refuses token {t} {tok.token_bytes(t)!r}"
            if gate is not None:
                gate.advance([t])
            ids.append(t)
            if t in tok.eog_token_ids and not params.ignore_eos:
                finish, delta = "stop", detok.flush()
            else:
                d = detok.add(t)
                delta = d.text
                if d.stop_string is not None:
                    finish, stop_reason = "stop", d.stop_string
                elif len(ids) >= limit:
                    finish, delta = "length", delta + detok.flush()
            text += delta
            outs.append(self._output(rid, prompt_ids, ids, text, delta, finish, stop_reason, t0))
            if finish:
                break
        return outs

    @staticmethod
    def _output(rid: str, prompt_ids: list[int], ids: list[int], text: str, delta: str, finish: str | None,
                stop_reason: Any, t0: float) -> RequestOutput:
        c = CompletionOutput(0, text, list(ids), finish, stop_reason, None, delta, [ids[-1]], None)
        m = RequestMetricsSnapshot(t0, 0.0, 0.0, [t0] * len(ids), time.monotonic() if finish else None, 0)
        return RequestOutput(rid, None, list(prompt_ids), [c], finish is not None, 0, m)

    def abort(self, request_id: str) -> None:
        pass

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        _, queue = await self.add(prompt_ids, params, request_id)
        while True:
            out = await queue.get()
            if isinstance(out, BaseException):
                raise out
            yield out
            if out.finished:
                return

    async def score(self, prompts: list[list[int]], k: int) -> Any:
        raise ValueError("prompt_logprobs: the scripted client does not score prompts")

    async def embed(self, prompts: list[list[int]]) -> list[list[float]]:
        raise ValueError("input: the scripted client does not embed")

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot(0, SchedulerStats(0, 0, 0, 0, 0.0, 1024, 0, 0, 0.0), 1024, 16)

    def spec_stats(self) -> Any:
        return None

    def set_max_queued(self, n: int | None) -> None:
        pass

    def shutdown(self) -> None:
        pass


# ---- per family: what a model of that family writes (its own markup), for the surface tests ----------

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
RESULT = "sunny, 21 C"          # the tool result a round trip sends back


@dataclass(frozen=True)
class FamilyReplies:
    """A family's scripted replies: ``answer`` (thinking, if any, then text), ``call`` (a get_weather call
    for Paris, after thinking if any), ``forced`` (the call alone, as the forced-call grammar writes it),
    ``final`` (the answer after the tool result), and what the parsers must find in them. ``call`` is
    empty for a family whose template takes no tools."""
    answer: str
    call: str
    forced: str
    final: str
    thought: str = ""               # the reasoning of answer / call ("" for families without thinking)
    text: str = "Hello there."      # the content of answer
    final_text: str = "It is sunny in Paris."


def _hermes(city: str = "Paris") -> str:
    return f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>'


REPLIES: dict[str, FamilyReplies] = {
    "qwen3": FamilyReplies(
        "<think>\nThe user greets me.\n</think>\n\nHello there.",
        "<think>\nThe user greets me.\n</think>\n\n" + _hermes(), _hermes(),
        "<think>\nThe user greets me.\n</think>\n\nIt is sunny in Paris.", "The user greets me."),
    "qwen3_coder": FamilyReplies(
        "Hello there.",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        "It is sunny in Paris."),
    "deepseek_r1": FamilyReplies(        # the template opens <think> in the prompt; it has no tools
        "The user greets me.\n</think>\n\nHello there.", "", "",
        "The user greets me.\n</think>\n\nIt is sunny in Paris.", "The user greets me."),
    "smollm3": FamilyReplies(            # llama.cpp's copy of its template takes no tools
        "<think>\nThe user greets me.\n</think>\nHello there.", "", "",
        "<think>\nThe user greets me.\n</think>\nIt is sunny in Paris.", "The user greets me."),
    "llama3": FamilyReplies(
        "Hello there.", '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        '{"name": "get_weather", "parameters": {"city": "Paris"}}', "It is sunny in Paris."),
    "mistral": FamilyReplies(
        "Hello there.", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "It is sunny in Paris."),
    "granite": FamilyReplies(
        "<think>The user greets me.</think><response>Hello there.</response>",
        "<think>The user greets me.</think><|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        "<think>The user greets me.</think><response>It is sunny in Paris.</response>", "The user greets me."),
    "gpt_oss": FamilyReplies(
        "<|channel|>analysis<|message|>The user greets me.<|end|><|start|>assistant<|channel|>final<|message|>Hello there.",
        "<|channel|>analysis<|message|>The user greets me.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
        "<|channel|>analysis<|message|>The user greets me.<|end|><|start|>assistant<|channel|>final<|message|>"
        "It is sunny in Paris.", "The user greets me."),
    "gemma4": FamilyReplies(
        "<|channel>thought\nThe user greets me.<channel|>Hello there.",
        '<|channel>thought\nThe user greets me.<channel|><|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
        "<|channel>thought\nThe user greets me.<channel|>It is sunny in Paris.", "The user greets me."),
    "glm": FamilyReplies(
        "\n<think>The user greets me.</think>\nHello there.",
        "\n<think>The user greets me.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
        "<arg_value>Paris</arg_value>\n</tool_call>",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
        "\n<think>The user greets me.</think>\nIt is sunny in Paris.", "The user greets me."),
}


def family_script(family: str) -> Script:
    """The family's reply to a prompt: the final answer once the tool result is in the prompt, the call
    when tools were offered (under a forced-call grammar: the call alone, or its thinking then the
    call where the engine lets the reply think first), else the answer."""
    r = REPLIES[family]

    def script(prompt: str, params: SamplingParams) -> str:
        if RESULT in prompt:
            return r.final
        if params.structured is not None:     # a forced call: after thinking where the engine lets it think
            return r.call.lstrip() if params.thinking is not None and r.thought else r.forced
        return r.call if "get_weather" in prompt else r.answer
    return script


def family_client(family: str) -> ScriptedClient:
    return ScriptedClient(family_tokenizer(family), family_script(family))
