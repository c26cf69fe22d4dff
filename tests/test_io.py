"""mpisphere.io under MPI: exact round trips onto every grid, stores xarray opens, refusals and damage on every rank.

The serial reference is the global array every rank builds from one seed:
what a rank reads must be exactly its slice of it, on any grid shape of
any number of ranks (sub-communicators of the launch), and what plain
Zarr and xarray read on one rank must be all of it.
"""

import os

import numpy
import pytest
from mpi4py import MPI

from mpisphere import DistributedRealSHT, DistributedRealVectorSHT, ProcessGrid
from mpisphere.quadrature import latitudes

zarr = pytest.importorskip("zarr")  # the io extra (Python 3.11 and newer)
xarray = pytest.importorskip("xarray")

from mpisphere.io import FieldStore, checkpoint, open_checkpoint  # noqa: E402

from helpers import every_rank, raises, sub_grids  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture
def shared(tmp_path):
    """A directory every rank sees: rank 0's ``tmp_path``."""
    return MPI.COMM_WORLD.bcast(str(tmp_path), root=0)


def whole_field(shape, dtype, seed=5):
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if numpy.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def tile_of(whole, grid, nlat, nlon):
    lat, lon = grid.local_slices(nlat, nlon)
    return numpy.ascontiguousarray(whole[..., lat, lon])


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
def test_tiles_round_trip_onto_every_grid_and_open_in_xarray(grid, shared, dtype):
    nlat, nlon = 19, 22  # uneven on every grid of 2-6 ranks
    whole = whole_field((3, 2, nlat, nlon), dtype)
    path = os.path.join(shared, "fields.zarr")
    store = FieldStore(path, grid, mode="w")
    store.write_tiles("t", tile_of(whole, grid, nlat, nlon), nlat, nlon, "legendre-gauss", dims=("time", "level"),
                      coords={"time": ([0.0, 0.5, 1.0], {"long_name": "model time in days"})},
                      attrs={"units": "K"})
    back = store.read_tiles("t", nlat, nlon, "legendre-gauss")
    assert back.dtype == whole.dtype
    assert store.variables() == ["t"] and store.attrs("t")["units"] == "K"
    assert repr(store) == f"FieldStore({path!r}, {grid!r}, mode='w')"
    numpy.testing.assert_array_equal(back, tile_of(whole, grid, nlat, nlon))
    for reader in sub_grids(grid.cart):
        if reader is not None:
            got = FieldStore(path, reader).read_tiles("t", nlat, nlon, "legendre-gauss")
            numpy.testing.assert_array_equal(got, tile_of(whole, reader, nlat, nlon))
    if grid.rank == 0:
        numpy.testing.assert_array_equal(zarr.open_array(os.path.join(path, "t"))[...], whole)
        ds = xarray.open_zarr(path)
        numpy.testing.assert_array_equal(ds["t"].values, whole)
        assert ds["t"].dims == ("time", "level", "lat", "lon") and ds["t"].attrs["units"] == "K"
        assert ds["lat"].attrs["units"] == "degrees_north" and ds["lat"].attrs["standard_name"] == "latitude"
        assert ds["lon"].attrs["units"] == "degrees_east" and ds["lon"].attrs["standard_name"] == "longitude"
        theta, _ = latitudes(nlat, "legendre-gauss")
        numpy.testing.assert_array_equal(ds["lat"].values, 90 - numpy.degrees(theta))  # north first
        assert ds["t"].attrs["mpisphere"]["grid_shape"] == [grid.npolar, grid.nazimuth]
        numpy.testing.assert_array_equal(ds["time"].values, [0.0, 0.5, 1.0])


