"""The ``attnviz`` command: subcommands over the core; no subcommand opens the window.

Heads, rows and columns are numbered from 1 here, as in the window; a row or a key column
may also be named by its token. A bad file or flag exits with status 2 and one line on
stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from attnviz.core.io.names import quoted

if TYPE_CHECKING:  # the modules themselves are imported where used: `bench` needs no numpy
    import numpy as np

    from attnviz.core.figures.figure import HeatmapSpec
    from attnviz.core.maths.results import Result
    from attnviz.core.maths.scenario import Scenario, Settings
    from attnviz.core.maths.training import Losses, Trainer

EXIT_USAGE = 2
TARGETS = ("previous-token", "copy-self", "first-token")  # the preset targets of --loss target
TASK_NAMES = ("toy-corpus", "copy", "previous-token", "previous-and-first", "induction")  # = TASKS
SCENARIO_FILES = ".attn.json (text) or .attn.npz (binary)"


class UsageError(Exception):
    """A problem with what the user asked for; printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}; see '{self.prog} --help'")


def _whole(text: str, least: int, why: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{quoted(text)}: {why}")
    return value


def _positive(text: str) -> int:
    return _whole(text, 1, "must be 1 or more")


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a whole number") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"{quoted(text)} must be in [0, 2^32)")
    return value


def _add_source(p: argparse.ArgumentParser, overrides: bool = True) -> None:
    from attnviz.core.maths.scenario import MASKS, POSITIONALS

    p.add_argument("file", nargs="?", metavar="FILE", help=f"a scenario, {SCENARIO_FILES}")
    p.add_argument(
        "--preset", metavar="NAME", help="a preset instead of a file (see 'attnviz presets')"
    )
    p.add_argument(
        "--example", metavar="NAME", help="a shipped example file (see 'attnviz examples')"
    )
    p.add_argument("--n", type=_positive, help="tokens, for the sized presets (gpt2-small)")
    p.add_argument("--seed", type=_seed, help="random seed, for the sized presets")
    if overrides:
        p.add_argument("--mask", choices=MASKS, help="override the mask strategy")
        p.add_argument(
            "--window",
            type=_positive,
            metavar="W",
            help="sliding-window: each query sees itself and the W - 1 keys before it",
        )
        scaling = p.add_mutually_exclusive_group()
        scaling.add_argument(
            "--scaled", action="store_true", help="divide scores by √d_k (if the file does not)"
        )
        scaling.add_argument("--no-scale", action="store_true", help="do not divide by √d_k")
        p.add_argument("--no-projections", action="store_true", help="Q = K = V = X, no W_O")
        p.add_argument("--positional", choices=POSITIONALS, help="override the position encoding")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="attnviz",
        usage="%(prog)s [FILE]\n       %(prog)s [-h] [--version] COMMAND ...",
        description="A desktop lab for transformer attention. 'attnviz' alone opens the "
        f"window; 'attnviz FILE' opens it on a saved scenario, {SCENARIO_FILES}. The "
        "commands below work without a window.",
        epilog="Run 'attnviz COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"attnviz {_version()}")
    # prog: each command's usage starts 'attnviz COMMAND', not with the two-line usage above
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, prog="attnviz")

    p = sub.add_parser("compute", help="compute every intermediate and print it")
    _add_source(p)
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument(
        "--check",
        action="store_true",
        help="also compare the torch engine and scaled_dot_product_attention with NumPy",
    )

    sub.add_parser("presets", help="list the presets")
    sub.add_parser("examples", help="list the example files that ship with attnviz")
    sub.add_parser("bench", help="time dense against fused attention (attnviz bench --help)")

    p = sub.add_parser("explain", help="print the worked arithmetic of one cell")
    _add_source(p)
    p.add_argument("--matrix", required=True, help=f"one of {', '.join(_explainable())}")
    p.add_argument("--head", type=_positive, help="head number (from 1), for per-head matrices")
    p.add_argument("--row", required=True, help="row number (from 1) or token")
    p.add_argument("--col", required=True, help="column number (from 1), or token for key columns")

    p = sub.add_parser(
        "grad",
        help="print the gradient of a loss with respect to every input and intermediate",
        description="Backpropagation through the layer: the loss over its output and the "
        "gradient of that loss with respect to every input (X, the weights and biases) and "
        "every intermediate (per head Q, K, V, scores, weights, output; concat, final).",
    )
    _add_source(p)
    p.add_argument(
        "--loss",
        metavar="LOSS",
        help="target (½‖final − T‖², T from --target), next-token (cross-entropy through a "
        "tied unembedding), or cell:I,J (final[I, J] itself, numbered from 1); default: "
        "the scenario's own (a file's, else target)",
    )
    p.add_argument(
        "--target",
        choices=TARGETS,
        help="the target T of --loss target: each row the previous token's row of X (a "
        "previous-token head, the default), X itself, or X's first row",
    )
    p.add_argument("--format", choices=("text", "json"), default="text")

    p = sub.add_parser(
        "train",
        help="train the layer on the scenario's loss or a task and write the trained scenario",
        description="Gradient descent on the scenario's own loss (see 'attnviz grad') or on a "
        "task (a token embedding table around the layer, examples and a held-out split): the "
        "losses before and after, and the inference loss (each position seeing only its past, "
        "as generation with a KV cache does; under the zero mask the training loss can fall "
        "through the leak while the inference loss does not).",
    )
    _add_source(p)
    p.add_argument(
        "--task",
        choices=("scenario", *TASK_NAMES),
        default="scenario",
        help="what to learn: the scenario's own loss (default), or a shipped task's next "
        "tokens over its examples",
    )
    p.add_argument("--steps", type=_positive, required=True, help="optimiser steps")
    p.add_argument("--optimizer", choices=("sgd", "momentum", "adam", "adamw"), default="adam")
    p.add_argument("--lr", type=_rate, default=0.01, help="learning rate (default 0.01)")
    p.add_argument("--weight-decay", type=_rate, default=0.0, metavar="WD")
    p.add_argument("--clip", type=_rate, help="the largest gradient norm (default: no clipping)")
    p.add_argument("--batch", type=_positive, default=8, help="a task's examples a step (8)")
    p.add_argument(
        "--train",
        metavar="NAMES",
        help="which matrices train, comma-separated (of X, X_kv, W_Q, W_K, W_V, W_O, the "
        "biases b_Q, b_K, b_V, b_O and the norms q_norm, k_norm; under a task E, the token "
        "embedding table, instead of X); default W_Q,W_K,W_V,W_O (and E under a task)",
    )
    p.add_argument("--loss", metavar="LOSS", help="as for 'attnviz grad'")
    p.add_argument("--target", choices=TARGETS, help="as for 'attnviz grad'")
    p.add_argument("--out", required=True, metavar="PATH", help="the trained scenario to write")
    p.add_argument(
        "--log",
        metavar="PATH",
        help="also write the losses as CSV: each step's loss (a task: its batch's) and, "
        "every hundredth of the run, the held-out and inference losses",
    )

    p = sub.add_parser("code", help="print the scenario as a standalone NumPy or PyTorch script")
    _add_source(p)
    p.add_argument(
        "--flavor",
        choices=("numpy", "torch", "tiled"),
        default="numpy",
        help="tiled: NumPy, each head computed FlashAttention-2's way (see --block-q/--block-k)",
    )
    p.add_argument("--block-q", type=_positive, default=2, metavar="BR", help="tiled: query rows")
    p.add_argument("--block-k", type=_positive, default=2, metavar="BC", help="tiled: key columns")
    p.add_argument(
        "--backward",
        action="store_true",
        help="also the scenario's own loss and the backward pass (numpy: by hand; torch: "
        "autograd), printing the gradients 'attnviz grad' gives",
    )

    p = sub.add_parser("export", help="write a heatmap as PNG or SVG without opening a window")
    _add_source(p)
    p.add_argument("--view", required=True, help=f"one of {', '.join(_views())}")
    p.add_argument("--head", type=_positive, default=1, help="head number (from 1), default 1")
    p.add_argument("--format", choices=("png", "svg"), help="default: from the --out suffix")
    p.add_argument("--out", required=True, metavar="PATH", help="the image file to write")
    p.add_argument("--scale", type=_scale, default=2.0, help="PNG pixels per unit (default 2)")

    p = sub.add_parser(
        "tiles",
        help="step through FlashAttention's tiled forward pass over one head",
        description="FlashAttention-2's forward pass over one head, a tile at a time: "
        "each step's running row maximum m, running denominator l and unnormalised "
        "output; the output, the log-sum-exp and the weights rebuilt from it, which equal "
        "dense attention; and the slow-memory traffic of dense and tiled attention.",
    )
    _add_source(p)
    p.add_argument("--head", type=_positive, default=1, help="head number (from 1), default 1")
    p.add_argument(
        "--block-q", type=_positive, default=2, metavar="BR", help="query rows a block (2)"
    )
    p.add_argument(
        "--block-k", type=_positive, default=2, metavar="BC", help="key columns a block (2)"
    )
    p.add_argument(
        "--precision", choices=("float64", "float32", "float16", "bfloat16"), default="float64"
    )
    p.add_argument("--format", choices=("text", "json"), default="text")

    p = sub.add_parser(
        "import",
        help="import attention layers of a pretrained model as a scenario",
        description="Import attention layers of a pretrained transformers model (a folder "
        "in Hugging Face layout, a model id in the local cache, an installed package that "
        "bundles a model, or a model id fetched from the Hub) run on a text, and save them "
        "with the model's own attention. One layer is a scenario; several layers (one load "
        "and run of the model), --dtype model or --weights-only make one .attn.npz.",
    )
    p.add_argument("source", help="folder, model id (org/name) or installed package name")
    p.add_argument("stdin", nargs="?", metavar="-", help="read the text from standard input")
    p.add_argument("--text", help="the text to run through the model")
    p.add_argument("--text-file", metavar="FILE", help="read the text from FILE (UTF-8)")
    p.add_argument(
        "--layer",
        type=_layers,
        default="0",
        help="a layer number from 0, a range (0-5), a list (1,3-4) or all (default 0)",
    )
    p.add_argument(
        "--dtype",
        choices=("float64", "float32", "model"),
        default="float64",
        help="model: import in float64 and also run the checkpoint's own precision "
        "(bf16/fp16/fp32), keeping its attention weights and the difference",
    )
    p.add_argument(
        "--weights-only",
        action="store_true",
        help="keep the attention weights (float32) and provenance, not the layers' matrices: "
        "a file to look at in the window, not to edit",
    )
    p.add_argument(
        "--out",
        metavar="PATH",
        help="the file to write: .attn.json (text), or .attn.npz (binary, for large layers, "
        "and the only form for several layers); default: named after the model and layers, "
        "in the current folder",
    )
    return parser


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a number") from None
    if not 0 <= value < 1e3:
        raise argparse.ArgumentTypeError(f"{quoted(text)}: expected a number in [0, 1000)")
    return value


