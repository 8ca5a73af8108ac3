"""DistributedTensor's generated methods: operators, reductions and elementwise methods, built
from the op registry with a name, a signature and a one-line docstring taken from the op;
and how its methods take their arguments (shapes, indices, operands).

`generated(call, mesh_call)` makes them for the class's body; each issues its op with
`call(name, *args, **kwargs)` on one place, `mesh_call` on a mesh.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any

import numpy as np

from ..ops import doc as op_doc
from ..ops.elementwise import BINARY_OPERATORS, COMPARISONS, UNARY_OPERATORS

SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%",
           "pow": "**", "and": "&", "or": "|", "xor": "^", "lshift": "<<", "rshift": ">>",
           "matmul": "@", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
           "neg": "-", "pos": "+", "invert": "~"}
REDUCTIONS = ["sum", "mean", "prod", "min", "max", "argmin", "argmax", "std", "var", "any",
              "all", "cumsum", "cumprod", "median", "ptp"]
# method name -> ufunc: NumPy's names, and torch's where they differ
UNARY_METHODS = {name: name for name in [
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "square", "reciprocal",
    "sin", "cos", "tan", "sinh", "cosh", "tanh", "arcsin", "arccos", "arctan", "sign", "floor",
    "ceil", "trunc", "isnan", "isinf", "isfinite", "conj", "negative"]}
UNARY_METHODS.update(abs="absolute", neg="negative", absolute="absolute")
BINARY_METHODS = {"add": "add", "sub": "subtract", "subtract": "subtract", "mul": "multiply",
                  "multiply": "multiply", "div": "true_divide", "divide": "true_divide",
                  "true_divide": "true_divide", "pow": "power", "power": "power",
                  "maximum": "maximum", "minimum": "minimum", "remainder": "remainder",
                  "fmod": "fmod", "arctan2": "arctan2", "dot": "dot", "matmul": "matmul"}
_WHERE = "on the tensor's worker; returns a new DistributedTensor"
# the type of each parameter name the generated methods use
_HINTS = {"other": Any, "axis": int | tuple[int, ...] | None, "keepdims": bool, "kwargs": Any}


class Size(int):
    """A tensor's element count (NumPy's t.size) that, called, gives its shape (torch's
    t.size()) or one dimension (t.size(dim))."""

    shape: tuple

    def __new__(cls, count: int, shape: tuple) -> Size:
        self = super().__new__(cls, count)
        self.shape = shape
        return self

    def __call__(self, dim: int | None = None) -> Any:
        """The shape, or dimension `dim` of it."""
        return self.shape if dim is None else self.shape[dim]


def operand(value):
    """A list or tuple operand as NumPy takes it: an array (t + [1, 2, 3])."""
    return np.asarray(value) if type(value) in (list, tuple) else value


# What an operator takes as it is (tensors, and local tensors of other libraries, have
# __array__); anything else only where NumPy makes an array of numbers of it (range(3)).
_OPERANDS = (int, float, bool, complex, str, bytes, list, tuple, np.ndarray, np.generic)


def operator_arg(value):
    """An operator's other operand as NumPy takes it (operand()), or NotImplemented where
    NumPy would make no array of numbers or strings of it (object(), None, a dict, a set):
    Python then asks the other operand's reflected method (its __radd__), and else raises
    its own TypeError ("unsupported operand type(s) for +"), as for a NumPy array."""
    if isinstance(value, _OPERANDS) or hasattr(value, "__array__"):
        return operand(value)
    array = array_like(value)
    return NotImplemented if array is None else array


def array_like(value):
    """`value` as NumPy's array of numbers, or None if NumPy makes no such array of it."""
    if not (hasattr(value, "__array__") or hasattr(value, "__len__") or
            hasattr(value, "__iter__")) or isinstance(value, (set, frozenset)):
        return None
    try:
        array = np.asarray(value)
    except Exception:  # noqa: BLE001 (anything NumPy refuses is refused by the caller, named)
        return None
    return array if array.dtype.kind not in "OVUS" else None


def _named(fn, name: str, doc: str):
    fn.__name__, fn.__qualname__, fn.__doc__ = name, f"DistributedTensor.{name}", doc
    # its code's too: a wait counts at the call a user made by its code's name ('forward()'
    # in mwrt.stats() for t * 2 waiting on t's pending shape), as tracebacks name it
    fn.__code__ = fn.__code__.replace(co_name=name, co_qualname=fn.__qualname__)
    return fn


def _lower(text: str) -> str:
    return text[0].lower() + text[1:] if text else text


