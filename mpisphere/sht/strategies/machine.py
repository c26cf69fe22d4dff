"""The machine the Legendre cost model is calibrated on: its rates (measured by :mod:`mpisphere.sht.calibration`).

``legendre="auto"`` compares the strategies' modelled times per batch
(``mpisphere.sht.strategies.base.LegendreStrategy.seconds``) on a
``MachineModel``, with rates for an analysis and for a synthesis (their
kernels differ: the analysis applies the quadrature weights):

* a product with a table reads the table once and does one multiply-add per
  entry and column: ``entries * itemsize / table_bandwidth + entries *
  columns / product_rate``. With few columns (one field is two real
  columns) the table's bytes dominate: the table is read for little work.
  A table that fits ``cache_bytes`` is read from the cache: the first term
  drops out;
* ducc0's recurrence computes each function value as it goes, for every
  field again: ``values * fields / on_the_fly_rate``.

The rates are effective ones: ``mpisphere.sht.calibration.calibrate``
fits them to whole one-rank transforms of each strategy, so what every
field costs besides the contraction (its FFT, layout changes) is in them.
The defaults were measured on the machines this project is developed on
(``python -m mpisphere calibrate`` prints the same rates for the machine it
runs on). A file written by ``python -m mpisphere calibrate --out
machine.json`` and named by ``MPISPHERE_MACHINE_MODEL=machine.json``
replaces them, the way FFTW's wisdom does: read when a transform is built,
the same file on every rank (a transform's description carries the model,
so ranks that read different ones raise instead of choosing different
exchanges).
"""

import dataclasses
import json
import math
import os

import numpy

__all__ = ["MachineModel", "MODEL_VARIABLE"]

MODEL_VARIABLE = "MPISPHERE_MACHINE_MODEL"

_KINDS = ("scalar_analysis", "scalar_synthesis", "vector_analysis", "vector_synthesis")
_WHAT = ("table_bandwidth", "product_rate", "on_the_fly_rate")
_RATES = tuple(f"{kind}_{what}" for kind in _KINDS for what in _WHAT)
_DEFAULTS = {  # python -m mpisphere calibrate on the development machine, 2026-12-04, three runs' medians
    "scalar_analysis": (6.24e9, 1.10e10, 6.9e9), "scalar_synthesis": (6.6e9, 1.08e10, 8.36e9),
    "vector_analysis": (3.57e9, 6.7e9, 3.27e9), "vector_synthesis": (3.58e9, 7.49e9, 3.22e9)}


@dataclasses.dataclass(frozen=True)
class MachineModel:
    """Rates of one core for each kind of transform (float64; float32 tables: half the bytes, twice the rate).

    Attributes
    ----------
    <kind>_table_bandwidth : float
        Bytes per second a table product with two columns streams.
    <kind>_product_rate : float
        Multiply-adds per second of a table product with many columns.
    <kind>_on_the_fly_rate : float
        Function values per second ducc0's recurrence contracts, per field
        (one complex column).

    cache_bytes : int
        Tables up to this size stay in a core's cache between calls.
    source : str
        Where the numbers come from.

    Notes
    -----
    ``<kind>`` is ``scalar_analysis``, ``scalar_synthesis``,
    ``vector_analysis`` or ``vector_synthesis``: the kernels around the
    contraction differ (the analysis applies the quadrature weights; the
    vector functions carry ``1 / sin(theta)`` and a degree coupling).
    """

    scalar_analysis_table_bandwidth: float = _DEFAULTS["scalar_analysis"][0]
    scalar_analysis_product_rate: float = _DEFAULTS["scalar_analysis"][1]
    scalar_analysis_on_the_fly_rate: float = _DEFAULTS["scalar_analysis"][2]
    scalar_synthesis_table_bandwidth: float = _DEFAULTS["scalar_synthesis"][0]
    scalar_synthesis_product_rate: float = _DEFAULTS["scalar_synthesis"][1]
    scalar_synthesis_on_the_fly_rate: float = _DEFAULTS["scalar_synthesis"][2]
    vector_analysis_table_bandwidth: float = _DEFAULTS["vector_analysis"][0]
    vector_analysis_product_rate: float = _DEFAULTS["vector_analysis"][1]
    vector_analysis_on_the_fly_rate: float = _DEFAULTS["vector_analysis"][2]
    vector_synthesis_table_bandwidth: float = _DEFAULTS["vector_synthesis"][0]
    vector_synthesis_product_rate: float = _DEFAULTS["vector_synthesis"][1]
    vector_synthesis_on_the_fly_rate: float = _DEFAULTS["vector_synthesis"][2]
    cache_bytes: int = 1 << 21
    source: str = "defaults (measured on a 2-core x86-64 development machine, 2026-12)"

    @classmethod
    def load(cls, environ=None):
        """The model named by ``MPISPHERE_MACHINE_MODEL`` (a JSON file from :func:`calibrate`), or the defaults.

        Raises a ``ValueError`` naming the file when it cannot be read.
        """
        environ = os.environ if environ is None else environ
        path = environ.get(MODEL_VARIABLE, "").strip()
        if not path:
            return cls()
        try:
            with open(path) as f:
                found = json.load(f)
            rates = {name: float(found[name]) for name in _RATES}
            cache = int(found["cache_bytes"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{MODEL_VARIABLE}={path!r}: not a machine model written by 'python -m mpisphere "
                             f"calibrate --out FILE' ({type(exc).__name__}: {exc})") from None
        if not all(math.isfinite(v) and v > 0 for v in rates.values()) or cache < 0:
            raise ValueError(f"{MODEL_VARIABLE}={path!r}: rates must be positive, got {rates}")
        return cls(**rates, cache_bytes=cache, source=path)

    def describe(self):
        """The rates as text (part of a transform's description: every rank must use the same model)."""
        rates = ", ".join(f"{name} {getattr(self, name):.4g}" for name in _RATES)
        return f"machine({rates}, cache_bytes {self.cache_bytes})"

    def _rate(self, what, vector, synthesis):
        return getattr(self, f"{'vector' if vector else 'scalar'}_{'synthesis' if synthesis else 'analysis'}_{what}")

    def table_product_seconds(self, entries, columns, dtype, vector=False, synthesis=False):
        """Time of products of tables with ``entries`` entries by ``columns`` real columns."""
        itemsize = numpy.dtype(dtype).itemsize
        speed = 2.0 if itemsize == 4 else 1.0
        streamed = entries * itemsize if entries * itemsize > self.cache_bytes else 0
        return (streamed / self._rate("table_bandwidth", vector, synthesis)
                + entries * columns / (self._rate("product_rate", vector, synthesis) * speed))

    def on_the_fly_seconds(self, values, fields, vector=False, synthesis=False):
        """Time of ducc0's recurrence over ``values`` function values for ``fields`` complex columns."""
        return values * fields / self._rate("on_the_fly_rate", vector, synthesis)

    def as_json(self):
        found = {name: getattr(self, name) for name in _RATES}
        return json.dumps({**found, "cache_bytes": self.cache_bytes, "source": self.source}, indent=1)