def _layer(text: str) -> int:
    return _whole(text, 0, "layers are numbered from 0")


def _layers(text: str) -> str:
    """--layer: all, a layer, a range or a list; the model's layer count is checked later."""
    from attnviz.core.layers import LayersError, parse_layers

    try:
        if text.strip() != "all":
            parse_layers(text, 2**31)
    except LayersError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--layer ")) from None
    return text.strip()


def _scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a number") from None
    if not 0.1 <= value <= 16:
        raise argparse.ArgumentTypeError(f"{quoted(text)} must be between 0.1 and 16")
    return value


def _views() -> tuple[str, ...]:
    """The views export draws: each intermediate, and the gradients d<view> beside them."""
    from attnviz.core.figures.figure import GRADIENT_VIEWS, VIEWS

    return (*VIEWS, *(f"d{v}" for v in (*GRADIENT_VIEWS, "concat", "final")))


def _version() -> str:
    from attnviz import __version__

    return __version__


def _explainable() -> tuple[str, ...]:
    from attnviz.core.maths.explain import EXPLAINABLE

    return EXPLAINABLE


def load_source(args: argparse.Namespace) -> Scenario:
    """The scenario the flags name: FILE, --preset, --example or the worked example, then
    overrides."""
    from attnviz.core import presets

    given = [x is not None for x in (args.file, args.preset, args.example)]
    if sum(given) > 1:
        raise UsageError("give one of FILE, --preset and --example, not more")
    if args.example is not None and not args.example.strip():
        raise UsageError("--example: give an example's name (attnviz examples lists them)")
    if args.file or args.example:
        if args.n is not None or args.seed is not None:
            raise UsageError("--n and --seed apply to presets, not to files")
        from attnviz.core.examples import find
        from attnviz.core.io.files import load_scenario

        s = load_scenario(args.file) if args.file else find(args.example).load()
    else:
        s = presets.make_preset(args.preset or "worked-example", args.n, args.seed)
    changes: dict[str, object] = {}
    if getattr(args, "mask", None):
        changes["mask"] = args.mask
    if getattr(args, "scaled", False) or getattr(args, "no_scale", False):
        changes["scale"] = bool(args.scaled)
    if getattr(args, "no_projections", False):
        changes["projections"] = False
    if getattr(args, "positional", None):
        changes["positional"] = args.positional
    if getattr(args, "window", None) is not None:
        changes["window"] = args.window
    return s.with_settings(**changes) if changes else s


