"""The scenario document both file forms share: the format's versions and fields, what
decides the version a save writes, and the checks that both readers apply alike to a
parsed document (its top, tokens and settings), each message naming its field.

Version 1 holds tokens, X, the heads' W_Q/W_K/W_V, W_O and the basic settings; version 2
adds cross-attention, shared key/value heads, biases, QK-norm weights and the newer
settings and values (custom masks, RoPE, ALiBi, …); version 3 adds ``provenance``
(``provenance_files``); version 4 the loss the gradients are of (``loss``,
``loss_target``, ``loss_cell``); version 5 a model's own RoPE frequencies and factor
(``rope_frequencies``, ``rope_factor``: scaled RoPE) and QK-norm over the whole
projection (``qk_norm`` "rms-whole"); version 6 T5's relative position bias (positional
``relative-bias``, ``relative_buckets``, ``relative_max_distance``,
``relative_bidirectional`` and the table ``relative_bias``, buckets × heads, saved with
the settings as a custom mask is). A save writes the oldest version that holds the
scenario.
"""

from __future__ import annotations

from typing import Any

from attnviz.core.io.checks import FileFormatError, clip, key_text, number
from attnviz.core.maths.scenario import (
    LIMITS,
    PER_HEAD_MOST,
    RELATIVE_BUCKETS_MOST,
    RELATIVE_DISTANCE_MOST,
    SOFTCAP_LEAST,
    WEIGHT_NAMES,
    Scenario,
    ScenarioError,
    Settings,
)

FORMAT = "attnviz-scenario"
VERSION = 6  # the newest this attnviz reads; a save writes the oldest that holds the scenario
VERSIONS = (1, 2, 3, 4, 5, 6)
V1_TOP_KEYS = ("format", "version", "tokens", "X", "heads", "W_O", "settings")
V2_TOP_KEYS = ("kv_tokens", "X_kv", "kv_heads", "b_O")
V3_TOP_KEYS = ("provenance",)
TOP_KEYS = set(V1_TOP_KEYS + V2_TOP_KEYS + V3_TOP_KEYS)
V1_SETTINGS = ("projections", "scale", "mask", "positional", "dropout", "dropout_seed", "ablated")
V2_SETTINGS = (
    "window",
    "mask_matrix",
    "causal_alignment",
    "rope_base",
    "rope_style",
    "rope_dims",
    "alibi_slopes",
    "scale_value",
    "qk_norm",
    "qk_norm_eps",
    "softcap",
    "sinks",
)
V4_SETTINGS = (
    "loss",
    "loss_target",
    "loss_cell",
    "target",
)  # the gradients' loss, when not the default
V5_SETTINGS = ("rope_frequencies", "rope_factor")  # scaled RoPE, when not the base's
# T5's relative position bias; the table (buckets × heads) with positional relative-bias only
V6_SETTINGS = ("relative_buckets", "relative_max_distance", "relative_bidirectional",
               "relative_bias")  # fmt: skip
SETTINGS_KEYS_ORDER = V1_SETTINGS + V2_SETTINGS + V4_SETTINGS + V5_SETTINGS + V6_SETTINGS
SETTINGS_KEYS = set(SETTINGS_KEYS_ORDER)
V1_HEAD_KEYS = ("W_Q", "W_K", "W_V")
Q_HEAD_KEYS = ("W_Q", "b_Q", "q_norm")
KV_HEAD_KEYS = ("W_K", "b_K", "W_V", "b_V", "k_norm")
HEAD_KEYS = ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "q_norm", "k_norm")
VECTORS = ("b_Q", "b_K", "b_V", "q_norm", "k_norm", "b_O")  # written as one list of numbers
# values a version lacks: version 1 these, version 4 those
V2_VALUES: dict[str, tuple[str, ...]] = {"mask": ("custom",), "positional": ("rope", "alibi")}
V5_VALUES: dict[str, tuple[str, ...]] = {"qk_norm": ("rms-whole",)}
V6_VALUES: dict[str, tuple[str, ...]] = {"positional": ("relative-bias",)}
_DEFAULTS = Settings()


# Scenario -> document: the settings, and the version a save writes ---------------------


