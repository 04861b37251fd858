"""What /v1/completions and /v1/chat/completions share before generating: the field checks and the
structured output on the SamplingParams, and the prompt scores a request wants (prompt logprobs:
legacy ``echo`` + ``logprobs``, ``max_tokens=0``, vLLM's ``prompt_logprobs``)."""

from __future__ import annotations

from typing import Any

from hitenter.sampling_params import SamplingParams
from hitenter.server.api_error import APIError
from hitenter.server.prompt_logprobs import PromptScores
from hitenter.server.protocol import CompletionRequest, check_known_fields
from hitenter.server.state import ServedModel
from hitenter.server.tools import ToolPlan


def prepare_params(req: Any, params: SamplingParams, plan: ToolPlan | None = None) -> SamplingParams:
    """400 for unknown fields; the request's structured output (or its tool plan's) on the params."""
    check_known_fields(req)
    spec = req.guided_spec()
    if plan is not None and plan.guided is not None:
        if spec is not None:
            raise APIError(400, f"{spec.param}: cannot be combined with tool_choice {plan.mode!r}", spec.param)
        spec = plan.guided
    if req.stream and req.prompt_logprobs is not None:
        raise APIError(400, "prompt_logprobs: not supported when streaming", "prompt_logprobs")
    if isinstance(req, CompletionRequest) and req.stream and req.echo and req.logprobs is not None:
        raise APIError(400, "echo: echo with logprobs is not supported when streaming", "echo")
    return params if spec is None else params.replace(guided=spec)


async def scores_for(m: ServedModel, req: Any, prompts: list[list[int]]) -> list[PromptScores] | None:
    """Prompt logprobs when the request wants them (legacy echo+logprobs, or prompt_logprobs)."""
    k = req.prompt_logprobs
    legacy = isinstance(req, CompletionRequest) and req.echo and req.logprobs is not None
    if k is None and not legacy:
        return None
    if legacy:
        k = max(k or 0, req.logprobs)
    try:
        return await m.client.score(prompts, k or 0)      # engine work, between its steps
    except ValueError as e:
        raise APIError(400, str(e), "prompt") from e
