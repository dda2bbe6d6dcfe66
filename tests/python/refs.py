"""Inputs and references of the Python tests, written here and not taken from the library.

Sums: rank order 0..W-1. f32 adds in f32; f16 and bf16 widen to f32 (exact),
add in rank order in f32 and round once to nearest even. Inputs are
deterministic per (rank, call), so every rank computes every rank's input.
"""

from __future__ import annotations

from typing import List

import numpy as np


def pattern(rank: int, call: int, nbytes: int) -> np.ndarray:
    """Bytes that differ per rank, call and offset."""
    i = np.arange(nbytes, dtype=np.uint64)
    return ((i * 131 + rank * 17 + call * 7 + 1) % 256).astype(np.uint8)


def values_f32(rank: int, call: int, count: int) -> np.ndarray:
    """Floats of mixed magnitude and sign, so that the order of addition shows in the last bits."""
    rng = np.random.default_rng(1000 * call + rank)
    mant = rng.standard_normal(count)
    exp = rng.integers(-8, 9, count)
    return (mant * np.exp2(exp)).astype(np.float32)


def values_f16(rank: int, call: int, count: int) -> np.ndarray:
    return (values_f32(rank, call, count) * 0.25).astype(np.float16)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bits (uint16), round to nearest even; NaN stays NaN."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return np.where(nan, (b >> 16) | 0x40, rounded).astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def values_bf16(rank: int, call: int, count: int) -> np.ndarray:
    """bf16 bits (uint16)."""
    return bf16_bits(values_f32(rank, call, count))


def sum_f32(rows: List[np.ndarray]) -> np.ndarray:
    acc = rows[0].astype(np.float32)
    for r in rows[1:]:
        acc = (acc + r.astype(np.float32)).astype(np.float32)
    return acc


def sum_f16(rows: List[np.ndarray]) -> np.ndarray:
    return sum_f32([r.astype(np.float32) for r in rows]).astype(np.float16)  # numpy rounds f32 -> f16 to nearest even


def sum_bf16(rows: List[np.ndarray]) -> np.ndarray:
    return bf16_bits(sum_f32([bf16_to_f32(r) for r in rows]))


def reversed_sum_differs(rows: List[np.ndarray]) -> bool:
    """Whether adding in reverse order gives other bits somewhere: the inputs can tell the orders apart."""
    return len(rows) > 2 and bool(np.any(sum_f32(rows).view(np.uint32) != sum_f32(rows[::-1]).view(np.uint32)))
