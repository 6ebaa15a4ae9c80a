"""The editable state: tokens, X, the heads' projections, W_O and the settings.

A ``Scenario`` is immutable and always valid: every constructor path checks shapes,
numbers and limits, and every edit returns a new scenario that shares the matrices it
did not touch. Conventions follow the brief: row vectors, ``X`` is ``n × d_model``, each
head's ``W_Q``, ``W_K``, ``W_V`` are ``d_model × d_k``, ``W_O`` is ``(h·d_k) × d_model``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MASKS = ("none", "causal", "causal-zero", "drop-after-softmax", "sliding-window")
MINUS_INF_MASKS = ("causal", "sliding-window")  # hidden keys get −∞: weight exactly 0
POSITIONALS = ("none", "sinusoidal")
WEIGHT_NAMES = ("W_Q", "W_K", "W_V")
MATRIX_NAMES = ("X", *WEIGHT_NAMES, "W_O")


@dataclass(frozen=True)
class Limits:
    """Sizes and values a scenario may hold (documented in the README)."""

    tokens: int = 2048
    d_model: int = 2048
    heads: int = 64
    d_k: int = 512
    score_cells: int = 2**26  # heads × n², so that every intermediate fits in memory
    abs_value: float = 1e6
    token_chars: int = 64


LIMITS = Limits()


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

    def __post_init__(self) -> None:
        for name in ("projections", "scale"):
            if not isinstance(getattr(self, name), bool):
                raise ScenarioError(f"settings.{name}: expected true or false")
        if self.mask not in MASKS:
            raise ScenarioError(f"settings.mask: {self.mask!r} is not one of {', '.join(MASKS)}")
        if self.positional not in POSITIONALS:
            raise ScenarioError(
                f"settings.positional: {self.positional!r} is not one of {', '.join(POSITIONALS)}"
            )
        w = self.window
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= LIMITS.tokens:
            raise ScenarioError(
                f"settings.window: expected a whole number of keys from 1 to {LIMITS.tokens}, "
                f"got {w!r}"
            )
        p = self.dropout
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ScenarioError(f"settings.dropout: expected a probability in [0, 1), got {p!r}")
        s = self.dropout_seed
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**32:
            raise ScenarioError(
                f"settings.dropout_seed: expected an integer in [0, 2^32), got {s!r}"
            )

        a = self.ablated  # 0-based here; every message numbers heads from 1, as users do
        if not isinstance(a, tuple):
            raise ScenarioError(f"settings.ablated: expected head numbers, got {type(a).__name__}")
        for i, h in enumerate(a):
            if isinstance(h, bool) or not isinstance(h, int):
                raise ScenarioError(
                    f"settings.ablated: expected head numbers, got {type(h).__name__}"
                )
            if not 0 <= h < LIMITS.heads:
                raise ScenarioError(
                    f"settings.ablated: head {h + 1} is not between 1 and {LIMITS.heads}"
                )
            if i and h <= a[i - 1]:
                problem = "repeats" if h == a[i - 1] else "is out of order"
                raise ScenarioError(f"settings.ablated: head {h + 1} {problem}")

    def replace(self, **changes: object) -> Settings:
        """A copy with some settings changed (validated)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


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


