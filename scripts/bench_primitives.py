"""Time every communication operator against the raw MPI call on the same bytes.

    mpiexec -n 4 python scripts/bench_primitives.py                  # 2 x 2 grid
    mpiexec -n 2 python scripts/bench_primitives.py                  # 1 x 2 and 2 x 1 grids
    mpiexec -n 4 python scripts/bench_primitives.py --large --json results.json
    mpiexec -n 4 python scripts/bench_primitives.py --device gpu

Reference problem: a (batch, nlat, nlon) = (32, 361, 720) float64 field split
over the grid. For each operator, forward and adjoint, and in the same run:
the raw mpi4py call on pre-packed contiguous NumPy buffers of the same bytes
(host memory also with --device gpu, so the reference runs on any MPI), and a
plain memory copy of the bytes the operator's input holds (device-to-device
with --device gpu). Each figure is the median over repetitions of the slowest rank's time (barrier-aligned), with
the min..max range; ratios are of medians. Times drift between runs on shared
machines: compare ratios within one run.
"""

import argparse
import sys

import numpy
from mpi4py import MPI

import mpisphere
from bench_halo import message_copies, raw_halo
from benchtools import mpi_version, grid_shapes, measure, write_results
from mpisphere import (CopyTo, GatherFrom, GatherFromCopyTo, HaloExchange, ProcessGrid, ReduceFrom, ReduceScatter,
                       ScatterTo, Transpose, collectives, split_sizes)
from mpisphere.partition import offsets_of