def in_use(s: Scenario, name: str) -> bool:
    """Whether an optional per-head array differs from its neutral value (0, or 1 for
    norm weights; norm weights also whenever QK-norm is on)."""
    if name.endswith("norm"):
        return s.settings.qk_norm != "none" or bool((getattr(s, name) != 1.0).any())
    return bool(getattr(s, name).any())


def settings_to_dict(st: Settings) -> dict[str, Any]:
    """Settings as saved; ablated heads are numbered from 1, as everywhere users see them.
    A version-2 setting is written only where it has an effect or differs from its
    default (the window only with a sliding-window mask), so that plain scenarios stay
    version 1."""
    d: dict[str, Any] = {name: getattr(st, name) for name in V1_SETTINGS}
    d["ablated"] = [h + 1 for h in st.ablated]
    for name in V2_SETTINGS:
        value = getattr(st, name, None)
        if name == "window":
            if st.mask == "sliding-window":
                d[name] = value
        elif name != "mask_matrix" and value != getattr(_DEFAULTS, name):
            d[name] = list(value) if isinstance(value, tuple) else value
    for name in V4_SETTINGS[:3]:  # (the target's grid T is the caller's, as mask_matrix)
        value = getattr(st, name)
        if value != getattr(_DEFAULTS, name):
            d[name] = [k + 1 for k in value] if name == "loss_cell" else value  # (from 1)
    for name in V5_SETTINGS:
        value = getattr(st, name)
        if value != getattr(_DEFAULTS, name):
            d[name] = list(value) if isinstance(value, tuple) else value
    for name in V6_SETTINGS[:3]:  # (the table is the caller's, as mask_matrix)
        value = getattr(st, name)
        if st.positional == "relative-bias" or value != getattr(_DEFAULTS, name):
            d[name] = value
    return d


def version_for(s: Scenario) -> int:
    """6 with T5's relative position bias; 5 with a model's own RoPE frequencies or
    factor; 4 with a loss other than the
    default (the gradients'); 3 with a provenance; else 1, unless the scenario uses
    something only version 2 can hold."""
    if set(settings_to_dict(s.settings)) & set(V6_SETTINGS) or _uses(s.settings, V6_VALUES):
        return 6
    if set(settings_to_dict(s.settings)) & set(V5_SETTINGS) or _uses(s.settings, V5_VALUES):
        return 5
    if set(settings_to_dict(s.settings)) & set(V4_SETTINGS):
        return 4
    if s.provenance is not None:
        return 3
    optional = (n for n in HEAD_KEYS if n not in WEIGHT_NAMES)
    uses_v2 = (
        s.cross
        or s.kv_heads != s.n_heads
        or s.b_O.any()
        or any(in_use(s, n) for n in optional)
        or set(settings_to_dict(s.settings)) & set(V2_SETTINGS)
        or _uses(s.settings, V2_VALUES)
    )
    return 2 if uses_v2 else 1


def _uses(st: Settings | dict[str, Any], values: dict[str, tuple[str, ...]]) -> str:
    """The first setting whose value is among ``values`` ('' when none is)."""
    get = st.get if isinstance(st, dict) else lambda k: getattr(st, k)
    return next((k for k, allowed in values.items() if get(k) in allowed), "")


# Document -> Scenario: the fields both forms check alike ------------------------------


def check_document(data: Any) -> int:
    """Check the top of a document (format, version, which fields); its version."""
    if not isinstance(data, dict):
        raise FileFormatError("expected a JSON object at the top")
    if data.get("format") != FORMAT:
        raise FileFormatError(f"format: expected {FORMAT!r}, got {clip(data.get('format'))}")
    version = data.get("version")
    if type(version) is not int or version not in VERSIONS:
        readable = ", ".join(map(str, VERSIONS[:-1])) + f" and {VERSIONS[-1]}"
        raise FileFormatError(
            f"version: {clip(version, 20)} is not supported (this attnviz reads {readable})"
        )
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise FileFormatError(f"{key_text(unknown[0])}: unknown field")
    for needs, keys in ((2, V2_TOP_KEYS), (3, V3_TOP_KEYS)):
        newer = [k for k in keys if k in data]
        if version < needs and newer:
            raise FileFormatError(f"{newer[0]}: needs version {needs} (the file says {version})")
    for key in ("tokens", "X", "heads", "W_O"):
        if key not in data:
            raise FileFormatError(f"{key}: missing")
    return version


