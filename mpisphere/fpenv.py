"""The caller's floating-point environment kept around a foreign kernel: traps held off, spurious flags dropped.

A host model built with ``-ffpe-trap=invalid,zero,overflow`` (or Python
code that enabled the same traps with ``feenableexcept``) turns every
operation that raises one of those flags into SIGFPE, wherever it runs.
ducc0's Legendre kernels (``ducc0.sht.leg2alm``/``alm2leg``) raise the
overflow flag on some CPUs while their results are finite: on x86-64 its
AVX2 build (``DUCC0_MAX_PSABI_LEVEL=3``, what a CPU without AVX-512 runs)
overflows in SIMD lanes whose values it then discards, at ``lmax = 361``
with every order; its AVX-512 build does not. Measured with
``fetestexcept`` after each call: 12 of 12 such cases at levels 1-3, none
at level 4; ducc0's real FFTs raise nothing at any level.

``HeldTraps`` runs such a kernel the way C99's ``feholdexcept``
means: the caller's environment (its flags and its traps) is saved, the
kernel runs with every trap off and clear flags, and the caller's
environment comes back unchanged, so a flag the kernel raised is dropped
when every output it wrote is finite. When an output is not finite the
flags are raised again in the caller's environment (``feraiseexcept``),
which traps where the caller asked for traps: nothing non-finite passes
unseen. Where the C library offers no ``<fenv.h>`` functions the kernel
runs as it is.
"""

import ctypes
import ctypes.util

import numpy

__all__ = ["HeldTraps", "fenv_available"]

# fenv_t is 32 bytes on x86-64 glibc and 8 on aarch64; a buffer larger than any platform's is safe for all
_ENV_BYTES = 1024
_ALL_FLAGS = -1  # fetestexcept masks with the platform's FE_ALL_EXCEPT itself


def _load_libm():
    """The C maths library's ``<fenv.h>`` functions, or None where they cannot be found."""
    name = ctypes.util.find_library("m")
    try:
        libm = ctypes.CDLL(name) if name else ctypes.CDLL(None)
        functions = [getattr(libm, f) for f in ("feholdexcept", "fesetenv", "fetestexcept", "feraiseexcept")]
    except (OSError, AttributeError):
        return None
    for function in functions:
        function.restype = ctypes.c_int
    return libm


_LIBM = _load_libm()  # a library handle, set once at import (read-only afterwards)


def fenv_available():
    """Whether :class:`HeldTraps` can hold the caller's environment here (the C library's ``<fenv.h>``)."""
    return _LIBM is not None


class HeldTraps:
    """A context manager: the caller's floating-point environment held around one foreign kernel.

    Parameters
    ----------
    outputs : sequence of ndarray
        The arrays the kernel writes, checked for non-finite values only
        when it raised a flag (the check costs nothing otherwise).

    Notes
    -----
    One object per use: ``with HeldTraps([out]): kernel(..., out=out)``.
    Entering saves the environment, clears the flags and turns every trap
    off (``feholdexcept``); leaving reads the flags the kernel raised
    (``fetestexcept``), restores the caller's environment (``fesetenv``:
    its own flags and traps, none of the kernel's) and, if the kernel raised
    a flag and an output is not finite, raises those flags again
    (``feraiseexcept``). Cost: four C calls through ctypes, about 2 us.
    """

    __slots__ = ("outputs", "_saved")

    def __init__(self, outputs=()):
        self.outputs = outputs
        self._saved = None

    def __enter__(self):
        if _LIBM is not None:
            self._saved = ctypes.create_string_buffer(_ENV_BYTES)
            if _LIBM.feholdexcept(self._saved) != 0:
                self._saved = None  # this platform cannot hold its traps: run as it is
        return self

    def __exit__(self, kind, value, traceback):
        if self._saved is None:
            return False
        raised = _LIBM.fetestexcept(_ALL_FLAGS)
        _LIBM.fesetenv(self._saved)
        self._saved = None
        if raised and kind is None and not all(bool(numpy.isfinite(out).all()) for out in self.outputs):
            _LIBM.feraiseexcept(raised)  # a real inf or NaN: as if the kernel had run in the caller's environment
        return False