class Bench:
    def __init__(self, grid, xp, repeats, warmup):
        self.grid, self.xp, self.repeats, self.warmup = grid, xp, repeats, warmup
        self.rows = []
        self.sync = None
        if xp is not numpy:
            self.sync = lambda: xp.cuda.get_current_stream().synchronize()

    def time(self, fn, comm=None, repeats=None):
        return measure(comm or self.grid.cart, fn, repeats or self.repeats, self.warmup, self.sync)

    def add(self, name, direction, fn, raw_name, raw_fn, nbytes, comm=None, repeats=None):
        op = self.time(fn, comm, repeats)
        with mpisphere.config.override(agreement=False):  # the same call without the agreement step
            unagreed = self.time(fn, comm, repeats)
        raw = self.time(raw_fn, comm, repeats)
        src = self.xp.ones(max(nbytes // 8, 1))
        dst = self.xp.empty_like(src)
        copy = self.time(lambda: dst.__setitem__(Ellipsis, src), comm)
        row = {"grid": f"{self.grid.npolar}x{self.grid.nazimuth}", "operator": name, "direction": direction,
               "median_ms": op[0], "min_ms": op[1], "max_ms": op[2], "raw_call": raw_name,
               "raw_median_ms": raw[0], "raw_min_ms": raw[1], "raw_max_ms": raw[2], "memcpy_ms": copy[0],
               "bytes": int(nbytes), "ratio_raw": op[0] / raw[0], "ratio_memcpy": op[0] / copy[0],
               "no_agreement_ms": unagreed[0], "agreement_ms": op[0] - unagreed[0]}
        self.rows.append(row)
        if self.grid.rank == 0:
            print(f"{row['grid']:>4} {name:28s} {direction:10s} {op[0]:8.2f} ms [{op[1]:7.2f}..{op[2]:7.2f}]  "
                  f"{raw_name:16s} {raw[0]:8.2f} ms  x{row['ratio_raw']:5.2f} raw  x{row['ratio_memcpy']:6.1f} memcpy  "
                  f"agreement {1e3 * row['agreement_ms']:+7.0f} us", flush=True)


def raw_alltoallv(comm, send_counts, recv_counts, dtype):
    send = numpy.ones(sum(send_counts), dtype)
    recv = numpy.empty(sum(recv_counts), dtype)
    sd, rd = offsets_of(send_counts), offsets_of(recv_counts)
    t = collectives.mpi_type(dtype)
    return lambda: comm.Alltoallv([send, (send_counts, sd), t], [recv, (recv_counts, rd), t])


def raw_allgatherv(comm, counts, dtype):
    send = numpy.ones(counts[comm.Get_rank()], dtype)
    recv = numpy.empty(sum(counts), dtype)
    t = collectives.mpi_type(dtype)
    return lambda: comm.Allgatherv([send, t], [recv, (counts, offsets_of(counts)), t])


def raw_reduce_scatter(comm, counts, dtype):
    send = numpy.ones(sum(counts), dtype)
    recv = numpy.empty(counts[comm.Get_rank()], dtype)
    t = collectives.mpi_type(dtype)
    return lambda: comm.Reduce_scatter([send, t], [recv, t], counts, MPI.SUM)


def raw_allreduce(comm, count, dtype):
    send = numpy.ones(count, dtype)
    recv = numpy.empty(count, dtype)
    t = collectives.mpi_type(dtype)
    return lambda: comm.Allreduce([send, t], [recv, t], MPI.SUM)


def bench_grid(grid, args, xp):
    b = Bench(grid, xp, args.repeats, args.warmup)
    dtype = numpy.dtype(args.dtype)
    batch, nlat, nlon = args.batch, args.nlat, args.nlon
    h, w = grid.local_shape(nlat, nlon)
    rng = numpy.random.default_rng(grid.rank)
    tile = xp.asarray(rng.standard_normal((batch, h, w)).astype(dtype))
    item = dtype.itemsize

    for name, comm, axes, extents in (("Transpose(azimuth, (0,-1))", grid.azimuth, (0, -1), (batch, nlon)),
                                      ("Transpose(polar, (0,-2))", grid.polar, (0, -2), (batch, nlat))):
        p = comm.Get_size()
        if p == 1:
            continue
        op = Transpose(comm, axes=axes, extents=extents)
        y = op.forward(tile)
        out_f, out_a = xp.empty_like(y), xp.empty_like(tile)
        unit_in, unit_out = tile.size // extents[0], y.size // extents[1]
        send_counts = [unit_in * n for n in split_sizes(extents[0], p)]
        recv_counts = [unit_out * n for n in split_sizes(extents[1], p)]
        raw = raw_alltoallv(comm, send_counts, recv_counts, dtype)
        b.add(name, "forward", lambda: op.forward(tile), "Alltoallv", raw, tile.nbytes, comm)
        b.add(name, "forward out=", lambda: op.forward(tile, out=out_f), "Alltoallv", raw, tile.nbytes, comm)
        raw_back = raw_alltoallv(comm, recv_counts, send_counts, dtype)
        b.add(name, "adjoint", lambda: op.adjoint(y), "Alltoallv", raw_back, y.nbytes, comm)
        b.add(name, "adjoint out=", lambda: op.adjoint(y, out=out_a), "Alltoallv", raw_back, y.nbytes, comm)

    comm = grid.azimuth if grid.nazimuth > 1 else grid.polar
    label = "azimuth" if comm is grid.azimuth else "polar"
    # the split axis along longitudes or latitudes (chunks strided in memory: packed or unpacked),
    # and along the leading batch axis (chunks contiguous: straight to MPI)
    for axis, extent, where in ((-1 if comm is grid.azimuth else -2, nlon if comm is grid.azimuth else nlat,
                                 "lon" if comm is grid.azimuth else "lat"), (0, batch, "batch")):
        # along the batch axis every rank holds the same trailing shape (rank 0's tile)
        part = tile if axis != 0 else xp.asarray(rng.standard_normal(
            (split_sizes(batch, comm.Get_size())[comm.Get_rank()], grid.lat_sizes(nlat)[0],
             grid.lon_sizes(nlon)[0])).astype(dtype))
        shape = list(part.shape)
        shape[axis] = extent
        whole = xp.asarray(rng.standard_normal(shape).astype(dtype))
        p = comm.Get_size()
        counts = [part.size // part.shape[axis] * n for n in split_sizes(extent, p)]
        gather_raw = raw_allgatherv(comm, counts, dtype)
        rs_raw = raw_reduce_scatter(comm, counts, dtype)
        gf, gfct, rsc, sc = (GatherFrom(comm, axis, extent), GatherFromCopyTo(comm, axis, extent),
                             ReduceScatter(comm, axis, extent), ScatterTo(comm, axis, extent))
        whole_out, part_out = xp.empty_like(whole), xp.empty_like(part)
        tag = f"({label}, {where})"
        b.add(f"GatherFrom{tag}", "forward", lambda: gf.forward(part), "Allgatherv", gather_raw, whole.nbytes, comm)
        b.add(f"GatherFrom{tag}", "forward out=", lambda: gf.forward(part, out=whole_out), "Allgatherv",
              gather_raw, whole.nbytes, comm)
        b.add(f"ScatterTo{tag}", "adjoint out=", lambda: sc.adjoint(part, out=whole_out), "Allgatherv",
              gather_raw, whole.nbytes, comm)
        b.add(f"ReduceScatter{tag}", "forward", lambda: rsc.forward(whole), "Reduce_scatter", rs_raw,
              whole.nbytes, comm)
        b.add(f"ReduceScatter{tag}", "forward out=", lambda: rsc.forward(whole, out=part_out), "Reduce_scatter",
              rs_raw, whole.nbytes, comm)
        b.add(f"ReduceScatter{tag}", "adjoint out=", lambda: rsc.adjoint(part, out=whole_out), "Allgatherv",
              gather_raw, whole.nbytes, comm)
        b.add(f"GatherFromCopyTo{tag}", "forward out=", lambda: gfct.forward(part, out=whole_out), "Allgatherv",
              gather_raw, whole.nbytes, comm)
        b.add(f"GatherFromCopyTo{tag}", "adjoint out=", lambda: gfct.adjoint(whole, out=part_out),
              "Reduce_scatter", rs_raw, whole.nbytes, comm)

    # the same array on every rank (a reduction needs equal shapes): rank 0's tile shape
    same = xp.asarray(rng.standard_normal((batch,) + grid.local_shape(nlat, nlon) if grid.rank == 0 else
                                          (batch, grid.lat_sizes(nlat)[0], grid.lon_sizes(nlon)[0])).astype(dtype))
    ar_raw = raw_allreduce(grid.cart, same.size, dtype)
    rf, ct = ReduceFrom(grid.cart), CopyTo(grid.cart)
    out = xp.empty_like(same)
    b.add("ReduceFrom(cart)", "forward", lambda: rf.forward(same), "Allreduce", ar_raw, same.nbytes)
    b.add("ReduceFrom(cart)", "forward out=", lambda: rf.forward(same, out=out), "Allreduce", ar_raw, same.nbytes)
    b.add("CopyTo(cart)", "adjoint out=", lambda: ct.adjoint(same, out=out), "Allreduce", ar_raw, same.nbytes)

    rows = cols = args.halo
    halo = HaloExchange(grid, rows, cols, extents=(nlat, nlon))
    padded = halo.forward(tile)
    halo_raw = raw_halo(grid, batch, h, w, rows, cols, dtype)
    halo_bytes = item * batch * (2 * rows * (w + 2 * cols) + 2 * h * cols)
    b.add(f"HaloExchange({rows},{cols})", "update", lambda: halo.update(padded), "4 x Sendrecv", halo_raw,
          halo_bytes)
    b.add(f"HaloExchange({rows},{cols})", "accumulate", lambda: halo.accumulate(padded), "4 x Sendrecv", halo_raw,
          halo_bytes)
    if xp is numpy:
        b.add(f"HaloExchange({rows},{cols}) copies only", "update", message_copies(halo, padded), "4 x Sendrecv",
              halo_raw, halo_bytes)
    b.add(f"HaloExchange({rows},{cols})", "forward", lambda: halo.forward(tile), "4 x Sendrecv", halo_raw,
          halo_bytes)
    b.add(f"HaloExchange({rows},{cols})", "adjoint", lambda: halo.adjoint(padded), "4 x Sendrecv", halo_raw,
          halo_bytes)
    bench_agreement(b, grid, xp, dtype, args)
    if xp is not numpy:
        bench_staging_copies(b, xp, tile)
    return b.rows


def bench_staging_copies(b, cupy, tile):
    """The staging path's own copies (mpisphere.backend, as the collectives call them) against CuPy's pinned copies.

    The bytes of one tile to a pinned host buffer and back, through
    ``backend.copy_to_host`` / ``copy_from_host`` with the staging path's
    own :class:`~mpisphere.backend.Workspace` buffers, and through
    ``ndarray.get(out=pinned)`` / ``ndarray.set(pinned)`` directly, in the
    same run: the ratio is the staging copies' share of the pinned copy
    bandwidth.
    """
    from mpisphere import backend
    workspace = backend.Workspace()
    host = workspace.host("bench", tile.size, tile.dtype, pinned=True)
    raw_host = cupy.cuda.alloc_pinned_memory(tile.nbytes)
    raw = numpy.frombuffer(raw_host, tile.dtype, tile.size)
    flat = tile.reshape(-1)
    sync = cupy.cuda.get_current_stream().synchronize

    def to_host():
        backend.copy_to_host(tile, host)

    def from_host():
        backend.copy_from_host(host, tile)
        sync()

    b.add("staging copy to host", "pinned", to_host, "ndarray.get(out=)", lambda: flat.get(out=raw), tile.nbytes)
    b.add("staging copy to device", "pinned", from_host, "ndarray.set()", lambda: (flat.set(raw), sync()),
          tile.nbytes)


def bench_agreement(b, grid, xp, dtype, args):
    """The agreement step's own cost, where it shows: calls on tiny arrays, with it and without it.

    The reference is the agreement's own collective on the same communicator
    (an Allreduce of six integers), measured in the same run.
    """
    reps = max(args.repeats * 20, 200)
    six = numpy.zeros(6, numpy.int64)
    for label, comm in (("cart", grid.cart), ("azimuth", grid.azimuth)):
        if comm.Get_size() == 1:
            continue
        tiny = xp.ones(4, dtype)
        rf = ReduceFrom(comm)
        raw = lambda: comm.Allreduce(MPI.IN_PLACE, [six, MPI.INT64_T], MPI.MAX)  # noqa: E731
        b.add(f"ReduceFrom({label}) of 4 numbers", "forward", lambda: rf.forward(tiny), "Allreduce 6 ints", raw,
              tiny.nbytes, comm, repeats=reps)
    h, w = grid.local_shape(args.nlat, args.nlon)
    # the halo's agreement travels in its own messages (a 64-byte header in front of each), so switching the
    # agreement off changes nothing for it: its figure here is the whole call's overhead over the raw Sendrecvs
    halo = HaloExchange(grid, 1, 1, extents=(args.nlat, args.nlon))
    small = xp.ones((1, h + 2, w + 2), dtype)
    raw = raw_halo(grid, 1, h, w, 1, 1, dtype)
    b.add("HaloExchange(1,1), 1 field", "update", lambda: halo.update(small), "4 x Sendrecv", raw,
          small.nbytes, repeats=reps)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nlat", type=int, default=361)
    parser.add_argument("--nlon", type=int, default=720)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--large", action="store_true", help="721 x 1440 (0.25 degree) instead of 361 x 720")
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--grids", default=None, help="comma-separated PxA grids (default: 2x2 on 4 ranks, "
                                                      "1x2,2x1 on 2 ranks, Compute_dims otherwise)")
    parser.add_argument("--halo", type=int, default=4, help="halo rows and columns")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--json", default=None, help="write the rows here (rank 0)")
    args = parser.parse_args(argv)
    if args.large:
        args.nlat, args.nlon = 721, 1440

    world = MPI.COMM_WORLD
    xp = numpy
    if args.device == "gpu":
        mpisphere.select_device(world)
        import cupy as xp  # noqa: N813
    size = world.Get_size()
    shapes = grid_shapes(args.grids, size)
    if world.Get_rank() == 0:
        print(f"mpisphere {mpisphere.__version__}, {size} ranks, field ({args.batch}, {args.nlat}, {args.nlon}) "
              f"{args.dtype}, {args.device}, {args.repeats} repeats; MPI: "
              f"{mpi_version()}")
        print(f"{'grid':>4} {'operator':28s} {'direction':10s} {'median':>11s} {'min..max':>18s}  "
              f"{'raw MPI call':16s} {'median':>11s}  ratios")
    rows = []
    for npolar, nazimuth in shapes:
        with ProcessGrid(world, npolar, nazimuth) as grid:
            if grid.rank == 0 and not rows:
                print(f"  GPU buffers: {grid.device_buffer_path}")
            rows += bench_grid(grid, args, xp)
    if args.json and world.Get_rank() == 0:
        meta = {"ranks": size, "batch": args.batch, "nlat": args.nlat, "nlon": args.nlon, "dtype": args.dtype,
                "device": args.device, "mpi": mpi_version()}
        write_results(args.json, meta, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
