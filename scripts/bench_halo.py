"""Time the halo exchange's two paths against the raw Sendrecv and the copies alone, in one run.

    mpiexec -n 2 python scripts/bench_halo.py                 # 1 x 2 and 2 x 1 grids
    mpiexec -n 4 python scripts/bench_halo.py --grids 2x2
    mpiexec -n 2 python scripts/bench_halo.py --json docs/results/halo-2ranks.json

For each grid, number of fields (``--batch``, default 1 and 32) and width
(``--widths``, default 1 and 4, rows and columns alike) on a 361 x 720
float64 field, timed in alternation round by round (so drift of a shared
machine hits every case alike):

``raw``
    one ``Sendrecv`` of pre-packed contiguous buffers per neighbour and
    direction (the reference; it makes none of the copies a tile needs);
``hand-written update`` / ``hand-written accumulate``
    the halo a user writes by hand in mpi4py on the same tile, the yardstick
    of the halo's speed: each block packed into a preallocated buffer
    (``numpy.copyto``), one ``Sendrecv`` per neighbour and direction,
    unpacked (added onto the owner's rows for ``accumulate``, then the halo
    zeroed); columns then rows (rows then columns for ``accumulate``), a
    one-rank ring wrapped by copies, zeros past the poles;
``copies``
    the message path's copies alone, no MPI: pack and unpack every block,
    wrap a one-rank ring, zero the rows past the poles;
``shared copies``
    the shared path's copies alone, no MPI: the column blocks packed by their
    owner and unpacked by the reader, the rows straight from the neighbour's
    tile into this rank's halo (``update``'s floor there);
``update`` / ``accumulate``
    on arrays from ``halo.zeros`` (shared memory on the node) and, with
    ``--no-shared`` or ``config.shared_memory=False``, on the same arrays
    through the message path, and on plain NumPy arrays (the message path).

Ratios are medians of per-round ratios. Memory per rank beyond the tile,
listed per case: the shared path keeps the column blocks its owner packs
(behind the tile, in the window); the message path one packed buffer per
neighbour and direction, out and in.
"""

import argparse

import numpy
from mpi4py import MPI

import mpisphere
from benchtools import mpi_version, grid_shapes, measure_rounds, write_results
from mpisphere import HaloExchange, ProcessGrid, collectives


def raw_halo(grid, batch, h, w, rows, cols, dtype):
    """One Sendrecv per neighbour and direction on pre-packed contiguous buffers (none on a one-rank ring)."""
    t = collectives.mpi_type(dtype)
    row_out = numpy.ones(batch * rows * (w + 2 * cols), dtype)
    col_out = numpy.ones(batch * h * cols, dtype)
    row_in, col_in = numpy.empty_like(row_out), numpy.empty_like(col_out)
    north, south = grid.polar_neighbors
    west, east = grid.azimuth_neighbors

    def run():
        if cols and grid.nazimuth > 1:
            grid.azimuth.Sendrecv([col_out, t], east, 1, [col_in, t], west, 1)
            grid.azimuth.Sendrecv([col_out, t], west, 2, [col_in, t], east, 2)
        if rows:
            grid.polar.Sendrecv([row_out, t], north, 3, [row_in, t], south, 3)
            grid.polar.Sendrecv([row_out, t], south, 4, [row_in, t], north, 4)
    return run


def hand_written_halo(grid, padded, rows, cols):
    """``(update, accumulate)`` as a user writes them in mpi4py: preallocated buffers, copyto, Sendrecv, unpack."""
    t = collectives.mpi_type(padded.dtype)
    lead = padded.shape[:-2]
    h, w = padded.shape[-2] - 2 * rows, padded.shape[-1] - 2 * cols
    north, south = grid.polar_neighbors
    west, east = grid.azimuth_neighbors
    col_out, col_in = numpy.empty(lead + (h, cols), padded.dtype), numpy.empty(lead + (h, cols), padded.dtype)
    row_out = numpy.empty(lead + (rows, w + 2 * cols), padded.dtype)
    row_in = numpy.empty_like(row_out)
    inner = slice(rows, rows + h)
    # (send from, receive into) for each direction: columns east then west, rows south then north
    east_cols = (slice(w, w + cols), slice(0, cols))
    west_cols = (slice(cols, 2 * cols), slice(w + cols, w + 2 * cols))
    south_rows = (slice(h, h + rows), slice(0, rows))
    north_rows = (slice(rows, 2 * rows), slice(h + rows, h + 2 * rows))

    def update():
        for dest, source, tag, (send, recv) in ((east, west, 1, east_cols), (west, east, 2, west_cols)):
            if grid.nazimuth == 1:
                padded[..., inner, recv] = padded[..., inner, send]
                continue
            numpy.copyto(col_out, padded[..., inner, send])
            grid.azimuth.Sendrecv([col_out, t], dest, tag, [col_in, t], source, tag)
            padded[..., inner, recv] = col_in
        for dest, source, tag, (send, recv) in ((south, north, 3, south_rows), (north, south, 4, north_rows)):
            if source == MPI.PROC_NULL:
                padded[..., recv, :] = 0
            if dest == MPI.PROC_NULL and source == MPI.PROC_NULL:
                continue
            numpy.copyto(row_out, padded[..., send, :])
            grid.polar.Sendrecv([row_out, t], dest, tag, [row_in, t], source, tag)
            if source != MPI.PROC_NULL:
                padded[..., recv, :] = row_in

    def accumulate():
        # the reverse: each halo block goes back to its owner, which adds it onto the rows it lent
        for dest, source, tag, (send, recv) in ((north, south, 3, south_rows), (south, north, 4, north_rows)):
            if dest != MPI.PROC_NULL or source != MPI.PROC_NULL:
                numpy.copyto(row_out, padded[..., recv, :])
                grid.polar.Sendrecv([row_out, t], dest, tag, [row_in, t], source, tag)
                if source != MPI.PROC_NULL:
                    padded[..., send, :] += row_in
            padded[..., recv, :] = 0
        for dest, source, tag, (send, recv) in ((west, east, 1, east_cols), (east, west, 2, west_cols)):
            if grid.nazimuth == 1:
                padded[..., inner, send] += padded[..., inner, recv]
            else:
                numpy.copyto(col_out, padded[..., inner, recv])
                grid.azimuth.Sendrecv([col_out, t], dest, tag, [col_in, t], source, tag)
                padded[..., inner, send] += col_in
            padded[..., inner, recv] = 0
    return update, accumulate


