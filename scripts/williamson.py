"""Williamson et al. (1992)'s shallow-water test set with mpisphere's model: cases 2, 5 and 6, errors and convergence.

    mpiexec -n 1 python -m mpi4py scripts/williamson.py --case 5                # T42-T170, both schemes
    mpiexec -n 4 python -m mpi4py scripts/williamson.py --case 6 --truncations 42,63
    python scripts/williamson.py --plot                                         # the pictures from the results

For each truncation (T42, T63, T85, T170 on the usual 3/2-dealiased Gauss
grids 64 x 128, 96 x 192, 128 x 256, 256 x 512) and each time scheme
(explicit third-order Adams-Bashforth, and semi-implicit leapfrog with a
Robert-Asselin filter, the gravity waves about a resting reference depth
implicit), the script runs the case and, once a model day, computes the
normalised l1, l2 and l-infinity errors of the free-surface height of
Williamson et al. (1992, eqs. 82-84), on the run's own Gauss grid with its
quadrature:

    l1 = I(|h - h_ref|) / I(|h_ref|),  l2 = sqrt(I((h - h_ref)^2) / I(h_ref^2)),  linf = max|h - h_ref| / max|h_ref|

Case 2 has an exact solution (the initial state). Cases 5 and 6 have none;
the reference is the same model at T213 (320 x 640), explicit, run by
this script once and kept in ``docs/results/williamson-reference-case<N>-T213.npz``
(its spectral coefficients up to T170, complex64, once a day) with its
settings, so it is not recomputed unless they change (``--recompute``).
The reference is interpolated to each grid through its coefficients
(truncated to the run's degrees, then synthesised on the run's grid).

The steps: explicit near its stability limit (gravity waves plus the
flow's speed at the truncation's highest degree), semi-implicit five times
that. A run that blows up is recorded as such. The results of the runs
asked for replace those of the same scheme and truncation in
``williamson-case<N>.json`` and leave the others (``--schemes semi-implicit``
reruns one scheme only).
"""

import argparse
import json
import math
import os
import sys
import time

import numpy
from mpi4py import MPI

from mpisphere import ProcessGrid
from mpisphere.examples import ShallowWaterSolver

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "results")
GRIDS = {42: (64, 128), 63: (96, 192), 85: (128, 256), 170: (256, 512), 213: (320, 640)}
DAYS = {2: 5, 5: 15, 6: 14}
# explicit steps (s) per truncation: about 0.7 of Adams-Bashforth's limit for (gravity wave + wind) at degree T
EXPLICIT_DT = {5: {42: 360.0, 63: 240.0, 85: 180.0, 170: 90.0, 213: 72.0},
               6: {42: 240.0, 63: 160.0, 85: 120.0, 170: 60.0, 213: 48.0},
               2: {42: 360.0, 63: 240.0, 85: 180.0, 170: 90.0, 213: 72.0}}
SEMI_IMPLICIT_FACTOR = {2: 5, 5: 5, 6: 5}
REFERENCE_DEPTH = {2: 4000.0, 5: 6000.0, 6: 12000.0}  # at least the largest depth of each case (m)
KEEP_DEGREES = 171  # the reference's coefficients kept: up to T170, the finest run compared


def time_step(case, truncation, scheme):
    dt = EXPLICIT_DT[case][truncation]
    return dt * SEMI_IMPLICIT_FACTOR[case] if scheme == "semi-implicit" else dt


def build(grid, case, truncation, scheme):
    nlat, nlon = GRIDS[truncation]
    return ShallowWaterSolver(grid, nlat, nlon, dt=time_step(case, truncation, scheme), lmax=truncation + 1,
                              mmax=truncation + 1, quadrature="legendre-gauss", scheme=scheme,
                              orography="williamson5" if case == 5 else None,
                              reference_depth=REFERENCE_DEPTH[case])


def initial_state(swe, case):
    if case == 2:
        return swe.williamson2_initial_condition()[0]
    return swe.williamson5_initial_condition() if case == 5 else swe.williamson6_initial_condition()


def surface_coefficients(swe, uspec):
    """The whole coefficients of the free-surface height ``(phi + phi_s) / g`` on rank 0 (None elsewhere)."""
    block = (uspec[0] + swe.grid2spec(swe.surface_geopotential)) / swe.gravity
    return swe.sht.gather_coefficients(block)


