"""A local stand-in for the OpenAI and Anthropic HTTP APIs, for tests (no network).

It answers `POST /v1/chat/completions`, `/v1/responses` and `/v1/messages`, as JSON or as
a server-sent-event stream, with usage that depends on the request (so a test can sum
it), and counts every request it received. Run it in the test's own process
(`ModelStub().start()`): a SIGKILLed client cannot take the counts with it.
`ModelStub(usage=...)` rewrites the usage of every reply as a proxy might (returning
None drops it: the reply carries no usage). `ModelStub(reply=...)` scripts the text of
`/v1/responses` replies: given the request's body it returns the reply's output items (a
list, to call tools) or None for the default answer; the usage still depends on the
request.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Rewrites one reply's usage object; None drops it.
UsageRewrite = Callable[[dict[str, Any]], dict[str, Any] | None]
# The output items of one /v1/responses reply, from the request's body; None: the default.
ReplyScript = Callable[[dict[str, Any]], list[dict[str, Any]] | None]


def usage_of(prompt: str) -> tuple[int, int]:
    """(input, output) tokens the stub reports for a prompt."""
    return 100 + 7 * len(prompt), 20 + len(prompt)


def _prompt(path: str, body: dict[str, Any]) -> str:
    if path.endswith("/responses"):
        value = body.get("input")
        return value if isinstance(value, str) else json.dumps(value)
    messages = body.get("messages") or [{}]
    content = messages[-1].get("content", "")
    return content if isinstance(content, str) else json.dumps(content)


class ModelStub:
    def __init__(self, usage: UsageRewrite | None = None, reply: ReplyScript | None = None) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.usage = usage
        self.reply = reply
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with stub._lock:
                    stub.requests.append((self.path, body))
                prompt = _prompt(self.path, body)
                reply = f"answer to {prompt}"
                tokens_in, tokens_out = usage_of(prompt)
                model = body.get("model", "model")
                if self.path.endswith("/chat/completions"):
                    events = _chat(model, reply, tokens_in, tokens_out, body.get("stream"))
                elif self.path.endswith("/responses"):
                    events = _responses(model, reply, tokens_in, tokens_out, body.get("stream"))
                    scripted = stub.reply(body) if stub.reply is not None else None
                    if scripted is not None and not body.get("stream"):
                        events["output"] = scripted
                elif self.path.endswith("/messages"):
                    events = _messages(model, reply, tokens_in, tokens_out, body.get("stream"))
                else:
                    self.send_error(404)
                    return
                if stub.usage is not None:
                    events = _rewrite_usage(events, stub.usage)
                if not body.get("stream"):
                    payload = json.dumps(events).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for event in events:
                    name = event.get("type") if isinstance(event, dict) else None
                    if name and not self.path.endswith("/chat/completions"):
                        self.wfile.write(f"event: {name}\n".encode())
                    data = event if isinstance(event, str) else json.dumps(event)
                    self.wfile.write(f"data: {data}\n\n".encode())
                self.wfile.flush()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> ModelStub:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def count(self) -> int:
        with self._lock:
            return len(self.requests)


def _rewrite_usage(value: Any, rewrite: UsageRewrite) -> Any:
    """`value` with every `usage` object in it rewritten (or dropped)."""
    if isinstance(value, list):
        return [_rewrite_usage(v, rewrite) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == "usage" and isinstance(item, dict):
            item = rewrite(dict(item))
            if item is None:
                continue
        out[key] = _rewrite_usage(item, rewrite)
    return out


def _chat(model: str, reply: str, tin: int, tout: int, stream: Any) -> Any:
    created = int(time.time())
    usage = {"prompt_tokens": tin, "completion_tokens": tout, "total_tokens": tin + tout}
    if not stream:
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        }
    base = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
    }
    words = reply.split(" ")
    chunks: list[Any] = [
        {
            **base,
            "choices": [
                {"index": 0, "delta": {"content": w if i == 0 else " " + w}, "finish_reason": None}
            ],
        }
        for i, w in enumerate(words)
    ]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    chunks.append({**base, "choices": [], "usage": usage})
    chunks.append("[DONE]")
    return chunks


def _response_object(model: str, reply: str, tin: int, tout: int) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": time.time(),
        "model": model,
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": reply, "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": tin,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": tout,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": tin + tout,
        },
    }


def _responses(model: str, reply: str, tin: int, tout: int, stream: Any) -> Any:
    done = _response_object(model, reply, tin, tout)
    if not stream:
        return done
    return [
        {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
         "content_index": 0, "delta": reply, "sequence_number": 1, "logprobs": []},
        {"type": "response.completed", "response": done, "sequence_number": 2},
    ]  # fmt: skip


def _messages(model: str, reply: str, tin: int, tout: int, stream: Any) -> Any:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": reply}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": tin, "output_tokens": tout},
    }
    if not stream:
        return message
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": tin, "output_tokens": 1},
    }
    return [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": reply}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         "usage": {"output_tokens": tout}},
        {"type": "message_stop"},
    ]  # fmt: skip
