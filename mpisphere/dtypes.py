"""The one dtype policy: which dtypes mpisphere moves, sums and transforms.

* Communication operators move and sum float16, float32, float64,
  complex64 and complex128 arrays. float16 is summed in float32 (MPI has no
  half-precision sum, and accumulating many float16 terms in float16 loses
  them); integers, booleans and extended precision are refused.
* Transforms take float32 or float64 fields and give complex64 or
  complex128 coefficients.

Each role's dtypes are in ``ROLES``; ``refusal`` says why a dtype
does not fit a role, and ``mpisphere.validation.check_dtype`` raises it.
No MPI here: :mod:`mpisphere.collectives` maps these dtypes to MPI types.
"""

import numpy

__all__ = ["SUPPORTED", "TRANSFORM", "ROLES", "refusal", "reduction_dtype", "complex_of", "real_of"]

SUPPORTED = tuple(numpy.dtype(d) for d in ("float16", "float32", "float64", "complex64", "complex128"))
TRANSFORM = tuple(numpy.dtype(d) for d in ("float32", "float64"))

ROLES = {
    "moved": SUPPORTED,                                    # what the communication operators move and sum
    "real field": tuple(d for d in SUPPORTED if d.kind == "f"),  # fields interpolated or differenced pointwise
    "transformed": TRANSFORM,                              # the real side of a transform
}
"""The dtypes each role admits."""


def refusal(dtype, role="moved"):
    """Why ``dtype`` does not fit ``role`` (a key of ``ROLES``), or ``None`` if it does."""
    try:
        dtype = numpy.dtype(dtype)
    except TypeError:
        return f"{dtype!r} is not a dtype"
    allowed = ROLES[role]
    if dtype in allowed:
        return None
    names = [d.name for d in allowed]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    return (f"unsupported dtype {dtype.name}; expected {listed}"
            + (" (convert bfloat16 to float32 first)" if "bfloat16" in str(dtype) else ""))


def reduction_dtype(dtype):
    """The dtype a sum over ranks runs in: float16 is promoted to float32, nothing else changes."""
    dtype = numpy.dtype(dtype)
    return numpy.dtype(numpy.float32) if dtype == numpy.float16 else dtype


def complex_of(dtype):
    """complex64 for float32, complex128 for float64."""
    return numpy.result_type(numpy.dtype(dtype), numpy.complex64)


def real_of(dtype):
    """float32 for complex64, float64 for complex128 (real dtypes are returned as they are)."""
    return numpy.empty(0, numpy.dtype(dtype)).real.dtype
