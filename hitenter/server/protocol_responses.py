"""OpenAI Responses' request body (POST /v1/responses) and its input items, turned into the chat
template's messages.

Input: a string (one user message) or items: messages (``user`` / ``assistant`` / ``system`` /
``developer``, content a string or ``input_text`` / ``output_text`` parts), ``function_call`` (an
earlier call of the model) and ``function_call_output`` (its result). ``instructions`` become the
system message (not carried to a later response, as OpenAI does). ``reasoning.effort`` switches the
model's thinking through its template; the reply's thinking is a ``reasoning`` output item (its text
in ``content``, streamed as ``response.reasoning_text.delta``) and counts in
``output_tokens_details.reasoning_tokens``; a stored response's thinking goes back to the template, and
so do ``reasoning`` items in the input (as Codex sends them back; ``include:
["reasoning.encrypted_content"]`` puts the text in ``encrypted_content`` too, unencrypted).
Images, files, built-in tools, background runs and ``truncation: "auto"`` are refused (400); ``user``,
``safety_identifier``, ``prompt_cache_key`` and ``metadata`` are metadata (no effect on generation).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from annotated_types import MaxLen, MinLen
from pydantic import ConfigDict, Discriminator, Field, Tag

from hitenter.server.api_error import APIError
from hitenter.server.reasoning import EFFORTS
from hitenter.server.schema_types import Bool, NLogprobs, PositiveInt, Temperature, TopP
from hitenter.server.schema_types import Nested as _Nested

INCLUDE = frozenset({"message.output_text.logprobs", "reasoning.encrypted_content"})


class TextPart(_Nested):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: Annotated[list[Any], MaxLen(0)] | None = None
    logprobs: list[Any] | None = None


class ImagePart(_Nested):
    """An ``input_image``: ``image_url`` a base64 data: URL (hitenter/server/image_chat.py); file ids are refused."""
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class MessageItem(_Nested):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart | ImagePart]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    def template_content(self) -> str | list[dict[str, Any]]:
        """The text, or with images its parts in order (dicts, as the chat path takes them)."""
        if isinstance(self.content, list) and any(isinstance(p, ImagePart) for p in self.content):
            return [p.model_dump(exclude_none=True) for p in self.content]
        return self.text()


class FunctionCallItem(_Nested):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Nested):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[TextPart]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningPart(_Nested):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningInputItem(_Nested):
    """An earlier reply's thinking, sent back (Codex does, with ``store`` false): its ``content`` text,
    else its ``encrypted_content`` (this server's is the text itself: nothing here encrypts), else its
    summary. It goes to the template as the next assistant turn's reasoning."""
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningPart] = []
    content: list[ReasoningPart] | None = None
    encrypted_content: str | None = None
    status: str | None = None

    def text(self) -> str:
        if self.content:
            return "".join(p.text for p in self.content)
        return self.encrypted_content or "\n\n".join(p.text for p in self.summary)


def _kind(v: Any) -> str | None:
    t = v.get("type", "message") if isinstance(v, dict) else getattr(v, "type", None)
    return t if t in ("message", "function_call", "function_call_output", "reasoning") else None


InputItem = Annotated[Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
                      | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
                      | Annotated[ReasoningInputItem, Tag("reasoning")],
                      Discriminator(_kind, custom_error_type="unsupported_item", custom_error_message=(
                          "unsupported input item: give a message, reasoning, function_call or function_call_output"))]
Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningInputItem


class FunctionTool(_Nested):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: Bool | None = None

    def as_openai(self) -> dict[str, Any]:
        fn = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}


class NamedChoice(_Nested):
    type: Literal["function"]
    name: str


class TextFormat(_Nested):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: Bool | None = None
    description: str | None = None


class TextConfig(_Nested):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None


class ReasoningConfig(_Nested):
    """``effort`` switches thinking through the template ("none": off; a level: gpt-oss's
    ``reasoning_effort``); no summaries are written (``summary`` is accepted, the items carry the text)."""
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None

    def think(self) -> tuple[bool | None, str | None]:
        e = self.effort
        return (None if e is None else e != "none"), ("low" if e == "minimal" else e if e in EFFORTS else None)


class ResponsesRequest(_Nested):
    model: str | None = None
    input: str | Annotated[list[InputItem], MinLen(1)]
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_logprobs: NLogprobs | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedChoice | None = None
    parallel_tool_calls: Bool | None = None
    text: TextConfig | None = None
    stream: Bool = False
    store: Bool = True
    previous_response_id: str | None = None
    include: list[str] | None = None
    truncation: Literal["disabled"] | None = None
    reasoning: ReasoningConfig | None = None
    background: Bool | None = None                                    # false only: no background runs
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None

    def check(self) -> None:
        if self.background:
            raise APIError(400, "background: background runs are not supported", "background")
        bad = sorted(set(self.include or ()) - INCLUDE)
        if bad:
            raise APIError(400, f"include: unsupported {bad}; supported: {sorted(INCLUDE)}", "include")

    def items(self) -> list[Item]:
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    def choice(self) -> Any:
        """tool_choice in OpenAI chat's spelling (tools.plan_tools)."""
        if isinstance(self.tool_choice, NamedChoice):
            return {"type": "function", "function": {"name": self.tool_choice.name}}
        return self.tool_choice

    def wants_logprobs(self) -> bool:
        return "message.output_text.logprobs" in (self.include or ()) or self.top_logprobs is not None