@dataclass(frozen=True, eq=False)
class Scenario:
    """Tokens, X, per-head W_Q/W_K/W_V stacked as (h, d_model, d_k), W_O, and settings."""

    tokens: tuple[str, ...]
    X: np.ndarray
    W_Q: np.ndarray
    W_K: np.ndarray
    W_V: np.ndarray
    W_O: np.ndarray
    settings: Settings = field(default_factory=Settings)

    def __post_init__(self) -> None:
        for name in MATRIX_NAMES:
            object.__setattr__(self, name, _frozen(np.asarray(getattr(self, name))))
        object.__setattr__(self, "tokens", tuple(self.tokens))
        self._check()

    def _check(self) -> None:
        lim = LIMITS
        if not isinstance(self.settings, Settings):
            raise ScenarioError("settings: expected a Settings object")
        if self.X.ndim != 2:
            raise ScenarioError(f"X: expected a 2-D matrix, got {self.X.ndim}-D")
        n, d_model = self.X.shape
        if not 1 <= n <= lim.tokens:
            raise ScenarioError(f"X: {n} tokens; expected 1 to {lim.tokens}")
        if not 1 <= d_model <= lim.d_model:
            raise ScenarioError(f"X: d_model {d_model}; expected 1 to {lim.d_model}")
        if len(self.tokens) != n:
            raise ScenarioError(f"tokens: {len(self.tokens)} labels for {n} rows of X")
        for i, token in enumerate(self.tokens):
            if not isinstance(token, str):
                raise ScenarioError(f"tokens[{i + 1}]: expected text, got {token!r}")
            problem = label_problem(token)
            if problem:
                raise ScenarioError(f"tokens[{i + 1}] {token!r:.40}: {problem}")
            if len(token) > lim.token_chars:
                raise ScenarioError(f"tokens[{i + 1}]: longer than {lim.token_chars} characters")
        if self.W_Q.ndim != 3:
            raise ScenarioError(f"W_Q: expected (heads, d_model, d_k), got {self.W_Q.ndim}-D")
        h, _, d_k = self.W_Q.shape
        if not 1 <= h <= lim.heads:
            raise ScenarioError(f"heads: {h}; expected 1 to {lim.heads}")
        if not 1 <= d_k <= lim.d_k:
            raise ScenarioError(f"d_k: {d_k}; expected 1 to {lim.d_k}")
        if any(head >= h for head in self.settings.ablated):
            missing = max(self.settings.ablated) + 1
            raise ScenarioError(f"settings.ablated: head {missing} does not exist ({h} heads)")
        if h * n * n > lim.score_cells:
            raise ScenarioError(
                f"size: {h} heads × {n}² scores exceeds the limit of {lim.score_cells} score cells"
            )
        for name in WEIGHT_NAMES:
            shape = getattr(self, name).shape
            if len(shape) != 3 or shape[0] != h:
                raise ScenarioError(f"{name}: expected {h} heads of {d_model}×{d_k}, got {shape}")
            if shape[1:] != (d_model, d_k):
                raise ScenarioError(
                    f"heads[1].{name}: expected {d_model}×{d_k}, got {shape[1]}×{shape[2]}"
                )
        if self.W_O.shape != (h * d_k, d_model):
            raise ScenarioError(
                f"W_O: expected {h * d_k}×{d_model}, got {'×'.join(map(str, self.W_O.shape))}"
            )
        check_values("X", self.X)
        for name in WEIGHT_NAMES:
            for head in range(h):
                check_values(f"heads[{head + 1}].{name}", getattr(self, name)[head])
        check_values("W_O", self.W_O)

    # Shape -----------------------------------------------------------------------------

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def d_model(self) -> int:
        return self.X.shape[1]

    @property
    def n_heads(self) -> int:
        return self.W_Q.shape[0]

    @property
    def d_k(self) -> int:
        return self.W_Q.shape[2]

    # Access and edits --------------------------------------------------------------------

    def matrix(self, name: str, head: int | None = None) -> np.ndarray:
        """One editable matrix as a read-only 2-D array (head is 0-based for W_Q/W_K/W_V)."""
        if name in WEIGHT_NAMES:
            if head is None or not 0 <= head < self.n_heads:
                raise ScenarioError(f"{name}: head {head} does not exist")
            return getattr(self, name)[head]
        if name in ("X", "W_O"):
            return getattr(self, name)
        raise ScenarioError(f"unknown matrix {name!r}; expected one of {', '.join(MATRIX_NAMES)}")

    def with_cells(
        self, name: str, head: int | None, row: int, col: int, values: np.ndarray
    ) -> Scenario:
        """A copy with the rectangle at (row, col) of one matrix set to values."""
        values = np.atleast_2d(np.asarray(values, dtype=np.float64))
        target = self.matrix(name, head)
        rows, cols = values.shape
        if row < 0 or col < 0 or row + rows > target.shape[0] or col + cols > target.shape[1]:
            raise ScenarioError(
                f"{matrix_label(name, head)}: a {rows}×{cols} block at row {row + 1}, "
                f"column {col + 1} does not fit a {target.shape[0]}×{target.shape[1]} matrix"
            )
        check_values(matrix_label(name, head), values, origin=(row, col))
        full = np.array(getattr(self, name))
        block = full[head] if name in WEIGHT_NAMES else full
        block[row : row + rows, col : col + cols] = values
        # Only the checked block changed, so skip re-checking every matrix (costly at
        # GPT-2 sizes, and this runs on every keystroke).
        edited = object.__new__(Scenario)
        for f in dataclasses.fields(self):
            object.__setattr__(edited, f.name, getattr(self, f.name))
        object.__setattr__(edited, name, _frozen(full))
        return edited

    def with_tokens(self, tokens: Sequence[str]) -> Scenario:
        return dataclasses.replace(self, tokens=tuple(tokens))

    def with_settings(self, **changes: object) -> Scenario:
        return dataclasses.replace(self, settings=self.settings.replace(**changes))


def matrix_label(name: str, head: int | None) -> str:
    """How error messages and files name a matrix: ``heads[2].W_K`` (1-based head)."""
    return f"heads[{head + 1}].{name}" if name in WEIGHT_NAMES and head is not None else name


