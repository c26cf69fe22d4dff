"""A strong-scaling model of the distributed SHT, built on mpisphere.sht.costs and measured one-rank rates.

    python scripts/scaling_model.py                     # 721 x 1440, 100 fields, float64 and float32, 1..1024 ranks
    python scripts/scaling_model.py --markdown          # the tables of docs/scaling.md
    mpiexec -n 4 python scripts/scaling_model.py --check   # the model against a measured run on this machine
    python scripts/scaling_model.py --km --markdown     # 4001 x 8000, lmax 2000, every Legendre strategy, 16,384 ranks
    mpiexec -n 4 python scripts/scaling_model.py --check --legendre all   # each strategy against a run here

Per rank and transform (forward; the inverse has the same counts reversed),
from :func:`mpisphere.sht.costs.sht_costs` (the counts a test checks against
the bytes handed to MPI): Legendre multiply-adds, FFT flops, table bytes,
bytes and messages of each of the four transposes. Time:

    T = max over ranks of (Legendre multiply-adds / R_L + FFT flops / R_F + bytes packed and unpacked / R_C)
        + sum over the four transposes of max over ranks of (messages * latency + bytes sent / bandwidth)

R_L, R_F and R_C (multiply-adds, flops and copied bytes a second) are
measured here on one core at start-up; R_L at 2 to 128 real columns (1 to
64 fields), because the contraction's matrix products run ten times faster
per multiply-add with 128 columns than with 2, and each rank's count is its
share of the batch (few fields on many polar ranks), interpolated between; latency and bandwidth are a stated
network model (--latency-us, --bandwidth-gbs: per rank, defaults 2 us and
6.25 GB/s, an HDR InfiniBand NIC's 25 GB/s shared by 4 ranks a node; with
one rank per GPU and one NIC per GPU use --bandwidth-gbs 25). Each rank
count gets the grid shape (npolar x nazimuth) with the smallest modelled time.

torch-harmonics' distributed SHT is modelled on the same terms: the same
four transposes with its padded splits, and its Legendre step as one
contraction over the full rectangle of (l, m) and all latitudes (no
triangle, no parity split): 4 times the multiply-adds of mpisphere's. Its
0.9.3 algorithm (``--legendre reduce-scatter``) contracts its own latitudes
into every degree for the whole batch, then reduce-scatters the degrees.

Overlap (``--overlap-hidden f``): the transforms' ``overlap=True`` runs two
chunks in turns so that one chunk's transposes travel while the other
computes; the model then takes ``f`` of the shorter of compute and network
time off (``scripts/bench_overlap.py`` measures ``f``: 0 on this machine's
shared-memory MPICH, so the default is 0).

The Legendre strategies (``--legendre``): ``transpose`` as above;
``reduce-scatter`` has no polar transposes but contracts each rank's own
latitudes (no parity split) for the whole batch and reduce-scatters every
degree's partial sums (time as a transpose of those bytes);
``table-free`` is the same pattern at ducc0's measured rate per function
value and field (the recurrence on the fly, one field per call).
"""

import argparse
import math
import sys
import time

import numpy

from mpisphere import truncate_sht
from mpisphere.sht.costs import LEGENDRE_STRATEGIES, sht_costs


def _median_seconds(fn, repeats=5):
    return _interleaved_medians([fn], repeats)[0]


