"""The editable state: tokens, X, the heads' projections, W_O and the settings.

A ``Scenario`` is immutable and always valid: every constructor path checks shapes,
numbers and limits, and every edit returns a new scenario that shares the matrices it
did not touch. Conventions follow the brief: row vectors, ``X`` is ``n × d_model``, each
head's ``W_Q``, ``W_K``, ``W_V`` are ``d_model × d_k``, ``W_O`` is ``(h·d_k) × d_model``.

What current models add is optional and neutral by default: biases (zero), QK-norm
weights (one), key/value heads shared by groups of query heads (G = H: one each), a
separate key/value input ``X_kv`` (cross-attention: m keys for n queries), a custom
0/1 mask, the settings for RoPE, ALiBi, soft-capping and sinks, and T5's learned
relative position bias (a table of buckets × heads).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnviz.core.maths.head_stack import HeadStack
from attnviz.core.maths.variants import (
    RELATIVE_BUCKETS_MOST as RELATIVE_BUCKETS_MOST,
)
from attnviz.core.maths.variants import (
    RELATIVE_DISTANCE_MOST as RELATIVE_DISTANCE_MOST,
)
from attnviz.core.maths.variants import (
    alibi_slopes,
    relative_exact,
    visible,
)
from attnviz.core.provenance import Provenance

MASKS = ("none", "causal", "causal-zero", "drop-after-softmax", "sliding-window", "custom")
MINUS_INF_MASKS = ("causal", "sliding-window", "custom")  # hidden keys get −∞: weight 0
POSITIONALS = ("none", "sinusoidal", "rope", "alibi", "relative-bias")
ALIGNMENTS = ("top-left", "bottom-right")
ROPE_STYLES = ("half", "interleaved")
QK_NORMS = ("none", "rms", "rms-whole")  # rms-whole: over all heads together (OLMo 2)
LOSSES = ("target", "next-token", "cell")  # what the gradients are of (maths/losses.py)
LOSS_TARGETS = ("previous-token", "copy-self", "first-token", "custom")  # custom: the T grid
WEIGHT_NAMES = ("W_Q", "W_K", "W_V")
Q_HEAD_NAMES = ("W_Q", "b_Q", "q_norm")  # one per query head
KV_HEAD_NAMES = ("W_K", "W_V", "b_K", "b_V", "k_norm")  # one per key/value head
HEAD_NAMES = Q_HEAD_NAMES + KV_HEAD_NAMES  # per-head stacks, (heads, rows, cols)
OPTIONAL_NAMES = ("b_Q", "q_norm", "b_K", "b_V", "k_norm", "b_O")  # neutral when left out
MATRIX_NAMES = ("X", *HEAD_NAMES, "W_O", "b_O", "X_kv", "mask_matrix", "target", "relative_bias")


@dataclass(frozen=True)
class Limits:
    """Sizes and values a scenario may hold (documented in the README)."""

    tokens: int = 2048
    d_model: int = 8192
    heads: int = 128
    d_k: int = 512
    score_cells: int = 2**26  # heads × n × m, so that every intermediate fits in memory
    weight_cells: int = 2**27  # all heads' W_Q, W_K and W_V together
    abs_value: float = 1e6
    token_chars: int = 64


LIMITS = Limits()
SOFTCAP_LEAST = 1e-6  # a smaller soft-cap c overflows the scores' s/c
PER_HEAD_MOST = 1e4  # sinks and ALiBi slopes lie within ±PER_HEAD_MOST


class ScenarioError(ValueError):
    """A scenario field is invalid; the message names the field and the problem."""


# What a token label may not hold: control characters (Unicode category Cc, so no tab or
# newline either), lone surrogates and non-characters. Labels are printed to terminals and
# written into SVG (XML), where these would garble the output or make it unreadable.
_BAD_LABEL_CHARS = re.compile(
    "[\x00-\x1f\x7f-\x9f\ud800-\udfff\ufdd0-\ufdef"
    + "".join(f"{chr(p + 0xFFFE)}{chr(p + 0xFFFF)}" for p in range(0, 0x110000, 0x10000))
    + "]"
)


def label_problem(label: str) -> str:
    """Why label cannot name a token ('' when it can): the first character it may not hold."""
    bad = _BAD_LABEL_CHARS.search(label)
    if bad is None:
        return ""
    code = ord(bad.group())
    if code <= 0x9F:
        kind = "a control character"
    elif 0xD800 <= code <= 0xDFFF:
        kind = "a lone surrogate"
    else:
        kind = "a non-character"
    return f"holds U+{code:04X}, {kind}; a token label must be printable text"


@dataclass(frozen=True)
class Settings:
    """How attention is computed over the scenario's matrices."""

    projections: bool = True
    scale: bool = True
    mask: str = "causal"
    positional: str = "none"
    dropout: float = 0.0
    dropout_seed: int = 0
    ablated: tuple[int, ...] = ()  # heads (0-based) switched off in the W_O mix
    window: int = 4  # sliding-window: query i sees keys i − window < j ≤ i
    causal_alignment: str = "top-left"  # or bottom-right: j ≤ i + (m − n)
    rope_base: float = 10000.0
    rope_style: str = "half"  # pairs i, i + r/2 (GPT-NeoX, Llama); "interleaved": 2i, 2i+1
    rope_dims: int | None = None  # how many leading features RoPE turns; None: all (even)
    # a model's own frequency per pair (scaled RoPE: Llama 3, YaRN, …); None: the base's
    rope_frequencies: tuple[float, ...] | None = None
    rope_factor: float = 1.0  # multiplies cos and sin (YaRN's attention factor)
    alibi_slopes: tuple[float, ...] | None = None  # one per query head; None: the paper's
    # relative-bias (T5): each score gets relative_bias[bucket(j − i), h]
    relative_buckets: int = 32  # T5's relative_attention_num_buckets
    relative_max_distance: int = 128  # T5's relative_attention_max_distance
    relative_bidirectional: bool = True  # an encoder's (keys after the query count too)
    scale_value: float | None = None  # replaces 1/√d_k when scale is on
    # "rms": RMSNorm of Q and K over each head's d_k, times q_norm/k_norm; "rms-whole":
    # the mean square per token over every head's features together (heads·d_k), then
    # the same per-head weights (OLMo 2 normalises the whole projection)
    qk_norm: str = "none"
    qk_norm_eps: float = 1e-6
    softcap: float | None = None  # scores become c·tanh(s/c)
    sinks: tuple[float, ...] | None = None  # one logit per query head, in the denominator
    loss: str = "target"  # the loss the gradients are of: one of LOSSES
    loss_target: str = "previous-token"  # the target output of the "target" loss
    loss_cell: tuple[int, int] = (0, 0)  # the output cell (row, column) of the "cell" loss

    def __post_init__(self) -> None:
        self._check_choices()
        self._check_numbers()
        _check_cell(self.loss_cell)
        for name in ("alibi_slopes", "sinks"):
            _check_per_head(name, getattr(self, name))
        _check_ablated(self.ablated)

    def _check_choices(self) -> None:
        """The switches and the named choices."""
        for name in ("projections", "scale", "relative_bidirectional"):
            if not isinstance(getattr(self, name), bool):
                raise ScenarioError(f"settings.{name}: expected true or false")
        for name, allowed in (
            ("mask", MASKS),
            ("positional", POSITIONALS),
            ("causal_alignment", ALIGNMENTS),
            ("rope_style", ROPE_STYLES),
            ("qk_norm", QK_NORMS),
            ("loss", LOSSES),
            ("loss_target", LOSS_TARGETS),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ScenarioError(
                    f"settings.{name}: {value!r} is not one of {', '.join(allowed)}"
                )

    def _check_numbers(self) -> None:
        """The numbers: bases, scales, RoPE's width, the window, the dropout."""
        _positive("rope_base", self.rope_base, above=1.0)
        _positive("rope_factor", self.rope_factor, above=0.0, most=1e3)
        _check_frequencies(self.rope_frequencies)
        _positive("qk_norm_eps", self.qk_norm_eps, above=0.0, most=1.0)
        for name in ("scale_value", "softcap"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name), above=0.0)
        if self.softcap is not None and self.softcap < SOFTCAP_LEAST:
            raise ScenarioError(
                f"settings.softcap: expected at least {SOFTCAP_LEAST:g} (a smaller cap "
                f"overflows the scores divided by it), got {self.softcap!r}"
            )
        if self.rope_dims is not None:
            _whole("rope_dims", self.rope_dims, 2, LIMITS.d_k, "an even number", even=True)
        _whole("window", self.window, 1, LIMITS.tokens, "a whole number of keys")
        _check_relative(self)
        p = self.dropout
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ScenarioError(f"settings.dropout: expected a probability in [0, 1), got {p!r}")
        s = self.dropout_seed
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**32:
            raise ScenarioError(
                f"settings.dropout_seed: expected an integer in [0, 2^32), got {s!r}"
            )

    def replace(self, **changes: object) -> Settings:
        """A copy with some settings changed (validated)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def _check_relative(st: Settings) -> None:
    """T5's buckets: at least one exact distance per direction, and a largest distance
    beyond the exact ones (else T5's logarithm divides by log 1 = 0)."""
    least = 4 if st.relative_bidirectional is True else 2
    _whole("relative_buckets", st.relative_buckets, least, RELATIVE_BUCKETS_MOST, "a whole number")
    exact = relative_exact(st.relative_buckets, st.relative_bidirectional)
    _whole(
        "relative_max_distance",
        st.relative_max_distance,
        exact + 1,
        RELATIVE_DISTANCE_MOST,
        f"a distance beyond the {exact} with buckets of their own,",
    )


def _check_cell(cell: object) -> None:
    """loss_cell: a row and a column of the output, from 0 (the scenario checks its size)."""
    if not (
        isinstance(cell, tuple)
        and len(cell) == 2
        and all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in cell)
    ):
        raise ScenarioError(f"settings.loss_cell: expected a row and a column, got {cell!r}")


