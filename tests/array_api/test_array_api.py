"""The Array API namespace of mwrt tensors (mwrt.array_api): complete for the version NumPy
declares, equal to NumPy on values, dtypes and shapes, and usable by a real consumer
(scikit-learn with array_api_dispatch=True). The standard's own suite, data-apis/
array-api-tests, is run outside the repository (see the README's Array API section)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mwrt

# The names of the 2024.12 standard, from its function stubs (data-apis/array-api,
# src/array_api_stubs/_2024_12/*.py, each file's __all__).
STANDARD = {
    "constants": "e inf nan newaxis pi",
    "creation": "arange asarray empty empty_like eye from_dlpack full full_like linspace "
                "meshgrid ones ones_like tril triu zeros zeros_like",
    "data types": "astype can_cast finfo iinfo isdtype result_type bool int8 int16 int32 "
                  "int64 uint8 uint16 uint32 uint64 float32 float64 complex64 complex128",
    "elementwise": "abs acos acosh add asin asinh atan atan2 atanh bitwise_and "
                   "bitwise_left_shift bitwise_invert bitwise_or bitwise_right_shift "
                   "bitwise_xor ceil clip conj copysign cos cosh divide equal exp expm1 floor "
                   "floor_divide greater greater_equal hypot imag isfinite isinf isnan less "
                   "less_equal log log1p log2 log10 logaddexp logical_and logical_not "
                   "logical_or logical_xor maximum minimum multiply negative nextafter "
                   "not_equal positive pow real reciprocal remainder round sign signbit sin "
                   "sinh square sqrt subtract tan tanh trunc",
    "indexing": "take take_along_axis",
    "inspection": "__array_namespace_info__",
    "linear algebra": "matmul matrix_transpose tensordot vecdot",
    "manipulation": "broadcast_arrays broadcast_to concat expand_dims flip moveaxis "
                    "permute_dims repeat reshape roll squeeze stack tile unstack",
    "searching": "argmax argmin count_nonzero nonzero searchsorted where",
    "sets": "unique_all unique_counts unique_inverse unique_values",
    "sorting": "argsort sort",
    "statistics": "cumulative_sum cumulative_prod max mean min prod std sum var",
    "utility": "all any diff",
}
LINALG = ("cholesky cross det diagonal eigh eigvalsh inv matmul matrix_norm matrix_power "
          "matrix_rank matrix_transpose outer pinv qr slogdet solve svd svdvals tensordot "
          "trace vecdot vector_norm")
FFT = ("fft ifft fftn ifftn rfft irfft rfftn irfftn hfft ihfft fftfreq rfftfreq fftshift "
       "ifftshift")
INFO = "capabilities default_device default_dtypes devices dtypes"
ARRAY = "shape dtype ndim size device T mT to_device __array_namespace__ __complex__ __index__"


@pytest.fixture(scope="module")
def xp(cluster):
    """The namespace, as array-API code finds it: from a tensor."""
    return mwrt.zeros(1).__array_namespace__()


def test_namespace_has_every_name_of_the_standard(xp):
    assert xp is mwrt.array_api
    assert xp.__array_api_version__ == np.__array_api_version__ == "2024.12"
    missing = [f"{section}: {name}" for section, names in STANDARD.items()
               for name in names.split() if not hasattr(xp, name)]
    missing += [f"linalg.{n}" for n in LINALG.split() if not hasattr(xp.linalg, n)]
    missing += [f"fft.{n}" for n in FFT.split() if not hasattr(xp.fft, n)]
    missing += [f"info.{n}" for n in INFO.split() if not hasattr(xp.__array_namespace_info__(), n)]
    missing += [f"array.{n}" for n in ARRAY.split() if not hasattr(mwrt.DistributedTensor, n)]
    assert not missing
    with pytest.raises(ValueError, match="api_version"):
        mwrt.zeros(1).__array_namespace__(api_version="2099.12")


def test_devices_name_places_and_moves_keep_values(xp):
    x = xp.asarray([[1.0, 2.0], [3.0, 4.0]])
    assert x.device == xp.Device(0, -1) == xp.__array_namespace_info__().default_device()
    assert xp.Device(1, -1) in xp.__array_namespace_info__().devices()
    y = xp.to_device(x, xp.Device(1))
    assert (y.get_node(), y.get_device()) == (1, -1)
    assert xp.zeros_like(y).device == y.device  # a *_like keeps its argument's place
    z = xp.ones((2, 3), dtype=xp.int32, device=y.device)
    assert (z.device, z.dtype, z.shape) == (y.device, np.dtype(np.int32), (2, 3))
    np.testing.assert_array_equal(y.to_device(x.device).numpy(), x.numpy())
    with pytest.raises(ValueError, match="different places"):
        xp.add(x, y)  # no silent copies between nodes


A = np.array([[3.0, -1.0, 2.0], [0.5, 4.0, -2.0], [1.0, 1.0, 5.0]])
I8 = np.array([[5, -3, 7], [0, 5, 1]], dtype=np.int8)
V = np.array([2.0, 0.0, -1.0, 2.0, 7.0, 0.0])

# (what, the function on the namespace, NumPy's expected result): a dozen representative
# functions, several where the standard's semantics differ from NumPy's own function.
CASES = [
    ("elementwise pow, promotion", lambda xp, a, i, v: xp.pow(i, 2), I8 ** 2),
    ("clip with one bound", lambda xp, a, i, v: xp.clip(a, max=1.5), np.clip(A, None, 1.5)),
    ("sum keepdims, dtype", lambda xp, a, i, v: xp.sum(i, axis=1, keepdims=True, dtype=xp.int64),
     I8.sum(axis=1, keepdims=True, dtype=np.int64)),
    ("std with correction", lambda xp, a, i, v: xp.std(a, axis=0, correction=1),
     A.std(axis=0, ddof=1)),
    ("sort descending", lambda xp, a, i, v: xp.sort(v, descending=True), np.sort(V)[::-1]),
    ("argsort descending, stable", lambda xp, a, i, v: xp.argsort(v, descending=True),
     np.array([4, 0, 3, 1, 5, 2])),
    ("unique_values, sorted", lambda xp, a, i, v: xp.unique_values(v), np.unique(V)),
    ("concat flattened", lambda xp, a, i, v: xp.concat([a, a], axis=None),
     np.concatenate([A, A], axis=None)),
    ("permute_dims", lambda xp, a, i, v: xp.permute_dims(xp.reshape(v, (2, 3, 1)), (2, 0, 1)),
     V.reshape(2, 3, 1).transpose(2, 0, 1)),
    ("cumulative_sum with initial", lambda xp, a, i, v: xp.cumulative_sum(i, axis=1,
                                                                         include_initial=True),
     np.cumulative_sum(I8, axis=1, include_initial=True)),
    ("vecdot", lambda xp, a, i, v: xp.vecdot(a, a), np.vecdot(A, A)),
    ("tensordot", lambda xp, a, i, v: xp.tensordot(a, a, axes=1), np.tensordot(A, A, axes=1)),
    ("linalg.inv", lambda xp, a, i, v: xp.linalg.inv(a), np.linalg.inv(A)),
    ("linalg.vector_norm", lambda xp, a, i, v: xp.linalg.vector_norm(a, axis=1, ord=1),
     np.linalg.vector_norm(A, axis=1, ord=1)),
    ("fft.rfft float32", lambda xp, a, i, v: xp.fft.rfft(xp.astype(v, xp.float32)),
     np.fft.rfft(V.astype(np.float32))),
    ("eye off the diagonal", lambda xp, a, i, v: xp.eye(3, 4, k=1, dtype=xp.int16),
     np.eye(3, 4, k=1, dtype=np.int16)),
    ("linspace without endpoint", lambda xp, a, i, v: xp.linspace(0, 1, 4, endpoint=False),
     np.linspace(0, 1, 4, endpoint=False)),
    ("diff with prepend", lambda xp, a, i, v: xp.diff(i, axis=1, prepend=xp.asarray(
        np.zeros((2, 1), np.uint8))), np.diff(I8, axis=1, prepend=np.zeros((2, 1), np.uint8))),
    ("diff by place, as NumPy's", lambda xp, a, i, v: xp.diff(v, 2), np.diff(V, 2)),
    ("where of a condition alone, as NumPy's", lambda xp, a, i, v: xp.where(v > 0)[0],
     np.where(V > 0)[0]),
    ("take along axis", lambda xp, a, i, v: xp.take(a, xp.asarray([2, 0]), axis=1),
     np.take(A, [2, 0], axis=1)),
]


@pytest.mark.parametrize("fn, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_functions_equal_numpy(xp, fn, expected):
    out = fn(xp, xp.asarray(A), xp.asarray(I8), xp.asarray(V))
    assert (out.shape, out.dtype) == (expected.shape, expected.dtype)  # the handle's meta
    value = out.numpy()
    assert (value.shape, value.dtype) == (expected.shape, expected.dtype)
    np.testing.assert_allclose(value, expected, rtol=1e-6)


def test_tuple_results_are_the_standards_named_tuples(xp):
    x = xp.asarray(np.array([3, 1, 3, 2]))
    values, indices, inverse, counts = xp.unique_all(x)
    assert type(xp.unique_all(x)).__name__ == "UniqueAllResult"
    for got, want in zip((values, indices, inverse, counts),
                         np.unique(np.array([3, 1, 3, 2]), return_index=True,
                                   return_inverse=True, return_counts=True)):
        np.testing.assert_array_equal(got.numpy(), want)
    q, r = xp.linalg.qr(xp.asarray(A))
    np.testing.assert_allclose((q @ r).numpy(), A, atol=1e-12)
    assert xp.linalg.eigh(xp.asarray(A @ A.T)).eigenvalues.shape == (3,)
    assert xp.astype(values, xp.int64, copy=False) is values
    assert xp.unstack(xp.zeros((2, 0)), axis=1) == ()


def test_scalar_conversions_and_slices_by_tensors(xp):
    x = xp.asarray(V)
    n = xp.sum(x > 1.0)  # 0-d: array-API code slices with it (x[:n])
    np.testing.assert_array_equal(x[:n].numpy(), V[:3])
    assert complex(xp.asarray(2.5)) == 2.5 + 0j


def test_a_mask_of_the_wrong_shape_is_numpys_index_error_at_once(xp):
    x = xp.asarray(A)
    with pytest.raises(IndexError, match="boolean index did not match"):
        x[xp.asarray([True, False])]  # raised here, not later at a sync point
    np.testing.assert_array_equal(x[x > 2.0].numpy(), A[A > 2.0])  # the session goes on


def test_linalg_cross_broadcasts_and_pinv_takes_a_tensor_rtol(xp):
    u, w = np.arange(3.0).reshape(1, 3), np.ones((2, 1, 3))
    np.testing.assert_array_equal(xp.linalg.cross(xp.asarray(u), xp.asarray(w)).numpy(),
                                  np.linalg.cross(u, w))
    out = xp.linalg.pinv(xp.asarray(A), rtol=xp.asarray(1e-3))
    assert (out.shape, out.dtype) == (A.shape, A.dtype)
    np.testing.assert_allclose(out.numpy(), np.linalg.pinv(A, rtol=1e-3))


def test_dlpack_exports_a_copy_on_the_master(xp):
    t = xp.asarray(A)
    assert t.__dlpack_device__() == (1, 0)
    np.testing.assert_array_equal(np.from_dlpack(t), A)
    with pytest.raises(BufferError, match="copy=False"):
        t.__dlpack__(copy=False)
    with pytest.raises(ValueError, match="copy=False"):  # NumPy 2's protocol: no copy, or an error
        np.asarray(t, copy=False)
    assert xp.from_dlpack(t, copy=False) is t  # a tensor to the namespace: no copy at all


SKLEARN = textwrap.dedent("""
    import numpy as np, sklearn, mwrt
    from sklearn.decomposition import PCA
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    mwrt.init_master_worker(local_workers=1, timeout=30)
    xp = mwrt.array_api
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 5))
    y = (X[:, 0] + 0.3 * rng.standard_normal(60) > 0).astype(np.int64)
    Xt, yt = xp.asarray(X), xp.asarray(y)
    with sklearn.config_context(array_api_dispatch=True):
        lda = LinearDiscriminantAnalysis().fit(Xt, yt)
        pca = PCA(n_components=3, svd_solver="full").fit(Xt)
        fitted = [lda.coef_, lda.intercept_, lda.scalings_, pca.components_,
                  pca.explained_variance_, pca.transform(Xt)]
    assert all(isinstance(t, mwrt.DistributedTensor) for t in fitted)
    ref_lda = LinearDiscriminantAnalysis().fit(X, y)
    ref_pca = PCA(n_components=3, svd_solver="full").fit(X)
    expected = [ref_lda.coef_, ref_lda.intercept_, ref_lda.scalings_, ref_pca.components_,
                ref_pca.explained_variance_, ref_pca.transform(X)]
    for got, want in zip(fitted, expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-12)
    from scipy.special import logsumexp
    from sklearn.externals import array_api_extra as xpx
    for got, want in [(xpx.cov(Xt.T), np.cov(X.T)), (logsumexp(Xt, axis=1), logsumexp(X, axis=1))]:
        assert isinstance(got, mwrt.DistributedTensor)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    mwrt.shutdown()
    print("fits equal")
""")


@pytest.mark.slow  # scikit-learn's import and fits
def test_scikit_learn_fits_on_mwrt_tensors_equal_its_numpy_fits():
    """LDA and PCA fits, array-api-extra's cov and SciPy's logsumexp, on mwrt tensors."""
    pytest.importorskip("sklearn")
    pytest.importorskip("array_api_compat")
    # A fresh interpreter: SciPy reads SCIPY_ARRAY_API once, when first imported.
    env = dict(os.environ, SCIPY_ARRAY_API="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(mwrt.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", SKLEARN], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fits equal" in done.stdout