# Text tables --------------------------------------------------------------------------


def _cell(v: float) -> str:
    return "-inf" if v == -float("inf") else f"{v:.4f}"


def table(title: str, a: np.ndarray, rows: Sequence[str], cols: Sequence[str]) -> Iterator[str]:
    """An aligned table with row and column labels, a line at a time."""
    import numpy as np

    finite = a[np.isfinite(a)]
    longest = [_cell(float(v)) for v in (finite.min(), finite.max())] if finite.size else []
    longest += ["-inf"] if np.isneginf(a).any() else []
    width = max([len(c) for c in cols] + [len(c) for c in longest])  # widest: min or max
    label = max(len(r) for r in rows)
    yield title
    yield " " * label + "  " + "  ".join(c.rjust(width) for c in cols)
    for r, row in zip(rows, a, strict=True):
        yield r.ljust(label) + "  " + "  ".join(_cell(float(v)).rjust(width) for v in row)


def result_lines(s: Scenario, r: Result) -> Iterator[str]:
    """The text form, a line at a time (a result at n = 2048 is gigabytes of text)."""
    import numpy as np

    from attnviz.core.figures.figure import variant_terms

    st = s.settings
    toks, keys = list(r.tokens), list(r.keys)
    numbered = [str(i + 1) for i in range(max(r.d_k * r.n_heads, s.d_model))]
    window = f" of {st.window}" if st.mask == "sliding-window" else ""
    yield (
        f"attnviz: {r.n_heads} head(s), n = {s.n}, d_model = {s.d_model}, d_k = {r.d_k}; "
        f"mask {st.mask}{window}, scale {'on' if st.scale else 'off'}, projections "
        f"{'on' if st.projections else 'off'}, position {st.positional}"
        + (f", dropout {st.dropout} (seed {st.dropout_seed})" if st.dropout else "")
        + "".join(f"; {long}" for _, long in variant_terms(r))
        + (f"; {s.kv_heads} key/value head(s)" if s.kv_heads != s.n_heads else "")
        + (f"; {s.m} keys of their own (cross-attention)" if s.cross else "")
    )
    for h in range(r.n_heads):
        yield from ("", f"== head {h + 1} ==")
        for name in head_fields(st):
            a = r.matrix(name, h)
            rows = keys if name in ("K", "V", "K_rot") else toks
            cols = keys if name in ("scores", "scaled", "masked", "weights") else numbered
            yield from table(f"{name}:", a, rows, cols[: a.shape[1]])
            yield ""
        columns = {"leak": r.leak[h], "row sum": r.row_sum[h], "entropy": r.entropy[h]}
        if st.sinks is not None:
            columns["sink"] = r.sink[h]
        stats = np.stack(list(columns.values()), axis=1)
        yield from table("per row:", stats, toks, list(columns))
    yield ""
    yield from table("concat:", r.concat, toks, numbered[: r.concat.shape[1]])
    yield ""
    bias = " + b_O" if "b_O" in r.biases else ""
    yield from table(
        f"final output (concat W_O{bias}):", r.final, toks, numbered[: r.final.shape[1]]
    )


def head_fields(st: Settings) -> tuple[str, ...]:
    """The per-head matrices the text and JSON give: Q_rot and K_rot too when QK-norm or
    RoPE turn Q and K."""
    from attnviz.core.maths.results import HEAD_MATRICES, TURNED_MATRICES

    turned = st.qk_norm != "none" or st.positional == "rope"
    return HEAD_MATRICES[:3] + (TURNED_MATRICES if turned else ()) + HEAD_MATRICES[3:]


def result_to_dict(s: Scenario, r: Result) -> dict[str, Any]:
    """The JSON form, its matrices as arrays (see write_json): the scenario as saved,
    per-head intermediates, concat and output.

    K and V are given per query head (repeated across a group that shares them), Q_rot
    and K_rot when QK-norm or RoPE is on, and each row's sink_weight when sinks are on.
    """
    from attnviz.core.io.files import scenario_to_dict

    heads = []
    for h in range(r.n_heads):
        head: dict[str, Any] = {name: r.matrix(name, h) for name in head_fields(s.settings)}
        head.update(leak=r.leak[h], row_sum=r.row_sum[h], entropy=r.entropy[h])
        if s.settings.sinks is not None:
            head["sink_weight"] = r.sink[h]
        heads.append(head)
    return {"scenario": scenario_to_dict(s), "heads": heads, "concat": r.concat, "output": r.final}


def write_json(out: TextIO, value: Any) -> None:
    """value as JSON (as json.dumps writes it), each array a row at a time so that a
    result at n = 2048 is never held as text; −∞ is written "-inf"."""
    import numpy as np

    if isinstance(value, dict):
        out.write("{")
        for k, (key, item) in enumerate(value.items()):
            out.write(f"{', ' if k else ''}{json.dumps(key)}: ")
            write_json(out, item)
        out.write("}")
    elif isinstance(value, np.ndarray) and value.ndim == 2:
        out.write("[")
        for k, row in enumerate(value):
            out.write(f"{', ' if k else ''}{_JSON.encode(_json_row(row))}")
        out.write("]")
    elif isinstance(value, list | tuple) and any(isinstance(v, dict | np.ndarray) for v in value):
        out.write("[")
        for k, item in enumerate(value):
            out.write(", " if k else "")
            write_json(out, item)
        out.write("]")
    else:
        row = _json_row(value) if isinstance(value, np.ndarray) else value
        out.write(_JSON.encode(row))


