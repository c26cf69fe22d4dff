"""What a user types first: signatures, import paths and defaults that follow from the operator.

Found by a new user (issue 30): ``inspect.signature`` of a transform showed
``(*args, **kwargs)``, ``from mpisphere.calculus import ...`` failed, and
``dottest`` on an inverse transform needed ``dtype=complex128`` spelled out.
"""

import inspect

import numpy
import pytest

import mpisphere as ms

from helpers import raises


@pytest.mark.parametrize("name", ["DistributedRealSHT", "DistributedInverseRealSHT", "DistributedRealVectorSHT",
                                  "DistributedInverseRealVectorSHT"])
def test_a_transform_shows_its_constructor_signature(name):
    parameters = list(inspect.signature(getattr(ms, name)).parameters)
    assert parameters[:6] == ["grid", "nlat", "nlon", "lmax", "mmax", "quadrature"], parameters
    assert {"orders", "legendre", "fft"} <= set(parameters)


def test_calculus_imports_by_its_short_path():
    from mpisphere.calculus import gradient, laplacian
    from mpisphere.sht import calculus

    assert laplacian is calculus.laplacian and gradient is calculus.gradient
    assert ms.calculus.laplacian is calculus.laplacian
    assert set(ms.calculus.__all__) == set(calculus.__all__)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_dottest_draws_points_of_the_dtype_the_operator_takes(grid, dtype):
    sht = ms.DistributedRealSHT(grid, 12, 24, dtype=dtype)
    isht = ms.DistributedInverseRealSHT(grid, 12, 24, dtype=dtype)
    vector = ms.DistributedInverseRealVectorSHT(grid, 12, 24, dtype=dtype)
    rtol = 1e-5 if dtype == numpy.float32 else 1e-12
    # no dtype= given: coefficients for the synthesis and for the analysis's adjoint, fields for the analysis
    for op in (isht, sht, sht.H, vector, isht.H @ isht, 2.0 * isht, isht - isht):
        assert ms.dottest(op, lead=(2,), rtol=rtol) <= rtol
    with raises(TypeError, match="expected complex coefficients"):
        ms.dottest(isht, lead=(2,), dtype=numpy.float64)  # an explicit dtype is still taken as given


def test_the_version_is_the_changelogs_newest_and_every_version_has_a_dated_section():
    import re
    from pathlib import Path
    text = (Path(__file__).parents[1] / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## (.*)$", text, flags=re.M)
    dated = [re.fullmatch(r"(\d+\.\d+\.\d+) \((\d{4}-\d{2}-\d{2})\)", s) for s in sections]
    assert sections and all(dated), sections  # no "Unreleased" section left behind a release
    versions = [tuple(map(int, m.group(1).split("."))) for m in dated]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions), sections
    dates = [m.group(2) for m in dated]
    assert dates == sorted(dates, reverse=True), sections
    assert ms.__version__ == dated[0].group(1), (ms.__version__, sections[0])
