"""Per-head matrices, one read-only array per head: an edit of one head copies that head.

A scenario keeps each per-head matrix (W_Q, W_K, W_V, their biases and norm weights) as
a ``HeadStack``: ``stack[h]`` is head h's 2-D array, ``stack.array()`` the whole
(heads, rows, cols) stack. ``with_head`` makes a new stack that shares every other head
(a Llama-3-8B layer's W_Q is 134 MB; an edit of one of its cells copies 4 MB).

``checked`` says whether every number was checked when it entered the stack (by the
check given to ``of`` and ``with_head``): a scenario checks a stack that was not, and
takes one that was as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

Check = Callable[[int, np.ndarray], None]  # raises for a head whose numbers are invalid


@dataclass(frozen=True, eq=False)
class HeadStack(NDArrayOperatorsMixin):
    """Heads × rows × cols, one read-only float64 array per head. ``whole`` is the stack
    the heads are views of, while no head has been replaced. Arithmetic, comparisons and
    NumPy functions see the whole stack (and give arrays)."""

    heads: tuple[np.ndarray, ...]
    whole: np.ndarray | None = None
    checked: bool = False

    @staticmethod
    def of(values: Any, check: Check | None = None) -> HeadStack:
        """A stack of the given (heads, rows, cols) numbers, each head checked by check."""
        if isinstance(values, HeadStack):
            return values
        whole = np.array(values, dtype=np.float64)
        if whole.ndim != 3:
            raise ValueError(f"expected (heads, rows, cols), got {whole.ndim}-D")
        whole.flags.writeable = False
        if check is not None:
            for h in range(len(whole)):
                check(h, whole[h])
        return HeadStack(tuple(whole), whole, check is not None)

    def with_head(self, h: int, values: np.ndarray, check: Check | None = None) -> HeadStack:
        """A copy with head h replaced by values (of its shape), checked by check."""
        head = np.array(values, dtype=np.float64)
        if head.shape != self.heads[h].shape:
            raise ValueError(f"head {h + 1}: expected {self.heads[h].shape}, got {head.shape}")
        if check is not None:
            check(h, head)
        head.flags.writeable = False
        heads = (*self.heads[:h], head, *self.heads[h + 1 :])
        return HeadStack(heads, checked=self.checked and check is not None)

    @property
    def shape(self) -> tuple[int, int, int]:
        rows, cols = self.heads[0].shape
        return len(self.heads), rows, cols

    @property
    def ndim(self) -> int:
        return 3

    @property
    def size(self) -> int:
        count, rows, cols = self.shape
        return count * rows * cols

    @property
    def nbytes(self) -> int:
        return 8 * self.size

    def array(self) -> np.ndarray:
        """The whole stack as one read-only (heads, rows, cols) array."""
        if self.whole is not None:
            return self.whole
        stack = np.stack(self.heads)
        stack.flags.writeable = False
        return stack

    def take(self, heads: Sequence[int]) -> np.ndarray:
        """The given heads, stacked: (len(heads), rows, cols)."""
        heads = list(heads)
        if heads == list(range(len(self.heads))):
            return self.array()
        return np.stack([self.heads[h] for h in heads])

    def any(self) -> bool:
        return any(bool(h.any()) for h in self.heads)

    def copy(self) -> np.ndarray:
        return np.array(self.array())

    def __len__(self) -> int:
        return len(self.heads)

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self.heads)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, np.integer)):
            return self.heads[key]
        return self.array()[key]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        stack = self.array()
        if dtype is not None and np.dtype(dtype) != stack.dtype:
            return stack.astype(dtype)
        return np.array(stack) if copy else stack

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        arrays = [a.array() if isinstance(a, HeadStack) else a for a in inputs]
        return getattr(ufunc, method)(*arrays, **kwargs)

    def __repr__(self) -> str:
        return f"HeadStack({self.shape[0]} × {self.shape[1]} × {self.shape[2]})"