def _whole(name: str, value: object, low: int, high: int, what: str, even: bool = False) -> None:
    """Check a setting is a whole number from low to high (even, if asked)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not low <= value <= high
        or (even and value % 2)
    ):
        raise ScenarioError(f"settings.{name}: expected {what} from {low} to {high}, got {value!r}")


def _check_per_head(name: str, values: object) -> None:
    """One number within ±10000 per query head (sinks, ALiBi slopes), or None."""
    if values is None:
        return
    if not isinstance(values, tuple) or not values or len(values) > LIMITS.heads:
        raise ScenarioError(f"settings.{name}: expected one number per query head")
    for h, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not abs(v) <= PER_HEAD_MOST:
            raise ScenarioError(
                f"settings.{name}[{h + 1}]: expected a number within ±{PER_HEAD_MOST:g}, got {v!r}"
            )


def _check_frequencies(values: object) -> None:
    """RoPE's frequencies per pair: positive numbers (radians per position), or None."""
    if values is None:
        return
    if not isinstance(values, tuple) or not values or len(values) > LIMITS.d_k // 2:
        raise ScenarioError("settings.rope_frequencies: expected one number per pair of RoPE")
    for k, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1e3:
            raise ScenarioError(
                f"settings.rope_frequencies[{k + 1}]: expected a number greater than 0 and "
                f"at most 1000 (radians per position), got {v!r}"
            )


