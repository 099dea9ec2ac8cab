#!/bin/sh
# Installs inflight's drop-in into Dify's API (docs/dify.md, section 2): the client (./inflight-client, a
# copy of inflight's clients/python) into Dify's venv with uv, and inflight.patch into Dify's source.
# The Dockerfile beside it runs it as root in Dify's image; DIFY_APP and DIFY_PYTHON say where else.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
app=${DIFY_APP:-/app}
python=${DIFY_PYTHON:-$app/api/.venv/bin/python}
uv pip install --no-cache --python "$python" "$here/inflight-client"
# A hunk that does not apply, or that was applied already, fails the build (no fuzz, no reversing).
patch -p1 --forward --fuzz=0 --no-backup-if-mismatch -d "$app" < "$here/inflight.patch"
"$python" -c 'import inflight_client.dify'