@pytest.mark.parametrize("vector", [False, True])
@pytest.mark.parametrize("write_orders, read_orders", [("contiguous", "balanced"), ("balanced", "contiguous")])
def test_coefficients_round_trip_between_order_layouts_and_grids(grid, shared, vector, write_orders, read_orders):
    nlat, nlon = 17, 32
    cls = DistributedRealVectorSHT if vector else DistributedRealSHT
    sht = cls(grid, nlat, nlon, orders=write_orders)
    lead = (2, 2) if vector else (3,)
    whole = whole_field(lead + (sht.lmax, sht.mmax), "complex128", seed=8)
    block = numpy.ascontiguousarray(whole[..., sht.local_degrees[:, None], sht.local_orders[None, :]])
    path = os.path.join(shared, "coefficients.zarr")
    FieldStore(path, grid, mode="w").write_coefficients("c", block, sht, dims=lead_names(vector))
    for reader in sub_grids(grid.cart):
        if reader is not None:
            other = cls(reader, nlat, nlon, orders=read_orders)
            got = FieldStore(path, reader).read_coefficients("c", other)
            numpy.testing.assert_array_equal(got, whole[..., other.local_degrees[:, None], other.local_orders[None, :]])
    if grid.rank == 0:
        ds = xarray.open_zarr(path)
        numpy.testing.assert_array_equal(ds["c"].values, whole)
        meta = ds["c"].attrs["mpisphere"]
        assert (meta["lmax"], meta["mmax"], meta["norm"], meta["csphase"]) == (sht.lmax, sht.mmax, "ortho", True)


def lead_names(vector):
    return ("time", "component") if vector else ("field",)


def test_append_extends_a_time_series(grid, shared):
    nlat, nlon = 9, 16
    whole = whole_field((4, nlat, nlon), "float64")
    path = os.path.join(shared, "series.zarr")
    store = FieldStore(path, grid, mode="w")
    for day in range(4):
        store.write_tiles("v", tile_of(whole[day:day + 1], grid, nlat, nlon), nlat, nlon, dims=("time",),
                          coords={"time": [float(day)]}, append=day > 0)
    numpy.testing.assert_array_equal(store.read_tiles("v", nlat, nlon), tile_of(whole, grid, nlat, nlon))
    if grid.rank == 0:
        ds = xarray.open_zarr(path)
        numpy.testing.assert_array_equal(ds["time"].values, [0.0, 1.0, 2.0, 3.0])
        numpy.testing.assert_array_equal(ds["v"].values, whole)


def test_a_reader_that_does_not_fit_is_refused_on_every_rank(grid, shared):
    nlat, nlon = 17, 32
    sht = DistributedRealSHT(grid, nlat, nlon)
    path = os.path.join(shared, "refuse.zarr")
    store = FieldStore(path, grid, mode="w")
    store.write_tiles("t", numpy.zeros(grid.local_shape(nlat, nlon)), nlat, nlon)
    store.write_coefficients("c", numpy.zeros(sht.block_shape, complex), sht)
    # chunks of zeros are files too (Zarr skips them unless told; a missing file means a damaged store)
    numpy.testing.assert_array_equal(store.read_tiles("t", nlat, nlon), 0)
    who = f"ranks? 0.*of {grid.size}"
    with raises(ValueError, match=f"read_tiles.*{who}.*nlat is 17 in the store, 18 here"):
        store.read_tiles("t", 18, nlon)
    with raises(ValueError, match="quadrature is 'equiangular' in the store, 'legendre-gauss' here"):
        store.read_tiles("t", nlat, nlon, "legendre-gauss")
    with raises(ValueError, match="mpisphere is 'coefficients' in the store, 'tiles' here"):
        store.read_tiles("c", nlat, nlon)
    for options, text in [(dict(lmax=8), "lmax is 9 in the store, 8 here"),
                          (dict(norm="schmidt"), "norm is 'ortho' in the store, 'schmidt' here"),
                          (dict(csphase=False), "csphase is True in the store, False here")]:
        other = DistributedRealSHT(grid, nlat, nlon, **options)
        with raises(ValueError, match=text):
            store.read_coefficients("c", other)
    with raises(ValueError, match="no variable 'nothing'"):
        store.read_tiles("nothing", nlat, nlon)
    with raises(PermissionError, match="read-only"):
        FieldStore(path, grid).write_tiles("u", numpy.zeros(grid.local_shape(nlat, nlon)), nlat, nlon)
    # a wrong tile on one rank only: every rank raises, naming it
    odd = grid.size - 1
    shape = grid.local_shape(nlat, nlon)
    tile = numpy.zeros((shape[0] + (grid.rank == odd), shape[1]))
    with raises(ValueError, match=f"rank {odd} of {grid.size}: expected this rank's tiles"):
        store.write_tiles("w", tile, nlat, nlon)
    with raises(FileNotFoundError, match="no store"):
        FieldStore(os.path.join(shared, "absent.zarr"), grid)


