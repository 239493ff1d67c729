"""Request bodies of the OpenAI-compatible API, validated before anything is forwarded."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_TOKENS_LIMIT = 4096


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, Field(min_length=1, max_length=200)]
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    n: Annotated[int, Field(ge=1, le=1)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    seed: int | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = None

    @field_validator("metadata")
    @classmethod
    def _few_tags(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is not None and len(v) > 16:
            raise ValueError("at most 16 metadata keys")
        return v


class ChatCompletionRequest(_Common):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)] | None = None
    logprobs: Literal[False] | None = None
    store: bool | None = None

    def forward(self) -> dict[str, Any]:
        body = self.model_dump(exclude_none=True, exclude={"messages", "metadata", "store", "logprobs"})
        body["messages"] = [{"role": m.role, "content": m.text()} for m in self.messages]
        if self.max_completion_tokens is not None:
            body["max_tokens"] = self.max_completion_tokens
            body.pop("max_completion_tokens", None)
        body.setdefault("max_tokens", 16)
        return body


class CompletionRequest(_Common):
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1, max_length=1)]
        | Annotated[list[int], Field(min_length=1)]
    )
    echo: Literal[False] | None = None
    suffix: None = None
    logprobs: None = None
    best_of: Annotated[int, Field(ge=1, le=1)] | None = None

    @model_validator(mode="after")
    def _prompt_not_empty(self) -> CompletionRequest:
        if isinstance(self.prompt, str) and not self.prompt:
            raise ValueError("prompt must not be empty")
        return self

    def forward(self) -> dict[str, Any]:
        body = self.model_dump(
            exclude_none=True, exclude={"metadata", "echo", "suffix", "logprobs", "best_of"}
        )
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            body["prompt"] = self.prompt[0]
        body.setdefault("max_tokens", 16)
        return body