def binary(op: str, py: str, call, mesh_call):
    """(forward, reverse, in-place) methods of Python operator `py` over op `op`; each
    returns NotImplemented for an operand NumPy makes no array of numbers of (operator_arg)."""
    sym, what = SYMBOLS.get(py, py), f"{_lower(op_doc(op)).rstrip('.')} (np.{op})"
    update = updating(op, call, mesh_call)

    def forward(self, other):
        if op == "power" and type(other) is int and other == 2:
            # NumPy's a ** 2 is np.square(a): the same values, but a bool's square is int8
            return (call if self._mesh is None else mesh_call)("square", self)
        taken = operator_arg(other)
        if taken is NotImplemented:  # t == None is all False in NumPy, not Python's False
            return _unequal(self, op, other) if op in _EQUALITY else NotImplemented
        try:
            return (call if self._mesh is None else mesh_call)(op, self, taken)
        except TypeError:
            if op not in _EQUALITY or hasattr(other, "_node") or np.ndim(other):
                raise  # (a tensor's own error stands: another place, another kind)
            return _unequal(self, op, other)

    def reverse(self, other):
        taken = operator_arg(other)
        if taken is NotImplemented:
            return NotImplemented
        return (call if self._mesh is None else mesh_call)(op, taken, self)

    def inplace(self, other):
        taken = operator_arg(other)
        return NotImplemented if taken is NotImplemented else update(self, taken)
    return (_named(forward, f"__{py}__", f"self {sym} other: {what}, {_WHERE}."),
            _named(reverse, f"__r{py}__", f"other {sym} self: {what}, {_WHERE}."),
            _named(inplace, f"__i{py}__", f"self {sym}= other: {what}, in place; returns self."))


_EQUALITY = ("equal", "not_equal")


def updating(op: str, call, mesh_call):
    """Method (self, other) over op `op` in place (t.add_(x)); returns self."""
    op_ = op + "_"

    def fn(self, other):
        (call if self._mesh is None else mesh_call)(op_, self, operand(other))
        return self
    return fn


def _unequal(tensor, op: str, other):
    """t == "a" where NumPy has no loop for the pair: NumPy's answer on a one-element probe
    (an array of False for ==, of True for !=), at every place of the tensor; else the
    TypeError stands."""
    probe = np.zeros((1,) * tensor.ndim, tensor.dtype)
    answer = probe == other if op == "equal" else probe != other
    if not isinstance(answer, np.ndarray):  # NumPy's own error was raised above
        raise TypeError(f"{op}: no comparison of {tensor.dtype} with {type(other).__name__}")
    return (np.ones_like if answer.all() else np.zeros_like)(tensor, dtype=bool)


def method(name: str, op: str, call, mesh_call, nargs: int):
    """Named method `name` over op `op` with `nargs` tensor operands (1: self only, 2: other)."""
    if nargs == 1:
        def fn(self):
            return (call if self._mesh is None else mesh_call)(op, self)
        return _named(fn, name, f"{op_doc(op).rstrip('.')} (np.{op}), {_WHERE}.")

    def fn2(self, other):
        return (call if self._mesh is None else mesh_call)(op, self, operand(other))
    return _named(fn2, name, f"{op_doc(op).rstrip('.')} (np.{op}) with `other`, {_WHERE}.")


def reduction(name: str, call, mesh_call):
    """Method `name(*args, **kwargs)` over reduction op `name`: arguments as NumPy's
    np.<name>(a, *args, **kwargs) takes them (axis, dtype, out=, keepdims, where=)."""
    def fn(self, *args, **kwargs):
        return (call if self._mesh is None else mesh_call)(name, self, *args, **kwargs)
    params = list(inspect.signature(getattr(np, name)).parameters.values())
    # inspect.signature (help(), Sphinx) reads the attribute, which functions do not declare.
    fn.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [params[0].replace(name="self"), *params[1:]])
    return _named(fn, name, f"{op_doc(name).rstrip('.')} (np.{name}), {_WHERE}; arguments "
                            f"as np.{name}'s.")


def generated(call, mesh_call) -> dict:
    """The generated operators and methods of DistributedTensor, by name, for its body."""
    made: dict = {}

    def put(fn):
        fn.__qualname__ = f"DistributedTensor.{fn.__name__}"
        params = list(inspect.signature(fn).parameters)[1:]
        fn.__annotations__ = {**{p: _HINTS.get(p, Any) for p in params}, "return": Any}
        made[fn.__name__] = fn

    for py, uf in BINARY_OPERATORS.items():
        forward, reverse, inplace = binary(uf, py, call, mesh_call)
        put(forward)
        put(reverse)
        put(inplace)
        put(_named(updating(uf, call, mesh_call), f"{uf}_", inplace.__doc__))
    for py, uf in COMPARISONS.items():
        put(binary(uf, py, call, mesh_call)[0])
    for py, uf in UNARY_OPERATORS.items():
        fn = method(f"__{py}__", uf, call, mesh_call, 1)
        fn.__doc__ = f"{'abs(self)' if py == 'abs' else SYMBOLS[py] + 'self'}: {fn.__doc__}"
        put(fn)
    for name in REDUCTIONS:
        put(reduction(name, call, mesh_call))
    for name, op in UNARY_METHODS.items():
        put(method(name, op, call, mesh_call, 1))
    for name, op in BINARY_METHODS.items():
        put(method(name, op, call, mesh_call, 2))
    for name, py in [("add_", "add"), ("sub_", "sub"), ("mul_", "mul"), ("div_", "truediv"),
                     ("pow_", "pow")]:
        inplace = made[f"__i{py}__"]
        put(_named(updating(BINARY_OPERATORS[py], call, mesh_call), name, inplace.__doc__))
    for fn in array_methods().values():
        put(fn)
    return made