def test_damaged_chunks_raise_on_every_rank(grid, shared):
    nlat, nlon = 21, 16
    whole = whole_field((2, nlat, nlon), "float64")
    path = os.path.join(shared, "damaged.zarr")
    FieldStore(path, grid, mode="w").write_tiles("t", tile_of(whole, grid, nlat, nlon), nlat, nlon)
    chunk_dir = os.path.join(path, "t", "c", "1")
    if grid.rank == 0:
        victim = os.path.join(chunk_dir, sorted(os.listdir(chunk_dir))[-1], "0")
        data = bytearray(open(victim, "rb").read())
        data[3] ^= 0x10  # one flipped bit
        open(victim, "wb").write(bytes(data))
    grid.cart.Barrier()
    store = FieldStore(path, grid)
    with raises(ValueError, match="checksum"):
        store.read_tiles("t", nlat, nlon)
    if grid.rank == 0:
        with raises(ValueError, match="checksum"):
            xarray.open_zarr(path)["t"].values
        os.remove(victim)
    grid.cart.Barrier()
    with raises(ValueError, match="chunk file.*missing"):
        store.read_tiles("t", nlat, nlon)
    if grid.rank == 0:
        with open(os.path.join(path, "t", "zarr.json"), "r+") as f:
            f.truncate(40)
    grid.cart.Barrier()
    with raises(ValueError, match=f"of {grid.size}: cannot open 't'.*JSONDecodeError"):
        store.read_tiles("t", nlat, nlon)


def test_an_interrupted_checkpoint_leaves_the_previous_one(grid, shared):
    nlat, nlon = 9, 16
    first = whole_field((2, nlat, nlon), "float64", seed=1)
    path = os.path.join(shared, "checkpoint")
    with checkpoint(path, grid) as store:
        store.write_tiles("x", tile_of(first, grid, nlat, nlon), nlat, nlon)
        store.set_attrs({"step": 1})
    odd = grid.size - 1
    # the failing rank sees its own exception, every other rank the agreed one naming it
    expected = "the model blew up" if grid.rank == odd else \
        f"rank {odd} of {grid.size}: the checkpoint was not completed: RuntimeError: the model blew up"
    with raises(RuntimeError, match=expected):
        with checkpoint(path, grid) as store:
            store.write_tiles("x", tile_of(first * 2, grid, nlat, nlon), nlat, nlon)
            if grid.rank == odd:
                raise RuntimeError("the model blew up while saving")
    store = open_checkpoint(path, grid)
    assert store.attrs()["step"] == 1
    numpy.testing.assert_array_equal(store.read_tiles("x", nlat, nlon), tile_of(first, grid, nlat, nlon))
    # the next save removes the unfinished version and becomes current
    with checkpoint(path, grid) as store:
        store.write_tiles("x", tile_of(first * 3, grid, nlat, nlon), nlat, nlon)
        store.set_attrs({"step": 3})
    assert open_checkpoint(path, grid).attrs()["step"] == 3
    if grid.rank == 0:
        assert sorted(os.listdir(path)) == ["CURRENT", "v000001.zarr", "v000003.zarr"]
        with open(os.path.join(path, "CURRENT"), "w") as f:
            f.write("garbage")
    grid.cart.Barrier()
    with raises(ValueError, match=f"CURRENT' is damaged.*|rank 0 of {grid.size}.*damaged"):
        open_checkpoint(path, grid)