_JSON = json.JSONEncoder(allow_nan=False)  # made once: json.dumps with options makes one a call


def _json_row(a: np.ndarray) -> list[Any]:
    return ["-inf" if v == -float("inf") else v for v in a.tolist()]


# Commands -----------------------------------------------------------------------------


def cmd_compute(args: argparse.Namespace) -> int:
    from attnviz.core.maths.forward import compute

    s = load_source(args)
    r = compute(s)
    if args.format == "json":
        data = result_to_dict(s, r)
        if args.check:
            data["check"] = _check(s)
        write_json(sys.stdout, data)
        sys.stdout.write("\n")
        return 0
    for line in result_lines(s, r):
        sys.stdout.write(line + "\n")
    if args.check:
        c = _check(s)
        print(
            f"\ncheck on {c['device']}, {c['dtype']}: torch engine vs NumPy {c['torch']:.3g}; "
            + (
                f"{c['reference']} vs NumPy {c['sdpa']:.3g}"
                if c["sdpa"] is not None
                else c["sdpa_note"]
            )
        )
    return 0


def _check(s: Scenario) -> dict[str, Any]:
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise UsageError(f"--check needs PyTorch ({e})") from None
    from attnviz.core.maths.torch_engine import cross_check

    c = cross_check(s, "auto", "float64")
    return {
        "device": c.device,
        "dtype": c.dtype,
        "torch": c.torch_diff,
        "sdpa": c.sdpa_diff,
        "sdpa_note": c.sdpa_note,
        "reference": c.reference,
    }


def cmd_presets(_: argparse.Namespace) -> int:
    from attnviz.core.presets import PRESETS

    name_width = max(len(p.name) for p in PRESETS.values())
    title_width = max(len(p.title) for p in PRESETS.values())
    for p in PRESETS.values():
        print(f"{p.name.ljust(name_width)}  {p.title.ljust(title_width)}  {p.summary}")
    return 0


def cmd_examples(_: argparse.Namespace) -> int:
    from attnviz.core.examples import examples

    shown = examples()
    width = max(len(e.name) for e in shown)
    section = ""
    for e in shown:
        if e.section != section:
            print(f"\n{e.section}:" if section else f"{e.section}:")
            section = e.section
        print(f"  {e.name.ljust(width)}  {e.title}")
    print(f"\nThe files are in {shown[0].path.parent}; attnviz compute --example NAME uses one.")
    return 0


def _index(text: str, size: int, labels: Sequence[str] | None, what: str) -> int:
    """A 1-based number or a token label -> 0-based index."""
    if re.fullmatch(r"-?[0-9]+", text):
        i = int(text)
        if not 1 <= i <= size:
            raise UsageError(f"--{what} {i}: expected 1 to {size}")
        return i - 1
    if labels is None:
        raise UsageError(f"--{what} {quoted(text)}: expected a number from 1 to {size}")
    hits = [i for i, t in enumerate(labels) if t == text]
    if not hits:
        raise UsageError(
            f"--{what} {quoted(text)}: no token has that name ({', '.join(map(repr, labels))})"
        )
    if len(hits) > 1:
        raise UsageError(
            f"--{what} {quoted(text)}: {len(hits)} tokens have that name; use a number"
        )
    return hits[0]


def cmd_explain(args: argparse.Namespace) -> int:
    from attnviz.core.maths.explain import EXPLAINABLE, explain, format_text
    from attnviz.core.maths.forward import compute
    from attnviz.core.maths.results import HEAD_MATRICES, TURNED_MATRICES

    s = load_source(args)
    r = compute(s)
    if args.matrix not in EXPLAINABLE:
        raise UsageError(
            f"--matrix {quoted(args.matrix)}: expected one of {', '.join(EXPLAINABLE)}"
        )
    head = None
    if args.matrix in HEAD_MATRICES + TURNED_MATRICES:
        if args.head is None:
            raise UsageError(f"--matrix {args.matrix} needs --head (1 to {r.n_heads})")
        if args.head > r.n_heads:
            raise UsageError(f"--head {args.head}: the scenario has {r.n_heads} head(s)")
        head = args.head - 1
    elif args.head is not None:
        raise UsageError(f"--matrix {args.matrix} is not per head: leave out --head")
    shape = r.matrix(args.matrix, head).shape
    keyed = args.matrix in ("scores", "scaled", "masked", "weights")
    rows = r.keys if args.matrix in ("K", "V", "K_rot") else r.tokens  # keys' rows under cross
    row = _index(args.row, shape[0], rows, "row")
    col = _index(args.col, shape[1], r.keys if keyed else None, "col")
    print(format_text(explain(s, r, args.matrix, head, row, col)))
    return 0


def parse_loss(text: str | None, target: str | None, s: Scenario) -> Any:
    """--loss and --target as a losses.Loss, checked against the scenario's output; the
    scenario's own loss where they are left out."""
    from attnviz.core.maths.losses import Loss

    own = Loss.of(s.settings)
    target = target or str(own.target)
    if text is None:
        return Loss(own.kind, target, own.cell)
    if text in ("target", "next-token"):
        return Loss(text, target)
    found = re.fullmatch(r"cell:(\d+),(\d+)", text)
    if not found:
        raise UsageError(f"--loss {quoted(text)}: expected target, next-token or cell:I,J")
    i, j = int(found[1]), int(found[2])
    if not (1 <= i <= s.n and 1 <= j <= s.d_model):
        raise UsageError(f"--loss {text}: the output is {s.n}×{s.d_model} (rows and columns "
                         "from 1)")  # fmt: skip
    return Loss("cell", cell=(i - 1, j - 1))


