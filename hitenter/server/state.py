"""What every route shares: the served models (each an EngineClient), the metrics, the server's
options, and the prompt checks that run before any tokenizing.

The character bound: a byte-level BPE token decodes to at most ``max_token_bytes`` bytes (the
longest entry of the vocabulary, special tokens included) and a character is at least one UTF-8
byte, so a text of ``c`` characters needs at least ``c / max_token_bytes`` tokens. A prompt longer
than ``max_token_bytes * max_model_len`` characters cannot fit the window whatever it says: it is
refused at once (400, like a context overflow) instead of spending seconds tokenizing it. The bound
is exact, never a heuristic: every prompt refused by it would overflow after tokenizing too.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any

from fastapi import Depends, Request

from hitenter.server.api_error import APIError, overflow_error
from hitenter.server.engine_client import EngineClient
from hitenter.server.metrics import ServerMetrics
from hitenter.server.schema_types import now


@dataclass
class ServedModel:
    name: str
    client: EngineClient
    owned: bool                      # created here: shut down with the app
    created: int = field(default_factory=now)

    @property
    def tokenizer(self) -> Any:
        return self.client.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.client.info.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.client.info.vocab_size

    @property
    def engine(self) -> Any:
        """The AsyncLLMEngine behind a local client (for tests and tools; the server uses ``client``)."""
        return getattr(self.client, "engine", None)

    @cached_property
    def max_prompt_chars(self) -> int | None:
        """Characters beyond which a text cannot fit the window (see the module docstring)."""
        tok = self.tokenizer
        if not hasattr(tok, "token_bytes"):
            return None
        longest = max((len(tok.token_bytes(i)) for i in range(tok.vocab_size)), default=0)
        return max(longest, 1) * self.max_model_len


@dataclass
class ServerState:
    models: dict[str, ServedModel]
    metrics: ServerMetrics
    special_in_content: bool = False       # --allow-special-tokens-in-content
    stores: dict[str, Any] = field(default_factory=dict)   # per-surface state (the Responses store)

    @property
    def default(self) -> ServedModel:
        return next(iter(self.models.values()))

    def roles(self) -> list[str]:
        """Chat roles every served model accepts ('tool' only where the chat template knows it)."""
        tool = all(supports_tool(m) for m in self.models.values())
        return ["system", "user", "assistant"] + (["tool"] if tool else [])

    def model_for(self, name: str | None) -> ServedModel:
        if not name:
            return self.default
        if name not in self.models:
            raise APIError(404, f"the model `{name}` does not exist; served: {sorted(self.models)}", "model")
        return self.models[name]


def server_state(request: Request) -> ServerState:
    return request.app.state.server   # type: ignore[no-any-return]


State = Annotated[ServerState, Depends(server_state)]


def check_chars(m: ServedModel, n_chars: int, param: str) -> None:
    bound = m.max_prompt_chars
    if bound is not None and n_chars > bound:
        raise APIError(400, f"{param}: {n_chars} characters cannot fit the {m.max_model_len}-token context "
                       f"window of `{m.name}` (at most {bound} characters)", param, n_ctx=m.max_model_len)


def check_ids(m: ServedModel, ids: list[int], param: str) -> None:
    """Token ids inside the vocabulary and the window (before any model work sees them)."""
    if len(ids) > m.max_model_len:
        raise overflow_error(param, len(ids), m.max_model_len)
    vocab = m.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise APIError(400, f"{param}: token ids must be in 0..{vocab - 1}, got {bad[:5]}", param)


async def encode(m: ServedModel, prompt: str | list[int], param: str, add_bos: bool | None = None) -> list[int]:
    """Token ids of a prompt (ids pass through, checked against the vocabulary and the window);
    ``add_bos``: the GGUF's choice when None (lm-eval's remote tokenizer asks for none)."""
    if not isinstance(prompt, str):
        check_ids(m, prompt, param)
        return prompt
    check_chars(m, len(prompt), param)
    try:
        return await asyncio.to_thread(m.tokenizer.encode, prompt, add_bos)
    except Exception as e:
        raise APIError(400, f"{param}: could not be tokenized: {e}", param) from e


def supports_tool(m: ServedModel) -> bool:
    return "tool" in (getattr(m.tokenizer, "chat_template", None) or "")


def _role_problem(m: ServedModel, messages: list[dict[str, Any]], param: str) -> APIError | None:
    for i, msg in enumerate(messages):
        if msg["role"] == "tool" and not supports_tool(m):
            return APIError(400, f"{param}.{i}.role: this model's chat template has no 'tool' role",
                            f"{param}.{i}.role")
    return None


async def chat_ids(state: ServerState, m: ServedModel, messages: list[dict[str, Any]],
                   add_generation_prompt: bool, continue_final: bool = False, param: str = "messages",
                   **template_kw: Any) -> list[int]:
    """Token ids of a conversation: message content stays text (see Tokenizer.apply_chat_template).
    ``continue_final``: cut right after the final (assistant) message's content, so the model continues
    it (the template's closing markup after it is dropped); ``template_kw``: e.g. ``tools``."""
    check_chars(m, sum(len(x.get("content") or "") for x in messages), param)
    problem = _role_problem(m, messages, param)
    if problem is not None:
        raise problem
    try:
        ids = await asyncio.to_thread(m.tokenizer.apply_chat_template, messages,
                                      add_generation_prompt=add_generation_prompt, tokenize=True,
                                      special_in_content=state.special_in_content, **template_kw)
        if continue_final:
            text = m.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                   **template_kw)
            ids = _cut_after_final(m, list(ids), str(text), messages)
    except APIError:
        raise
    except Exception as e:   # a template that rejects the conversation (roles, order) is the caller's error
        raise APIError(400, f"{param}: the chat template rejected them: {e}", param) from e
    return list(ids)


def _cut_after_final(m: ServedModel, ids: list[int], text: str, messages: list[dict[str, Any]]) -> list[int]:
    """``ids`` without the template markup that follows the final message's content (prefill)."""
    final = (messages[-1].get("content") or "").strip()
    at = text.rfind(final) if final else -1
    if at < 0:
        raise APIError(400, "continue_final_message: the chat template changed the final message's text",
                       "continue_final_message")
    tail = m.tokenizer.encode(text[at + len(final):], add_bos=False)   # the template's own markup
    if tail and ids[-len(tail):] != tail:
        raise APIError(400, "continue_final_message: cannot cut this template's markup after the final "
                       "message", "continue_final_message")
    return ids[:len(ids) - len(tail)] if tail else ids
