#!/usr/bin/env bash
# Build the wheel, install it (not editable) in a fresh virtual environment, and run
# attnviz from outside the checkout: the resources must come from the installed package.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
python3 -m pip wheel -q --no-deps -w "$work/dist" .
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q torch==2.13.0 "$work"/dist/attnviz-*.whl
cd "$work"
export QT_QPA_PLATFORM=offscreen
"$work/venv/bin/attnviz" compute --preset stage-1-simple | tail -n 3
"$work/venv/bin/attnviz" export --view weights --out "$work/weights.png"
"$work/venv/bin/attnviz" export --view masked --out "$work/masked.svg"
"$work/venv/bin/python" - "$work" <<'PY'
import sys
from pathlib import Path

from attnviz.resources import path

icon = path("attnviz.svg")
assert icon.is_file() and "site-packages" in str(icon), icon
assert Path(sys.argv[1], "weights.png").stat().st_size > 1000
assert Path(sys.argv[1], "masked.svg").read_text().startswith("<svg")
print("installed wheel: compute, export and resources from", icon.parent)
PY
