"""A fake OpenAI upstream on loopback, in a thread of the test: ``/v1/chat/completions`` answers at once or
streams server-sent events, as the request's last message (JSON) says, and records what it serves.

A message is ``{"tag": ..., "mode": ..., "labels": {...}}``. Modes: ``plain`` answers at once; ``hold``
sends its first chunk (a stream) and waits for :meth:`FakeUpstream.finish` of its tag before the rest;
``cut`` sends its first chunk, waits for its tag, then drops the connection mid-body; ``fail`` answers 500.
``labels`` (scope -> value) are counted while the request is served: :attr:`peak` is the most served at
once per ``(scope, value)``, across every replica calling this upstream.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter


class FakeUpstream:
    def __init__(self) -> None:
        self.port = 0
        self.started: list[str] = []  # tags, in the order they reached the upstream
        self.started_at: dict[str, float] = {}  # tag -> when it reached the upstream (time.monotonic())
        self.active: Counter[tuple[str, str]] = Counter()
        self.peak: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Condition()
        self._gates: dict[str, asyncio.Event] = {}
        self._finished: set[str] = set()
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the fake upstream did not start")

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # The test's side.
    def finish(self, tag: str) -> None:
        """Lets the request ``tag`` go on (its rest, its cut), now or when it arrives."""
        self._loop.call_soon_threadsafe(self._gate(tag).set)

    def wait_started(self, tag: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            while tag not in self.started:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{tag} never reached the upstream (started: {self.started})")
                self._lock.wait(left)

    def order(self, tags: list[str]) -> list[str]:
        with self._lock:
            return [t for t in self.started if t in tags]

    # The server's side (the loop's thread).
    def _gate(self, tag: str) -> asyncio.Event:
        return self._gates.setdefault(tag, asyncio.Event())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        labels: list[tuple[str, str]] = []
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.decode("latin-1").split("\r\n"):
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            try:
                body = json.loads(await reader.readexactly(length))
                order = json.loads(body["messages"][-1]["content"])
            except (ValueError, KeyError, IndexError, TypeError):  # not one of the tests' requests
                return await self._json(writer, 404, {"error": {"message": "not found"}})
            tag, mode, stream = order["tag"], order.get("mode", "plain"), bool(body.get("stream"))
            labels = [(k, str(v)) for k, v in order.get("labels", {}).items()]
            with self._lock:
                for label in labels:
                    self.active[label] += 1
                    self.peak[label] = max(self.peak[label], self.active[label])
                self.started.append(tag)
                self.started_at[tag] = time.monotonic()
                self._lock.notify_all()
            if mode == "fail":
                return await self._json(
                    writer, 500, {"error": {"message": "upstream failed", "type": "server_error"}}
                )
            if not stream:
                if mode == "hold":
                    await self._gate(tag).wait()
                return await self._json(writer, 200, _completion(tag))
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                b"connection: close\r\n\r\n"
            )
            await self._chunk(writer, _sse(_delta(tag, "first ")))
            if mode in ("hold", "cut"):
                await self._gate(tag).wait()
            if mode == "cut":
                writer.write(b"ffff\r\npartial")  # a chunk it never ends
                await writer.drain()
                writer.transport.abort()
                return
            await self._chunk(writer, _sse(_delta(tag, "last", "stop")) + b"data: [DONE]\n\n")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with self._lock:
                for label in labels:
                    self.active[label] -= 1
            writer.close()

    @staticmethod
    async def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await writer.drain()

    @staticmethod
    async def _json(writer: asyncio.StreamWriter, status: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n" % (
            status,
            b"OK" if status == 200 else b"Error",
        )
        writer.write(head + b"content-length: %d\r\nconnection: close\r\n\r\n" % len(data) + data)
        await writer.drain()


def _completion(tag: str) -> dict[str, object]:
    return {
        "id": f"chatcmpl-{tag}",
        "object": "chat.completion",
        "created": 0,
        "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": tag}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _delta(tag: str, text: str, finish: str | None = None) -> dict[str, object]:
    return {
        "id": f"chatcmpl-{tag}",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": finish}],
    }


def _sse(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
