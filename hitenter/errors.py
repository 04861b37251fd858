"""Errors a user can act on. Every loader/validation failure raises one of these, never a raw traceback."""

from __future__ import annotations


class HitenterError(Exception):
    """Base class for hitenter's own errors."""


class ModelLoadError(HitenterError, ValueError):
    """A model file or name could not be loaded (missing, truncated, corrupt, unsupported)."""


class UnknownModelError(ModelLoadError):
    """A model name that the registry does not know."""


class ContextOverflowError(HitenterError, ValueError):
    """Prompt tokens + max_tokens do not fit the context window. Raised before any model work."""

    def __init__(self, n_prompt_tokens: int, n_ctx: int, max_tokens: int | None = None) -> None:
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx
        self.max_tokens = max_tokens
        if max_tokens is None:
            msg = (
                f"the prompt has {n_prompt_tokens} tokens but the context window is {n_ctx} tokens; "
                f"shorten the prompt to at most {n_ctx - 1} tokens"
            )
        else:
            msg = (
                f"the prompt has {n_prompt_tokens} tokens and max_tokens is {max_tokens}, "
                f"{n_prompt_tokens + max_tokens} in all, but the context window is {n_ctx} tokens; "
                f"shorten the prompt or lower max_tokens to at most {max(n_ctx - n_prompt_tokens, 0)}"
            )
        super().__init__(msg)


class QueueFullError(HitenterError):
    """The engine's waiting queue is full (max_queued_requests)."""