def message_copies(halo, padded):
    """The copies of one message-path ``update`` without MPI: pack and unpack each block, the ring, the poles."""
    from mpisphere.halo.plan import copy_runs
    h, w = padded.shape[-2] - 2 * halo.rows, padded.shape[-1] - 2 * halo.cols
    plan = halo._call.message_plan(padded)
    pattern = halo.pattern
    phases = pattern.phases(h, w, gather=True)

    def run():
        pattern.wrap(padded, h, w)
        for phase in phases:
            for tag, send_region, recv_region in phase:
                out_buf, in_buf = plan.outgoing[tag][1], plan.incoming[tag][1]
                if out_buf is not None and tag in pattern.sends:
                    copy_runs(out_buf, padded, send_region)
                if in_buf is not None and tag in pattern.receives:
                    copy_runs(padded, in_buf, recv_region, into_region=True)
        halo.boundary.fill(padded, h, w, None)
    return run


def shared_copies(halo, padded):
    """The copies of one shared-path ``update`` without MPI, as the path makes them.

    The thin column blocks packed behind the tile by their owner and unpacked by
    the reader, the rows straight from the neighbour's tile into this rank's
    halo; the one-rank ring and the poles as on the message path.
    """
    from mpisphere.halo.plan import copier, copy_runs, unpacker
    memory = halo.grid.node_memory
    record = memory.find(padded)
    h, w = padded.shape[-2] - 2 * halo.rows, padded.shape[-1] - 2 * halo.cols
    pattern = halo.pattern
    tiles = pattern.neighbour_tiles(halo.grid, halo.extents)
    copies = []
    for phase in pattern.phases(h, w, gather=True):
        for tag, send_region, recv_region in phase:
            dest, source = pattern.sends.get(tag), pattern.receives.get(tag)
            staged = record.staging.get(tag)
            if dest is not None and staged is not None:  # this rank packs its block for the neighbour
                copies.append(lambda staged=staged, region=send_region: copy_runs(staged[1], padded, region))
            if source is None or not memory.on_node(source):
                continue
            ho, wo = tiles[source]
            if staged is not None:  # the neighbour's packed block
                rows, cols = recv_region
                theirs = memory.view(record.serial, source,
                                     padded.shape[:-2] + (rows.stop - rows.start, cols.stop - cols.start),
                                     offset=staged[0])
                copies.append(unpacker(padded, recv_region, theirs))
            else:
                theirs = memory.view(record.serial, source, padded.shape[:-2] + (ho + 2 * halo.rows,
                                                                                 wo + 2 * halo.cols))
                copies.append(copier(padded, recv_region, theirs, pattern.send_region(tag, ho, wo, gather=True)))

    def run():
        pattern.wrap(padded, h, w)
        for copy in copies:
            copy()
        halo.boundary.fill(padded, h, w, None)
    return run


