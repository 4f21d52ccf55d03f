#!/usr/bin/env bash
# Developer helper: a venv for THIS work tree that reuses an existing venv's
# installed dependencies (no download) and installs slicefeed editable.
#   ./dev-setup.sh /path/to/deps/venv
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
deps=${1:?path to a venv that has the dependencies}
python3 -m venv "$here/.venv-dev"
site=$("$here/.venv-dev/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/_slicefeed_deps.pth"
"$here/.venv-dev/bin/python" -m pip install -q --no-deps -e "$here"
echo "activate with: . $here/.venv-dev/bin/activate"
