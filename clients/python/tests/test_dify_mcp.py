"""Dify's MCP server with the guide's patch: it answers an agent-chat app's tool call with the app's text.

Dify's MCP server (``api/core/mcp/server/streamable_http.py``, Dify 1.16.1, commit 59b879d2df) imports
``RateLimitGenerator`` from ``core.app.features.rate_limiting.rate_limit`` and reads a streamed answer only
when the app's response is of that class (``match response: case RateLimitGenerator():``; an
``isinstance`` before Dify's #36274), iterating its ``generator`` attribute for ``agent_thought`` events;
anything else is logged as "Unexpected response type" and answers ``""``.

Below, a package tree shaped as Dify's (``core/...``, ``services/...``) whose modules are written here, in
our own words, with what those three Dify modules do: ``rate_limit.py`` ends with the same lines as
Dify's (so the guide's patch applies to it as written), the rate limiting package re-exports ``RateLimit``,
the generate service wraps the app's stream with ``RateLimit.generate``, and the MCP server matches on the
class. The guide's patch of ``rate_limit.py`` is applied with ``git apply``; the earlier guide's way
(importing the drop-in in the generate service only) is kept as the case that answers ``""``.
"""

from __future__ import annotations

import gc
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from test_dify_guide_patches import RATE_LIMIT, guide_patches

from inflight_client import RedisLimiter, dify

APP = "4d0c9a7e-1b2f-4c3d-8e5f-6a7b8c9d0e1f"

# Dify's modules, reduced to what the MCP path needs (our own code, not Dify's).
RATE_LIMIT_MODULE = """\
import contextlib


class RateLimit:
    def __init__(self, client_id, max_active_requests):
        self.client_id = client_id

    def enter(self, request_id=None):
        return request_id or "dify-request"

    def exit(self, request_id):
        pass

    def generate(self, generator, request_id):
        return RateLimitGenerator(self, generator, request_id)


@contextlib.contextmanager
def rate_limit_context(rate_limit, request_id):
    request_id = rate_limit.enter(request_id)
    yield
    rate_limit.exit(request_id)


class RateLimitGenerator:
    def __init__(self, rate_limit, generator, request_id):
        self.rate_limit = rate_limit
        self.generator = generator
        self.request_id = request_id
        self.closed = False

    def close(self):
        if not self.closed:
            self.closed = True
            self.rate_limit.exit(self.request_id)
            if self.generator is not None and hasattr(self.generator, "close"):
                self.generator.close()
"""

SERVICE_MODULE = """\
{import_line}


def generate(app_id, limit, stream):
    rate_limit = RateLimit(app_id, limit)
    request_id = rate_limit.enter()
    return rate_limit.generate(stream, request_id)
"""

MCP_MODULE = """\
import json
import logging
from collections.abc import Mapping

from core.app.features.rate_limiting.rate_limit import RateLimitGenerator

logger = logging.getLogger("mcp")


def extract_answer(response):
    match response:
        case RateLimitGenerator():
            answer = ""
            for item in response.generator:
                if isinstance(item, str) and item.startswith("data: "):
                    event = json.loads(item[6:])
                    if event.get("event") == "agent_thought":
                        answer += event.get("thought", "")
            return answer
        case Mapping():
            return response.get("answer", "")
        case _:
            logger.warning("Unexpected response type: %s", type(response))
            return ""
"""


def dify_tree(root: Path, guide: str) -> None:
    """Writes the tree; ``guide`` is "patch" (this guide's patch of ``rate_limit.py``) or "service" (the
    earlier guide's: the generate service imports the drop-in, ``rate_limit.py`` stays Dify's)."""
    files = {
        "core/__init__.py": "",
        "core/app/__init__.py": "",
        "core/app/features/__init__.py": "",
        "core/app/features/rate_limiting/__init__.py": "from .rate_limit import RateLimit\n",
        RATE_LIMIT.removeprefix("api/"): RATE_LIMIT_MODULE,
        "core/mcp/__init__.py": "",
        "core/mcp/server/__init__.py": "",
        "core/mcp/server/streamable_http.py": MCP_MODULE,
        "services/__init__.py": "",
        "services/app_generate_service.py": SERVICE_MODULE.format(
            import_line="from core.app.features.rate_limiting import RateLimit"
            if guide == "patch"
            else "from inflight_client.dify import RateLimit"
        ),
    }
    for name, text in files.items():
        path = root / "api" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if guide == "patch":
        subprocess.run(["git", "init", "-q"], cwd=root, check=True)
        subprocess.run(["git", "apply"], cwd=root, input=guide_patches()[RATE_LIMIT], text=True, check=True)


@pytest.fixture
def dify_modules(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path / "api"))
    yield tmp_path
    sys.path.remove(str(tmp_path / "api"))
    for name in [n for n in sys.modules if n.split(".")[0] in ("core", "services")]:
        del sys.modules[name]


@pytest.fixture
def drop_in(r: redis.Redis) -> Iterator[RedisLimiter]:
    limiter = dify.configure(r, lease=2.0)
    yield limiter
    limiter.close()


def agent_chat_stream() -> Iterator[str]:
    for thought in ("Looking it up. ", "The answer is 42."):
        yield "data: " + json.dumps({"event": "agent_thought", "thought": thought})
    yield "data: " + json.dumps({"event": "message_end"})


def test_with_the_guides_patch_the_mcp_server_answers_the_text_and_the_slot_comes_back(
    dify_modules: Path, drop_in: RedisLimiter
) -> None:
    dify_tree(dify_modules, "patch")
    from core.app.features.rate_limiting import RateLimit
    from core.app.features.rate_limiting.rate_limit import RateLimitGenerator, rate_limit_context
    from core.mcp.server.streamable_http import extract_answer
    from services.app_generate_service import generate

    assert (RateLimit, RateLimitGenerator, rate_limit_context) == (
        dify.RateLimit,
        dify.RateLimitGenerator,
        dify.rate_limit_context,
    )
    response = generate(APP, 2, agent_chat_stream())
    assert drop_in.status(f"app:{APP}").in_flight == 1
    assert extract_answer(response) == "Looking it up. The answer is 42."
    # The MCP server read the inner generator and never closed the wrapper: collected, it gives the slot
    # back (through the limiter's thread).
    del response
    gc.collect()
    deadline = time.monotonic() + 10
    while drop_in.status(f"app:{APP}").in_flight and time.monotonic() < deadline:
        time.sleep(0.02)
    assert drop_in.status(f"app:{APP}").in_flight == 0


def test_without_it_the_mcp_server_answers_nothing(
    dify_modules: Path, drop_in: RedisLimiter, caplog: pytest.LogCaptureFixture
) -> None:
    dify_tree(dify_modules, "service")
    from core.mcp.server.streamable_http import extract_answer
    from services.app_generate_service import generate

    response = generate(APP, 2, agent_chat_stream())
    with caplog.at_level(logging.WARNING, logger="mcp"):
        assert extract_answer(response) == ""
    assert "Unexpected response type" in caplog.text
    response.close()
