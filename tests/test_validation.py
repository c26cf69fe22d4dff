"""The one validation layer: integers, choices, dtypes per role (serial)."""

import numpy
import pytest

from mpisphere import dtypes
from mpisphere.validation import check_choice, check_dtype, check_int


def test_integers():
    assert check_int(numpy.int32(5), "n") == 5
    with pytest.raises(TypeError, match=r"^Op: n must be an integer, got 5.0$"):
        check_int(5.0, "n", "Op")
    with pytest.raises(ValueError, match=r"^Op: width must be non-negative, got width=-1$"):
        check_int(-1, "width", "Op", minimum=0)
    with pytest.raises(ValueError, match="must be at least 3"):
        check_int(2, "nlat", minimum=3)


def test_choices_and_aliases():
    assert check_choice("ortho", ("ortho", "schmidt"), "norm") == "ortho"
    assert check_choice("Gauss", ("legendre-gauss",), "quadrature", aliases={"gauss": "legendre-gauss"}) \
        == "legendre-gauss"
    with pytest.raises(ValueError, match=r"^T: norm must be one of 'ortho', 'schmidt', got 'unit'$"):
        check_choice("unit", ("ortho", "schmidt"), "norm", "T")
    with pytest.raises(ValueError, match="got \\[1\\]"):  # unhashable values are refused, not a TypeError
        check_choice([1], ("a",), "x")


@pytest.mark.parametrize("role, allowed, refused", [
    ("moved", ["float16", "float32", "float64", "complex64", "complex128"], ["int64", "bool", "longdouble"]),
    ("real field", ["float16", "float32", "float64"], ["complex128", "longdouble", "int32"]),
    ("transformed", ["float32", "float64"], ["float16", "complex128", "longdouble"]),
])
def test_each_role_admits_its_dtypes_only(role, allowed, refused):
    for name in allowed:
        assert check_dtype(name, role) == numpy.dtype(name)
        assert dtypes.refusal(name, role) is None
    for name in refused:
        with pytest.raises(TypeError, match=rf"^Op: dtype: unsupported dtype {numpy.dtype(name).name}; expected"):
            check_dtype(name, role, who="Op")
    with pytest.raises(TypeError, match="is not a dtype"):
        check_dtype("no-such-type", role)