def bench_case(grid, args, batch, width):
    dtype = numpy.dtype(args.dtype)
    nlat, nlon = args.nlat, args.nlon
    h, w = grid.local_shape(nlat, nlon)
    halo = HaloExchange(grid, width, width, extents=(nlat, nlon))
    rng = numpy.random.default_rng(grid.rank)
    plain = rng.standard_normal((batch, h + 2 * width, w + 2 * width)).astype(dtype)
    cases = {"raw": raw_halo(grid, batch, h, w, width, width, dtype)}
    by_hand = plain.copy()
    cases["hand-written update"], cases["hand-written accumulate"] = hand_written_halo(grid, by_hand, width, width)
    # the yardstick computes what the halo computes: checked once, bit for bit, before anything is timed
    for ours, theirs in ((halo.update, cases["hand-written update"]),
                         (halo.accumulate, cases["hand-written accumulate"])):
        by_hand[...] = plain
        expected = ours(plain.copy())
        theirs()
        if not numpy.array_equal(by_hand, expected):
            raise AssertionError(f"rank {grid.rank}: the hand-written halo differs from HaloExchange's")
    has_shared = hasattr(halo, "zeros") and not args.plain_only
    if has_shared:
        cases["copies"] = message_copies(halo, plain)
        shared = halo.zeros((batch,), dtype)
        shared[...] = plain
        cases["shared copies"] = shared_copies(halo, shared)
        cases["update shared"] = lambda: halo.update(shared)
        cases["accumulate shared"] = lambda: halo.accumulate(shared)

        def forced(call):
            def run():
                with mpisphere.config.override(shared_memory=False):
                    call(shared)
            return run
        cases["update shared, messages forced"] = forced(halo.update)
        cases["accumulate shared, messages forced"] = forced(halo.accumulate)
        if args.compare_packing:  # the column blocks read straight from the neighbour's tile, not packed by it
            straight = halo.zeros((batch,), dtype)
            straight[...] = plain
            halo.grid.node_memory.find(straight).staging.clear()
            cases["update shared, columns straight"] = lambda: halo.update(straight)
            cases["accumulate shared, columns straight"] = lambda: halo.accumulate(straight)
    cases["update plain"] = lambda: halo.update(plain)
    cases["accumulate plain"] = lambda: halo.accumulate(plain)
    times = measure_rounds(grid.cart, cases, args.repeats, args.warmup)
    raw = times["raw"]
    rows = []
    floor = None
    if "copies" in times:
        floor = times["copies"] + raw  # round by round: what a packing exchange cannot go below
    for name, t in times.items():
        # against the hand-written halo of the same direction (the yardstick), round by round
        yardstick = times["hand-written accumulate" if "accumulate" in name else "hand-written update"]
        row = {"grid": f"{grid.npolar}x{grid.nazimuth}", "fields": batch, "width": width, "case": name,
               "median_ms": float(numpy.median(t)), "min_ms": float(t.min()), "max_ms": float(t.max()),
               "ratio_raw": float(numpy.median(t / raw)), "ratio_hand_written": float(numpy.median(t / yardstick)),
               "ratio_copies_plus_raw": None if floor is None else float(numpy.median(t / floor))}
        rows.append(row)
        if grid.rank == 0:
            extra = f"  x{row['ratio_hand_written']:5.2f} hand-written"
            extra += "" if floor is None else f"  x{row['ratio_copies_plus_raw']:5.2f} (copies + raw)"
            print(f"{row['grid']:>4} {batch:3d} fields  width {width}  {name:36s} {row['median_ms']:8.3f} ms "
                  f"[{row['min_ms']:7.3f}..{row['max_ms']:7.3f}]  x{row['ratio_raw']:5.2f} raw{extra}", flush=True)
    if has_shared:
        message_bytes = 2 * sum(buf.nbytes for _, buf in halo._call.message_plan(plain).outgoing.values()
                                if buf is not None)
        staged_bytes = sum(block.nbytes for _, block in grid.node_memory.find(shared).staging.values())
        for row in rows:
            row.update(message_path_bytes=message_bytes, shared_path_bytes=staged_bytes)
        if grid.rank == 0:
            print(f"     memory per rank beyond the tile: shared path {staged_bytes} bytes (the column blocks "
                  f"packed behind the tile); message path {message_bytes} bytes (packed buffers out and in)",
                  flush=True)
    halo.free()
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nlat", type=int, default=361)
    parser.add_argument("--nlon", type=int, default=720)
    parser.add_argument("--batch", default="1,32", help="comma-separated numbers of fields")
    parser.add_argument("--widths", default="1,4", help="comma-separated halo widths (rows = columns)")
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--grids", default=None, help="comma-separated PxA grids (default: 2x2 on 4 ranks, "
                                                      "1x2,2x1 on 2 ranks)")
    parser.add_argument("--repeats", type=int, default=201)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--plain-only", action="store_true",
                        help="only the raw call and plain arrays (to compare with code that has no shared path)")
    parser.add_argument("--compare-packing", action="store_true",
                        help="also shared tiles whose column blocks are read straight from the neighbour's tile")
    parser.add_argument("--json", default=None, help="write the rows here (rank 0)")
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    size = world.Get_size()
    shapes = grid_shapes(args.grids, size)
    if world.Get_rank() == 0:
        print(f"mpisphere {mpisphere.__version__}, {size} ranks, field (*, {args.nlat}, {args.nlon}) {args.dtype}, "
              f"{args.repeats} rounds; MPI: {mpi_version()}", flush=True)
    rows = []
    for npolar, nazimuth in shapes:
        with ProcessGrid(world, npolar, nazimuth) as grid:
            for batch in (int(b) for b in args.batch.split(",")):
                for width in (int(v) for v in args.widths.split(",")):
                    rows += bench_case(grid, args, batch, width)
    if args.json and world.Get_rank() == 0:
        write_results(args.json, {"script": "bench_halo.py", "ranks": size, "nlat": args.nlat, "nlon": args.nlon,
                                  "repeats": args.repeats}, rows)


if __name__ == "__main__":
    main()
