#!/usr/bin/env bash
# Build the wheel, install it (not editable) in a fresh virtual environment, and run
# attnviz from outside the checkout: the resources must come from the installed package.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip wheel -q --no-deps -w "$work/dist" .
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q torch==2.13.0 "$work"/dist/attnviz-*.whl
cd "$work"
export QT_QPA_PLATFORM=offscreen
"$work/venv/bin/attnviz" compute --preset stage-1-simple | tail -n 3
"$work/venv/bin/attnviz" export --view weights --out "$work/weights.png"
"$work/venv/bin/attnviz" export --view masked --out "$work/masked.svg"
"$work/venv/bin/attnviz" examples | tail -n 1
"$work/venv/bin/attnviz" compute --example minilm-layer-0 --format json >"$work/minilm.json"
"$work/venv/bin/python" - "$work" <<'PY'
import json
import sys
from pathlib import Path

from attnviz.assets import ICON_SVG, resource
from attnviz.core.examples import examples
from attnviz.core.maths.forward import compute

icon = resource(*ICON_SVG)
assert icon.is_file() and "site-packages" in str(icon), icon
for size in (16, 24, 32, 48, 64, 128, 256, 512):
    assert resource("icons", "hicolor", f"{size}x{size}", "apps", icon.stem + ".png").is_file()
assert Path(sys.argv[1], "weights.png").stat().st_size > 1000
assert Path(sys.argv[1], "masked.svg").read_text().startswith("<svg")
shipped = examples()
for example in shipped:
    assert "site-packages" in str(example.path), example.path
    result = compute(example.load())
    assert all(h.weights.size for h in result.heads), example.name
assert len(json.loads(Path(sys.argv[1], "minilm.json").read_text())["heads"]) == 12
print(f"installed wheel: compute, export, the icon and {len(shipped)} examples from", icon.parents[4])
PY
