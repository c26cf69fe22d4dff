"""Draw a field on an octahedral grid: every point of O24, coloured by a band-limited field synthesised on 2 x 2 ranks.

    mpiexec -n 4 python -m mpi4py scripts/plot_reduced.py --out docs/reduced_o24.png

The field is the synthesis of a few spherical harmonics (a Rossby-Haurwitz-like
wave 4 on a zonal flow); the points are drawn where they lie (longitude,
latitude), so the rings visibly shorten towards the poles.
"""

import argparse

import numpy
from mpi4py import MPI

import mpisphere as ms


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=24, help="octahedral O<n>")
    parser.add_argument("--out", default="reduced_o24.png")
    args = parser.parse_args()
    grid = ms.ProcessGrid(MPI.COMM_WORLD)
    rings = ms.RingGeometry.octahedral(args.n)
    synthesis = ms.DistributedInverseReducedRealSHT(grid, rings)
    whole = numpy.zeros((synthesis.lmax, synthesis.mmax), complex)
    whole[1, 0], whole[3, 0], whole[5, 4], whole[8, 3] = 1.0, -0.5, 0.6, 0.3j
    points = synthesis.forward(synthesis.scatter_coefficients(whole if grid.rank == 0 else None))
    field = synthesis.tiles.gather(points)
    owner = synthesis.tiles.gather(numpy.full(synthesis.tiles.npoints, float(grid.rank)))
    if grid.rank == 0:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        lon = numpy.degrees(rings.longitudes)
        lat = 90 - numpy.degrees(rings.colatitudes)
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), constrained_layout=True)
        shown = axes[0].scatter(lon, lat, c=field, s=4, cmap="RdBu_r")
        fig.colorbar(shown, ax=axes[0], shrink=0.8)
        axes[0].set_title(f"{rings.name}: {rings.npoints} points, synthesis on {grid.npolar} x {grid.nazimuth} ranks")
        axes[1].scatter(lon, lat, c=owner, s=4, cmap="tab10", vmin=0, vmax=9)
        axes[1].set_title("which rank holds each point (rings balanced by points)")
        for ax in axes:
            ax.set_xlabel("longitude")
            ax.set_ylabel("latitude")
            ax.set_xlim(0, 360)
            ax.set_ylim(-90, 90)
        fig.savefig(args.out, dpi=110)
        print(f"wrote {args.out}")
    grid.free()


if __name__ == "__main__":
    main()
