"""A timing sweep's settings and their one command line.

``Config`` is what a sweep runs with; ``config_to_argv`` and ``config_from_argv`` turn it
into ``attnviz bench`` flags and back, and the command's own parser is built from the
same ``add_config_arguments``: the window that starts a sweep in a child process and the
command that runs it cannot disagree on a flag. Standard library only.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, NoReturn

# flex: torch.compile(flex_attention) with a block mask; flex-eager: the same without the
# compiler (unfused: it materialises the scores), for where no compiler toolchain is found.
FLEX = ("flex", "flex-eager")
IMPLEMENTATIONS = ("naive", "sdpa", "flash", "efficient", "cudnn", "math", *FLEX)
DEFAULT_IMPLS = IMPLEMENTATIONS[:6]  # flex compiles once per n: asked for by name
DTYPES = ("float32", "float16", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
PHASES = ("prefill", "decode")
MAX_N = {"cpu": 32768, "cuda": 131072}
MAX_DOCUMENTS = 128  # the float64 check at n = 128 must hold a token of each


@dataclass(frozen=True)
class Config:
    device: str = "auto"
    dtype: str = "float32"
    batch: int = 1
    heads: int = 12
    d_head: int = 64
    causal: bool = False
    backward: bool = False
    min_n: int = 256
    max_n: int = 4096
    impls: tuple[str, ...] = ("naive", "sdpa")
    repeats: int = 5
    warmup: int = 1
    threads: int = 0  # CPU threads for torch; 0 keeps torch's default
    phase: str = "prefill"  # prefill: n queries; decode: one new query against n cached keys
    kv_heads: int = 0  # key/value heads shared by groups of query heads (GQA); 0: heads
    window: int = 0  # a causal sliding window: each query sees itself and W - 1 keys back
    documents: int = 0  # n split into this many equal documents that never see each other

    @property
    def groups(self) -> int:
        """The number of key/value heads G (heads without grouping)."""
        return self.kv_heads or self.heads

    def check(self) -> None:
        """Raise ValueError naming the first bad parameter."""
        if self.device not in DEVICES:
            raise ValueError(f"device: {self.device!r}; expected auto, cpu or cuda")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        for name, low, high in (
            ("batch", 1, 1024),
            ("heads", 1, 1024),
            ("d_head", 1, 1024),
            ("repeats", 1, 1000),
            ("warmup", 0, 100),
            ("threads", 0, 1024),
            ("kv_heads", 0, 1024),
            ("window", 0, MAX_N["cuda"]),
            ("documents", 0, MAX_DOCUMENTS),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name}: {value!r}; expected a whole number from {low} to {high}")
        for name in ("min_n", "max_n"):
            n = getattr(self, name)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1 or n & (n - 1):
                raise ValueError(f"{name}: {n!r}; expected a power of two")
        if self.min_n > self.max_n:
            raise ValueError(f"min_n {self.min_n} is larger than max_n {self.max_n}")
        if self.max_n > MAX_N["cuda"]:
            raise ValueError(f"max_n: {self.max_n}; the largest sweep goes to {MAX_N['cuda']}")
        unknown = [i for i in self.impls if i not in IMPLEMENTATIONS]
        if unknown or not self.impls:
            given = ", ".join(unknown) or "none given"
            raise ValueError(f"impl: {given}; expected some of {', '.join(IMPLEMENTATIONS)}")
        self._check_shape()

    def _check_shape(self) -> None:
        """The new settings: phase, key/value heads, window and documents."""
        if self.phase not in PHASES:
            raise ValueError(f"phase: {self.phase!r}; expected prefill or decode")
        if self.kv_heads and self.heads % self.kv_heads:
            fits = ", ".join(str(g) for g in range(1, self.heads + 1) if self.heads % g == 0)
            raise ValueError(
                f"kv_heads: {self.kv_heads} does not divide heads {self.heads}; "
                f"expected one of {fits}"
            )
        d = self.documents
        if d and (d & (d - 1) or d > self.min_n):
            raise ValueError(
                f"documents: {d}; expected a power of two up to min_n ({self.min_n}) and "
                f"{MAX_DOCUMENTS}, so that every n splits into equal documents"
            )
        if self.phase == "decode":
            for name, flag in (("window", "--window"), ("documents", "--documents")):
                if getattr(self, name):
                    raise ValueError(
                        f"{name}: the decode phase times one new row against the whole "
                        f"cache; leave out {flag}"
                    )
            if self.backward:
                raise ValueError("backward: the decode phase times the forward pass only")

    def sizes(self) -> list[int]:
        return [2**k for k in range(self.min_n.bit_length() - 1, self.max_n.bit_length())]

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON has them (impls a list): the same before and after JSON."""
        return asdict(self) | {"impls": list(self.impls)}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Config:
        """The config a report's ``config`` dict describes (read back from JSON: impls may
        be a list). Keys that are no Config field are ignored; missing ones take defaults."""
        known = {f.name for f in fields(cls)}
        kept = {k: v for k, v in values.items() if k in known}
        if "impls" in kept:
            kept["impls"] = tuple(kept["impls"])
        return cls(**kept)