def run(grid, case, truncation, scheme, on_day, days):
    """Run the case, calling ``on_day(day, swe, uspec)`` once a model day (day 0 too); seconds per model day."""
    swe = build(grid, case, truncation, scheme)
    uspec = initial_state(swe, case)
    history = swe.new_history()  # the days continue one scheme, as one long run
    steps = int(round(86400.0 / swe.dt))
    on_day(0, swe, uspec)
    start = time.perf_counter()
    for day in range(1, days + 1):
        uspec = swe.timestep(uspec, steps, history)
        if not numpy.isfinite(swe.diagnostics(uspec)["mass"]):
            raise FloatingPointError(f"case {case} T{truncation} {scheme} blew up on day {day}")
        on_day(day, swe, uspec)
    return grid.cart.allreduce(time.perf_counter() - start, op=MPI.MAX) / days


def settings_of(case, truncation, days):
    return {"case": case, "truncation": truncation, "grid": GRIDS[truncation], "scheme": "explicit",
            "dt": time_step(case, truncation, "explicit"), "days": days,
            "reference_depth": REFERENCE_DEPTH[case], "kept_degrees": KEEP_DEGREES}


def reference(grid, case, truncation, days, recompute, results=RESULTS):
    """Case ``case``'s reference coefficients per day ``(days + 1, 171, 171)`` on rank 0 (None elsewhere)."""
    path = os.path.join(results, f"williamson-reference-case{case}-T{truncation}.npz")
    settings = settings_of(case, truncation, days)
    found = None
    if grid.rank == 0 and os.path.exists(path) and not recompute:
        data = numpy.load(path)
        if json.loads(str(data["settings"])) == json.loads(json.dumps(settings)):
            found = data["coefficients"]
    if grid.cart.bcast(found is not None, root=0):
        return found
    kept = []

    def keep(day, swe, uspec):
        whole = surface_coefficients(swe, uspec)
        if whole is not None:
            kept.append(whole[:KEEP_DEGREES, :KEEP_DEGREES].astype(numpy.complex64))
            print(f"  reference case {case} T{truncation}: day {day}", flush=True)
    seconds = run(grid, case, truncation, "explicit", keep, days)
    if grid.rank == 0:
        coefficients = numpy.stack(kept)
        numpy.savez_compressed(path, coefficients=coefficients, settings=json.dumps(settings),
                               seconds_per_day=seconds, ranks=grid.size)
        return coefficients
    return None


