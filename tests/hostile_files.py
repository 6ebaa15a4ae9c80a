"""Hostile files for the tests and for benchmarks/hostile_sizes.py."""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np

from attnviz.core.io import files as F
from attnviz.core.presets import worked_example


def write_snapshot_bomb(path: Path, shape: tuple[int, int]) -> None:
    """A snapshot whose X is a deflated matrix of zeros of shape: a small file (about 1 MiB
    for 256 MiB) that unpacks to shape's float64 bytes."""
    F.save_snapshot(path, worked_example())
    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i) for i in z.infolist() if i.filename != "X.npy"}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for name, data in members.items():
            z.writestr(name, data)
        with z.open("X.npy", "w", force_zip64=True) as member:
            header = {"descr": "<f8", "fortran_order": False, "shape": shape}
            np.lib.format.write_array_header_1_0(member, header)
            size = math.prod(shape) * 8
            for _ in range(size // 2**20):
                member.write(bytes(2**20))
            member.write(bytes(size % 2**20))