def _bad_write(case, grid, nlat, nlon):
    """The arguments of ``write_tiles`` with one mistake, on the last rank only: ``(args, kwargs)``."""
    tile = numpy.zeros((2,) + grid.local_shape(nlat, nlon))
    good = ("w", tile, nlat, nlon), {"dims": ("time",)}
    if grid.rank != grid.size - 1:
        return good
    return {
        "name": (("a/b", tile, nlat, nlon), {"dims": ("time",)}),
        "not an array": (("w", tile.tolist(), nlat, nlon), {"dims": ("time",)}),
        "dtype": (("w", tile.astype(numpy.int32), nlat, nlon), {"dims": ("time",)}),
        "dims": (("w", tile, nlat, nlon), {"dims": ("lat",)}),
        "coords": (("w", tile, nlat, nlon), {"dims": ("time",), "coords": {"time": [0.0, 1.0, 2.0]}}),
        "attrs": (("w", tile, nlat, nlon), {"dims": ("time",), "attrs": {"when": object()}}),
    }[case]


@pytest.mark.parametrize("case, message", [
    ("name", "name must be a nonempty string without '/'"),
    ("not an array", "expected a NumPy or CuPy array, got list"),
    ("dtype", "int32"),
    ("dims", r"dims must name the 1 leading axes once each \(not lat, lon\), got \('lat',\)"),
    ("coords", r"coords\['time'\] must be numbers along a leading axis"),
    ("attrs", "attrs must be JSON"),
])
def test_a_bad_write_on_one_rank_raises_on_every_rank(grid, shared, case, message):
    nlat, nlon = 9, 16
    store = FieldStore(os.path.join(shared, "bad.zarr"), grid, mode="w")
    args, kwargs = _bad_write(case, grid, nlat, nlon)
    with raises((TypeError, ValueError), match=f"rank {grid.size - 1} of {grid.size}: .*{message}"):
        store.write_tiles(*args, **kwargs)
    assert store.variables() == []  # nothing was written


def test_writes_that_do_not_fit_the_store_raise_on_every_rank(grid, shared):
    nlat, nlon = 9, 16
    store = FieldStore(os.path.join(shared, "fit.zarr"), grid, mode="w")
    store.write_tiles("v", numpy.zeros((1,) + grid.local_shape(nlat, nlon)), nlat, nlon, dims=("time",))
    with raises(ValueError, match=f"{every_rank(grid.size)}: append=True extends the first leading axis"):
        store.write_tiles("v", numpy.zeros(grid.local_shape(nlat, nlon)), nlat, nlon, append=True)
    # rank 0 writes the metadata and finds it; every rank raises, naming rank 0
    with raises(ValueError, match=f"rank 0 of {grid.size}: cannot append: 'v' holds"):
        store.write_tiles("v", numpy.zeros((1,) + grid.local_shape(nlat, nlon), numpy.float32), nlat, nlon,
                          dims=("time",), append=True)
    with raises(ValueError, match="one store holds one grid"):
        store.write_tiles("u", numpy.zeros(grid.local_shape(11, nlon)), 11, nlon)
    with raises(TypeError, match=f"{every_rank(grid.size)}: attrs must be JSON"):
        store.set_attrs({"when": object()})
    with ProcessGrid(MPI.COMM_SELF) as alone:
        other = DistributedRealSHT(alone, nlat, nlon)
        if grid.size > 1:
            with raises(TypeError, match="sht must be a distributed transform of this store's grid"):
                store.write_coefficients("c", numpy.zeros(other.block_shape, complex), other)


