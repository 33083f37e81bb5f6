"""0/1 indicator tensors in the compute dtype, the currency of the correction math.

Why not bool masks: on CPU, comparisons that produce ``bool`` and bool->float conversions run
3–8x slower than float kernels (measured on ``[64, 2048]``: ``x > a`` 60 us, ``(x > a).float()``
150 us, ``torch.gt(x, a, out=float)`` 20 us, ``x * y`` 18 us). With 0/1 floats, ``and`` is a
product, ``or`` of disjoint sets a sum, ``not`` is ``1 - x`` and a count is a ``sum``.
Every function here keeps the shape of its input; ``out=`` reuses a scratch buffer (fresh
``[B, T]`` buffers cost page faults on CPU, comparable to the kernel itself).
"""

import torch
from torch import Tensor


def lt(x: Tensor, bound: float | Tensor, out: Tensor | None = None) -> Tensor:
    """``1.0`` where ``x < bound`` else ``0.0`` (same shape and dtype as ``x``; into ``out`` if given)."""
    return torch.lt(x, bound, out=torch.empty_like(x) if out is None else out)


def gt(x: Tensor, bound: float | Tensor, out: Tensor | None = None) -> Tensor:
    """``1.0`` where ``x > bound`` else ``0.0``."""
    return torch.gt(x, bound, out=torch.empty_like(x) if out is None else out)


def finite_(x: Tensor) -> Tensor:
    """In place: ``x`` becomes ``1.0`` where it was finite, else ``0.0``; returns ``x``.

    ``x - x`` is 0 for a finite value and NaN for NaN/±inf (two passes; ``isfinite`` takes three).
    """
    return x.sub_(x).eq_(0.0)


def from_bool(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool mask as 0/1 ``dtype`` (through a uint8 view: 8x faster than ``mask.to(dtype)`` on CPU)."""
    return mask.view(torch.uint8).to(dtype)
