#!/usr/bin/env bash
# Runs every test of the workspace. The Redis tests start their own redis-server processes on free ports,
# so the only thing needed beside Rust is the redis-server binary: installed here when it is missing. Then the
# Python client's tests (clients/python), in a venv made here (target/pyvenv).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server not found: installing redis-server and redis-tools" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server redis-tools >/dev/null
fi

# The status page's test runs it in headless Chromium (Debian's chromium package): installed here in CI
# (CI=true), where its absence fails that test; elsewhere that test is skipped, saying so, unless installed.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "${CI:-}" = "true" ]; then
    echo "chromium not found: installing chromium (apt-get, with sudo when not root)" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium not found: the status page's browser tests will be skipped (apt-get install chromium)" >&2
  fi
fi

cargo test --workspace --all-features "$@"

# The Python client (clients/python), in a venv of its own, against real redis-server and inflight processes:
# the cross-language tests use target/debug/inflight, which cargo test has just built for its own
# integration tests (built here only when missing, e.g. after a filtered cargo test).
[ -x target/debug/inflight ] || cargo build -q -p inflight-server
venv=target/pyvenv
if [ ! -x "$venv/bin/python" ]; then
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    echo "python3 -m venv failed: installing python3-venv" >&2
    rm -rf "$venv"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$venv"
  fi
fi
"$venv/bin/pip" install -q --disable-pip-version-check ./clients/python pytest ruff gevent
rm -rf clients/python/build
"$venv/bin/ruff" check clients/python
"$venv/bin/ruff" format --check clients/python
INFLIGHT_BIN="$PWD/target/debug/inflight" "$venv/bin/python" -m pytest -q -p no:cacheprovider clients/python/tests