def cmd_grad(args: argparse.Namespace) -> int:
    from attnviz.core.maths.backward import HEAD_GRADIENTS
    from attnviz.core.maths.losses import gradients

    s = load_source(args)
    loss = parse_loss(args.loss, args.target, s)
    g = gradients(s, loss)
    what = {"target": f"target ({loss.target})", "next-token": "next-token"}.get(
        loss.kind, f"cell:{loss.cell[0] + 1},{loss.cell[1] + 1}"
    )
    if args.format == "json":
        doc = {
            "loss": {"kind": loss.kind, "name": what, "value": g.loss},
            "inputs": dict(g.inputs),
            "heads": [{name: getattr(h, name) for name in HEAD_GRADIENTS} for h in g.heads],
            "concat": g.concat,
            "final": g.final,
        }
        write_json(sys.stdout, doc)
        sys.stdout.write("\n")
        return 0
    for line in gradient_lines(s, g, what):
        sys.stdout.write(line + "\n")
    return 0


def gradient_lines(s: Scenario, g: Any, what: str) -> Iterator[str]:
    """The text form of every gradient, a line at a time, named as the views name them."""
    from attnviz.core.maths.backward import HEAD_GRADIENTS

    toks, keys = list(s.tokens), list(s.key_tokens)
    numbered = [str(i + 1) for i in range(max(s.d_model, 1024))]
    yield f"loss {what} = {g.loss:.10g}"
    d_k = g.heads[0].Q.shape[1] if g.heads else 0
    mixed = [f"h{k // d_k + 1}·{k % d_k + 1}" for k in range(len(g.heads) * d_k)]
    for name, a in g.inputs.items():
        kind = "head" if name in ("W_Q", "b_Q", "q_norm") or s.kv_heads == s.n_heads else (
            "key/value head")  # fmt: skip
        for h, matrix in enumerate(a if a.ndim == 3 else [a]):
            head = f" ({kind} {h + 1})" if a.ndim == 3 else ""
            rows = {"X": toks, "X_kv": keys, "W_O": mixed}.get(name, numbered[: len(matrix)])
            yield ""
            yield from table(f"dL/d{name}{head}:", matrix, rows, numbered[: matrix.shape[1]])
    for h, head_grads in enumerate(g.heads):
        yield from ("", f"== head {h + 1} ==")
        for name in HEAD_GRADIENTS:
            a = getattr(head_grads, name)
            rows = keys if name in ("K", "V", "K_rot") else toks
            cols = keys if name in ("scores", "scaled", "masked", "weights") else numbered
            yield from table(f"dL/d{name}:", a, rows, cols[: a.shape[1]])
            yield ""
    yield from table("dL/dconcat:", g.concat, toks, numbered[: g.concat.shape[1]])
    yield ""
    yield from table("dL/dfinal:", g.final, toks, numbered[: g.final.shape[1]])


def cmd_train(args: argparse.Namespace) -> int:
    from attnviz.core import presets
    from attnviz.core.io.files import atomic_write, save_scenario
    from attnviz.core.io.outputs import SCENARIO_SUFFIXES
    from attnviz.core.maths.optimizers import Optimizer
    from attnviz.core.maths.tasks import load_task
    from attnviz.core.maths.training import Trainer

    reads = [args.file] if args.file else []
    _check_output(args.out, SCENARIO_SUFFIXES, reads)
    if args.log:
        _check_output(args.log, (".csv",), [*reads, args.out], flag="--log")
    seed = args.seed or 0
    preset = presets.PRESETS.get(args.preset or "worked-example")
    if args.file or preset is None or not preset.sized:
        args.seed = None  # the run's seed only; a sized preset's weights take it too
    s = load_source(args)
    if args.task == "scenario":
        loss = parse_loss(args.loss, args.target, s)
        s = s.with_settings(loss=loss.kind, loss_target=str(loss.target), loss_cell=loss.cell)
    elif args.loss or args.target:
        raise UsageError("--loss and --target apply to --task scenario: a task has its own")
    opt = Optimizer(args.optimizer, lr=args.lr, weight_decay=args.weight_decay, clip=args.clip)
    trains = [name.strip() for name in (args.train or "").split(",") if name.strip()]
    task = None if args.task == "scenario" else load_task(args.task)
    trainer = Trainer(s, opt, task, seed=seed, trains=trains or None, batch=args.batch)
    first, last, rows = _train_rows(trainer, args.steps)
    save_scenario(args.out, trainer.scenario)
    if args.log:
        atomic_write(args.log, ("step,loss,held_out,inference\n" + "".join(rows)).encode())
    what = "" if task is None else f" on {task.name}"
    held = "" if last.held_out is None else f"; held-out loss {last.held_out:.6g}"
    print(
        f"trained {', '.join(trainer.trains)}{what} for {args.steps:,} steps ({opt.kind}, lr "
        f"{opt.lr:g}, seed {seed}): loss {first.train:.6g} → {last.train:.6g}{held}; "
        f"inference loss (each position its past only) {last.inference:.6g}"
    )
    print(f"wrote {one_line(args.out)}" + (f" and {one_line(args.log)}" if args.log else ""))
    return 0


