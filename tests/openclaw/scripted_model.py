"""A scripted OpenAI-compatible model server for driving a real OpenClaw agent.

It serves `POST /v1/chat/completions` (streaming SSE when the request asks for
it) and answers from a script: a function of the conversation that returns a
tool call, several tool calls in one response, a final text, or a context
overflow. Every agent request's messages
are kept, so a test can assert on what the model was shown; a request that
offers no tools (the gateway summarising a transcript for compaction) gets a
summary and is only counted.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Message = dict[str, Any]


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class Calls:
    """Several tool calls in one response (one assistant message: a turn), in this order."""

    calls: list[ToolCall]


@dataclass
class Reply:
    text: str


@dataclass
class Overflow:
    """Refuse the request as a provider does when the context window is exceeded."""


OVERFLOW_MESSAGE = (
    "This model's maximum context length is 128000 tokens. However, your messages resulted in "
    "131072 tokens. Please reduce the length of the messages."
)

Answer = ToolCall | Calls | Reply | Overflow
Script = Callable[[list[Message]], Answer]


def message_text(message: Message) -> str:
    """The text of a chat message, whether its content is a string or a list of parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def tool_messages(messages: list[Message]) -> list[Message]:
    """The tool results the model has been shown, oldest first. The gateway adds a user
    message of internal context after tool results, so the last message is not one."""
    return [m for m in messages if m.get("role") == "tool"]


class ScriptedModel:
    """Run with `with ScriptedModel(script) as model:`; `model.base_url` is the provider's baseUrl."""

    def __init__(self, script: Script, model_id: str = "scripted") -> None:
        self.script = script
        self.model_id = model_id
        self.requests: list[list[Message]] = []
        self.tools_offered: list[str] = []
        self.summaries = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> ScriptedModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, body: dict[str, Any]) -> Answer:
        messages = body.get("messages") or []
        if not body.get("tools"):
            # The gateway's summariser (compaction) offers no tools and wants text.
            with self._lock:
                self.summaries += 1
            return Reply(
                "Summary: the user asked for a command to be run; it was run several times with the same output."
            )
        with self._lock:
            self.requests.append(messages)
            self.tools_offered = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        return self.script(messages)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet: the test reports what matters
                pass

            def do_POST(self) -> None:
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self.send_error(404)
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                answer = model._answer(body)
                if isinstance(answer, Overflow):
                    self._overflow()
                elif body.get("stream"):
                    self._stream(answer)
                else:
                    self._json(answer)

            def _overflow(self) -> None:
                error = {
                    "message": OVERFLOW_MESSAGE,
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded",
                }
                self._send_json(400, {"error": error})

            def _json(self, answer: ToolCall | Calls | Reply) -> None:
                message: dict[str, Any] = {"role": "assistant", "content": None}
                if not isinstance(answer, Reply):
                    message["tool_calls"] = [_tool_call(call) for call in _calls(answer)]
                    finish = "tool_calls"
                else:
                    message["content"] = answer.text
                    finish = "stop"
                payload = _envelope(model.model_id, "chat.completion")
                payload["choices"] = [{"index": 0, "message": message, "finish_reason": finish}]
                payload["usage"] = _USAGE
                self._send_json(200, payload)

            def _send_json(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, answer: ToolCall | Calls | Reply) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                if not isinstance(answer, Reply):
                    # One delta per call, as providers stream them: each call's index, id, name and arguments.
                    deltas = [
                        {"role": "assistant", "content": None, "tool_calls": [{"index": index, **_tool_call(call)}]}
                        for index, call in enumerate(_calls(answer))
                    ]
                    finish = "tool_calls"
                else:
                    deltas = [{"role": "assistant", "content": answer.text}]
                    finish = "stop"
                for delta in deltas:
                    self._event(_chunk(model.model_id, delta, None))
                self._event(_chunk(model.model_id, {}, finish) | {"usage": _USAGE})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

            def _event(self, payload: dict[str, Any]) -> None:
                self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
                self.wfile.flush()

        return Handler


_USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def _envelope(model_id: str, kind: str) -> dict[str, Any]:
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": kind, "created": int(time.time()), "model": model_id}


def _chunk(model_id: str, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    payload = _envelope(model_id, "chat.completion.chunk")
    payload["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    return payload


def _calls(answer: ToolCall | Calls) -> list[ToolCall]:
    return answer.calls if isinstance(answer, Calls) else [answer]


def _tool_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:16]}",
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
    }


def provider_config(base_url: str, model_id: str = "scripted") -> dict[str, Any]:
    """`models.providers.<name>` for the gateway config: an OpenAI-compatible provider on a private address."""
    return {
        "baseUrl": base_url,
        "apiKey": "test",
        "api": "openai-completions",
        "request": {"allowPrivateNetwork": True},
        "models": [
            {
                "id": model_id,
                "name": model_id,
                "api": "openai-completions",
                "input": ["text"],
                "contextWindow": 128000,
                "maxTokens": 4096,
                "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
            }
        ],
    }