def default_max_n(device: str) -> int:
    """The sweep's top n when ``--max-n`` is left out: 65536 on a GPU, 4096 otherwise."""
    return 65536 if device == "cuda" else 4096


# The command line -----------------------------------------------------------------------


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _impls(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in IMPLEMENTATIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or 'nothing'}: expected some of {','.join(IMPLEMENTATIONS)}"
        )
    return names


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per Config field (``--impl`` for impls, ``--d-head`` for d_head, …)."""
    d = Config()
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--dtype", choices=DTYPES, default=d.dtype)
    p.add_argument("--batch", type=_whole, default=d.batch)
    p.add_argument("--heads", type=_whole, default=d.heads)
    p.add_argument("--d-head", type=_whole, default=d.d_head)
    p.add_argument("--causal", action="store_true", help="mask future keys")
    p.add_argument("--backward", action="store_true", help="time forward + backward")
    p.add_argument("--min-n", type=_whole, default=d.min_n, help="a power of two")
    p.add_argument(
        "--max-n",
        type=_whole,
        default=None,
        help="a power of two (default: 4096 on a CPU, 65536 on a GPU)",
    )
    p.add_argument(
        "--impl",
        type=_impls,
        default=None,
        help=f"comma-separated: {','.join(IMPLEMENTATIONS)} (default: all but flex)",
    )
    p.add_argument("--repeats", type=_whole, default=d.repeats)
    p.add_argument(
        "--warmup", type=_whole, default=d.warmup, help="untimed runs before the timed ones"
    )
    p.add_argument("--threads", type=_whole, default=0, help="CPU threads (default: torch's)")
    p.add_argument(
        "--phase",
        choices=PHASES,
        default=d.phase,
        help="prefill: n queries at once; decode: one new query against a cache of n",
    )
    p.add_argument(
        "--kv-heads",
        type=_whole,
        default=d.kv_heads,
        help="key/value heads shared by groups of query heads (GQA; default: --heads)",
    )
    p.add_argument(
        "--window",
        type=_whole,
        default=d.window,
        help="a causal sliding window of W keys (each query sees itself and W - 1 before it)",
    )
    p.add_argument(
        "--documents",
        type=_whole,
        default=d.documents,
        help="split n into D equal documents that never attend to each other (a power of 2)",
    )


def config_from_namespace(args: argparse.Namespace, device: str | None = None) -> Config:
    """The Config that parsed flags describe; device (resolved by the caller, e.g. "auto"
    to "cuda") replaces ``--device`` and picks the default ``--max-n``."""
    device = device or args.device
    return Config(
        device=device,
        dtype=args.dtype,
        batch=args.batch,
        heads=args.heads,
        d_head=args.d_head,
        causal=args.causal,
        backward=args.backward,
        min_n=args.min_n,
        max_n=args.max_n if args.max_n is not None else default_max_n(device),
        impls=args.impl or DEFAULT_IMPLS,
        repeats=args.repeats,
        warmup=args.warmup,
        threads=args.threads,
        phase=args.phase,
        kv_heads=args.kv_heads,
        window=args.window,
        documents=args.documents,
    )


def config_to_argv(config: Config) -> list[str]:
    """``attnviz bench`` flags for every field of config, defaults included."""
    c = config
    argv = ["--device", c.device, "--dtype", c.dtype, "--batch", str(c.batch)]
    argv += ["--heads", str(c.heads), "--d-head", str(c.d_head)]
    argv += ["--min-n", str(c.min_n), "--max-n", str(c.max_n), "--impl", ",".join(c.impls)]
    argv += ["--repeats", str(c.repeats), "--warmup", str(c.warmup), "--threads", str(c.threads)]
    argv += ["--phase", c.phase, "--kv-heads", str(c.kv_heads)]
    argv += ["--window", str(c.window), "--documents", str(c.documents)]
    return argv + (["--causal"] if c.causal else []) + (["--backward"] if c.backward else [])


class _Refuse(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def config_from_argv(argv: Sequence[str]) -> Config:
    """The Config that ``attnviz bench`` flags describe (only the Config flags; the device
    is kept as given). Raises ValueError for a flag it does not know or cannot read."""
    p = _Refuse(prog="attnviz bench", add_help=False)
    add_config_arguments(p)
    return config_from_namespace(p.parse_args(list(argv)))