def _check_ablated(heads: object) -> None:
    """Heads switched off: 0-based, in order, each once (messages number them from 1)."""
    if not isinstance(heads, tuple):
        raise ScenarioError(f"settings.ablated: expected head numbers, got {type(heads).__name__}")
    for i, h in enumerate(heads):
        if isinstance(h, bool) or not isinstance(h, int):
            raise ScenarioError(f"settings.ablated: expected head numbers, got {type(h).__name__}")
        if not 0 <= h < LIMITS.heads:
            raise ScenarioError(
                f"settings.ablated: head {h + 1} is not between 1 and {LIMITS.heads}"
            )
        if i and h <= heads[i - 1]:
            problem = "repeats" if h == heads[i - 1] else "is out of order"
            raise ScenarioError(f"settings.ablated: head {h + 1} {problem}")


def _positive(name: str, value: object, above: float, most: float = 1e9) -> None:
    """Check a setting is a number greater than above (and at most most)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not above < value <= most:
        raise ScenarioError(
            f"settings.{name}: expected a number greater than {above:g} "
            f"and at most {most:g}, got {value!r}"
        )


def _frozen(array: np.ndarray) -> np.ndarray:
    """A read-only float64 array (no copy when it already is one)."""
    if array.dtype != np.float64 or array.flags.writeable:
        array = np.array(array, dtype=np.float64)
        array.flags.writeable = False
    return array


def check_values(
    where: str, values: np.ndarray, limit: float = LIMITS.abs_value, origin: tuple[int, ...] = ()
) -> None:
    """Raise ScenarioError naming the first cell that is not a finite number within limit.

    origin is the block's position in its matrix, so that the message names the real cell.
    """
    if values.size == 0:
        return
    # max and min are NaN when any entry is NaN, so this catches NaN, ±inf and size
    # without a temporary copy of the values.
    if values.max() <= limit and values.min() >= -limit:
        return
    bad = np.argwhere(~(np.abs(values) <= limit))[0]
    value = float(values[tuple(bad)])
    offset = origin or (0,) * len(bad)
    cell = ",".join(str(int(i) + o + 1) for i, o in zip(bad, offset, strict=True))
    problem = "is not a finite number" if not np.isfinite(value) else f"exceeds ±{limit:g}"
    raise ScenarioError(f"{where}[{cell}]: {value!r} {problem}")


def _head_checker(name: str) -> Callable[[int, np.ndarray], None]:
    """Checks the numbers of one head of per-head matrix ``name``."""

    def check(head: int, values: np.ndarray) -> None:
        check_values(matrix_label(name, head), values)

    return check


def _unchecked(head: int, values: np.ndarray) -> None:
    """(Neutral numbers, 0 and 1: nothing to check.)"""


def head_stack(name: str, values: HeadStack | np.ndarray) -> HeadStack:
    """Per-head numbers as a checked HeadStack (a stack already checked as it is)."""
    if isinstance(values, HeadStack):
        if values.checked:
            return values
        values = values.array()
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 3:
        raise ScenarioError(f"{name}: expected (heads, rows, d_k), got {array.ndim}-D")
    return HeadStack.of(array, _head_checker(name))


@dataclass(frozen=True, eq=False)
class Scenario:
    """Tokens, X, the heads' projections, W_O, the optional parts of current models, and
    settings.

    Per-head matrices are HeadStacks (heads on axis 0): ``W_Q`` (H, d_model, d_k) with
    ``b_Q`` and ``q_norm`` (H, 1, d_k) for the H query heads; ``W_K``, ``W_V`` (G, d_model,
    d_k) with ``b_K``, ``b_V``, ``k_norm`` (G, 1, d_k) for the G key/value heads (G divides
    H; query head h reads key/value head ⌊h·G/H⌋). ``b_O`` is (1, d_model). ``X_kv`` (m ×
    d_model) with ``kv_tokens`` makes it cross-attention; without it the keys are the
    tokens of X. ``mask_matrix`` (n × m, 1 = may attend) is kept only for the custom mask.
    Optional matrices left as None get their neutral value.

    Every scenario is valid: the shapes, labels and sizes are checked when it is made, and
    every number when it enters (a matrix given as an array; a stack's heads when the
    stack is made, see HeadStack). An edit returns a new scenario that shares every
    matrix it did not touch; an edit of one head of a stack copies that head alone.
    """

    tokens: tuple[str, ...]
    X: np.ndarray
    W_Q: HeadStack
    W_K: HeadStack
    W_V: HeadStack
    W_O: np.ndarray
    settings: Settings = field(default_factory=Settings)
    b_Q: HeadStack = None  # type: ignore[assignment]
    b_K: HeadStack = None  # type: ignore[assignment]
    b_V: HeadStack = None  # type: ignore[assignment]
    b_O: np.ndarray = None  # type: ignore[assignment]
    q_norm: HeadStack = None  # type: ignore[assignment]
    k_norm: HeadStack = None  # type: ignore[assignment]
    kv_tokens: tuple[str, ...] | None = None
    X_kv: np.ndarray | None = None
    mask_matrix: np.ndarray | None = None
    target: np.ndarray | None = None  # the loss's own target T (n × d_model), when custom
    relative_bias: np.ndarray | None = None  # (buckets, heads): T5's learned table
    provenance: Provenance | None = None  # set when imported from a model; kept by edits

    def __post_init__(self) -> None:
        # The fields as given are normalised once, here: tuples, read-only float64 arrays,
        # stacks, and the neutral value of each optional matrix left out.
        set_field = functools.partial(object.__setattr__, self)
        set_field("tokens", tuple(self.tokens))
        if self.kv_tokens is not None:
            set_field("kv_tokens", tuple(self.kv_tokens))
        for name in ("X", "W_O"):
            set_field(name, _frozen(np.asarray(getattr(self, name))))
        for name in WEIGHT_NAMES:
            set_field(name, head_stack(name, getattr(self, name)))
        self._check_shape()
        for name in OPTIONAL_NAMES:
            value = getattr(self, name)
            if value is None:
                set_field(name, self._neutral(name))
            elif name in HEAD_NAMES:
                set_field(name, head_stack(name, value))
        if self.settings.mask == "custom" and self.mask_matrix is None:
            set_field("mask_matrix", causal_start(self.n, self.m, self.settings.causal_alignment))
        if self.settings.loss_target == "custom" and self.target is None:
            set_field("target", previous_rows(np.asarray(self.X)))  # the default target's T
        if self.settings.positional == "relative-bias" and self.relative_bias is None:
            set_field("relative_bias", np.zeros((self.settings.relative_buckets, self.n_heads)))
        for name in ("b_O", "X_kv", "mask_matrix", "target", "relative_bias"):
            if getattr(self, name) is not None:
                set_field(name, _frozen(np.asarray(getattr(self, name))))
        self._check()

    def _neutral(self, name: str) -> Any:
        """The neutral value of an optional matrix (zero biases, norm weights of one)."""
        if name == "b_O":
            return np.zeros((1, self.X.shape[1]))
        count = len(self.W_Q) if name in Q_HEAD_NAMES else len(self.W_K)
        value = 1.0 if name.endswith("norm") else 0.0
        return HeadStack.of(np.full((count, 1, self.W_Q.shape[2]), value), _unchecked)

    def _check_shape(self) -> None:
        """X, the heads and their widths: what the neutral matrices are made from."""
        lim = LIMITS
        if self.X.ndim != 2:
            raise ScenarioError(f"X: expected a 2-D matrix, got {self.X.ndim}-D")
        n, d_model = self.X.shape
        if not 1 <= n <= lim.tokens:
            raise ScenarioError(f"X: {n} tokens; expected 1 to {lim.tokens}")
        if not 1 <= d_model <= lim.d_model:
            raise ScenarioError(f"X: d_model {d_model}; expected 1 to {lim.d_model}")
        h, _, d_k = self.W_Q.shape
        if not 1 <= h <= lim.heads:
            raise ScenarioError(f"heads: {h}; expected 1 to {lim.heads}")
        if not 1 <= d_k <= lim.d_k:
            raise ScenarioError(f"d_k: {d_k}; expected 1 to {lim.d_k}")
        g = len(self.W_K)
        if g < 1 or h % g:
            raise ScenarioError(
                f"kv_heads: {g} key/value heads do not divide {h} query heads "
                "(each group of query heads shares one key/value head)"
            )

    def _check(self) -> None:
        if self.provenance is not None and not isinstance(self.provenance, Provenance):
            raise ScenarioError("provenance: expected a Provenance object")
        _check_labels("tokens", self.tokens, self.n)
        self._check_keys()
        self._check_settings()
        self._check_sizes()
        for name in HEAD_NAMES:
            self._check_stack(name)
        if self.W_O.shape != (self.n_heads * self.d_k, self.d_model):
            raise ScenarioError(
                f"W_O: expected {self.n_heads * self.d_k}×{self.d_model}, "
                f"got {_dims(self.W_O.shape)}"
            )
        if self.b_O.shape != (1, self.d_model):
            raise ScenarioError(f"b_O: expected length {self.d_model}, got {_dims(self.b_O.shape)}")
        self._check_mask()
        self._check_target()
        self._check_relative_bias()
        row, col = self.settings.loss_cell
        if row >= self.n or col >= self.d_model:
            raise ScenarioError(
                f"settings.loss_cell: row {row + 1}, column {col + 1}; the output is "
                f"{self.n}×{self.d_model}"
            )
        for name in ("X", "X_kv", "W_O", "b_O"):
            if getattr(self, name) is not None:
                check_values(name, getattr(self, name))

    def _check_keys(self) -> None:
        """Cross-attention's own keys: X_kv of d_model columns, a label per row."""
        if (self.X_kv is None) != (self.kv_tokens is None):
            raise ScenarioError("X_kv: cross-attention needs both kv_tokens and X_kv")
        if self.X_kv is None:
            return
        if self.X_kv.ndim != 2 or self.X_kv.shape[1] != self.d_model:
            raise ScenarioError(
                f"X_kv: expected rows of d_model {self.d_model}, got {_dims(self.X_kv.shape)}"
            )
        if not 1 <= self.m <= LIMITS.tokens:
            raise ScenarioError(f"X_kv: {self.m} tokens; expected 1 to {LIMITS.tokens}")
        _check_labels("kv_tokens", self.kv_tokens, self.m)

    def _check_sizes(self) -> None:
        """Every intermediate fits in memory: the score cells and the weights."""
        lim, h, g = LIMITS, self.n_heads, self.kv_heads
        if h * self.n * self.m > lim.score_cells:
            raise ScenarioError(
                f"size: {h} heads × {self.n} × {self.m} scores exceeds the limit of "
                f"{lim.score_cells} score cells"
            )
        if (h + 2 * g) * self.d_model * self.d_k > lim.weight_cells:
            raise ScenarioError(f"size: W_Q, W_K and W_V hold more than {lim.weight_cells} numbers")

    def _check_stack(self, name: str) -> None:
        """A per-head matrix: one per query (or key/value) head, d_model (or 1) × d_k."""
        count = self.n_heads if name in Q_HEAD_NAMES else self.kv_heads
        rows = self.d_model if name in WEIGHT_NAMES else 1
        shape = getattr(self, name).shape
        if shape[0] != count:
            raise ScenarioError(
                f"{name}: expected {count} heads of {rows}×{self.d_k}, got {_dims(shape)}"
            )
        if shape[1:] != (rows, self.d_k):
            problem = f"{_dims(shape[1:])}" if rows > 1 else f"length {shape[2]}"
            want = f"{rows}×{self.d_k}" if rows > 1 else f"length {self.d_k}"
            raise ScenarioError(f"{matrix_label(name, 0)}: expected {want}, got {problem}")

    def _check_settings(self) -> None:
        """What of the checks depends on the settings and not on the custom mask."""
        if not isinstance(self.settings, Settings):
            raise ScenarioError("settings: expected a Settings object")
        st, h, d_k = self.settings, self.n_heads, self.d_k
        if any(head >= h for head in st.ablated):
            missing = max(st.ablated) + 1
            raise ScenarioError(f"settings.ablated: head {missing} does not exist ({h} heads)")
        for name in ("alibi_slopes", "sinks"):
            values = getattr(st, name)
            if values is not None and len(values) != h:
                raise ScenarioError(f"settings.{name}: {len(values)} numbers for {h} query heads")
        if st.rope_dims is not None and st.rope_dims > d_k:
            raise ScenarioError(f"settings.rope_dims: {st.rope_dims} is more than d_k {d_k}")
        if st.rope_frequencies is not None and st.positional == "rope":
            width = d_k if st.projections else self.d_model
            even = width - width % 2
            pairs = min(even if st.rope_dims is None else st.rope_dims, even) // 2
            if len(st.rope_frequencies) != pairs:
                raise ScenarioError(
                    f"settings.rope_frequencies: {len(st.rope_frequencies)} numbers for the "
                    f"{pairs} pairs RoPE turns"
                )

    def _check_mask(self) -> None:
        """A custom mask: n × m of 0 and 1."""
        if self.settings.mask != "custom":
            return
        mask = self.mask_matrix
        if mask is None or mask.shape != (self.n, self.m):
            got = "none" if mask is None else _dims(mask.shape)
            raise ScenarioError(
                f"settings.mask_matrix: expected {self.n}×{self.m} of 0 and 1, got {got}"
            )
        if not np.isin(mask, (0.0, 1.0)).all():
            r, c = np.argwhere(~np.isin(mask, (0.0, 1.0)))[0]
            raise ScenarioError(
                f"settings.mask_matrix[{r + 1},{c + 1}]: {float(mask[r, c])!r} is not 0 or 1"
            )

    def _check_target(self) -> None:
        """The loss's own target T: n × d_model numbers (kept while another target is
        chosen, as the custom mask is, so that choosing it again brings it back)."""
        if self.target is None:
            return
        if self.target.shape != (self.n, self.d_model):
            raise ScenarioError(
                f"settings.target: expected {self.n}×{self.d_model}, got {_dims(self.target.shape)}"
            )
        check_values("settings.target", self.target)

    def _check_relative_bias(self) -> None:
        """T5's table: one row per bucket, one column per query head (kept while another
        positional is chosen, as the custom mask is)."""
        table = self.relative_bias
        if table is None:
            return
        want = (self.settings.relative_buckets, self.n_heads)
        if table.shape != want:
            raise ScenarioError(
                f"relative_bias: expected {_dims(want)} (buckets × heads), got {_dims(table.shape)}"
            )
        check_values("relative_bias", table)

    def shape_of(self, name: str) -> tuple[int, ...] | None:
        """The shape of matrix ``name``; None if absent."""
        value = getattr(self, name)
        return None if value is None else tuple(value.shape)

    # Shape -----------------------------------------------------------------------------

    @property
    def n(self) -> int:
        return int(self.X.shape[0])

    @property
    def m(self) -> int:
        """How many keys: the tokens of X_kv under cross-attention, else n."""
        return self.n if self.X_kv is None else int(self.X_kv.shape[0])

    @property
    def d_model(self) -> int:
        return int(self.X.shape[1])

    @property
    def n_heads(self) -> int:
        return len(self.W_Q)

    @property
    def kv_heads(self) -> int:
        """G, the number of key/value heads (n_heads without sharing, 1 for MQA)."""
        return len(self.W_K)

    @property
    def weight_count(self) -> int:
        """How many numbers W_Q, W_K, W_V and W_O hold."""
        h, g, d_k = self.n_heads, self.kv_heads, self.d_k
        return (h + 2 * g) * self.d_model * d_k + int(self.W_O.size)

    @property
    def d_k(self) -> int:
        return self.W_Q.shape[2]

    @property
    def cross(self) -> bool:
        return self.X_kv is not None

    @property
    def key_tokens(self) -> tuple[str, ...]:
        """The labels of the keys: kv_tokens under cross-attention, else tokens."""
        return self.tokens if self.kv_tokens is None else self.kv_tokens

    def kv_head_of(self, head: int) -> int:
        """The key/value head that query head ``head`` (0-based) reads."""
        return head * self.kv_heads // self.n_heads

    def arrays(self) -> dict[str, np.ndarray]:
        """Every matrix the scenario holds, by name, as arrays (optional ones only when
        present)."""
        return {
            name: np.asarray(getattr(self, name))
            for name in MATRIX_NAMES
            if getattr(self, name) is not None
        }

    # Access and edits --------------------------------------------------------------------

    def matrix(self, name: str, head: int | None = None) -> np.ndarray:
        """One editable matrix as a read-only 2-D array; head (0-based) for per-head
        matrices: a query head for W_Q, b_Q, q_norm, a key/value head for the others.
        Biases and norm weights are one-row matrices."""
        if name in HEAD_NAMES:
            stack: HeadStack = getattr(self, name)
            if head is None or not 0 <= head < len(stack):
                raise ScenarioError(f"{name}: head {head} does not exist")
            return stack.heads[head]
        if name in MATRIX_NAMES:
            value = getattr(self, name)
            if value is None:
                raise ScenarioError(f"{name}: this scenario has none")
            return value  # type: ignore[no-any-return]
        raise ScenarioError(f"unknown matrix {name!r}; expected one of {', '.join(MATRIX_NAMES)}")

    def with_cells(
        self, name: str, head: int | None, row: int, col: int, values: np.ndarray
    ) -> Scenario:
        """A copy with the rectangle at (row, col) of one matrix set to values (checked
        here: the scenario checks only the matrices that are not per-head stacks again)."""
        values = self.check_cells(name, head, row, col, values)
        rows, cols = slice(row, row + values.shape[0]), slice(col, col + values.shape[1])
        block = np.array(self.matrix(name, head))
        block[rows, cols] = values
        if name in HEAD_NAMES:
            assert head is not None
            stack: HeadStack = getattr(self, name)
            edited: dict[str, Any] = {name: stack.with_head(head, block, _head_checker(name))}
        else:
            edited = {name: block}
        return dataclasses.replace(self, **edited)

    def check_cells(
        self, name: str, head: int | None, row: int, col: int, values: np.ndarray
    ) -> np.ndarray:
        """values as float64 rows, if with_cells may set them there; else ScenarioError."""
        values = np.atleast_2d(np.asarray(values, dtype=np.float64))
        target = self.matrix(name, head)
        rows, cols = values.shape
        if row < 0 or col < 0 or row + rows > target.shape[0] or col + cols > target.shape[1]:
            raise ScenarioError(
                f"{matrix_label(name, head)}: a {rows}×{cols} block at row {row + 1}, "
                f"column {col + 1} does not fit a {target.shape[0]}×{target.shape[1]} matrix"
            )
        if name == "mask_matrix":
            if not np.isin(values, (0.0, 1.0)).all():
                raise ScenarioError("mask_matrix: a cell is 0 (hidden) or 1 (may attend)")
        else:
            check_values(matrix_label(name, head), values, origin=(row, col))
        return values

    def with_tokens(self, tokens: Sequence[str]) -> Scenario:
        return dataclasses.replace(self, tokens=tuple(tokens))

    def with_settings(self, **changes: object) -> Scenario:
        """A copy with some settings changed (the matrices shared; T5's table cut or padded
        with zeros to a new number of buckets)."""
        settings = self.settings.replace(**changes)
        table = self.relative_bias
        if table is not None and table.shape[0] != settings.relative_buckets:
            table = _fit(table, (settings.relative_buckets, table.shape[1]))
        return dataclasses.replace(self, settings=settings, relative_bias=table)