def tokens_field(where: str, tokens: Any) -> list[str]:
    """A non-empty list of at most LIMITS.tokens text labels."""
    if not isinstance(tokens, list) or not tokens:
        raise FileFormatError(f"{where}: expected a non-empty list of text labels")
    if len(tokens) > LIMITS.tokens:
        raise FileFormatError(f"{where}: {len(tokens)} tokens; the limit is {LIMITS.tokens}")
    for i, t in enumerate(tokens):
        if not isinstance(t, str):
            raise FileFormatError(f"{where}[{i + 1}]: expected text, got {clip(t)}")
    return tokens


def head_keys(version: int, shared: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The fields each query head must have and may have, for a version and whether the
    document has kv_heads."""
    allowed = (Q_HEAD_KEYS if shared else HEAD_KEYS) if version >= 2 else V1_HEAD_KEYS
    return ("W_Q",) if shared else V1_HEAD_KEYS, allowed


# The range of each number a settings object may hold, as read: (low, high, whole, ends)
# as ``checks.number`` takes them; the ranges Settings itself checks.
SETTING_NUMBERS: dict[str, tuple[float, float, bool, str]] = {
    "dropout": (0.0, 1.0, False, "[)"),
    "dropout_seed": (0, 2**32 - 1, True, "[]"),
    "window": (1, LIMITS.tokens, True, "[]"),
    "rope_base": (1.0, 1e9, False, "(]"),
    "rope_dims": (2, LIMITS.d_k, True, "[]"),  # Settings checks that it is even
    "scale_value": (0.0, 1e9, False, "(]"),
    "qk_norm_eps": (0.0, 1.0, False, "(]"),
    "softcap": (SOFTCAP_LEAST, 1e9, False, "[]"),  # a smaller c overflows s/c
    "rope_factor": (0.0, 1e3, False, "(]"),
    "relative_buckets": (2, RELATIVE_BUCKETS_MOST, True, "[]"),  # Settings checks the rest
    "relative_max_distance": (2, RELATIVE_DISTANCE_MOST, True, "[]"),
}
_OPTIONAL = ("rope_dims", "alibi_slopes", "scale_value", "softcap", "sinks", "rope_frequencies")


def settings_from_dict(value: Any, version: int = VERSION) -> Settings:
    """Settings from their saved object (mask_matrix apart: the caller reads it); every
    number is range-checked here, by ``checks.number``."""
    if not isinstance(value, dict):
        raise FileFormatError("settings: expected an object")
    if version < 2:
        _check_version_1(value)
    newer = sorted(set(value) & set(V4_SETTINGS))
    if version < 4 and newer:
        raise FileFormatError(f"settings.{newer[0]}: needs version 4 (the file says {version})")
    for needs, names, values in ((5, V5_SETTINGS, V5_VALUES), (6, V6_SETTINGS, V6_VALUES)):
        newer = sorted(set(value) & set(names)) or [_uses(value, values)]
        if version < needs and newer[0]:
            what = newer[0] if newer[0] in names else f"{newer[0]} {value[newer[0]]!r}"
            raise FileFormatError(
                f"settings.{what}: needs version {needs} (the file says {version})"
            )
    unknown = sorted(set(value) - SETTINGS_KEYS)
    if unknown:
        raise FileFormatError(
            f"settings.{key_text(unknown[0])}: unknown setting; "
            f"known: {', '.join(SETTINGS_KEYS_ORDER)}"
        )
    value = {k: v for k, v in value.items() if k not in ("mask_matrix", "target", "relative_bias")}
    if "ablated" in value:
        value["ablated"] = _ablated(value["ablated"])
    if "loss_cell" in value:
        value["loss_cell"] = _cell(value["loss_cell"])
    for name in (n for n in value if value[n] is not None or n not in _OPTIONAL):
        if name in SETTING_NUMBERS:
            low, high, whole, ends = SETTING_NUMBERS[name]
            value[name] = number(value[name], f"settings.{name}", low, high, whole, ends)
        elif name in ("alibi_slopes", "sinks"):
            value[name] = _per_head(name, value[name])
        elif name == "rope_frequencies":
            value[name] = _frequencies(value[name])
    try:
        return Settings(**value)
    except ScenarioError as e:
        raise FileFormatError(str(e)) from None


def _check_version_1(value: dict[str, Any]) -> None:
    """Refuse what only version 2 may say in a file that says version 1."""
    newer = sorted(set(value) & set(V2_SETTINGS))
    if newer:
        raise FileFormatError(f"settings.{newer[0]}: needs version 2 (the file says 1)")
    for name, values in V2_VALUES.items():
        if value.get(name) in values:
            raise FileFormatError(
                f"settings.{name}: {value[name]!r} needs version 2 (the file says 1)"
            )


def _ablated(heads: Any) -> tuple[int, ...]:
    """Head numbers from 1 as saved, 0-based and in order."""
    if not isinstance(heads, list) or len(heads) > LIMITS.heads:
        raise FileFormatError(
            f"settings.ablated: expected a list of at most {LIMITS.heads} head numbers from 1"
        )
    numbers = [
        number(h, f"settings.ablated[{i + 1}]", 1, LIMITS.heads, integer=True)
        for i, h in enumerate(heads)
    ]
    if len(set(numbers)) != len(numbers):
        raise FileFormatError(f"settings.ablated: head numbers {clip(heads)} repeat")
    return tuple(sorted(h - 1 for h in numbers))


def _cell(cell: Any) -> tuple[int, int]:
    """The loss's output cell as saved, [row, column] from 1, 0-based."""
    if not isinstance(cell, list) or len(cell) != 2:
        raise FileFormatError("settings.loss_cell: expected [row, column], numbered from 1")
    row, col = (
        number(k, f"settings.loss_cell[{i + 1}]", 1, most, integer=True)
        for i, (k, most) in enumerate(zip(cell, (LIMITS.tokens, LIMITS.d_model), strict=True))
    )
    return int(row) - 1, int(col) - 1


def _per_head(name: str, numbers: Any) -> tuple[float, ...]:
    """A list of numbers, one per head (sinks, ALiBi slopes)."""
    if not isinstance(numbers, list) or not 1 <= len(numbers) <= LIMITS.heads:
        raise FileFormatError(
            f"settings.{name}: expected a list of numbers, one per head (1 to {LIMITS.heads} heads)"
        )
    most = PER_HEAD_MOST
    return tuple(number(v, f"settings.{name}[{h + 1}]", -most, most) for h, v in enumerate(numbers))


def _frequencies(numbers: Any) -> tuple[float, ...]:
    """RoPE's frequencies as saved: one number per pair, radians per position."""
    if not isinstance(numbers, list) or not 1 <= len(numbers) <= LIMITS.d_k // 2:
        raise FileFormatError(
            f"settings.rope_frequencies: expected a list of 1 to {LIMITS.d_k // 2} numbers, "
            "one per pair RoPE turns"
        )
    return tuple(
        number(v, f"settings.rope_frequencies[{k + 1}]", 0.0, 1e3, ends="(]")
        for k, v in enumerate(numbers)
    )


def document_settings(data: dict[str, Any], version: int) -> tuple[Settings, Any]:
    """The document's settings, and its settings object, whose mask_matrix the caller
    reads when the mask is custom (it is there then, and only then)."""
    value = data.get("settings", {})
    settings = settings_from_dict(value, version)
    if settings.mask == "custom":
        if "mask_matrix" not in value:
            raise FileFormatError("settings.mask_matrix: missing (the custom mask needs it)")
    elif "mask_matrix" in value:
        raise FileFormatError(
            f"settings.mask_matrix: only for the custom mask (mask is {settings.mask!r})"
        )
    relative = settings.positional == "relative-bias"
    if relative != ("relative_bias" in value):
        raise FileFormatError(
            "settings.relative_bias: missing (T5's relative position bias needs its table)"
            if relative
            else "settings.relative_bias: only for positional relative-bias "
            f"(positional is {settings.positional!r})"
        )
    if (settings.loss_target == "custom") != ("target" in value):
        raise FileFormatError(
            "settings.target: missing (the custom target needs it)"
            if "target" not in value
            else f"settings.target: only for the custom target (loss_target is "
            f"{settings.loss_target!r})"
        )
    return settings, value