def array_methods() -> dict:
    """ndarray's methods that are NumPy functions of the array (t.searchsorted(v) is
    np.searchsorted(t, v)): each goes as that function goes, through __array_function__."""
    def argpartition(self, kth, axis=-1, kind="introselect", order=None):
        """The indices that partition along `axis` around `kth` (np.argpartition)."""
        return np.argpartition(self, kth, axis, kind, order)

    def partition(self, kth, axis=-1, kind="introselect", order=None):
        """Partition along `axis` around `kth`, in place (np.partition, written back)."""
        self[...] = np.partition(self, kth, axis, kind, order)

    def choose(self, choices, out=None, mode="raise"):
        """Elements of `choices` picked by this tensor's values (np.choose)."""
        return np.choose(self, choices, out=out, mode=mode)

    def compress(self, condition, axis=None, out=None):
        """The slices along `axis` where `condition` holds (np.compress)."""
        return np.compress(condition, self, axis, out)

    def searchsorted(self, v, side="left", sorter=None):
        """Where `v` would go in this sorted 1-D tensor (np.searchsorted)."""
        return np.searchsorted(self, v, side, sorter)

    def put(self, indices, values, mode="raise"):
        """Write `values` at flat `indices`, in place (np.put)."""
        np.put(self, indices, values, mode)

    def tobytes(self, order="C"):
        """The elements' bytes, copied to the master (ndarray.tobytes)."""
        return self.numpy().tobytes(order)

    def __bytes__(self):
        """bytes(t) as bytes() of the local array or tensor gives it (a NumPy array's buffer;
        Python asks a 0-d integer one's __index__ first)."""
        return bytes(self.torch() if self.holds_torch else self.numpy())
    return {fn.__name__: fn for fn in (argpartition, partition, choose, compress,
                                       searchsorted, put, tobytes, __bytes__)}


def shape_arg(shape: tuple) -> tuple:
    """A shape given as ints or as one tuple or list: the ints."""
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape


def names_dtype(value: Any) -> bool:
    """True if `value` names a dtype (view(np.int8), view("f4")), not a shape or a tensor."""
    if isinstance(value, (np.dtype, str)):
        return True
    return isinstance(value, type) and issubclass(value, (np.generic, bool, int, float, complex))


def index_arg(index):
    """Lists in an index become arrays (the wire carries lists as tuples); tensors as slice
    bounds become ints (x[:n] with n a 0-d tensor: its value decides the shape)."""
    if isinstance(index, tuple):
        return tuple([_index_part(i) for i in index])
    return _index_part(index)


def _index_part(part):
    kind = type(part)
    if kind is slice:
        bounds = (part.start, part.stop, part.step)
        if any(b is not None and type(b) is not int for b in bounds):
            return slice(*(b if b is None else operator.index(b) for b in bounds))
        return part
    if kind is not list:
        return part
    array = np.asarray(part)  # an empty list indexes as intp in NumPy, not as float64
    return array.astype(np.intp) if array.size == 0 and array.dtype == np.float64 else array


def is_element(index: Any) -> bool:
    """True if `index` picks one element by integers alone (NumPy returns a scalar; `()`
    picks a 0-d tensor's one element)."""
    if isinstance(index, tuple):
        return all(_is_int(i) for i in index)
    return _is_int(index)


def _is_int(value: Any) -> bool:
    if type(value) is np.ndarray:  # a 0-d integer array indexes as its integer does
        return value.ndim == 0 and value.dtype.kind in "iu"
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def out_arg(out) -> dict:
    """out= as keyword arguments: none when it is None."""
    return {} if out is None else {"out": out}


def rebinding(op: str, call, mesh_call):
    """An element's augmented assignment over op `op`: a new value, as a scalar's is."""
    def fn(self, other):
        taken = operator_arg(other)
        if taken is NotImplemented:
            return NotImplemented
        return (call if self._mesh is None else mesh_call)(op, self, taken)
    fn.__name__, fn.__qualname__ = f"__i{op}__", f"Element.__i{op}__"
    return fn