def previous_rows(X: np.ndarray) -> np.ndarray:
    """Each row the one before it (the first its own): the previous-token target."""
    return np.concatenate([X[:1], X[:-1]])


@functools.lru_cache(maxsize=8)
def causal_start(n: int, m: int, alignment: str) -> np.ndarray:
    """The custom mask a scenario starts from, causal (read-only): the same array each
    time, so that the same scenario under it names the same cached result."""
    causal = visible(n, m, "causal", alignment=alignment).astype(np.float64)
    causal.flags.writeable = False
    return causal


def _dims(shape: tuple[int, ...]) -> str:
    return "×".join(map(str, shape))


def _check_labels(where: str, labels: tuple[str, ...] | None, count: int) -> None:
    labels = labels or ()
    if len(labels) != count:
        rows = "rows of X" if where == "tokens" else "rows of X_kv"
        raise ScenarioError(f"{where}: {len(labels)} labels for {count} {rows}")
    if all(isinstance(token, str) for token in labels):  # (all at once, then one by one)
        clean = _BAD_LABEL_CHARS.search("".join(labels)) is None
        if clean and max(map(len, labels), default=0) <= LIMITS.token_chars:
            return
    for i, token in enumerate(labels):
        if not isinstance(token, str):
            raise ScenarioError(f"{where}[{i + 1}]: expected text, got {token!r}")
        problem = label_problem(token)
        if problem:
            raise ScenarioError(f"{where}[{i + 1}] {token!r:.40}: {problem}")
        if len(token) > LIMITS.token_chars:
            raise ScenarioError(f"{where}[{i + 1}]: longer than {LIMITS.token_chars} characters")