def _interleaved_medians(fns, rounds, warmup=3):
    """Median seconds of each of ``fns``, timed one after the other round by round (drift hits all alike)."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, kept in zip(fns, times):
            start = time.perf_counter()
            fn()
            kept.append(time.perf_counter() - start)
    return [sorted(kept)[len(kept) // 2] for kept in times]


# complex fields per Legendre rate measurement: the products' column count (2 per field) decides their speed,
# and a rank's count ranges from 1 field (many polar ranks) to the whole batch
RATE_FIELDS = (1, 2, 4, 8, 16, 32, 64)


class LegendreRate:
    """Multiply-adds a second of the contraction as a function of its real columns, from measured points.

    Linear in ``log2(columns)`` between the points, constant beyond the ends.
    """

    def __init__(self, columns, rates):
        self.columns, self.rates = numpy.asarray(columns, float), numpy.asarray(rates, float)

    def __call__(self, columns):
        return float(numpy.interp(numpy.log2(max(columns, 1)), numpy.log2(self.columns), self.rates))

    def describe(self):
        return ", ".join(f"{c:.0f}: {r / 1e9:.2f}" for c, r in zip(self.columns, self.rates))


def measure_table_free_rate(dtype, nlat=361, lmax=181, fields=8):
    """ducc0's leg2alm on one rank's latitudes and orders: function values times real columns a second."""
    from mpi4py import MPI

    from mpisphere import Layout
    from mpisphere.quadrature import latitudes
    from mpisphere.sht.costs import row_table_entries
    from mpisphere.sht.strategies.table_free import TableFreeLegendre
    theta, _ = latitudes(nlat, "equiangular")
    orders = numpy.arange(lmax)
    stage = TableFreeLegendre(lmax, orders, theta, "ortho", True, False, numpy.result_type(dtype, numpy.complex64),
                              Layout("distributed", MPI.COMM_SELF))
    x = (numpy.random.default_rng(0).standard_normal((fields, 1, nlat, lmax)) + 0j).astype(stage.dtype)
    out = numpy.empty((fields, 1, lmax, lmax), stage.dtype)
    seconds = _median_seconds(lambda: stage._run("forward", x, out, None), 7)
    return row_table_entries(lmax, orders, nlat) * 2 * fields / seconds


def measure_rates(dtype, rounds=31):
    """The Legendre contraction's :class:`LegendreRate`, flops/s of the real FFT, bytes/s of a transposing copy.

    Per stored table entry (see :meth:`LegendreTables.multiply_adds`), at
    361 x 720, lmax 181, for each of :data:`RATE_FIELDS`; the FFT and the
    copy on 8 fields.
    """
    from mpi4py import MPI

    from mpisphere import DistributedRealSHT, ProcessGrid
    from mpisphere.sht import contraction
    from mpisphere.stages.fourier import FourierStage
    nlat, nlon, batch = 361, 720, 8
    with ProcessGrid(MPI.COMM_SELF) as grid:
        sht = DistributedRealSHT(grid, nlat, nlon, dtype=dtype)
        cdtype = sht.cdtype
        rng = numpy.random.default_rng(0)
        real = lambda a: a.view(a.real.dtype)  # noqa: E731
        workspace = type(grid.scratch)()
        contractions = []
        for fields in RATE_FIELDS:
            fourier = (rng.standard_normal((nlat, sht.mmax, fields)) + 0j).astype(cdtype)
            spectral = numpy.empty((sht.lmax, sht.mmax, fields), cdtype)
            contractions.append(lambda f=fourier, s=spectral: contraction.analyze(sht.tables, real(f), real(s),
                                                                                  workspace))
        stage = FourierStage(nlon, dtype, False, sht.domain, sht.fft)
        x = rng.standard_normal((batch, nlat, nlon)).astype(dtype)
        spectrum = numpy.empty((batch, nlat, nlon // 2 + 1), cdtype)
        source = rng.standard_normal((batch, nlat, 360, 2)).astype(dtype)
        target = numpy.empty((nlat, 360, 2, batch), dtype)
        # calls of milliseconds on a shared machine: many rounds, every kind in alternation
        seconds = _interleaved_medians(contractions + [
            lambda: stage._rfft(x, "forward", spectrum),
            lambda: numpy.copyto(target, source.transpose(1, 2, 3, 0))], rounds=rounds)
        columns = [2 * fields for fields in RATE_FIELDS]
        rate_legendre = LegendreRate(columns, [sht.tables.multiply_adds(c) / t for c, t in zip(columns, seconds)])
        rate_fft = 2.5 * nlon * math.log2(nlon) * batch * nlat / seconds[-2]
        rate_copy = source.nbytes / seconds[-1]
    return rate_legendre, rate_fft, rate_copy, measure_table_free_rate(dtype)


def th_costs(nlat, nlon, lmax, mmax, npolar, nazimuth, batch, itemsize, legendre="transpose"):
    """torch-harmonics' algorithm in the same terms: padded splits, full-rectangle Legendre.

    ``legendre="reduce-scatter"``: its 0.9.3 algorithm (own latitudes, the
    whole batch, a Reduce_scatter of the degrees instead of the polar
    transposes). Returns multiply-adds, FFT flops, bytes sent and messages
    per exchange, and the real columns of its contraction.
    """
    pad = lambda n, p: -(-n // p)  # noqa: E731
    padded = pad(batch, max(npolar, nazimuth)) * max(npolar, nazimuth)
    h, w, m, l = pad(nlat, npolar), pad(nlon, nazimuth), pad(mmax, nazimuth), pad(lmax, npolar)
    bp, ba = padded // npolar, padded // nazimuth
    fft = 2.5 * nlon * math.log2(nlon) * ba * h
    c = 2 * itemsize
    if legendre != "transpose":
        madds = 2 * padded * m * lmax * h
        sent = ((padded - ba) * h * w * itemsize, ba * h * (mmax - m) * c, 0, padded * (lmax - l) * m * c)
        return madds, fft, sent, (nazimuth - 1, nazimuth - 1, 0, npolar - 1), 2 * padded
    madds = 2 * bp * m * lmax * nlat
    sent = ((padded - ba) * h * w * itemsize, ba * h * (mmax - m) * c, (padded - bp) * h * m * c,
            bp * (lmax - l) * m * c)
    messages = (nazimuth - 1, nazimuth - 1, npolar - 1, npolar - 1)
    return madds, fft, sent, messages, 2 * bp


def model_time(costs, rates, latency, bandwidth, itemsize, legendre="transpose"):
    rate_legendre, rate_fft, rate_copy, rate_table_free = rates
    if legendre == "table-free":
        rate_legendre = lambda columns: rate_table_free  # noqa: E731 -- one field a call: no column effect
    compute = max(_legendre_seconds(c, rate_legendre, itemsize) + c.fft_flops / rate_fft
                  + 2 * sum(c.sent) / rate_copy for c in costs)
    communicate = sum(max(c.messages[t] * latency + c.sent[t] / bandwidth for c in costs) for t in range(4))
    return compute, communicate


def _legendre_seconds(cost, rate, itemsize):
    """A rank's contraction time at the rate of its column count (multiply-adds per function value)."""
    values = cost.legendre_values
    if not values or not cost.legendre_multiply_adds:
        return 0.0
    return cost.legendre_multiply_adds / rate(cost.legendre_multiply_adds / values)