def errors(swe, uspec, reference_coefficients, exact_height=None):
    """Normalised (l1, l2, linf) of the free-surface height against the reference, the same on every rank."""
    height = swe.spec2grid((uspec[0] + swe.grid2spec(swe.surface_geopotential)) / swe.gravity)
    if exact_height is None:
        lmax, mmax = swe.lmax, swe.mmax
        whole = None
        if swe.grid.rank == 0:
            whole = numpy.zeros((lmax, mmax), complex)
            kept = reference_coefficients[:lmax, :mmax]
            whole[:kept.shape[0], :kept.shape[1]] = kept
        block = swe.sht.scatter_coefficients(whole)
        exact_height = swe.isht.forward(numpy.ascontiguousarray(block, dtype=swe.sht.cdtype))
    diff = height - exact_height
    l1 = float(swe.integrate_grid(abs(diff))) / float(swe.integrate_grid(abs(exact_height)))
    l2 = math.sqrt(float(swe.integrate_grid(diff ** 2)) / float(swe.integrate_grid(exact_height ** 2)))
    top_diff = swe.grid.cart.allreduce(float(abs(diff).max()), op=MPI.MAX)
    top = swe.grid.cart.allreduce(float(abs(exact_height).max()), op=MPI.MAX)
    return l1, l2, top_diff / top


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", type=int, choices=[2, 5, 6], default=5)
    parser.add_argument("--truncations", default="42,63,85,170")
    parser.add_argument("--schemes", default="explicit,semi-implicit")
    parser.add_argument("--recompute", action="store_true", help="recompute the reference")
    parser.add_argument("--reference", type=int, default=213, choices=sorted(GRIDS),
                        help="the reference's truncation (213; lower ones only to try the script quickly)")
    parser.add_argument("--results", default=RESULTS, help="folder of the references and results (docs/results)")
    parser.add_argument("--days", type=int, default=None, help="fewer days than the case's (to try the script)")
    parser.add_argument("--plot", action="store_true", help="only draw the pictures from the results")
    args = parser.parse_args(argv)
    if args.plot:
        return plot()
    world = MPI.COMM_WORLD
    out = os.path.join(args.results, f"williamson-case{args.case}.json")
    days = DAYS[args.case] if args.days is None else min(args.days, DAYS[args.case])
    results = {"case": args.case, "days": days, "reference": args.reference, "runs": []}
    with ProcessGrid(world) as grid:
        ref = None if args.case == 2 else reference(grid, args.case, args.reference, days, args.recompute, args.results)
        for scheme in args.schemes.split(","):
            for truncation in map(int, args.truncations.split(",")):
                rows = []
                exact = {}

                def measure(day, swe, uspec):
                    if args.case == 2:
                        if "h" not in exact:
                            _, geopotential = swe.williamson2_initial_condition()
                            exact["h"] = geopotential / swe.gravity
                        rows.append(errors(swe, uspec, None, exact["h"]))
                    else:
                        rows.append(errors(swe, uspec, ref[day] if ref is not None else None))
                try:
                    seconds = run(grid, args.case, truncation, scheme, measure, days)
                except FloatingPointError as exc:  # the same on every rank: the check is a reduction
                    results["runs"].append({"scheme": scheme, "truncation": truncation, "grid": GRIDS[truncation],
                                            "dt": time_step(args.case, truncation, scheme), "blew_up": str(exc),
                                            "errors": rows})
                    if grid.rank == 0:
                        print(f"  {exc}", flush=True)
                    continue
                results["runs"].append({"scheme": scheme, "truncation": truncation, "grid": GRIDS[truncation],
                                        "dt": time_step(args.case, truncation, scheme), "seconds_per_day": seconds,
                                        "ranks": [grid.npolar, grid.nazimuth], "errors": rows})
                if grid.rank == 0:
                    l1, l2, linf = rows[-1]
                    dt = time_step(args.case, truncation, scheme)
                    print(f"case {args.case} T{truncation:<3d} {scheme:13s} dt {dt:5.0f} s: "
                          f"day {days}: l1 {l1:.2e} l2 {l2:.2e} linf {linf:.2e}; "
                          f"{seconds:.2f} s per model day on {grid.npolar} x {grid.nazimuth}", flush=True)
        if grid.rank == 0:
            write_results(out, results)
    return 0


def write_results(path, results):
    """Write ``results``, keeping the runs of ``path`` of the same case, days and reference that it does not redo."""
    runs = results["runs"]
    if os.path.exists(path):
        with open(path) as f:
            before = json.load(f)
        if all(before.get(key) == results[key] for key in ("case", "days", "reference")):
            redone = {(r["scheme"], r["truncation"]) for r in runs}
            runs = [r for r in before["runs"] if (r["scheme"], r["truncation"]) not in redone] + runs
    order = {"explicit": 0, "semi-implicit": 1}
    runs.sort(key=lambda r: (order.get(r["scheme"], 2), r["truncation"]))
    with open(path, "w") as f:
        json.dump(dict(results, runs=runs), f, indent=1)


def plot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for case in (5, 6):
        path = os.path.join(RESULTS, f"williamson-case{case}.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            results = json.load(f)
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), dpi=110)
        for run_ in (r for r in results["runs"] if "blew_up" not in r):
            style = "-" if run_["scheme"] == "explicit" else "--"
            l2 = [e[1] for e in run_["errors"]]
            left.semilogy(range(len(l2)), l2, style, label=f"T{run_['truncation']} {run_['scheme']}")
        left.set_xlabel("day")
        left.set_ylabel("normalised l2 height error")
        left.set_title(f"Williamson case {case} against the T213 run")
        left.legend(fontsize=7)
        for scheme, style in (("explicit", "o-"), ("semi-implicit", "s--")):
            runs = [r for r in results["runs"] if r["scheme"] == scheme and "blew_up" not in r]
            if runs:
                for k, name in ((0, "l1"), (1, "l2"), (2, "linf")):
                    right.loglog([r["truncation"] for r in runs], [r["errors"][-1][k] for r in runs], style,
                                 label=f"{name} {scheme}")
        right.set_xlabel("truncation T")
        right.set_title(f"day {results['days']}")
        right.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(RESULTS, "..", f"williamson_case{case}.png"))
        plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
