"""Plans that once redistributed (the mesh differential suite counted them): int lists and
masks along a sharded axis, setitem through a mask, argmin/argmax of the whole on a 2-D mesh,
var/std over an empty sharded axis, reshapes of nested shards or two sharded axes, an int
along one sharded axis of two. Each runs under MWRT_STRICT_PLACEMENT=1 (no fallback)
with NumPy's value."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from tests.mesh.test_mesh import data, four, same, strict  # noqa: F401 - four: the module's fixture
from tests.mesh.test_mesh_plans_moves import planned, square  # noqa: F401 - a fixture

import mwrt
from mwrt import Shard

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["2", "3", "2x2"])
def mesh(four, request):
    """1-D meshes of 2 and 3 nodes, and a 2x2 one."""
    if request.param == "2x2":
        return mwrt.mesh({"a": 2, "b": 2})
    return mwrt.mesh(nodes=list(range(int(request.param))))


def shards(mesh, *axes):
    """The shard= values to try: each axis, and on a 2-D mesh both dimensions on it."""
    return [(a, a) if mesh.ndim == 2 else a for a in axes] + \
        ([(0, 1)] if mesh.ndim == 2 else [])


def no_fallback(fn):
    """fn()'s result, with the strict setting on and no PlacementWarning."""
    with strict(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    assert [w for w in caught if issubclass(w.category, mwrt.PlacementWarning)] == []
    return result


def test_an_int_list_along_any_axis_takes_each_places_rows(mesh):
    """Along a sharded axis the rows move to the result's even blocks, in the list's order
    (repeated, negative, descending, empty), the master waiting on no worker."""
    x = data(7, 3)
    lists = [[0, -1], [6, 0, 3, 3, -1, 2, 5], [], [4, 4, 4, 4, 4], list(range(7))[::-1]]
    for shard in shards(mesh, 0, 1):
        X = mwrt.dist_send(x, mesh=mesh, shard=shard)
        for rows in lists:
            got = planned(lambda: X[rows])
            assert got.placements == X.placements
            same(got, x[rows])
        same(planned(lambda: X[:, [2, 0, 2]]), x[:, [2, 0, 2]])
        same(planned(lambda: X[..., [1]]), x[..., [1]])
        mask = np.array([True, False, True, True, False, False, True])
        same(planned(lambda: X[mask]), x[mask])
        got = X[[1, 2]]
        X += 1  # a copy: NumPy's is one too
        same(got, x[[1, 2]])
        x = x + 1


def test_an_int_list_on_an_unsharded_axis_keeps_the_shards(mesh):
    x = data(2, 3, 4)
    X = mwrt.dist_send(x, mesh=mesh, shard=shards(mesh, 2)[0])
    got = planned(lambda: X[[1, 0, 1]])
    assert got.placements == X.placements
    same(got, x[[1, 0, 1]])
    index = np.array([[0, 2], [1, 1]])  # axis 2 moves to 3
    got = planned(lambda: X[:, index])
    assert got.placements == tuple(Shard(3) for _ in got.placements)
    same(got, x[:, index])


def test_a_mask_selects_at_each_place(mesh):
    """The result is sharded on its one axis, blocks even; a tensor sharded on another axis
    than the first is sharded on it first; a mask placed otherwise is placed as the tensor."""
    x = np.arange(-12.0, 12.0).reshape(4, 3, 2) % 7 - 3
    for shard in shards(mesh, 0, 1, 2):
        X = mwrt.dist_send(x, mesh=mesh, shard=shard)
        for cut in (0, 10, -10):
            got = no_fallback(lambda: X[X > cut])
            same(got, x[x > cut])
            assert all(type(p) is not mwrt.Partial for p in got.placements)
        other = mwrt.dist_send(x > 0, mesh=mesh, shard=None)
        same(no_fallback(lambda: X[other]), x[x > 0])
    Y = mwrt.dist_send(np.zeros((0, 3)), mesh=mesh, shard=0)
    same(no_fallback(lambda: Y[Y > 0]), np.zeros(0))
    v = np.arange(5) - 2
    V = mwrt.dist_send(v, mesh=mesh, shard=0)
    got = no_fallback(lambda: V[V != 0])
    assert got.placements == V.placements == (Shard(0),) * mesh.ndim  # nested: row-major
    assert [s.shape[0] for s in got.shards()] == \
        [len(b) for b in np.array_split(v[v != 0], mesh.size)]
    same(got, v[v != 0])


def test_setting_through_a_mask_at_each_place(mesh):
    x = np.arange(-6.0, 6.0).reshape(4, 3)
    for shard in shards(mesh, 0, 1):
        for value in (7, np.array([2.5]), np.float32(1.5), True):
            X, want = mwrt.dist_send(x, mesh=mesh, shard=shard), x.copy()
            no_fallback(lambda: X.__setitem__(X > 0, value))
            want[want > 0] = value
            same(X, want)
        X, want = mwrt.dist_send(x, mesh=mesh, shard=shard), x.copy()
        total = X.sum()  # a Partial one-element value, made whole at every place
        no_fallback(lambda: X.__setitem__(X < 0, total))
        want[want < 0] = x.sum()
        same(X, want)


def test_setting_an_empty_tensor_through_a_mask_sets_nothing(mesh):
    """t[t > 0] = V of an empty t, V a mesh tensor or array of none or one element: no place
    has an element to set; it ran on replicated copies (the mesh differential, seed 6:
    v3[v3 > 0] = v2 of two empty (0,) tensors)."""
    for shape, shard in [((0,), 0), ((0,), None), ((0, 3), 0), ((2, 0), 1)]:
        x = np.zeros(shape, np.complex128)
        for value in (mwrt.dist_send(np.zeros(0), mesh=mesh, shard=0),
                      mwrt.dist_send(np.ones(1), mesh=mesh), np.zeros(0), np.ones(1), 2.5):
            X = mwrt.dist_send(x, mesh=mesh, shard=shard)
            no_fallback(lambda: X.__setitem__(np.absolute(X) > 0, value))
            same(X, x)


def test_setting_an_array_through_a_mask_where_each_block_is_a_run(mesh):
    """t[t > 0] = values (a master array): where each place's block is one run of t's C
    order (sharded on axis 0, or on a later axis with those before it of length 1), the
    places' counts come to the master and each place sets its block from its run of the
    values; it ran on replicated copies (the mesh differential, seed 4: v1[v1 > 0] =
    np.arange(2.0) of a (3, 1) v1 sharded on axis 1 of a 1x3 mesh)."""
    for x, shard in [(np.arange(-6.0, 6.0).reshape(4, 3), 0), (np.arange(-3, 4), 0),
                     (np.array([[19.25], [1.25], [-18.25]]), 1), (np.arange(-2, 4)[None], 1),
                     (np.arange(-12.0, 12.0).reshape(4, 3, 2), 0), (np.zeros((5, 2)), 0)]:
        for placed in [shard, None] + ([(shard, shard), (shard, None), (None, shard)]
                                       if mesh.ndim == 2 else []):
            X, want = mwrt.dist_send(x, mesh=mesh, shard=placed), x.copy()
            values = np.arange(10.0, 10.0 + np.count_nonzero(x > 0))
            with strict():
                X[X > 0] = values
            want[want > 0] = values
            same(X, want)
    X = mwrt.dist_send(np.arange(-3.0, 4.0), mesh=mesh, shard=0)
    with strict(), pytest.raises(ValueError, match="cannot assign 2 input values to the 3"):
        X[X > 0] = np.arange(2.0)


def test_setting_an_array_through_a_mask_where_blocks_are_several_runs(mesh):
    """t[t > 0] = values where a block is several runs of t's C order (sharded on a later
    axis than the first, or on two): each run's count comes to the master in one round trip
    and each place sets its block from its runs of the values; it ran on replicated copies
    with a PlacementWarning."""
    for x, shard in [(np.arange(-6.0, 6.0).reshape(4, 3), 1), (np.zeros((0, 3)), 1),
                     (np.arange(-12, 12).reshape(2, 3, 4), 2), (np.arange(-12, 12).reshape(
                         2, 3, 4) % 5 - 2, 1), (np.arange(-6.0, 6.0).reshape(3, 4)[::-1], 1)]:
        for placed in [shard] + ([(0, shard), (shard, 0), (shard, shard)]
                                 if mesh.ndim == 2 else []):
            X, want = mwrt.dist_send(x, mesh=mesh, shard=placed), x.copy()
            values = np.arange(10, 10 + np.count_nonzero(x > 0)).astype(x.dtype)
            no_fallback(lambda: X.__setitem__(X > 0, values))
            want[want > 0] = values
            same(X, want)
    X = mwrt.dist_send(np.arange(-3.0, 3.0).reshape(2, 3), mesh=mesh, shard=1)
    with strict(), pytest.raises(ValueError, match="cannot assign 3 input values to the 2"):
        X[X > 0] = np.arange(3.0)


def test_real_and_imag_keep_the_placement_and_view_their_base(mesh):
    """X.real and X.imag run at every place on its block, as elementwise ops, and view X: a
    write through X.real shows in X. A sharded X had no rule for them (PlacementError in
    strict mode, else a copy on replicated operands, which a write did not reach)."""
    x = (np.arange(12.0).reshape(4, 3) - 5) * (1 + 2j)
    for shard in [None, *shards(mesh, 0, 1)]:
        X, want = mwrt.dist_send(x, mesh=mesh, shard=shard), x.copy()
        for name in ("real", "imag"):
            got = no_fallback(lambda: getattr(X, name))
            assert got.placements == X.placements
            same(got, getattr(x, name))
            same(no_fallback(lambda: getattr(np, name)(X)), getattr(np, name)(x))
        R = no_fallback(lambda: X.real)
        no_fallback(lambda: R.__setitem__(slice(1, None), 7.0))
        want.real[1:] = 7.0
        same(X, want)
    y = np.arange(5.0)
    Y = mwrt.dist_send(y, mesh=mesh, shard=0)
    same(no_fallback(lambda: Y.imag), y.imag)


def test_argmin_and_argmax_of_the_whole_on_a_2d_mesh(square):
    """Each element's position in C order is a sum of its axes' aranges: no block moves."""
    x = np.array([[3, 9, 1], [9, 0, 9], [2, 2, 9], [1, 1, 1]], np.int32)
    f = x.astype(np.float64)
    f[1, 2] = f[3, 0] = np.nan
    for v in (x, f, np.arange(24.0).reshape(2, 3, 4) % 7):
        for shard in [(1, 1), (0, 0), (1, 0), (v.ndim - 1, 0)]:
            X = mwrt.dist_send(v, mesh=square, shard=shard)
            for name in ("argmin", "argmax"):
                for kwargs in ({}, {"keepdims": True}):
                    same(planned(lambda: getattr(np, name)(X, **kwargs)),
                         getattr(np, name)(v, **kwargs))


def test_var_and_std_over_an_empty_sharded_axis_are_nan(mesh):
    for v in (np.zeros((0, 3), np.uint8), np.zeros((2, 0), bool), np.zeros((0, 3))):
        X = mwrt.dist_send(v, mesh=mesh, shard=0)
        for name, kwargs in [("var", {"keepdims": True}), ("std", {"axis": 0}),
                             ("var", {"axis": 0, "ddof": 1})]:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                want = getattr(v, name)(**kwargs)
                got = no_fallback(lambda: getattr(X, name)(**kwargs))
                same(got, want)


RESHAPES = [((4, 3), (0, 0), (-1,)), ((4, 3), (0, 0), (2, -1)), ((4, 3), (1, 1), (-1,)),
            ((4, 3), (0, 1), (-1,)), ((4, 3), (1, 0), (12, 1)), ((2, 0), (0, 0), (-1, 2)),
            ((3, 4, 2), (2, 2), (1, -1, 1)), ((3, 4, 2), (0, 2), (6, 4)),
            ((2, 3, 4), (2, 1), (4, 6))]


@pytest.mark.parametrize("shape, shard, new", RESHAPES)
def test_a_reshape_of_nested_shards_or_of_two_sharded_axes_moves_runs(square, shape, shard,
                                                                         new):
    """Nested shards of one axis lie along their line in row-major order, as one mesh
    dimension's do; two sharded axes are first one (an all-to-all)."""
    x = np.arange(float(np.prod(shape))).reshape(shape)
    X = mwrt.dist_send(x, mesh=square, shard=shard)
    same(no_fallback(lambda: X.reshape(new)), x.reshape(new))
    same(no_fallback(lambda: X.ravel()), x.ravel())


def test_an_int_along_a_sharded_axis_keeps_another_sharded(square):
    """The row is broadcast along the mesh dimensions that shard the picked axis only."""
    x = np.arange(24.0).reshape(3, 4, 2)
    for shard, index in [((0, 2), np.s_[1]), ((0, 2), np.s_[-1, :, None, 1]),
                         ((0, 1), np.s_[:, 2]), ((0, 1), np.s_[:, 2, 1:]), ((1, 0), np.s_[2])]:
        X = mwrt.dist_send(x, mesh=square, shard=shard)
        got = no_fallback(lambda: X[index])
        same(got, x[index])
    X = mwrt.dist_send(x, mesh=square, shard=(0, 2))
    same(no_fallback(lambda: np.median(X, axis=-1, keepdims=True)),
         np.median(x, axis=-1, keepdims=True))


def test_argmin_and_argmax_of_complex_tensors_take_two_phases(mesh):
    """NumPy orders complex numbers by real part, then imaginary; a NaN in either is the
    extreme, the first one found."""
    x = np.array([[8 - 6j, 15.75 - 13.75j], [16.75 - 12.75j, -14 + 15j], [16.75 + 11j, 3 + 1j],
                  [16.75 + 11j, 0j]])
    nan = x.copy()
    nan[2, 1], nan[3, 0] = complex(0, np.nan), complex(np.nan, 1)
    for v in (x, nan):
        for shard in shards(mesh, 0, 1):
            X = mwrt.dist_send(v, mesh=mesh, shard=shard)
            for name in ("argmin", "argmax"):
                for kwargs in ({}, {"axis": 0}, {"axis": 1, "keepdims": True}):
                    same(planned(lambda: getattr(np, name)(X, **kwargs)),
                         getattr(np, name)(v, **kwargs))


def test_a_product_of_row_and_column_shards_replicates_the_smaller_operand(mesh):
    """A @ A.T of a row-sharded A: the right operand (or the left, where it is smaller) is
    all_gathered and the product keeps the other's rows (columns); no fallback."""
    a, b = data(6, 5), data(5, 3, seed=1)
    for x, sx, y, sy, placed in [(a, 0, a.T, 1, Shard(0)), (a, 0, b, 1, Shard(0)),
                                 (a[:2], 0, b, 1, Shard(1)), (a, 0, a[0], 0, Shard(0))]:
        X, Y = (mwrt.dist_send(v, mesh=mesh, shard=shards(mesh, s)[0])
                for v, s in ((x, sx), (y, sy)))
        for product in (np.matmul, np.dot):
            got = no_fallback(lambda: product(X, Y))
            assert got.placements == (placed,) * mesh.ndim
            same(got, product(x, y), exact=False)


def test_dot_with_a_0d_operand_multiplies(mesh):
    """np.dot of a sharded vector and a 0-d tensor (a median's, a sum's) is NumPy's multiply:
    the rule cut the 0-d operand as a contracted axis (IndexError), or placed the result on
    axis -1 (ValueError)."""
    x = np.array([5.75, 0.0, -4.75, -11.5, -5.5])
    X = mwrt.dist_send(x, mesh=mesh, shard=shards(mesh, 0)[0])
    m, total = np.median(X[1:].copy(), axis=0), X.sum()
    same(no_fallback(lambda: np.dot(X, m)), np.dot(x, np.median(x[1:], axis=0)))
    same(no_fallback(lambda: np.dot(total, X)), np.dot(x.sum(), x), exact=False)
    same(no_fallback(lambda: np.dot(X, 2)), np.dot(x, 2))


def test_operands_sharded_on_fewer_nested_dimensions_are_placed_as_the_first(square):
    """(Shard(0), Shard(0)) beside (Replicate(), Shard(0)): elementwise ops and concatenate
    place the second as the first, where they ran on replicated copies."""
    x = np.arange(12.0).reshape(4, 3)
    X = mwrt.dist_send(x, mesh=square, shard=(0, 0))
    Y = mwrt.dist_send(x, mesh=square, shard=(None, 0))
    same(no_fallback(lambda: X - Y), x - x)
    same(no_fallback(lambda: Y * X), x * x)
    same(no_fallback(lambda: np.concatenate([X, 2 * Y, X.replicate()])),
         np.concatenate([x, 2 * x, x]))
    v = np.arange(5.0)
    V, W = (mwrt.dist_send(v, mesh=square, shard=s) for s in ((0, 0), (None, 0)))
    same(no_fallback(lambda: np.concatenate([V, W], axis=-1)), np.concatenate([v, v]))


def test_concatenate_and_stack_of_operands_sharded_on_different_axes(mesh):
    """The others are exchanged to the first sharded operand's placements first."""
    x = np.arange(24.0).reshape(4, 3, 2)
    first, other = shards(mesh, 0, 1)[:2]
    X, Y = mwrt.dist_send(x, mesh=mesh, shard=first), mwrt.dist_send(x, mesh=mesh, shard=other)
    for join, kwargs in [(np.concatenate, {}), (np.concatenate, {"axis": 1}),
                         (np.stack, {}), (np.stack, {"axis": -1})]:
        got = no_fallback(lambda: join([X, Y * 2], **kwargs))
        same(got, join([x, x * 2], **kwargs))
