"""The offline entry point: ``LLM(model).generate(prompts, params)`` and ``LLM.chat(conversations)``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hitenter.config import EngineConfig
from hitenter.engine.image_prompt import MEDIA_MARKER, chat_segments
from hitenter.engine.llm_engine import LLMEngine
from hitenter.engine_options import engine_config
from hitenter.models.vision.content import image_parts, with_markers
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
        self.engine = LLMEngine(config=engine_config(model, config, engine_options))
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

    def _with_images(self, prompt: Prompt | dict[str, Any]) -> Any:
        """A vLLM-style ``{"prompt": text, "multi_modal_data": {"image": image or [images]}}`` as an engine
        image prompt (the text holds one MEDIA_MARKER, "<__media__>", per image); other prompts unchanged."""
        if not isinstance(prompt, dict):
            return prompt
        text, data = prompt.get("prompt"), prompt.get("multi_modal_data") or {}
        if not isinstance(text, str):
            raise ValueError("prompt: a dict prompt needs a 'prompt' string")
        images = data.get("image", [])
        images = list(images) if isinstance(images, (list, tuple)) else [images]
        from hitenter.models.vision.image_source import image_rgb   # Pillow: imported when an image comes

        return self.engine.image_prompt(text, [image_rgb(im) for im in images])

    def generate(self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None = None,
                 on_output: Callable[[RequestOutput], None] | None = None) -> list[RequestOutput]:
        """Run prompts (text, or token ids) to completion, batched together; outputs in prompt order.

        ``params`` is one SamplingParams for all prompts or a list with one per prompt (vLLM's convention).
        ``on_output`` sees every intermediate output (for streaming to a terminal).
        All requests are validated before any runs: one bad prompt raises and nothing is queued.
        """
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if params is None:
            params = SamplingParams()
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(plist) != len(prompts):
            raise ValueError(f"params: got {len(plist)} SamplingParams for {len(prompts)} prompts")
        eng = self.engine
        # validate and tokenize all first (once each): nothing half-queued
        pending = [eng.prepare_request(None, self._with_images(p), sp) for p, sp in zip(prompts, plist, strict=True)]
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
        """Apply the model's chat template to each conversation, then generate. Images (image_url / image /
        input_image parts, Anthropic image blocks, Ollama's `images`; data: URLs, base64, numpy arrays or PIL
        images) go where the template puts them, as llama.cpp's server lays them out; without a vision
        encoder (``LLM(model, mmproj=...)``) an image is a ValueError naming where it is."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        prompts: list[Any] = []
        for c, conversation in enumerate(conversations):
            found = image_parts(list(conversation))
            if found and self.engine.vision is None:
                where, kind = found[0]
                raise ValueError(f"conversation {c}, {where}: an image ({kind}), but the model has no "
                                 "vision encoder loaded: pass its projector, LLM(model, mmproj='mmproj.gguf')")
            if found:
                from hitenter.models.vision.image_source import image_rgb

                messages, images = with_markers(list(conversation), MEDIA_MARKER)
                segments = chat_segments(self.tokenizer, messages, add_generation_prompt)
                prompts.append(self.engine.image_prompt(segments, [image_rgb(p) for _, p in images], add_bos=False))
            else:
                prompts.append(self.tokenizer.apply_chat_template(list(conversation),
                                                                  add_generation_prompt=add_generation_prompt))
        return self.generate(prompts, params, **kwargs)