def from_heads(
    tokens: Sequence[str],
    X: object,
    heads: Sequence[Mapping[str, Any]],
    W_O: object,
    settings: Settings | None = None,
) -> Scenario:
    """Build a scenario from a list of per-head dicts {"W_Q", "W_K", "W_V"}."""
    if not heads:
        raise ScenarioError("heads: expected at least one head")
    stacks = {}
    for name in WEIGHT_NAMES:
        mats = [np.asarray(head[name], dtype=np.float64) for head in heads]
        shapes = {m.shape for m in mats}
        if len(shapes) > 1:
            first = mats[0].shape
            bad = next(i for i, m in enumerate(mats) if m.shape != first)
            raise ScenarioError(
                f"heads[{bad + 1}].{name}: expected {'×'.join(map(str, first))}, "
                f"got {'×'.join(map(str, mats[bad].shape))}"
            )
        stacks[name] = np.stack(mats)
    return Scenario(
        tokens=tuple(tokens),
        X=np.asarray(X, dtype=np.float64),
        W_O=np.asarray(W_O, dtype=np.float64),
        settings=settings or Settings(),
        **stacks,
    )


# Resizing: each returns a new scenario and keeps every value that still has a place. --


def _fit(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """array cropped or zero-padded to shape, aligned at the origin."""
    out = np.zeros(shape)
    region = tuple(slice(0, min(a, b)) for a, b in zip(array.shape, shape, strict=True))
    out[region] = array[region]
    return out


def resized(
    s: Scenario,
    *,
    n: int | None = None,
    d_model: int | None = None,
    heads: int | None = None,
    d_k: int | None = None,
) -> Scenario:
    """A copy with new sizes; kept cells keep their values, new cells are 0.

    Changing d_k or the number of heads keeps each head's block of W_O in place.
    """
    n = s.n if n is None else n
    d_model = s.d_model if d_model is None else d_model
    heads = s.n_heads if heads is None else heads
    d_k = s.d_k if d_k is None else d_k
    for label, value, hi in (
        ("tokens", n, LIMITS.tokens),
        ("d_model", d_model, LIMITS.d_model),
        ("heads", heads, LIMITS.heads),
        ("d_k", d_k, LIMITS.d_k),
    ):
        if not 1 <= value <= hi:
            raise ScenarioError(f"{label}: {value}; expected 1 to {hi}")
    tokens = list(s.tokens[:n]) + [f"t{i + 1}" for i in range(s.n, n)]
    blocks = s.W_O.reshape(s.n_heads, s.d_k, s.d_model)
    W_O = _fit(blocks, (heads, d_k, d_model)).reshape(heads * d_k, d_model)
    ablated = tuple(h for h in s.settings.ablated if h < heads)
    return dataclasses.replace(
        s,
        settings=s.settings.replace(ablated=ablated),
        tokens=tuple(tokens),
        X=_fit(s.X, (n, d_model)),
        W_Q=_fit(s.W_Q, (heads, d_model, d_k)),
        W_K=_fit(s.W_K, (heads, d_model, d_k)),
        W_V=_fit(s.W_V, (heads, d_model, d_k)),
        W_O=W_O,
    )


def insert_token(s: Scenario, index: int, label: str = "", x: object = None) -> Scenario:
    """A copy with a token inserted before row index (x defaults to zeros)."""
    if not 0 <= index <= s.n:
        raise ScenarioError(f"tokens: cannot insert at position {index + 1} of {s.n}")
    row = np.zeros(s.d_model) if x is None else np.asarray(x, dtype=np.float64)
    tokens = list(s.tokens)
    tokens.insert(index, label or f"t{s.n + 1}")
    return dataclasses.replace(s, tokens=tuple(tokens), X=np.insert(s.X, index, row, axis=0))


def remove_token(s: Scenario, index: int) -> Scenario:
    """A copy without the token at row index."""
    if not 0 <= index < s.n:
        raise ScenarioError(f"tokens: there is no token {index + 1} of {s.n}")
    if s.n == 1:
        raise ScenarioError("tokens: a scenario needs at least one token")
    tokens = s.tokens[:index] + s.tokens[index + 1 :]
    return dataclasses.replace(s, tokens=tokens, X=np.delete(s.X, index, axis=0))


def permute_tokens(s: Scenario, order: Sequence[int]) -> Scenario:
    """A copy whose row i is the old row order[i] (move, reverse and shuffle tokens)."""
    order = list(order)
    if sorted(order) != list(range(s.n)):
        raise ScenarioError(f"tokens: {order} is not a reordering of {s.n} tokens")
    return dataclasses.replace(s, tokens=tuple(s.tokens[i] for i in order), X=s.X[order])


def move_token(s: Scenario, src: int, dst: int) -> Scenario:
    """A copy with the token at src moved to position dst."""
    order = list(range(s.n))
    if not (0 <= src < s.n and 0 <= dst < s.n):
        raise ScenarioError(f"tokens: cannot move token {src + 1} to {dst + 1} of {s.n}")
    order.insert(dst, order.pop(src))
    return permute_tokens(s, order)
