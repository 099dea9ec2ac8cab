#!/usr/bin/env bash
# Fault runs on loopback (issue 28; RELIABILITY.md, "Chaos runs"): real redis-server, Sentinel and Cluster
# topologies, holders in Rust (the library), Python (clients/python), over `inflight serve`'s API and
# through `inflight proxy`, each writing a history that the history checker (crates/history) judges. One
# JSON line per scenario; exits non-zero when a scenario is over its bound.
#   scripts/chaos.sh            every scenario (under 30 minutes on 2 cores)
#   scripts/chaos.sh --quick    a subset with shorter runs (under 5 minutes; part of scripts/test.sh)
#   scripts/chaos.sh --only NAME   the scenarios whose name contains NAME
# Histories and logs stay in target/chaos/<scenario>/.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/install.sh
install_missing redis-server=redis-server,redis-tools redis-cli=redis-tools

cargo build -q -p inflight-server -p inflight-chaos

# The Python holders need the client in a venv (the one scripts/test.sh makes).
venv=target/pyvenv
if [ ! -x "$venv/bin/python" ]; then
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    rm -rf "$venv"
    install_packages python3-venv
    python3 -m venv "$venv"
  fi
fi
# Installed each time, as scripts/test.sh does: the client may have changed since.
"$venv/bin/pip" install -q --disable-pip-version-check ./clients/python
rm -rf clients/python/build

exec target/debug/inflight-chaos run --inflight target/debug/inflight --python "$venv/bin/python" "$@"
