"""LiteLLM's ``custom_auth`` for the tests (no database): the keys of the JSON file ``INFLIGHT_TEST_KEYS``,
each ``{"team_id": ..., "user_id": ..., "max_parallel_requests": ..., "metadata": {...},
"team_metadata": {...}}``."""

from __future__ import annotations

import hashlib
import json
import os

from fastapi import Request
from litellm.proxy._types import UserAPIKeyAuth


async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    with open(os.environ["INFLIGHT_TEST_KEYS"]) as f:
        keys = json.load(f)
    if api_key not in keys:
        raise Exception(f"unknown key {api_key[:6]}...")
    token = hashlib.sha256(api_key.encode()).hexdigest()
    return UserAPIKeyAuth(api_key=token, token=token, **keys[api_key])
