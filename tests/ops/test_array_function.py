"""NumPy functions on DistributedTensors (__array_function__): linalg, fft, joins, einsum and
any other NumPy function run on the worker and equal NumPy's results on the master.

Each test body runs for a tensor in host memory and on a (fake) GPU of the same worker
(MWRT_FAKE_GPUS). "Shape known without a round trip" is checked on the handle: a result
whose Spec the master computed has `_spec` set when the call returns, while a lazy one has
none until its shape is first asked of the worker.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import mwrt
from mwrt.ops import numpy_functions


@pytest.fixture(scope="module")
def two_nodes():
    """Two workers, each with host memory and two fake GPUs."""
    saved = os.environ.get("MWRT_FAKE_GPUS")
    os.environ["MWRT_FAKE_GPUS"] = "2"  # the local workers inherit it
    mwrt.shutdown()
    try:
        mwrt.init_master_worker(local_workers=2, timeout=30)
    finally:
        os.environ.pop("MWRT_FAKE_GPUS") if saved is None else \
            os.environ.update(MWRT_FAKE_GPUS=saved)
    yield mwrt
    mwrt.shutdown()


@pytest.fixture(params=[-1, 0], ids=["host", "fakegpu"])
def device(request, two_nodes):
    if request.param >= 0 and mwrt.device_count(0) == 0:
        pytest.skip("the local worker sees no GPU")
    return request.param


def _put(array, device, node=0):
    return mwrt.dist_send(np.ascontiguousarray(array), node=node, device=device)


def _same(result, expected, known=True, rtol=1e-4, atol=1e-5):
    """`result` (tensors) equals `expected` (NumPy's); its Spec was known at issue if `known`."""
    if isinstance(expected, tuple):
        assert isinstance(result, tuple) and len(result) == len(expected), result
        for r, e in zip(result, expected):
            _same(r, e, known, rtol, atol)
        return
    assert isinstance(result, mwrt.DistributedTensor), type(result)
    assert (result._spec is not None) == known, (result, known)
    expected = np.asarray(expected)
    assert result.shape == expected.shape and result.dtype == expected.dtype, \
        (result, expected.shape, expected.dtype)
    np.testing.assert_allclose(result.numpy(), expected, rtol=rtol, atol=atol)


def _named_same(name, result, expected, known=True, rtol=1e-4, atol=1e-5):
    """_same, its failure naming the function."""
    try:
        _same(result, expected, known, rtol, atol)
    except AssertionError as exc:
        raise AssertionError(f"{name}: {exc}") from None


def _matrices(seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((4, 4)).astype(np.float32)
    spd = (a @ a.T + 4 * np.eye(4)).astype(np.float32)
    return rng, a, spd


def test_linalg_equals_numpy_with_the_shape_known_at_once(device):
    rng, a, spd = _matrices()
    wide = rng.standard_normal((2, 3, 5))
    A, S, W = _put(a, device), _put(spd, device), _put(wide, device)
    b1, b2 = rng.standard_normal(4).astype(np.float32), rng.standard_normal((4, 2))
    for name, result, expected in [
        ("inv", np.linalg.inv(A), np.linalg.inv(a)),
        ("pinv", np.linalg.pinv(W), np.linalg.pinv(wide)),
        ("det", np.linalg.det(A), np.linalg.det(a)),
        ("slogdet", np.linalg.slogdet(A), tuple(np.linalg.slogdet(a))),
        ("cholesky", np.linalg.cholesky(S), np.linalg.cholesky(spd)),
        ("matrix_power", np.linalg.matrix_power(A, 3), np.linalg.matrix_power(a, 3)),
        ("solve 1-D", np.linalg.solve(A, _put(b1, device)), np.linalg.solve(a, b1)),
        ("solve 2-D", np.linalg.solve(S, _put(b2, device)), np.linalg.solve(spd, b2)),
        ("norm", np.linalg.norm(A), np.linalg.norm(a)),
        ("norm axis", np.linalg.norm(W, axis=1, keepdims=True),
         np.linalg.norm(wide, axis=1, keepdims=True)),
        ("norm fro", np.linalg.norm(A, "fro"), np.linalg.norm(a, "fro")),
        ("eigvalsh", np.linalg.eigvalsh(S), np.linalg.eigvalsh(spd)),
        ("svd values", np.linalg.svd(W, compute_uv=False), np.linalg.svd(wide, compute_uv=False)),
        ("cond", np.linalg.cond(S), np.linalg.cond(spd)),
        ("matrix_rank", np.linalg.matrix_rank(A), np.linalg.matrix_rank(a)),
        ("svdvals", np.linalg.svdvals(W), np.linalg.svdvals(wide)),
        ("vector_norm", np.linalg.vector_norm(W, axis=(0, 2)),
         np.linalg.vector_norm(wide, axis=(0, 2))),
        ("matrix_norm", np.linalg.matrix_norm(W, keepdims=True),
         np.linalg.matrix_norm(wide, keepdims=True)),
        ("matrix_transpose", np.linalg.matrix_transpose(W), np.linalg.matrix_transpose(wide)),
        ("matmul", np.linalg.matmul(A, S), np.linalg.matmul(a, spd)),
    ]:
        _named_same("np.linalg." + name, result, expected, rtol=1e-3, atol=1e-4)


def test_linalg_decompositions_are_tuples_of_tensors(device):
    rng, a, spd = _matrices(1)
    wide = rng.standard_normal((3, 5))
    A, S, W = _put(a, device), _put(spd, device), _put(wide, device)
    w, v = np.linalg.eigh(S)
    ew, ev = np.linalg.eigh(spd)
    _same(w, ew, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(np.abs(v.numpy()), np.abs(ev), rtol=1e-3, atol=1e-4)
    for full in (True, False):
        u, s, vh = np.linalg.svd(W, full_matrices=full)
        eu, es, evh = np.linalg.svd(wide, full_matrices=full)
        assert (u.shape, s.shape, vh.shape) == (eu.shape, es.shape, evh.shape)
        assert all(t._spec is not None for t in (u, s, vh))
        np.testing.assert_allclose((u.numpy()[:, :3] * s.numpy()) @ vh.numpy()[:3], wide,
                                   atol=1e-10)
    q, r = np.linalg.qr(A)
    assert q._spec is not None and r._spec is not None
    np.testing.assert_allclose(q.numpy() @ r.numpy(), a, atol=1e-5)
    assert np.linalg.qr(W, mode="r").shape == np.linalg.qr(wide, mode="r").shape


def test_decompositions_and_unique_sets_are_numpys_named_tuples(device):
    _, a, spd = _matrices(6)
    A, S = _put(a, device), _put(spd, device)
    v = np.array([3, 1, 3, 0, 1, 3])
    V = _put(v, device)
    for name, result, expected in [
        ("eigh", np.linalg.eigh(S), np.linalg.eigh(spd)),
        ("svd", np.linalg.svd(A), np.linalg.svd(a)),
        ("qr", np.linalg.qr(A), np.linalg.qr(a)),
        ("slogdet", np.linalg.slogdet(A), np.linalg.slogdet(a)),
        ("eig", np.linalg.eig(S), np.linalg.eig(spd)),
        ("unique_all", np.unique_all(V), np.unique_all(v)),
        ("unique_counts", np.unique_counts(V), np.unique_counts(v)),
        ("unique_inverse", np.unique_inverse(V), np.unique_inverse(v)),
    ]:
        assert type(result) is type(expected), (name, type(result))
    assert np.linalg.eigh(S).eigenvalues.shape == (4,)
    _same(tuple(np.unique_all(V)), tuple(np.unique_all(v)), known=False)
    _same(np.unique_counts(V).counts, np.unique_counts(v).counts, known=False)
    _same(np.linalg.slogdet(A).logabsdet, np.linalg.slogdet(a).logabsdet)
    h, tau = np.linalg.qr(A, mode="raw")  # NumPy's is a plain tuple
    _same((h, tau), np.linalg.qr(a, mode="raw"))
    assert type(np.linalg.qr(A, mode="raw")) is tuple


def test_fft_equals_numpy_with_the_shape_known_at_once(device):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    c = (x + 1j * rng.standard_normal((4, 6))).astype(np.complex64)
    X, C = _put(x, device), _put(c, device)
    for name, result, expected in [
        ("fft", np.fft.fft(X), np.fft.fft(x)),
        ("fft n", np.fft.fft(X, n=8, axis=0), np.fft.fft(x, n=8, axis=0)),
        ("ifft", np.fft.ifft(C), np.fft.ifft(c)),
        ("rfft", np.fft.rfft(X), np.fft.rfft(x)),
        ("irfft", np.fft.irfft(C), np.fft.irfft(c)),
        ("irfft n", np.fft.irfft(C, n=7), np.fft.irfft(c, n=7)),
        ("hfft", np.fft.hfft(C), np.fft.hfft(c)),
        ("fft2", np.fft.fft2(X), np.fft.fft2(x)),
        ("fftn s", np.fft.fftn(X, s=(3, 5), axes=(0, 1)), np.fft.fftn(x, s=(3, 5), axes=(0, 1))),
        ("ifft2", np.fft.ifft2(C), np.fft.ifft2(c)),
        ("rfftn", np.fft.rfftn(X), np.fft.rfftn(x)),
        ("rfft2 axes", np.fft.rfft2(X, axes=(1, 0)), np.fft.rfft2(x, axes=(1, 0))),
        ("irfftn", np.fft.irfftn(C), np.fft.irfftn(c)),
        ("irfft2 s", np.fft.irfft2(C, s=(4, 9)), np.fft.irfft2(c, s=(4, 9))),
        ("fftshift", np.fft.fftshift(X), np.fft.fftshift(x)),
    ]:
        _named_same("np.fft." + name, result, expected, rtol=1e-3, atol=1e-4)


def test_joins_einsum_and_registry_functions(device):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    A, B = _put(a, device), _put(b, device)
    for name, result, expected in [
        ("concatenate", np.concatenate([A, B], axis=1), np.concatenate([a, b], axis=1)),
        ("stack", np.stack([A, B]), np.stack([a, b])),
        ("where", np.where(A > 0, A, B), np.where(a > 0, a, b)),
        ("einsum", np.einsum("ij,kj->ik", A, B), np.einsum("ij,kj->ik", a, b)),
        ("einsum implicit", np.einsum("ij,ij", A, B), np.einsum("ij,ij", a, b)),
        ("outer", np.outer(A[0], B[1]), np.outer(a[0], b[1])),
        ("inner", np.inner(A, B), np.inner(a, b)), ("vdot", np.vdot(A, B), np.vdot(a, b)),
        ("kron", np.kron(A, B), np.kron(a, b)),
        ("diag", np.diag(A[0], 1), np.diag(a[0], 1)),
        ("trace", np.trace(A), np.trace(a)),
        ("sum", np.sum(A, axis=0), np.sum(a, axis=0)),
        ("reshape", np.reshape(A, (4, 3)), np.reshape(a, (4, 3))),
        ("sort", np.sort(A, axis=0), np.sort(a, axis=0)),
        ("tril", np.tril(A), np.tril(a)),
        ("clip", np.clip(A, -0.5, 0.5), np.clip(a, -0.5, 0.5)),
    ]:
        _named_same("np." + name, result, expected)


def test_broadcast_arrays_and_meshgrid_take_numpy_arrays_and_numbers_beside_tensors(device):
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    A = _put(a, device)
    for name, result, expected in [
        ("broadcast_arrays", np.broadcast_arrays(A, a[0].astype(np.int16), 1),
         np.broadcast_arrays(a, a[0].astype(np.int16), 1)),
        ("meshgrid", np.meshgrid(A[0], a[1]), np.meshgrid(a[0], a[1])),
        ("meshgrid sparse", np.meshgrid(a[1], A[0], indexing="ij", sparse=True),
         np.meshgrid(a[1], a[0], indexing="ij", sparse=True)),
    ]:
        assert type(result) is type(expected), name
        _named_same("np." + name, result, expected)


def test_block_arranges_tensors_numpy_arrays_and_numbers(device):
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    A = _put(a, device)
    for name, result, expected in [
        ("block 2-d", np.block([[A, A[:, :1]], [np.zeros((1, 4))]]),
         np.block([[a, a[:, :1]], [np.zeros((1, 4))]])),
        ("block 1-d", np.block([A[0], 1, A[1]]), np.block([a[0], 1, a[1]])),
        ("block deeper than the arrays", np.block([[[A]]]), np.block([[[a]]])),
        ("block of one", np.block(A), np.block(a)),
    ]:
        _named_same("np." + name, result, expected)
    with pytest.raises(ValueError, match="must match exactly"):  # at issue, as NumPy's
        np.block([[A, np.ones((3, 1))]])


def test_splits_are_lists_as_numpys(device):
    a = np.arange(12.0).reshape(3, 4)
    A = _put(a, device)
    for name, result, expected in [
        ("split", np.split(A, 2, axis=1), np.split(a, 2, axis=1)),
        ("array_split", np.array_split(A, 2), np.array_split(a, 2)),
        ("hsplit", np.hsplit(A, [1]), np.hsplit(a, [1])),
        ("vsplit", np.vsplit(A, 3), np.vsplit(a, 3)),
    ]:
        assert type(result) is list, name
        _named_same("np." + name, tuple(result), tuple(expected))


def test_functions_whose_result_count_follows_their_options(device):
    a = np.arange(12.0).reshape(4, 3)
    A = _put(a, device)
    v, w = np.array([3, 1, 4, 1, 5]), np.array([1, 5, 9])
    V, W = _put(v, device), _put(w, device)
    for name, result, expected in [
        ("intersect1d indices", np.intersect1d(V, W, return_indices=True),
         np.intersect1d(v, w, return_indices=True)),
        ("intersect1d by place", np.intersect1d(V, W, False, True),
         np.intersect1d(v, w, False, True)),
        ("average returned", np.average(A, 0, None, True), np.average(a, 0, None, True)),
        ("cov without rows", np.cov(A, rowvar=False, ddof=0), np.cov(a, rowvar=False, ddof=0)),
    ]:
        _named_same("np." + name, result, expected, known=False)
    hist, edges = np.histogramdd(A[:, :2], bins=(2, 3))
    want, want_edges = np.histogramdd(a[:, :2], bins=(2, 3))
    assert type(edges) is list and len(edges) == 2
    _same((hist, *edges), (want, *want_edges), known=False)
    assert np.einsum_path("ij,jk", A, A.T)[0] == np.einsum_path("ij,jk", a, a.T)[0]


def test_functions_without_a_rule_run_with_a_lazy_shape(device):
    rng, a, _ = _matrices(4)
    A = _put(a, device)
    for name, result, expected in [
        ("percentile", np.percentile(A, 30, axis=0), np.percentile(a, 30, axis=0)),
        ("cov", np.cov(A), np.cov(a)),
        ("where 1-arg", np.where(A > 0), np.where(a > 0)),
        ("nonzero", np.nonzero(A[0] > 0), np.nonzero(a[0] > 0)),
        ("unique counts", np.unique((A > 0).astype(np.int8), return_counts=True),
         tuple(np.unique((a > 0).astype(np.int8), return_counts=True))),
        ("einsum ellipsis", np.einsum("...j->...", A), np.einsum("...j->...", a)),
    ]:
        _named_same("np." + name, result, expected, known=False)
    assert "percentile" not in numpy_functions.RULES  # the lazy path is what this test is about


def test_eig_has_a_data_dependent_dtype_so_it_is_lazy(device):
    _, _, spd = _matrices(5)
    rot = np.array([[0.0, -1.0], [1.0, 0.0]])  # complex eigenvalues ±i
    for matrix in (spd.astype(np.float64), rot):
        values, vectors = np.linalg.eig(_put(matrix, device))
        assert values._spec is None and vectors._spec is None
        expected = np.linalg.eig(matrix).eigenvalues
        assert values.dtype == expected.dtype
        np.testing.assert_allclose(np.sort_complex(values.numpy()), np.sort_complex(expected),
                                   atol=1e-8)


def test_master_side_functions(device, tmp_path):
    a = np.arange(12.0).reshape(3, 4)
    A = _put(a, device)
    assert np.shape(A) == (3, 4) and np.ndim(A) == 2 and np.size(A, 1) == 4
    assert np.result_type(A, np.float32) == np.float64
    assert np.iscomplexobj(A) is False
    assert np.array_repr(A) == np.array_repr(a)
    np.save(tmp_path / "a.npy", A)
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), a)
    # Python bools, as NumPy's (print(np.allclose(t, a)) shows True, json takes it)
    assert np.allclose(A, a) is True and np.array_equal(A, A) is True
    assert np.array_equiv(A, A[0]) is False and np.allclose(A, a + 1) is False
    assert np.count_nonzero(A) == 11 and np.isscalar(np.count_nonzero(A))  # NumPy's np.int64
    _same(np.count_nonzero(A, axis=0), np.count_nonzero(a, axis=0))
    # views share their base's storage, as NumPy's; a copy, another tensor, a master array not
    assert np.shares_memory(A, A) and np.may_share_memory(A[1], A) and np.shares_memory(A.T, A)
    assert not np.shares_memory(A, A.copy()) and not np.may_share_memory(A, A + 0)
    assert not np.may_share_memory(A, a)


def test_creation_like_a_tensor_makes_it_at_the_tensors_place(two_nodes):
    like = _put(np.ones(2), -1, node=1)
    for name, made, expected in [
        ("zeros", np.zeros((2, 3), dtype=np.int8, like=like), np.zeros((2, 3), np.int8)),
        ("arange", np.arange(5, like=like), np.arange(5)),
        ("asarray", np.asarray([1.5, 2], like=like), np.asarray([1.5, 2])),
        ("full", np.full(3, 7, like=like), np.full(3, 7)),
        ("eye", np.eye(2, k=1, like=like), np.eye(2, k=1)),
        ("0-d array", np.array(3.0, like=like), np.array(3.0)),
    ]:
        assert isinstance(made, mwrt.DistributedTensor) and made.get_node() == 1, name
        _named_same("np." + name, made, expected)
    with pytest.raises(TypeError, match="like= takes a NumPy tensor on one place"):
        np.zeros(2, like=mwrt.dist_send(np.ones(2), mesh=mwrt.mesh()))


def test_in_place_functions_change_the_worker_array(device):
    a = np.arange(9.0).reshape(3, 3)
    A = _put(a, device)
    np.fill_diagonal(A, -1.0)
    np.copyto(A[0], 7.0)  # a view: the worker's array changes through it
    expected = a.copy()
    np.fill_diagonal(expected, -1.0)
    expected[0] = 7.0
    np.testing.assert_array_equal(A.numpy(), expected)
    into = np.zeros((3, 3))
    np.copyto(into, A)  # a master array changed in place: done here, on a copy of A
    np.testing.assert_array_equal(into, expected)


def test_tensors_in_two_places_are_a_named_error(two_nodes):
    a = np.ones((2, 2))
    on0, on1 = _put(a, -1, node=0), _put(a, -1, node=1)
    with pytest.raises(ValueError, match=r"np\.concatenate: arguments live in different places "
                                         r"\(node 0 device -1 and node 1 device -1\).*\.to\("):
        np.concatenate([on0, on1])
    with pytest.raises(ValueError, match=r"np\.linalg\.solve: .*node 0 device -1 and node 1"):
        np.linalg.solve(on0, on1)
    if mwrt.device_count(0):
        with pytest.raises(ValueError, match=r"np\.einsum: .*node 0 device -1 and node 0 "
                                             r"device 0"):
            np.einsum("ij,jk", on0, _put(a, 0))
    np.testing.assert_array_equal(np.concatenate([on0, on1.to(node=0)]).numpy(),
                                  np.concatenate([a, a]))


def test_bad_shapes_fail_at_issue_time_as_numpy_would(two_nodes):
    A = _put(np.ones((3, 4)), -1)
    with pytest.raises(np.linalg.LinAlgError, match=r"np\.linalg\.inv: .*square .*\(3, 4\)"):
        np.linalg.inv(A)
    with pytest.raises(np.linalg.LinAlgError, match=r"np\.linalg\.det: 1-dimensional"):
        np.linalg.det(A[0])
    with pytest.raises(ValueError, match=r"np\.einsum: label 'j' has sizes 4 and 3"):
        np.einsum("ij,jk->ik", A, A)
    with pytest.raises(ValueError, match=r"np\.linalg\.qr: unrecognized mode 'bad'"):
        np.linalg.qr(A, mode="bad")


def test_a_mesh_tensors_function_results_are_numpys_sequences(two_nodes):
    a = np.arange(16.0).reshape(4, 4)
    spd = a @ a.T + np.eye(4)
    mesh = mwrt.mesh()
    X, S = mwrt.dist_send(a, mesh=mesh), mwrt.dist_send(spd, mesh=mesh)
    assert type(np.linalg.eigh(S)) is type(np.linalg.eigh(spd))
    np.testing.assert_allclose(np.linalg.eigh(S).eigenvalues.numpy(), np.linalg.eigh(spd)[0])
    assert type(np.unique_counts(X)).__name__ == "UniqueCountsResult"
    assert type(np.split(X, 2)) is list
    hist, edges = np.histogramdd(X[:, :2], bins=2)  # its edges: a list, one per dimension
    want, want_edges = np.histogramdd(a[:, :2], bins=2)
    np.testing.assert_array_equal(hist.numpy(), want)
    assert type(edges) is list and len(edges) == 2
    np.testing.assert_array_equal(edges[1].numpy(), want_edges[1])


def test_bins_counted_from_the_data_are_refused_naming_the_function(two_nodes):
    V = _put(np.arange(10.0), -1)
    for fn in (np.histogram, np.histogram_bin_edges):
        with pytest.raises(TypeError, match=rf"np\.{fn.__name__}: bins='auto' are counted"):
            made = fn(V, bins="auto")
            (made[0] if isinstance(made, tuple) else made).numpy()


def test_repeat_by_counts_in_a_tensor_is_refused_by_name(two_nodes):
    A = _put(np.arange(6.0).reshape(3, 2), -1)
    with pytest.raises(TypeError, match=r"repeat: counts held in a tensor .*mwrt\.array_api"):
        np.repeat(A, _put(np.array([1, 0, 2]), -1), axis=0)
    np.testing.assert_array_equal(np.repeat(A, np.array([1, 0, 2]), axis=0).numpy(),
                                  np.repeat(np.arange(6.0).reshape(3, 2), [1, 0, 2], axis=0))


def test_another_librarys_ufunc_runs_where_the_tensor_lives(device):
    special = pytest.importorskip("scipy.special")
    v = np.array([0.5, 1.5, 2.0])
    V = _put(v, device)
    for name, got, want in [("erf", special.erf(V), special.erf(v)),
                            ("xlogy", special.xlogy(V, V), special.xlogy(v, v)),
                            ("psi", special.psi(V), special.psi(v)),
                            ("fresnel", special.fresnel(V), special.fresnel(v))]:
        _named_same("scipy.special." + name, got, want, known=False)
    out = _put(np.zeros(3), device)
    assert special.erf(V, out=out) is out
    _same(out, special.erf(v), known=True)
    into = np.zeros(3)
    assert special.erf(V, out=into) is into  # the master's array, written here
    np.testing.assert_allclose(into, special.erf(v))


def test_a_function_argument_is_refused_with_the_way_to_run_the_call(two_nodes):
    A = _put(np.arange(6.0).reshape(2, 3), -1)
    with pytest.raises(TypeError, match=r"np\.apply_along_axis: takes a function \(sum\).*"
                                        r"mwrt\.remote"):
        np.apply_along_axis(np.sum, 1, A)
    with pytest.raises(TypeError, match=r"takes a function \(<lambda>\)"):
        np.apply_over_axes(lambda a, axis: a, A, [0])


def test_a_function_outside_numpys_namespaces_still_runs(two_nodes):
    a = np.arange(10.0)
    windows = np.lib.stride_tricks.sliding_window_view(_put(a, -1), 3)
    np.testing.assert_array_equal(windows.numpy(),
                                  np.lib.stride_tricks.sliding_window_view(a, 3))


def test_only_numpys_public_functions_run_by_name_on_a_worker():
    assert numpy_functions.allowed("linalg.inv") and numpy_functions.allowed("einsum")
    assert numpy_functions.allowed("lib.stride_tricks.sliding_window_view")
    for path in ("save", "load", "fromfile", "ctypeslib.load_library", "_core.multiarray.empty",
                 "lib.npyio.DataSource", "testing.assert_equal"):
        assert not numpy_functions.allowed(path), path
        with pytest.raises(ValueError, match=rf"np\.{path}: not a NumPy function mwrt runs"):
            numpy_functions.resolve(np, path)
    with pytest.raises(TypeError, match=r"np\.ndarray: not a function"):
        numpy_functions.resolve(np, "ndarray")


def test_an_in_place_function_on_another_stream_is_ordered_as_a_write(device):
    big = _put(np.zeros((512, 512)), device)
    side = mwrt.Stream(node=0, device=device)
    with mwrt.stream(side):
        for _ in range(20):  # keep the side stream busy before the write
            big = big @ big
        np.fill_diagonal(big, 3.0)
    # Read on the default stream: numpy() waits for the stream that wrote big last.
    np.testing.assert_array_equal(np.diagonal(big.numpy()), np.full(512, 3.0))
    assert np.count_nonzero(big.numpy()) == 512
