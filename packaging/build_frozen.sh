#!/usr/bin/env bash
# Build the one-folder frozen program with PyInstaller, run it headless, report its size.
#   bash packaging/build_frozen.sh [PYTHON]     (default: .venv/bin/python, with pyinstaller)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-.venv/bin/python}
"$py" -m PyInstaller --noconfirm --log-level WARN --distpath build/frozen --workpath build/pyinstaller packaging/attnviz.spec
app=build/frozen/attnviz
export QT_QPA_PLATFORM=offscreen
start=$(date +%s.%N)
"$app/attnviz" compute --preset stage-1-simple >/dev/null
end=$(date +%s.%N)
"$app/attnviz" export --view weights --out build/frozen/weights.png
"$app/attnviz" export --view masked --out build/frozen/masked.svg
echo "frozen attnviz compute: $(echo "$end - $start" | bc) s"
echo "size: $(du -sh "$app" | cut -f1) in all; torch: $(du -sh "$app/_internal/torch" 2>/dev/null | cut -f1)"
