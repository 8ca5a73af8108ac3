"""Shape ops (views where NumPy gives views), indexing and item assignment.

Their meta rules run NumPy itself on stand-ins of item size 0, so every shape rule and
error is exactly NumPy's and costs no memory on the master.
"""

from __future__ import annotations

import numpy as np

from .meta_helpers import shaped, standin
from .registry import KEEPS, UNKNOWN, Spec, register


def _impl(name):
    def impl(xp, a, *args, **kwargs):
        return getattr(xp, name)(a, *args, **kwargs)
    return impl


def _view_meta(name):
    fn = getattr(np, name)

    def meta(a, *args, **kwargs):
        return Spec(fn(standin(a), *args, **kwargs).shape, a.dtype)
    return meta


for _name in ["reshape", "transpose", "swapaxes", "squeeze", "expand_dims", "ravel",
              "moveaxis", "broadcast_to", "flip", "atleast_1d", "atleast_2d", "roll",
              "diagonal", "tril", "triu", "tile", "sort", "ascontiguousarray"]:
    register(_name, _impl(_name), _view_meta(_name),
             scalar=KEEPS if _name in ("reshape", "transpose", "squeeze") else False)


def _repeat_meta(a, repeats, axis=None):
    # A Spec is a tuple to NumPy, which would read its fields as counts.
    if isinstance(repeats, Spec):
        raise TypeError(f"repeat: counts held in a tensor size the result from their values "
                        f"(got a tensor of shape {repeats.shape}, expected an int, a list or a "
                        "NumPy array): pass counts.numpy(), or use mwrt.array_api.repeat, "
                        "which reads back their total")
    return Spec(np.repeat(standin(a), repeats, axis).shape, a.dtype)


register("repeat", _impl("repeat"), _repeat_meta)


def _view_dtype_meta(a, dtype):
    """NumPy's a.view(dtype): the last axis resized to hold the same bytes (its checks, by
    arithmetic: a stand-in holds no bytes to reinterpret)."""
    new = np.dtype(dtype)
    if new.itemsize == a.dtype.itemsize:
        return Spec(a.shape, new)
    if not a.shape:
        raise ValueError("Changing the dtype of a 0d array is only supported if the itemsize "
                         "is unchanged")
    last = a.shape[-1] * a.dtype.itemsize
    if last % new.itemsize:
        raise ValueError("When changing to a larger dtype, its size must be a divisor of the "
                         "total size in bytes of the last axis of the array.")
    return Spec((*a.shape[:-1], last // new.itemsize), new)


register("view", lambda xp, a, dtype: a.view(dtype), _view_dtype_meta,
         doc="The same bytes read as another dtype (NumPy's ndarray.view), a view.")

register("argsort", _impl("argsort"),
         lambda a, *args, **kwargs: Spec(np.argsort(standin(a), *args, **kwargs).shape,
                                         np.dtype(np.intp)))


def _sort_inplace(xp, a, *args, **kwargs):
    a.sort(*args, **kwargs)


def _sort_inplace_meta(a, *args, **kwargs):
    standin(a).sort(*args, **kwargs)  # NumPy's checks of axis, kind and order


register("sort_", _sort_inplace, _sort_inplace_meta, inplace=True,
         doc="Sort in place along an axis (NumPy's ndarray.sort).")
register("flatten", lambda xp, a, order="C": a.flatten(order),
         lambda a, order="C": Spec(standin(a).flatten(order).shape, a.dtype),
         doc="A 1-D copy of the tensor.")


def _part_meta(part):
    def meta(a):
        return Spec(a.shape, getattr(np, part)(np.ones(1, a.dtype)).dtype)
    return meta


register("real", lambda xp, a: xp.real(a), _part_meta("real"), scalar=KEEPS,
         doc="The real part: a view of a complex tensor, the tensor itself if real.")
register("imag", lambda xp, a: xp.imag(a), _part_meta("imag"), scalar=KEEPS,
         doc="The imaginary part: a view of a complex tensor, zeros if real.")


def _setpart(xp, a, part, value):
    setattr(a, part, value)


def _setpart_meta(a, part, value):
    if part not in ("real", "imag"):
        raise ValueError(f"setpart_: part must be 'real' or 'imag' (got {part!r})")
    np.broadcast_to(shaped(value.shape if isinstance(value, Spec) else np.shape(value)),
                    a.shape)


register("setpart_", _setpart, _setpart_meta, inplace=True,
         doc="Write the real or imaginary part in place (t.real = v).")


def take_meta(a, indices, *args, **kwargs):
    # the indices' stand-in is zeros: in bounds whenever the axis is not empty
    return Spec(np.take(standin(a), _index_standin(indices), *args, **kwargs).shape, a.dtype)


register("take", _impl("take"), take_meta, scalar=True)  # np.take(v, 0): a scalar


def _index_standin(index, masks: bool = False):
    """Replace tensor Specs inside an index by stand-ins NumPy can index with (a mask by
    UNKNOWN, or with `masks` by an all-False one of its shape, which NumPy checks)."""
    if isinstance(index, Spec):  # before tuple: a Spec is a NamedTuple
        if index.dtype == np.bool_:  # a mask: the result's length depends on the data
            return np.broadcast_to(np.False_, index.shape) if masks else UNKNOWN
        if not np.issubdtype(index.dtype, np.integer):
            raise IndexError(f"getitem: arrays used as indices must be of integer or boolean "
                             f"type (got {index.dtype})")
        return np.zeros(index.shape, dtype=np.intp)
    if isinstance(index, tuple):
        return tuple(_index_standin(i, masks) for i in index)
    return index


def _has_unknown(index):
    return index is UNKNOWN or (isinstance(index, tuple) and any(i is UNKNOWN for i in index))


def getitem_impl(xp, a, index):
    return a[index]


def getitem_meta(a, index):
    stand_index = _index_standin(index)
    if _has_unknown(stand_index):
        # NumPy's IndexError for a mask of the wrong shape now, not sticky on the worker
        standin(a)[_index_standin(index, masks=True)]
        return UNKNOWN
    # Zeros stand in for integer index tensors: in bounds whenever the axis is not empty.
    return Spec(standin(a)[stand_index].shape, a.dtype)


def setitem_impl(xp, a, index, value):
    a[index] = value


def setitem_meta(a, index, value):
    stand_index = _index_standin(index)
    if _has_unknown(stand_index):
        return
    target = standin(a)[stand_index].shape
    vshape = value.shape if isinstance(value, Spec) else np.shape(value)
    while len(vshape) > len(target) and vshape[0] == 1:  # NumPy drops a value's leading 1s
        vshape = vshape[1:]
    try:
        np.broadcast_to(np.empty(vshape, dtype=np.dtype([])), target)
    except ValueError:
        raise ValueError(f"setitem: could not broadcast input array from shape {vshape} "
                         f"into shape {target}") from None
    return


register("getitem", getitem_impl, getitem_meta, doc="Index like NumPy: a view or a copy.")
register("setitem", setitem_impl, setitem_meta, inplace=True,
         doc="Assign to the indexed elements in place.")