def matrix_label(name: str, head: int | None) -> str:
    """How error messages and files name a matrix: ``heads[2].W_K`` (1-based head)."""
    if name in HEAD_NAMES and head is not None:
        return f"heads[{head + 1}].{name}"
    return name


def from_heads(
    tokens: Sequence[str],
    X: object,
    heads: Sequence[Mapping[str, Any]],
    W_O: object,
    settings: Settings | None = None,
    kv_heads: Sequence[Mapping[str, Any]] | None = None,
    **extra: Any,
) -> Scenario:
    """Build a scenario from per-head dicts.

    Each head holds "W_Q", "W_K", "W_V" and optionally "b_Q", "b_K", "b_V" (vectors of
    d_k), "q_norm", "k_norm". With ``kv_heads`` the query heads hold only "W_Q", "b_Q",
    "q_norm" and each key/value head "W_K", "W_V", "b_K", "b_V", "k_norm". ``extra``:
    the other Scenario fields (b_O, kv_tokens, X_kv, mask_matrix).
    """
    if not heads:
        raise ScenarioError("heads: expected at least one head")
    if kv_heads is not None and not kv_heads:
        raise ScenarioError("kv_heads: expected at least one key/value head")
    stacks: dict[str, Any] = {}
    for name in HEAD_NAMES:
        group, where = (
            (heads, "heads")
            if name in Q_HEAD_NAMES or kv_heads is None
            else (
                kv_heads,
                "kv_heads",
            )
        )
        if name not in WEIGHT_NAMES and not any(name in head for head in group):
            continue  # neutral: the Scenario fills it in
        d_k = np.shape(group[0][WEIGHT_NAMES[0] if where == "heads" else "W_K"])[-1]
        neutral = 1.0 if name.endswith("norm") else 0.0
        mats = [
            np.asarray(head[name], dtype=np.float64).reshape(-1, np.shape(head[name])[-1])
            if name in head
            else np.full((1, d_k), neutral)
            for head in group
        ]
        first = mats[0].shape
        bad = next((i for i, m in enumerate(mats) if m.shape != first), None)
        if bad is not None:
            raise ScenarioError(
                f"{where}[{bad + 1}].{name}: expected {_dims(first)}, got {_dims(mats[bad].shape)}"
            )
        stacks[name] = np.stack(mats)
    if "b_O" in extra and extra["b_O"] is not None:
        extra["b_O"] = np.asarray(extra["b_O"], dtype=np.float64).reshape(1, -1)
    return Scenario(
        tokens=tuple(tokens),
        X=np.asarray(X, dtype=np.float64),
        W_O=np.asarray(W_O, dtype=np.float64),
        settings=settings or Settings(),
        **stacks,
        **extra,
    )