def _train_rows(trainer: Trainer, steps: int) -> tuple[Losses, Losses, list[str]]:
    """Run the steps with a progress line. The CSV's row k: the loss after k steps (a
    task's: its next batch's; the last row: over every training example) and, every
    hundredth of the run, the held-out and inference losses."""
    progress = StepPrinter(sys.stderr)
    # a terminal's line rewritten a hundred times; a log's a line each tenth of the run
    every = max(1, steps // (100 if progress.terminal else 10))
    evaluate = max(1, steps // 100)
    at = {0: trainer.losses()}
    losses = []
    try:
        for k in range(1, steps + 1):
            losses.append(trainer.step())
            if k % evaluate == 0 or k == steps:
                at[k] = trainer.losses()
            if k % every == 0:
                progress(f"step {k:,} of {steps:,}: loss {losses[-1]:.6g}", k / steps)
    finally:
        progress.close()
    losses.append(at[steps].train)
    rows = []
    for k, loss in enumerate(losses):
        held = "" if k not in at or at[k].held_out is None else repr(at[k].held_out)
        inference = repr(at[k].inference) if k in at else ""
        rows.append(f"{k},{loss!r},{held},{inference}\n")
    return at[0], at[steps], rows


def cmd_code(args: argparse.Namespace) -> int:
    from attnviz.core.io.codegen import to_script

    source = args.file or args.example or args.preset or "worked-example"
    blocks = (args.block_q, args.block_k)
    script = to_script(
        load_source(args), args.flavor, source=source, blocks=blocks, backward=args.backward
    )
    sys.stdout.write(script)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from attnviz.core.figures.figure import VIEWS, spec_for, svg_size, to_svg
    from attnviz.core.io.files import atomic_write
    from attnviz.core.maths.results import HEAD_MATRICES, TURNED_MATRICES
    from attnviz.core.maths.streaming import layer

    if args.view not in _views():
        raise UsageError(f"--view {quoted(args.view)}: expected one of {', '.join(_views())}")
    fmt = args.format or os.path.splitext(args.out)[1].lower().lstrip(".")
    if fmt not in ("png", "svg"):
        raise UsageError(f"--out {args.out}: give --format png or svg, or a .png or .svg name")
    _check_output(args.out, (f".{fmt}",), reads=[args.file] if args.file else [])
    s = load_source(args)
    n_heads = s.n_heads if s.settings.projections else 1
    if args.head > n_heads:
        raise UsageError(f"--head {args.head}: the scenario has {n_heads} head(s)")
    if args.view not in VIEWS:  # a gradient, dL/d(view), for the scenario's own loss
        spec = _gradient_spec(s, args.view[1:], args.head - 1)
    elif args.view in (*HEAD_MATRICES, *TURNED_MATRICES, "X"):
        spec = _one_head_spec(s, args.view, args.head - 1)
    else:  # concat and final mix every head; layer() stores no n × n matrix
        spec = spec_for(layer(s), args.view)
    try:
        if fmt == "svg":
            svg = to_svg(spec)
            svg_size(svg)  # well-formed XML, or an error and no file
            atomic_write(args.out, svg.encode("utf-8"))
        else:
            if not os.environ.get("QT_QPA_PLATFORM", "").startswith("offscreen"):
                os.environ["QT_QPA_PLATFORM"] = "offscreen"  # never shows anything
            from PySide6.QtWidgets import QApplication

            from attnviz.ui.images import write_png

            # A QApplication (not a QGuiApplication), so that windows may follow in-process.
            _app = QApplication.instance() or QApplication(["attnviz"])
            write_png(spec, args.out, args.scale)
    except (OSError, ValueError) as e:
        raise UsageError(f"--out {args.out}: {getattr(e, 'strerror', None) or e}") from None
    print(f"wrote {args.out} ({spec.title})")
    return 0


def _span(pair: tuple[int, int]) -> list[int]:
    """0-based [start, stop) as a 1-based inclusive [first, last]."""
    return [pair[0] + 1, pair[1]]


def _finite(a: Any) -> Any:
    """An array as JSON lists, with null for −∞ and NaN (JSON has neither)."""
    import numpy as np

    values = np.asarray(a, dtype=np.float64).astype(object)
    values[~np.isfinite(values.astype(np.float64))] = None
    return values.tolist()


def cmd_tiles(args: argparse.Namespace) -> int:
    import numpy as np

    from attnviz.core.maths.forward import compute_head
    from attnviz.core.maths.tiling import overflowed_text, tiles

    s = load_source(args)
    heads = s.n_heads if s.settings.projections else 1
    if args.head > heads:
        raise UsageError(f"--head {args.head}: the scenario has {heads} head(s)")
    t = tiles(s, args.head - 1, args.block_q, args.block_k, args.precision)
    kept = ~t.overflowed
    dense = compute_head(s, args.head - 1).output
    error = float(np.abs(t.output[kept] - dense[kept]).max()) if kept.any() else None
    overflowed = [int(i) + 1 for i in np.flatnonzero(t.overflowed)]
    traffic = t.traffic()
    if args.format == "json":
        doc = {
            "head": args.head,
            "block_q": args.block_q,
            "block_k": args.block_k,
            "precision": args.precision,
            "steps": [
                {
                    "q_rows": _span(step.rows),
                    "k_cols": _span(step.cols),
                    "skipped": step.skipped,
                    "m": _finite(step.m_new),
                    "l": _finite(step.l_new),
                    "O": _finite(step.O),
                }
                for step in t.steps
            ],
            "output": _finite(t.output),
            "lse": _finite(t.lse),
            "weights_from_lse": _finite(t.weights_from_lse),
            "max_error_vs_dense": error,
            "overflowed_rows": overflowed,
            "traffic": {
                "dense_reads": traffic.dense_reads,
                "dense_writes": traffic.dense_writes,
                "tiled_reads": traffic.tiled_reads,
                "tiled_writes": traffic.tiled_writes,
            },
        }
        print(json.dumps(doc))
        return 0
    print(
        f"head {args.head}: {len(t.steps)} tiles of {args.block_q} query rows × "
        f"{args.block_k} key columns, {t.skipped} skipped by the mask ({args.precision})"
    )
    for step in t.steps:
        where = f"rows {step.rows[0] + 1}–{step.rows[1]}, keys {step.cols[0] + 1}–{step.cols[1]}"
        if step.skipped:
            print(f"  {where}: skipped (the mask hides every key)")
            continue
        m = " ".join(f"{v:.4g}" for v in step.m_new)
        l = " ".join(f"{v:.4g}" for v in step.l_new)
        print(f"  {where}: m = [{m}]  l = [{l}]" + ("  (block done)" if step.last else ""))
    columns = [str(j + 1) for j in range(t.output.shape[1])]
    print(table("output O / l", t.output, s.tokens, columns))
    print(f"log-sum-exp: {' '.join(f'{v:.6g}' for v in t.lse)}")
    if overflowed:
        print(f"{overflowed_text(t, s.tokens)}: their output and log-sum-exp are nan")
    if error is not None:
        print(f"largest difference from dense attention's output: {error:.2e}")
    print(
        f"slow-memory traffic (numbers): dense {traffic.dense:,} ({traffic.dense_reads:,} "
        f"read, {traffic.dense_writes:,} written); tiled {traffic.tiled:,} "
        f"({traffic.tiled_reads:,} read, {traffic.tiled_writes:,} written)"
    )
    return 0


MAX_TEXT_CHARS = 2**19  # the most a provenance's text holds


def import_text(args: argparse.Namespace) -> str:
    """The text of --text, --text-file FILE or - (standard input): exactly one, at most
    MAX_TEXT_CHARS characters; bytes that are not UTF-8 are named by the tokenizer."""
    if args.stdin is not None and args.stdin != "-":
        raise UsageError(
            f"unexpected argument {quoted(args.stdin)}; give - to read the text from standard input"
        )
    given = [x is not None for x in (args.text, args.text_file, args.stdin)]
    if sum(given) != 1:
        raise UsageError(
            "give the text once: --text T, --text-file FILE or - (standard input)"
            + ("" if sum(given) else "; none was given")
        )
    if args.text is not None:
        text: str = args.text
        where = "--text"
    elif args.text_file is not None:
        from attnviz.core.io.files import FileFormatError, read_file

        where = f"--text-file {one_line(args.text_file)}"
        try:
            data = read_file(args.text_file, 4 * MAX_TEXT_CHARS)
        except FileFormatError as e:
            raise UsageError(f"--text-file {e}") from None
        text = data.decode("utf-8", "surrogateescape").removeprefix("\ufeff")
    else:
        where = "standard input"
        data = sys.stdin.buffer.read(4 * MAX_TEXT_CHARS + 1)
        if len(data) > 4 * MAX_TEXT_CHARS:
            raise UsageError(
                f"standard input: over {4 * MAX_TEXT_CHARS:,} bytes; use a shorter text"
            )
        text = data.decode("utf-8", "surrogateescape").removeprefix("\ufeff")
    if len(text) > MAX_TEXT_CHARS:
        raise UsageError(
            f"{where}: {len(text):,} characters; an import takes at most {MAX_TEXT_CHARS:,}"
        )
    return text


def cmd_import(args: argparse.Namespace) -> int:
    from attnviz.core.io.outputs import SCENARIO_SUFFIXES
    from attnviz.core.models.sources import Cancelled

    text = import_text(args)
    several = not args.layer.isdigit() or args.dtype == "model" or args.weights_only
    model = [args.source] if os.path.isdir(args.source) else []
    suffixes = (".attn.npz",) if several else SCENARIO_SUFFIXES
    _check_output(args.out or "model.attn.npz", suffixes, folders=model)
    steps = StepPrinter(sys.stderr)
    try:
        if several:
            return _import_layers(args, text, steps)
        return _import_one(args, text, steps)
    except (Cancelled, KeyboardInterrupt):
        steps.close()
        print("attnviz: import cancelled", file=sys.stderr)
        return 130
    finally:
        steps.close()


def _import_one(args: argparse.Namespace, text: str, steps: StepPrinter) -> int:
    from attnviz.core.io.files import save_scenario
    from attnviz.core.io.outputs import free_name
    from attnviz.core.models.importer import Request, import_model_layer

    layer = int(args.layer)
    got = import_model_layer(Request(args.source, text, layer, args.dtype), report=steps)
    steps.close()
    s, p = got.scenario, got.provenance
    # a name the user did not give never replaces a file
    out = args.out or free_name(default_import_name(args.source, layer, s))
    try:
        save_scenario(out, s)
    except OSError as e:
        raise UsageError(f"--out {out}: {e.strerror or e}") from None
    print(
        f"imported layer {p.layer} of {p.layers} from {one_line(p.source)} "
        f"({p.model_type}, {p.kind}): "
        f"{s.n} tokens, {s.n_heads} heads ({s.kv_heads} key/value), d_model {s.d_model}, "
        f"d_k {s.d_k}, in {got.seconds:.1f} s\n"
        f"agreement with the model ({got.dtype}): attention weights {got.agreement_weights:.1e}, "
        f"attention output {got.agreement_output:.1e}\n"
        f"wrote {one_line(out)} ({os.path.getsize(out) / 2**20:.1f} MiB)"
    )
    return 0


def _import_layers(args: argparse.Namespace, text: str, steps: StepPrinter) -> int:
    from attnviz.core.io.layers_files import save_layers
    from attnviz.core.io.outputs import free_name
    from attnviz.core.layers import spans
    from attnviz.core.models.importer import Request, import_model_layers

    got = import_model_layers(
        Request(args.source, text, 0, args.dtype),
        args.layer,
        weights_only=args.weights_only,
        report=steps,
    )
    steps.close()
    stack, run = got.layers, got.layers.run
    model = os.path.basename(args.source.rstrip("/\\")).strip(".") or "model"
    kept = "-weights" if stack.weights_only else ""
    out = args.out or free_name(
        f"{model}-layers{spans(stack.stored).replace(', ', '_')}{kept}.attn.npz"
    )
    try:
        save_layers(out, stack)
    except OSError as e:
        raise UsageError(f"--out {out}: {e.strerror or e}") from None
    heads, n = stack.weights[0].shape[:2]
    lines = [
        f"imported layers {spans(stack.stored)} of {run.layers} from {one_line(run.source)} "
        f"({run.model_type}, {run.kind}) in one run: {n} tokens, {heads} heads, "
        f"in {got.seconds:.1f} s"
    ]
    worst = max(range(len(got.agreement)), key=lambda i: max(got.agreement[i]))
    where = (
        f"in layer {stack.stored[0]}, computed whole (the others' weights are the same run's)"
        if stack.weights_only
        else f"at worst over the layers (layer {stack.stored[worst]})"
    )
    lines.append(f"agreement with the model ({stack.dtype}): {got.worst:.1e} {where}")
    if stack.native:
        gaps = [stack.native_gap(i) or 0.0 for i in range(len(stack.stored))]
        i = max(range(len(gaps)), key=gaps.__getitem__)
        lines.append(
            f"the model in its own precision ({stack.native}) differs from float64 by up to "
            f"{gaps[i]:.1e} in the attention weights (layer {stack.stored[i]}); kept in the file"
        )
    if stack.weights_only:
        lines.append("weights only: the attention weights (float32), no matrices (look, not edit)")
    lines.append(f"wrote {one_line(out)} ({os.path.getsize(out) / 2**20:.1f} MiB)")
    print("\n".join(lines))
    return 0


class StepPrinter:
    """An import's progress on a stream: a line for each step ("Unpacking the model…"),
    or, on a terminal, one line that each report rewrites, with the bytes done, and that
    is cleared at the end."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.terminal = stream.isatty()
        self.step = ""
        self.shown = 0  # characters on the terminal's line

    def __call__(self, what: str, fraction: float) -> None:
        if fraction >= 1:
            return
        step = what.partition(" (")[0]  # "Unpacking the model (3 of 91 MB)" is one step
        if self.terminal:
            self._rewrite(f"  {what}…")
        elif step != self.step:
            self.stream.write(f"  {step}…\n")
        self.step = step
        self.stream.flush()

    def _rewrite(self, text: str) -> None:
        self.stream.write("\r" + text.ljust(self.shown))
        self.shown = len(text)

    def close(self) -> None:
        """Clear the terminal's progress line (the next message starts on a clean line)."""
        if self.terminal and self.shown:
            self._rewrite("")
            self.stream.write("\r")
            self.stream.flush()
        self.shown = 0


def _check_output(
    out: str,
    suffixes: Sequence[str],
    reads: Sequence[str] = (),
    folders: Sequence[str] = (),
    flag: str = "--out",
) -> None:
    """Before any work: out can be written and is none of what the command reads."""
    from attnviz.core.io.outputs import output_problem

    problem = output_problem(out, suffixes, reads, folders)
    if problem is not None:
        raise UsageError(f"{flag} {out}: {problem}; nothing was written")


def default_import_name(source: str, layer: int, s: Scenario) -> str:
    """``<model>-layer<L>.attn.json`` (``.attn.npz`` for layers of over a million weights)."""
    from attnviz.core.io.files import file_name_for

    model = os.path.basename(source.rstrip("/\\")).strip(".") or "model"
    return file_name_for(f"{model}-layer{layer}", s)


def _one_head_spec(s: Scenario, view: str, head: int) -> HeatmapSpec:
    """spec_for(compute(s), view, head) for a per-head view or X, computing that head only."""
    from attnviz.core.figures.figure import spec_for
    from attnviz.core.maths.forward import one_head

    return spec_for(one_head(s, head), view, head)


def _gradient_spec(s: Scenario, view: str, head: int) -> HeatmapSpec:
    """The heatmap of dL/d(view) for the scenario's own loss, as the Pipeline draws it
    beside the view (concat and final: the layer's, not a head's)."""
    from attnviz.core.figures.figure import gradient_spec, spec_for
    from attnviz.core.maths.forward import compute
    from attnviz.core.maths.losses import gradients

    r = compute(s)
    g = gradients(s, r=r)
    layer_wide = view in ("concat", "final")
    value = spec_for(r, view, None if layer_wide else head)
    spec = gradient_spec(value, g.matrix(view, head), view, head, s.settings.mask,
                         g.heads[head].future)  # fmt: skip
    return dataclasses.replace(spec, title=f"dL/d{view}") if layer_wide else spec


def one_line(text: str, most: int = 1000) -> str:
    """text with control characters escaped (\\n, \\x1b): one line, and no terminal codes;
    its middle left out beyond ``most`` characters (a name the user gave may be huge)."""
    if len(text) > most:
        left = len(text) - most * 9 // 10
        text = f"{text[: most * 7 // 10]} … ({left:,} characters left out) … {text[-most // 5 :]}"
    return re.sub(r"[\x00-\x1f\x7f-\x9f]", lambda m: ascii(m.group())[1:-1], text)


def _looks_like_a_file(text: str) -> bool:
    """Whether a missing FILE was meant as a path: a folder in it, or an extension."""
    separators = {os.sep, "/"} | ({os.altsep} if os.altsep else set())
    return any(sep in text for sep in separators) or bool(os.path.splitext(text)[1])


def open_window(path: str | None) -> int:
    """No subcommand: the desktop window, on FILE when given."""
    if path is not None and not os.path.isfile(path):
        from attnviz.core.io.files import not_a_file

        why = not_a_file(path)  # a folder, a pipe, … is named, even without an extension
        if why != "no such file" or _looks_like_a_file(path):
            print(f"attnviz: {one_line(path)}: {why}", file=sys.stderr)
        else:
            commands = ", ".join(SUBCOMMANDS)
            print(
                f"attnviz: {quoted(path)} is not a command or a file; commands: {commands}",
                file=sys.stderr,
            )
        return EXIT_USAGE
    from attnviz.ui.platform_check import problem

    why = problem()
    if why:
        print(why, file=sys.stderr)
        return 1
    from attnviz.ui.app import run

    return run(path)


COMMANDS = {
    "compute": cmd_compute,
    "presets": cmd_presets,
    "examples": cmd_examples,
    "explain": cmd_explain,
    "export": cmd_export,
    "grad": cmd_grad,
    "train": cmd_train,
    "code": cmd_code,
    "tiles": cmd_tiles,
    "import": cmd_import,
}
SUBCOMMANDS = (
    "compute",
    "presets",
    "examples",
    "bench",
    "explain",
    "grad",
    "train",
    "code",
    "export",
    "tiles",
    "import",
)  # as --help lists them


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":  # torch and the standard library only (GPU machines)
        from attnviz.bench.cli import main as bench_main

        return bench_main(argv[1:])
    if not argv or (len(argv) == 1 and argv[0] not in COMMANDS and not argv[0].startswith("-")):
        return open_window(argv[0] if argv else None)
    from attnviz.core.maths.scenario import ScenarioError

    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # named here, where the command is known, not by the top-level parser
            raise UsageError(
                f"unrecognized arguments: {' '.join(unknown)}; see 'attnviz {args.command} --help'"
            )
        code = COMMANDS[args.command](args)
        sys.stdout.flush()  # a full disk or a closed pipe is found here, not at exit
        return code
    except (UsageError, ScenarioError) as e:
        print(f"attnviz: {one_line(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # the reader went away (| head): not an error
        _drop_stdout()
        return 0
    except OSError as e:  # a full disk, an unreadable output: one line, never exit 0
        _drop_stdout()
        where = f" ({one_line(os.fsdecode(e.filename))})" if e.filename else ""
        print(f"attnviz: {e.strerror or e}{where}; the output is incomplete", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _drop_stdout()
        print("attnviz: interrupted; files are written whole or not at all", file=sys.stderr)
        return 130


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that its unwritten rest is not retried at exit."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):  # no real stdout (a test's capture)
        pass
