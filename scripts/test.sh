#!/usr/bin/env bash
# Runs every test of the workspace. The Redis tests start their own redis-server processes on free ports,
# so the only thing needed beside Rust is the redis-server binary: installed here when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server not found: installing redis-server and redis-tools" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server redis-tools >/dev/null
fi

exec cargo test --workspace --all-features "$@"