def test_a_field_on_either_tiling_is_written_and_read_through_the_tiling(grid, shared):
    """write_field / read_field: a regular tiling stores tiles, RingTiles points, each read back on another
    grid through its own tiling, the same as write_tiles / write_points would store them."""
    from mpisphere import RingGeometry, RingTiles
    path = os.path.join(shared, "fields.zarr")
    store = FieldStore(path, grid, mode="w")
    regular = grid.tiling(9, 12)
    whole = whole_field((2, 9, 12), "float64")
    store.write_field("t", numpy.ascontiguousarray(regular.piece(whole, grid.rank)), regular, "legendre-gauss")
    rings = RingGeometry.octahedral(5)
    tiles = RingTiles(grid, rings)
    points = whole_field((rings.npoints,), "float64")
    on_rings = os.path.join(shared, "rings.zarr")  # one store holds one grid
    FieldStore(on_rings, grid, mode="w").write_field("p", numpy.ascontiguousarray(points[tiles.point_indices()]),
                                                     tiles)
    for sub in sub_grids(grid.cart):
        if sub is not None:
            again = FieldStore(path, sub, mode="r")
            numpy.testing.assert_array_equal(again.read_field("t", sub.tiling(9, 12), "legendre-gauss"),
                                             sub.tiling(9, 12).piece(whole, sub.rank))
            on_sub = RingTiles(sub, rings)
            numpy.testing.assert_array_equal(FieldStore(on_rings, sub, mode="r").read_field("p", on_sub),
                                             points[on_sub.point_indices()])
            numpy.testing.assert_array_equal(again.read_tiles("t", 9, 12, "legendre-gauss"),
                                             again.read_field("t", sub.tiling(9, 12), "legendre-gauss"))
    with raises(ValueError, match="quadrature"):
        store.read_field("t", regular, "equiangular")
    # something that is not a tiling, on the last rank only: every rank raises, naming it
    last = grid.size - 1
    given = (9, 12) if grid.rank == last else regular
    with raises(TypeError, match=rf"rank {last} of {grid.size}: tiles must be the RingTiles .* a grid.tiling\(nlat, "
                                 r"nlon\)\), got tuple"):
        store.read_field("t", given, "legendre-gauss")


@pytest.mark.parametrize("kind", ["octahedral", "healpix"])
def test_points_of_a_reduced_grid_round_trip_onto_every_grid_and_open_in_xarray(grid, shared, kind):
    from mpisphere import RingGeometry, RingTiles
    rings = RingGeometry.octahedral(6) if kind == "octahedral" else RingGeometry.healpix(4)
    whole = whole_field((2, rings.npoints), "float64")
    path = os.path.join(shared, "points.zarr")
    tiles = RingTiles(grid, rings)
    store = FieldStore(path, grid, mode="w")
    hours = {"units": "hours since 2026-12-07", "long_name": "model time"}
    store.write_points("h", numpy.ascontiguousarray(whole[:, tiles.point_indices()]), tiles, dims=("time",),
                       coords={"time": ([0.0, 6.0], hours)}, attrs={"units": "m"})
    store.write_points("h", numpy.ascontiguousarray(whole[:1, tiles.point_indices()]), tiles, dims=("time",),
                       coords={"time": ([12.0], hours)}, append=True)
    expected = numpy.concatenate([whole, whole[:1]])
    for sub in sub_grids(grid.cart):  # read back on every grid of the launch's first k ranks
        if sub is not None and sub.nazimuth <= rings.nlon.min():  # every ring is split over the azimuth ranks
            on_sub = RingTiles(sub, rings)
            back = FieldStore(path, sub, mode="r").read_points("h", on_sub)
            numpy.testing.assert_array_equal(back, expected[:, on_sub.point_indices()])
    other = RingTiles(grid, RingGeometry.octahedral(7))
    with raises(ValueError, match="rings is"):
        store.read_points("h", other)
    if grid.rank == 0:
        ds = xarray.open_zarr(path)
        assert ds["h"].dims == ("time", "point") and ds["h"].shape == (3, rings.npoints)
        # the time coordinate, extended by the append (xarray decodes CF time units into dates)
        assert [str(t)[:13] for t in ds["h"].time.values] == ["2026-12-07T00", "2026-12-07T06", "2026-12-07T12"]
        numpy.testing.assert_array_equal(ds["h"].values, expected)
        numpy.testing.assert_allclose(ds["h"].lat.values, 90 - numpy.degrees(rings.colatitudes))
        numpy.testing.assert_allclose(ds["h"].lon.values, numpy.degrees(rings.longitudes))
    grid.cart.Barrier()