def shapes(ranks, nlat, lmax):
    return [(p, ranks // p) for p in range(1, ranks + 1) if ranks % p == 0 and p <= min(nlat, lmax)
            and ranks // p <= lmax]


def scaling_rows(nlat, nlon, batch, dtype, rates, latency, bandwidth, rank_counts, orders="balanced",
                 legendre="transpose", lmax=None, overlap_hidden=0.0):
    lmax, mmax = truncate_sht(nlat, nlon, lmax, lmax)
    itemsize = numpy.dtype(dtype).itemsize
    rows = []
    for ranks in rank_counts:
        best = None
        for npolar, nazimuth in shapes(ranks, nlat, lmax):
            costs = sht_costs(nlat, nlon, lmax, mmax, npolar, nazimuth, batch=batch, dtype=dtype, orders=orders,
                              legendre=legendre)
            compute, communicate = model_time(costs, rates, latency, bandwidth, itemsize, legendre)
            total = compute + communicate - overlap_hidden * min(compute, communicate)
            if best is None or total < best[0]:
                best = (total, compute, communicate, npolar, nazimuth, costs)
        total, compute, communicate, npolar, nazimuth, costs = best
        worst = max(costs, key=lambda c: c.legendre_multiply_adds)
        th_best = None
        for p, a in shapes(ranks, nlat, lmax):
            madds, fft, sent, messages, columns = th_costs(nlat, nlon, lmax, mmax, p, a, batch, itemsize,
                                                           "transpose" if legendre == "transpose" else "reduce-scatter")
            t = madds / rates[0](columns) + fft / rates[1] + 2 * sum(sent) / rates[2] + sum(
                messages[i] * latency + sent[i] / bandwidth for i in range(4))
            th_best = t if th_best is None else min(th_best, t)
        rows.append({"ranks": ranks, "grid": f"{npolar}x{nazimuth}",
                     "legendre_gmadd": worst.legendre_multiply_adds / 1e9,
                     "fft_gflop": max(c.fft_flops for c in costs) / 1e9,
                     "table_mb": max(c.table_bytes for c in costs) / 2 ** 20,
                     "scratch_mb": max(c.scratch_bytes for c in costs) / 2 ** 20,
                     "sent_mb": [max(c.sent[t] for c in costs) / 2 ** 20 for t in range(4)],
                     "messages": [max(c.messages[t] for c in costs) for t in range(4)],
                     "compute_s": compute, "communicate_s": communicate, "time_s": total,
                     "torch_harmonics_s": th_best})
    base = rows[0]["time_s"] * rows[0]["ranks"]
    for row in rows:
        row["efficiency"] = base / (row["time_s"] * row["ranks"])
    return rows


def print_rows(rows, markdown):
    if markdown:
        print("| ranks | grid | Legendre Gmadd | FFT Gflop | tables MB | scratch MB | sent MB (lon, m, lat, l) "
              "| messages | compute s | network s | time s | efficiency | torch-harmonics model s |")
        print("| ---: | --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        sent = ", ".join(f"{v:.0f}" if v >= 10 else f"{v:.1f}" for v in r["sent_mb"])
        messages = ", ".join(str(v) for v in r["messages"])
        cells = [str(r["ranks"]), r["grid"], f"{r['legendre_gmadd']:.2f}", f"{r['fft_gflop']:.2f}",
                 f"{r['table_mb']:.0f}", f"{r['scratch_mb']:.0f}", sent, messages, f"{r['compute_s']:.4f}",
                 f"{r['communicate_s']:.4f}", f"{r['time_s']:.4f}", f"{r['efficiency']:.2f}",
                 f"{r['torch_harmonics_s']:.4f}"]
        print("| " + " | ".join(cells) + " |" if markdown else "  ".join(cells))


def check(args):
    """Model against measurement on this machine: the transform on every grid shape of this launch."""
    from mpi4py import MPI

    from mpisphere import DistributedRealSHT, ProcessGrid
    world = MPI.COMM_WORLD
    dtype = numpy.dtype(args.check_dtype)
    rates = measure_rates(dtype, args.rounds) if world.Get_rank() == 0 else None
    rates = world.bcast(rates)
    # this machine's "network": shared memory, probed with one Alltoall per message size
    probe = []
    for nbytes in (8, 1 << 20):
        count = nbytes // 8
        send = numpy.zeros(count * world.Get_size())
        recv = numpy.empty_like(send)
        seconds = _median_seconds(lambda: world.Alltoall(send, recv), 9)
        probe.append(world.allreduce(seconds, op=MPI.MAX))
    if world.Get_size() == 1:
        latency, bandwidth = 0.0, math.inf
    else:
        latency = probe[0] / (world.Get_size() - 1)
        bandwidth = (1 << 20) * (world.Get_size() - 1) / max(probe[1] - probe[0], 1e-9)
    nlat, nlon, batch = 361, 720, args.check_batch
    lmax, mmax = truncate_sht(nlat, nlon)
    strategies = list(LEGENDRE_STRATEGIES) if args.legendre == "all" else [args.legendre]
    for legendre, (npolar, nazimuth) in ((s, shape) for s in strategies
                                         for shape in shapes(world.Get_size(), nlat, lmax)):
        with ProcessGrid(world, npolar, nazimuth) as grid:
            sht = DistributedRealSHT(grid, nlat, nlon, dtype=dtype, orders="balanced", legendre=legendre)
            x = numpy.random.default_rng(grid.rank).standard_normal((batch,) + sht.tile_shape).astype(dtype)
            out = sht.forward(x)

            def run():
                grid.cart.Barrier()
                sht.forward(x, out=out)
            measured = grid.cart.allreduce(_median_seconds(run, 7), op=MPI.MAX)
        costs = sht_costs(nlat, nlon, lmax, mmax, npolar, nazimuth, batch=batch, dtype=dtype, orders="balanced",
                          legendre=legendre)
        compute, communicate = model_time(costs, rates, latency, bandwidth, dtype.itemsize, legendre)
        if world.Get_rank() == 0:
            model = (compute + communicate) * 1e3
            print(f"{legendre:>14} {npolar}x{nazimuth}: measured {measured * 1e3:.1f} ms, model {model:.1f} ms "
                  f"(compute {compute * 1e3:.1f}, network {communicate * 1e3:.1f}; latency {latency * 1e6:.1f} us, "
                  f"bandwidth {bandwidth / 1e9:.1f} GB/s probed), {batch} x {nlat} x {nlon} {dtype.name}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nlat", type=int, default=721)
    parser.add_argument("--nlon", type=int, default=1440)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--latency-us", type=float, default=2.0)
    parser.add_argument("--bandwidth-gbs", type=float, default=6.25)
    parser.add_argument("--max-ranks", type=int, default=1024)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--check", action="store_true", help="compare with a measured run (under mpiexec)")
    parser.add_argument("--check-batch", type=int, default=32)
    parser.add_argument("--check-dtype", default="float64")
    parser.add_argument("--legendre", default="transpose", choices=list(LEGENDRE_STRATEGIES) + ["all"],
                        help="the Legendre strategy modelled (all: each in turn)")
    parser.add_argument("--lmax", type=int, default=None, help="lmax = mmax (default: torch-harmonics' truncation)")
    parser.add_argument("--km", action="store_true",
                        help="4001 x 8000, lmax = mmax = 2000, 16 fields, up to 16,384 ranks, float64, every strategy")
    parser.add_argument("--dtypes", default="float64,float32")
    parser.add_argument("--rounds", type=int, default=31,
                        help="timed rounds of each rate measurement (median; fewer: quicker, noisier rates)")
    parser.add_argument("--overlap-hidden", type=float, default=0.0,
                        help="share of the shorter of compute and network time that overlap=True hides (0 here)")
    args = parser.parse_args(argv)
    if args.check:
        return check(args)
    if args.km:
        args.nlat, args.nlon, args.lmax, args.batch, args.max_ranks = 4001, 8000, 2000, 16, 16384
        args.legendre, args.dtypes = "all", "float64"
    counts = [2 ** k for k in range(int(math.log2(args.max_ranks)) + 1)]
    strategies = list(LEGENDRE_STRATEGIES) if args.legendre == "all" else [args.legendre]
    for dtype in (numpy.dtype(d) for d in args.dtypes.split(",")):
        rates = measure_rates(dtype, args.rounds)
        lmax, mmax = truncate_sht(args.nlat, args.nlon, args.lmax, args.lmax)
        for legendre in strategies:
            print(f"\n{args.batch} x {args.nlat} x {args.nlon} {dtype.name}, lmax = mmax = {lmax}, balanced "
                  f"orders, legendre={legendre!r}; rates on one core: Legendre {rates[0].describe()} Gmadd/s by real "
                  f"columns, table-free {rates[3] / 1e9:.2f} Gmadd/s, FFT {rates[1] / 1e9:.2f} Gflop/s, "
                  f"copies {rates[2] / 1e9:.2f} GB/s; network {args.latency_us} us, {args.bandwidth_gbs} GB/s a rank\n")
            rows = scaling_rows(args.nlat, args.nlon, args.batch, dtype, rates, args.latency_us * 1e-6,
                                args.bandwidth_gbs * 1e9, counts, legendre=legendre, lmax=args.lmax,
                                overlap_hidden=args.overlap_hidden)
            print_rows(rows, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
