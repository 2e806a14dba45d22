"""A scripted fake of the embedding and chat providers: a real HTTP server on 127.0.0.1.

It speaks each provider's wire format (OpenAI-compatible /embeddings and /chat/completions,
DashScope text and multimodal embeddings, Gemini batchEmbedContents, Ollama /api/embed) with
deterministic vectors derived from a hash of the text, and lets a test script the answer to
each request: status, headers (Retry-After), delays, malformed bodies, wrong dimensions, a
dropped connection; a gate holds the requests that match it until the test opens it. It
runs stdlib ``http.server`` in its own thread, so trio tests use it without any event loop
of their own; every request is recorded for assertions.

    with FakeProvider(dims=8) as fake:
        fake.script(Reply(status=429, headers={"Retry-After": "1"}), Reply())
        ... fake.url ... fake.requests ...
"""

from __future__ import annotations

import hashlib
import http.server
import re
import socket
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson


def fake_vector(text: str, dims: int) -> np.ndarray:
    """The (unnormalized) vector the fake returns for ``text``: seeded by its SHA-256."""
    seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
    return np.random.default_rng(seed).standard_normal(dims).astype(np.float32)


def unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


@dataclass
class Reply:
    """What the fake does for one request. Defaults: a correct answer at once."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    #: Close the connection without answering.
    drop: bool = False
    #: Send these bytes as the body instead of the normal answer.
    raw: bytes | None = None
    #: Send these bytes as the whole answer (status line and headers too), then close.
    wire: bytes | None = None
    #: Send this JSON instead of the normal answer (chat scripts use it).
    json: Any = None
    #: Return vectors of this dimension instead of the requested one.
    dims: int | None = None
    #: Return this many vectors fewer than asked.
    missing: int = 0


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)


def chat_answer(content: str | None = "ok", tool_calls: list[dict[str, Any]] | None = None,
                finish_reason: str = "stop") -> dict[str, Any]:
    """A chat.completion object as OpenAI-compatible servers send it."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
        finish_reason = "tool_calls"
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def tool_call(name: str, arguments: Any, call_id: str = "call_1") -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


_GEMINI = re.compile(r"/v1beta/models/(?P<model>[^/:]+):batchEmbedContents$")


@dataclass
class Gate:
    """Holds every request whose JSON body ``match``es until :meth:`open` (or the server
    stops): ``entered`` is set once one is held, ``held`` counts those waiting now."""

    match: Callable[[Any], bool]
    entered: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    held: int = 0

    def open(self) -> None:
        self.released.set()


