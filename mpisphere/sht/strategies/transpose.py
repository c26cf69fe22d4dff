"""The ``"transpose"`` Legendre strategy: every latitude of a share of the batch on each rank, parity-split tables.

A polar transpose gives each rank all latitudes of its share of the batch;
each rank contracts them with its orders' tables at every latitude, split by
equatorial parity (:mod:`mpisphere.sht.tables`: half the memory and
arithmetic of whole tables); a second transpose splits the degrees. The
fastest strategy on one rank for many fields, and on a GPU; its tables do
not shrink with the polar ranks.
"""

import numpy

from ...partition import split_sizes
from ..legendre_stage import LegendreStage
from ..tables import scalar_tables, vector_tables
from .base import LegendreStrategy, triangle_entries

__all__ = ["TRANSPOSE", "Transpose"]


class Transpose(LegendreStrategy):
    name = "transpose"
    polar_transposes = True
    runs_on_device = True
    summary = ("polar transposes; each rank holds its orders' parity-split tables at every latitude (host: one "
               "product per order, in cache; device: one batched product)")

    def build_tables(self, request):
        r = request
        if r.vector:
            return vector_tables(r.lmax, r.orders, r.theta, None, r.csphase, r.dtype)
        return scalar_tables(r.lmax, r.orders, r.theta, None, r.norm, r.csphase, r.synthesis, r.dtype)

    def stage(self, request, tables):
        r = request
        return LegendreStage(tables, r.nlat, r.cdtype, r.contraction, r.layout, r.weights)

    def table_bytes(self, nlat, lmax, mmax, npolar, nazimuth, *, vector=False, dtype=numpy.float64,
                    orders="contiguous"):
        return numpy.dtype(dtype).itemsize * self.largest(
            nlat, lmax, mmax, npolar, nazimuth, orders, lambda mine, h: triangle_entries(lmax, mine, nlat, vector))

    def values(self, lmax, orders, nlat, h, npolar, vector=False):
        return triangle_entries(lmax, orders, nlat, vector)

    def seconds(self, model, nlat, lmax, mmax, npolar, nazimuth, batch, *, vector=False, dtype=numpy.float64,
                orders="contiguous", synthesis=False):
        entries = self.table_bytes(nlat, lmax, mmax, npolar, nazimuth, vector=vector, orders=orders,
                                   dtype=numpy.int8)  # one byte an entry: the entry count
        fields = (2 if vector else 1) * max(split_sizes(batch, npolar))
        return model.table_product_seconds(entries, 2 * fields, dtype, vector, synthesis)


TRANSPOSE = Transpose()
