"""``ServedModel``: one model the server holds, by the name requests give it, over its EngineClient.

A character bound (``max_prompt_chars``): a byte-level BPE token decodes to at most ``max_token_bytes``
bytes and a character is at least one UTF-8 byte, so a text of ``c`` characters needs at least
``c / max_token_bytes`` tokens; a prompt longer than ``max_token_bytes * max_model_len`` characters
cannot fit the window (hitenter/server/generation.py refuses it before tokenizing).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from hitenter.server.engine_client import EngineClient


def _now() -> int:
    return int(time.time())


@dataclass(eq=False)
class ServedModel:
    name: str
    client: EngineClient
    owned: bool                      # created by the server: shut down when it is unloaded or the app stops
    created: int = field(default_factory=_now)

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