class FakeProvider:
    """Loopback HTTP server with a queue of scripted replies (then correct answers)."""

    def __init__(self, *, dims: int = 8, api_key: str | None = None, port: int = 0) -> None:
        self.dims = dims
        #: When set, requests without this key (Bearer or x-goog-api-key) get 401.
        self.api_key = api_key
        self.requests: list[Recorded] = []
        self._script: deque[Reply] = deque()
        self._gates: list[Gate] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.chat_default: Callable[[Any], dict[str, Any]] = lambda body: chat_answer()
        #: When no scripted reply is left: the reply to a request by its JSON body (None:
        #: a correct answer), e.g. a failure for every batch holding some text.
        self.reply_for: Callable[[Any], Reply | None] | None = None
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # The status line and headers go out in one write, the body in another: with
            # Nagle's algorithm the body waited for the client's delayed ACK (40 ms a call).
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                fake._handle(self)

            def do_GET(self) -> None:
                fake._handle(self)

        self._server = _Server(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)

    def clear_script(self) -> None:
        with self._lock:
            self._script.clear()

    def gate(self, match: Callable[[Any], bool]) -> Gate:
        """Hold the requests whose JSON body ``match``es (see :class:`Gate`)."""
        g = Gate(match)
        with self._lock:
            self._gates.append(g)
        return g

    def _hold(self, body: bytes) -> None:
        try:
            parsed = orjson.loads(body or b"{}")
        except orjson.JSONDecodeError:
            return
        with self._lock:
            gates = [g for g in self._gates if not g.released.is_set() and g.match(parsed)]
        for g in gates:
            with self._lock:
                g.held += 1
            g.entered.set()
            while not (g.released.wait(0.05) or self._stop.is_set()):
                pass
            with self._lock:
                g.held -= 1

    def pending_script(self) -> int:
        with self._lock:
            return len(self._script)

    def start(self) -> FakeProvider:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ handler

    def _handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in h.headers.items()}
        with self._lock:
            self.requests.append(Recorded(h.command, h.path, headers, body))
            reply = self._script.popleft() if self._script else None
        if reply is None:
            reply = self._reply_for(body)
        self._hold(body)
        if reply.delay_s and self._stop.wait(reply.delay_s):
            return
        if reply.drop:
            h.close_connection = True
            with _quiet():
                h.connection.shutdown(socket.SHUT_RDWR)
            return
        if reply.wire is not None:
            h.close_connection = True
            with _quiet():
                h.wfile.write(reply.wire)
                h.wfile.flush()
            return
        if reply.status == 200 and self.api_key is not None and not self._authorized(headers):
            self._send(h, 401, {}, orjson.dumps({"error": {"message": "invalid api key"}}))
            return
        if reply.raw is not None:
            out = reply.raw
        elif reply.json is not None:
            out = orjson.dumps(reply.json)
        elif reply.status != 200:
            out = orjson.dumps({"error": {"message": f"scripted status {reply.status}"}})
        else:
            try:
                out = orjson.dumps(self._answer(h.path, orjson.loads(body or b"{}"), reply))
            except (KeyError, TypeError, ValueError) as exc:
                self._send(h, 400, {}, orjson.dumps({"error": {"message": f"bad request: {exc}"}}))
                return
        self._send(h, reply.status, reply.headers, out)

    def _reply_for(self, body: bytes) -> Reply:
        if self.reply_for is None:
            return Reply()
        try:
            parsed = orjson.loads(body or b"{}")
        except orjson.JSONDecodeError:
            return Reply()
        return self.reply_for(parsed) or Reply()

    def _authorized(self, headers: dict[str, str]) -> bool:
        return headers.get("authorization") == f"Bearer {self.api_key}" or (
            headers.get("x-goog-api-key") == self.api_key
        )

    @staticmethod
    def _send(h: http.server.BaseHTTPRequestHandler, status: int, headers: dict[str, str],
              body: bytes) -> None:
        with _quiet():
            h.send_response(status)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(body)))
            for k, v in headers.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(body)

    def _vectors(self, texts: list[str], dims: int | None, reply: Reply) -> list[list[float]]:
        d = reply.dims or dims or self.dims
        texts = texts[: len(texts) - reply.missing] if reply.missing else texts
        return [fake_vector(t, d).tolist() for t in texts]

    def _answer(self, path: str, req: Any, reply: Reply) -> Any:
        path = path.split("?", 1)[0]
        if path.endswith("/chat/completions"):
            return self.chat_default(req)
        if path.endswith("/embeddings"):
            vecs = self._vectors(list(req["input"]), req.get("dimensions"), reply)
            return {"object": "list", "model": req["model"],
                    "data": [{"object": "embedding", "index": i, "embedding": v}
                             for i, v in reversed(list(enumerate(vecs)))],
                    "usage": {"prompt_tokens": 1, "total_tokens": 1}}
        if path.endswith("/text-embedding/text-embedding"):
            dims = (req.get("parameters") or {}).get("dimension")
            vecs = self._vectors(list(req["input"]["texts"]), dims, reply)
            return {"output": {"embeddings": [{"text_index": i, "embedding": v}
                                              for i, v in enumerate(vecs)]},
                    "usage": {"total_tokens": 1}, "request_id": "fake"}
        if path.endswith("/multimodal-embedding/multimodal-embedding"):
            dims = (req.get("parameters") or {}).get("dimension")
            texts = [c["text"] for c in req["input"]["contents"]]
            vecs = self._vectors(texts, dims, reply)
            return {"output": {"embeddings": [{"index": i, "embedding": v, "type": "text"}
                                              for i, v in enumerate(vecs)]},
                    "usage": {"input_tokens": 1}, "request_id": "fake"}
        m = _GEMINI.search(path)
        if m:
            reqs = req["requests"]
            for r in reqs:
                if r["model"] != f"models/{m['model']}":
                    raise ValueError("model in body does not match the URL")
            texts = [r["content"]["parts"][0]["text"] for r in reqs]
            dims = reqs[0].get("outputDimensionality") if reqs else None
            return {"embeddings": [{"values": v} for v in self._vectors(texts, dims, reply)]}
        if path.endswith("/api/embed"):
            inp = req["input"]
            texts = [inp] if isinstance(inp, str) else list(inp)
            return {"model": req["model"], "embeddings": self._vectors(
                texts, req.get("dimensions"), reply)}
        raise KeyError(f"unknown path {path}")


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients hanging up mid-request is part of the script, not an error


class _quiet:
    """Ignore a client that went away mid-answer (it is allowed to)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: type[BaseException] | None, *rest: object) -> bool:
        return typ is not None and issubclass(typ, OSError)
