"""A fake OpenAI-compatible chat model: echoes the last user message, or judges one, over Chat
Completions (`/v1/chat/completions`) and the Responses API (`/v1/responses`, what NeMo Gym's
model servers call).

A prompt in the demo's judge format ("Expected: ...", "Response: ...", ending in "Answer yes
or no.") is answered "yes" when the response contains the expected text, else "no".

Latency and error rate come from the environment so the demo can run, and be overloaded,
without a real model:

    FAKE_MODEL_LATENCY_SECONDS   time spent per completion (default 0.5)
    FAKE_MODEL_ERROR_RATE        fraction of completions answered with a 500 (default 0)

Run it with `uvicorn examples.fastapi_app.fake_model:app --port 8001`.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from typing import Literal

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field


class ChatMessage(BaseModel):
    role: str
    content: str


class ChatRequest(BaseModel):
    model: str = "fake-model"
    messages: list[ChatMessage] = Field(min_length=1)


class ResponsesRequest(BaseModel):
    model: str = "fake-model"
    input: str | list[ChatMessage] = Field(min_length=1)


class Choice(BaseModel):
    index: int
    message: ChatMessage
    finish_reason: Literal["stop"] = "stop"


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


def _env_float(name: str, default: float) -> float:
    """The float in environment variable `name`, or `default`; a bad value names the variable."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None


LATENCY_SECONDS = _env_float("FAKE_MODEL_LATENCY_SECONDS", 0.5)
ERROR_RATE = _env_float("FAKE_MODEL_ERROR_RATE", 0.0)

JUDGE_SUFFIX = "Answer yes or no."

app = FastAPI(title="Fake OpenAI-compatible model")


def _judge(prompt: str) -> str:
    """'yes' if the prompt's Response line contains its Expected line, else 'no'."""
    fields = dict(line.split(": ", 1) for line in prompt.splitlines() if ": " in line)
    expected, response = fields.get("Expected", "").strip(), fields.get("Response", "")
    return "yes" if expected and expected in response else "no"


@app.post("/v1/chat/completions", response_model=ChatCompletion)
async def chat_completions(request: ChatRequest) -> ChatCompletion | JSONResponse:
    """Echo the last user message after the configured latency; fail at the configured rate."""
    await asyncio.sleep(LATENCY_SECONDS)
    if random.random() < ERROR_RATE:
        error = {
            "message": "fake model error",
            "type": "server_error",
            "param": None,
            "code": "fake_error",
        }
        return JSONResponse({"error": error}, status_code=500)
    prompt = request.messages[-1].content
    answer = _judge(prompt) if prompt.rstrip().endswith(JUDGE_SUFFIX) else prompt
    words = len(prompt.split())
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex[:12]}",
        created=int(time.time()),
        model=request.model,
        choices=[Choice(index=0, message=ChatMessage(role="assistant", content=answer))],
        usage=Usage(prompt_tokens=words, completion_tokens=words, total_tokens=2 * words),
    )


@app.post("/v1/responses")
async def responses(request: ResponsesRequest) -> dict[str, object]:
    """The Responses API's answer to the same: an output message echoing the last input."""
    await asyncio.sleep(LATENCY_SECONDS)
    prompt = request.input if isinstance(request.input, str) else request.input[-1].content
    answer = _judge(prompt) if prompt.rstrip().endswith(JUDGE_SUFFIX) else prompt
    words = len(prompt.split())
    message = {
        "id": f"msg_{uuid.uuid4().hex[:12]}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": answer, "annotations": []}],
    }
    usage = {
        "input_tokens": words,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": words,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 2 * words,
    }
    return {
        "id": f"resp_{uuid.uuid4().hex[:12]}",
        "object": "response",
        "created_at": time.time(),
        "model": request.model,
        "status": "completed",
        "output": [message],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }


@app.get("/v1/models")
async def list_models() -> dict[str, object]:
    """The one model this server pretends to be."""
    return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}


@app.get("/health")
async def health() -> dict[str, str]:
    """Liveness for scripts and compose health checks."""
    return {"status": "ok"}
