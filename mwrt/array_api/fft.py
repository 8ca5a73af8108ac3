"""The standard's `fft` extension: NumPy's (CuPy's on a GPU) FFTs, run on the worker that
holds the tensor; the frequency helpers make their tensors on `device=`."""

from __future__ import annotations

import numpy as np

from ..master import creation
from ._info import place
from ._run import run

__all__ = ["fft", "fftfreq", "fftn", "fftshift", "hfft", "ifft", "ifftn", "ifftshift", "ihfft",
           "irfft", "irfftn", "rfft", "rfftfreq", "rfftn"]


def _one(name: str):
    def transform(x, /, *, n=None, axis=-1, norm="backward"):
        return run(f"fft.{name}", x, n=n, axis=axis, norm=norm)
    transform.__name__ = transform.__qualname__ = name
    transform.__doc__ = f"np.fft.{name} along `axis` (length `n`), on the tensor's worker."
    return transform


def _many(name: str):
    def transform(x, /, *, s=None, axes=None, norm="backward"):
        return run(f"fft.{name}", x, s=None if s is None else tuple(s),
                   axes=None if axes is None else tuple(axes), norm=norm)
    transform.__name__ = transform.__qualname__ = name
    transform.__doc__ = f"np.fft.{name} over `axes` (lengths `s`), on the tensor's worker."
    return transform


fft, ifft, rfft, irfft, hfft, ihfft = (_one(n) for n in
                                       ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft"))
fftn, ifftn, rfftn, irfftn = (_many(n) for n in ("fftn", "ifftn", "rfftn", "irfftn"))


def fftshift(x, /, *, axes=None):
    """The zero frequency moved to the middle."""
    return run("fft.fftshift", x, axes=axes)


def ifftshift(x, /, *, axes=None):
    """fftshift undone."""
    return run("fft.ifftshift", x, axes=axes)


def fftfreq(n, /, *, d=1.0, dtype=None, device=None):
    """The sample frequencies of an FFT of length `n`, made on `device`."""
    node, dev = place(device)
    return creation.fftfreq(n, d, np.float64 if dtype is None else dtype, node=node, device=dev)


def rfftfreq(n, /, *, d=1.0, dtype=None, device=None):
    """The sample frequencies of a real FFT of length `n`, made on `device`."""
    node, dev = place(device)
    return creation.fftfreq(n, d, np.float64 if dtype is None else dtype, real=True,
                            node=node, device=dev)
