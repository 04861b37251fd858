"""The offline entry point: ``LLM(model).generate(prompts, params)`` and ``LLM.chat(conversations)``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hitenter.config import EngineConfig
from hitenter.engine.llm_engine import LLMEngine
from hitenter.models.vision.content import image_parts
from hitenter.outputs import RequestOutput
from hitenter.sampling_params import SamplingParams

Prompt = str | list[int]
Message = dict[str, Any]


class LLM:
    """A model and its serving engine in this process.

    ``LLM()`` loads the default model (pulled when missing); ``LLM("path/to/model.gguf")``,
    ``LLM("hf:owner/repo/file.gguf")`` and known names work too. Keyword arguments are the engine's
    options (every field of hitenter.config.EngineConfig: max_model_len, max_num_seqs, kv_cache_memory,
    dtype, quantization, ...), or pass ``config=EngineConfig(...)``.
    """

    def __init__(self, model: str | None = None, config: EngineConfig | None = None, **engine_options: Any) -> None:
        self.engine = LLMEngine(model, config, **engine_options)
        self.tokenizer = self.engine.tokenizer
        self.model_config = self.engine.model_config

    def close(self) -> None:
        """Release what the engine holds outside this process (tensor-parallel / prefill workers); idempotent.
        Also run when the runner is garbage collected and at interpreter exit."""
        close = getattr(self.engine.runner, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None = None,
                 on_output: Callable[[RequestOutput], None] | None = None) -> list[RequestOutput]:
        """Run prompts (text, or token ids) to completion, batched together; outputs in prompt order.

        ``params`` is one SamplingParams for all prompts or a list with one per prompt (vLLM's convention).
        ``on_output`` sees every intermediate output (for streaming to a terminal).
        All requests are validated before any runs: one bad prompt raises and nothing is queued.
        """
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if params is None:
            params = SamplingParams()
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(plist) != len(prompts):
            raise ValueError(f"params: got {len(plist)} SamplingParams for {len(prompts)} prompts")
        eng = self.engine
        # validate and tokenize all first (once each): nothing half-queued
        pending = [eng.prepare_request(None, p, sp) for p, sp in zip(prompts, plist, strict=True)]
        ids: list[str] = []
        try:
            for pr in pending:
                eng.admit(pr)
                ids.append(pr.request_id)
            final: dict[str, RequestOutput] = {}
            while len(final) < len(ids):
                for out in eng.step():
                    if on_output is not None:
                        on_output(out)
                    if out.finished:
                        final[out.request_id] = out
        finally:
            for rid in ids:       # on error or KeyboardInterrupt nothing stays queued or holds blocks
                eng.abort(rid)
        return [final[rid] for rid in ids]

    def trace(self, prompt: Prompt, max_new_tokens: int = 0) -> Any:
        """One traced forward of this engine's model (embeddings, hidden states, attention probabilities,
        rotary angles, logits), outside the scheduler and KV cache; see hitenter/models/trace.py."""
        from hitenter.models.trace import trace_with_generation
        eng = self.engine
        return trace_with_generation(eng.runner.model, eng.encode_prompt(prompt), max_new_tokens,
                                     frozenset(eng.tokenizer.eog_token_ids))

    def chat(self, conversations: list[Message] | Sequence[list[Message]],
             params: SamplingParams | Sequence[SamplingParams] | None = None,
             add_generation_prompt: bool = True, **kwargs: Any) -> list[RequestOutput]:
        """Apply the model's chat template to each conversation, then generate. A message holding an image
        (an image_url / image / input_image part, or Ollama's `images`) is a ValueError: images are not
        taken by this engine's models yet, and a chat template would drop them silently."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        for c, conversation in enumerate(conversations):
            found = image_parts(list(conversation))
            if found:
                where, kind = found[0]
                raise ValueError(f"conversation {c}, {where}: an image ({kind}), but the model has no "
                                 "vision encoder loaded: images are not supported for it")
        prompts = [self.tokenizer.apply_chat_template(list(c), add_generation_prompt=add_generation_prompt)
                   for c in conversations]
        return self.generate(prompts, params, **kwargs)
