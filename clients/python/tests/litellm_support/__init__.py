"""Helpers of test_litellm.py: a fake OpenAI upstream, LiteLLM's custom_auth for the tests, the proxies."""