# Resizing: each returns a new scenario and keeps every value that still has a place. --


def _fit(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """array cropped or zero-padded to shape, aligned at the origin."""
    out = np.zeros(shape)
    region = tuple(slice(0, min(a, b)) for a, b in zip(array.shape, shape, strict=True))
    out[region] = array[region]
    return out


def _fit_mask(s: Scenario, n: int, m: int) -> np.ndarray | None:
    """The custom mask at a new size: kept cells keep their value, new ones are causal."""
    if s.mask_matrix is None:
        return None
    causal = visible(n, m, "causal", alignment=s.settings.causal_alignment).astype(np.float64)
    rows, cols = min(n, s.n), min(m, s.m)
    causal[:rows, :cols] = s.mask_matrix[:rows, :cols]
    return causal


def _cell_within(cell: tuple[int, int], n: int, d_model: int) -> tuple[int, int]:
    """The loss's output cell, moved inside an output of n × d_model."""
    return min(cell[0], n - 1), min(cell[1], d_model - 1)


def _fit_per_head(
    values: tuple[float, ...] | None, heads: int, pad: np.ndarray
) -> tuple[float, ...] | None:
    """Per-head settings (sinks, ALiBi slopes) for a new head count: cut, or padded with
    the values pad gives those heads."""
    if values is None:
        return None
    return tuple(values[:heads]) + tuple(float(v) for v in pad[len(values) : heads])


def resized(
    s: Scenario,
    *,
    n: int | None = None,
    d_model: int | None = None,
    heads: int | None = None,
    d_k: int | None = None,
    kv_heads: int | None = None,
    m: int | None = None,
) -> Scenario:
    """A copy with new sizes; kept cells keep their values, new cells are 0 (1 for norm
    weights).

    Changing d_k or the number of heads keeps each head's block of W_O in place. Without
    kv_heads, key/value heads follow the query heads when each had its own, and otherwise
    keep their number when it still divides the heads (else the largest that does).
    ``m`` sets the number of keys under cross-attention.
    """
    n = s.n if n is None else n
    d_model = s.d_model if d_model is None else d_model
    heads = s.n_heads if heads is None else heads
    d_k = s.d_k if d_k is None else d_k
    if kv_heads is None:
        kv_heads = heads if s.kv_heads == s.n_heads else math.gcd(s.kv_heads, heads)
    m = (n if s.X_kv is None else s.m) if m is None else m
    for label, value, hi in (
        ("tokens", n, LIMITS.tokens),
        ("d_model", d_model, LIMITS.d_model),
        ("heads", heads, LIMITS.heads),
        ("d_k", d_k, LIMITS.d_k),
        ("kv_heads", kv_heads, heads),
        ("key tokens", m, LIMITS.tokens),
    ):
        if not 1 <= value <= hi:
            raise ScenarioError(f"{label}: {value}; expected 1 to {hi}")
    tokens = list(s.tokens[:n]) + [f"t{i + 1}" for i in range(s.n, n)]
    blocks = s.W_O.reshape(s.n_heads, s.d_k, s.d_model)
    W_O = _fit(blocks, (heads, d_k, d_model)).reshape(heads * d_k, d_model)
    st = s.settings
    rope_dims = st.rope_dims if st.rope_dims is None or st.rope_dims <= d_k else None
    freqs = st.rope_frequencies
    if freqs is not None and len(freqs) != (rope_dims or d_k - d_k % 2) // 2:
        freqs = None  # another width: the base's frequencies
    settings = st.replace(
        ablated=tuple(h for h in st.ablated if h < heads),
        # a new head's sink starts at 0 (as a freshly initialised one does); its ALiBi
        # slope is the paper's for the new head count
        sinks=_fit_per_head(st.sinks, heads, np.zeros(heads)),
        alibi_slopes=_fit_per_head(st.alibi_slopes, heads, alibi_slopes(heads)),
        rope_dims=rope_dims,
        rope_frequencies=freqs,
        loss_cell=_cell_within(st.loss_cell, n, d_model),
    )
    stacks: dict[str, Any] = {}
    for name in HEAD_NAMES:
        count = heads if name in Q_HEAD_NAMES else kv_heads
        rows = d_model if name in WEIGHT_NAMES else 1
        fitted = _fit(getattr(s, name), (count, rows, d_k))
        if name.endswith("norm"):
            fitted[:, :, s.d_k :] = 1.0
            fitted[s.n_heads if name == "q_norm" else s.kv_heads :] = 1.0
        stacks[name] = fitted
    cross: dict[str, Any] = {}
    if s.X_kv is not None and s.kv_tokens is not None:
        kv_tokens = list(s.kv_tokens[:m]) + [f"k{i + 1}" for i in range(s.m, m)]
        cross = {"kv_tokens": tuple(kv_tokens), "X_kv": _fit(s.X_kv, (m, d_model))}
    return dataclasses.replace(
        s,
        settings=settings,
        tokens=tuple(tokens),
        X=_fit(s.X, (n, d_model)),
        W_O=W_O,
        b_O=_fit(s.b_O, (1, d_model)),
        mask_matrix=_fit_mask(s, n, m),
        target=None if s.target is None else _fit(s.target, (n, d_model)),
        # a function of the distance j − i: any n keeps it; a new head's column is 0
        relative_bias=None
        if s.relative_bias is None
        else _fit(s.relative_bias, (len(s.relative_bias), heads)),
        **stacks,
        **cross,
    )


def with_cross_attention(s: Scenario, on: bool) -> Scenario:
    """A copy with its own key/value tokens (starting as a copy of the queries' tokens
    and X), or without them (keys are the tokens of X again)."""
    if on == s.cross:
        return s
    if on:
        changed = dataclasses.replace(s, kv_tokens=s.tokens, X_kv=s.X, mask_matrix=s.mask_matrix)
    else:
        changed = dataclasses.replace(
            s, kv_tokens=None, X_kv=None, mask_matrix=_fit_mask(s, s.n, s.n)
        )
    return changed


def with_kv_heads(s: Scenario, kv_heads: int) -> Scenario:
    """A copy with G key/value heads shared by groups of the query heads. Going from H
    heads to fewer, each group keeps the key/value weights of its first head; going back
    to one each, every query head gets its group's weights."""
    H, G = s.n_heads, s.kv_heads
    if not 1 <= kv_heads <= H or H % kv_heads:
        raise ScenarioError(f"kv_heads: {kv_heads} does not divide {H} query heads")
    if kv_heads == G:
        return s
    # the key/value head each new one copies: the one its first query head read before
    source = [(g * H // kv_heads) * G // H for g in range(kv_heads)]
    return dataclasses.replace(s, **{name: getattr(s, name)[source] for name in KV_HEAD_NAMES})


def insert_token(s: Scenario, index: int, label: str = "", x: object = None) -> Scenario:
    """A copy with a token inserted before row index (x defaults to zeros)."""
    if not 0 <= index <= s.n:
        raise ScenarioError(f"tokens: cannot insert at position {index + 1} of {s.n}")
    row = np.zeros(s.d_model) if x is None else np.asarray(x, dtype=np.float64)
    tokens = list(s.tokens)
    tokens.insert(index, label or f"t{s.n + 1}")
    mask = s.mask_matrix
    if mask is not None:  # the new query sees what its causal place lets it see
        causal = visible(
            s.n + 1, s.m + (not s.cross), "causal", alignment=s.settings.causal_alignment
        )
        if not s.cross:
            mask = np.insert(mask, index, causal[:-1, index], axis=1)
        mask = np.insert(mask, index, causal[index], axis=0)
    target = None if s.target is None else np.insert(s.target, index, 0.0, axis=0)
    return dataclasses.replace(
        s,
        tokens=tuple(tokens),
        X=np.insert(s.X, index, row, axis=0),
        mask_matrix=mask,
        target=target,
    )


def remove_token(s: Scenario, index: int) -> Scenario:
    """A copy without the token at row index."""
    if not 0 <= index < s.n:
        raise ScenarioError(f"tokens: there is no token {index + 1} of {s.n}")
    if s.n == 1:
        raise ScenarioError("tokens: a scenario needs at least one token")
    tokens = s.tokens[:index] + s.tokens[index + 1 :]
    mask = s.mask_matrix
    if mask is not None:
        mask = np.delete(mask, index, axis=0)
        if not s.cross:
            mask = np.delete(mask, index, axis=1)
    settings = s.settings.replace(loss_cell=_cell_within(s.settings.loss_cell, s.n - 1, s.d_model))
    target = None if s.target is None else np.delete(s.target, index, axis=0)
    return dataclasses.replace(
        s,
        tokens=tokens,
        X=np.delete(s.X, index, axis=0),
        mask_matrix=mask,
        settings=settings,
        target=target,
    )


def permute_tokens(s: Scenario, order: Sequence[int]) -> Scenario:
    """A copy whose row i is the old row order[i] (move, reverse and shuffle tokens)."""
    order = list(order)
    if sorted(order) != list(range(s.n)):
        raise ScenarioError(f"tokens: {order} is not a reordering of {s.n} tokens")
    mask = s.mask_matrix
    if mask is not None:
        mask = mask[order] if s.cross else mask[np.ix_(order, order)]
    target = None if s.target is None else s.target[order]
    return dataclasses.replace(
        s, tokens=tuple(s.tokens[i] for i in order), X=s.X[order], mask_matrix=mask, target=target
    )


def move_token(s: Scenario, src: int, dst: int) -> Scenario:
    """A copy with the token at src moved to position dst."""
    order = list(range(s.n))
    if not (0 <= src < s.n and 0 <= dst < s.n):
        raise ScenarioError(f"tokens: cannot move token {src + 1} to {dst + 1} of {s.n}")
    order.insert(dst, order.pop(src))
    return permute_tokens(s, order)
