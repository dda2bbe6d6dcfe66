"""Host buffers: what a numpy array or a CPU torch tensor is to the C ABI, and aligned allocation.

The library takes 16-byte aligned buffers (``Misaligned`` otherwise). numpy's
own allocations are aligned on 64-bit Linux, but a slice such as ``a[1:]``
of a float32 array is not: :func:`empty` and :func:`aligned` give buffers
that always are.
"""

from __future__ import annotations

import enum
import operator
import sys
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Sequence, Union

from . import _lib

# numpy is needed only by empty()/zeros()/aligned() and by callers passing arrays, so it is not
# imported here: type checkers see numpy.ndarray, typing.get_type_hints() (which evaluates the
# annotations at run time, as sphinx-autodoc-typehints and run-time validators do) sees Any.
if TYPE_CHECKING:
    from numpy import ndarray as NumpyArray
else:
    NumpyArray = Any

ALIGNMENT = 16
"""Every buffer address must be a multiple of this many bytes."""


class DType(enum.IntEnum):
    """Element types of the sums (``enum tpf_dtype``)."""

    F32 = _lib.DTYPE_F32
    F16 = _lib.DTYPE_F16
    BF16 = _lib.DTYPE_BF16


DTypeLike = Union[DType, str, Any]
"""A DType, a name (``"float32"``, ``"f16"``, ``"bfloat16"``, ``"torch.float32"``), a numpy type or dtype
(``np.float32``, ``np.dtype("float16")``, ml_dtypes' ``bfloat16``) or a torch dtype."""

# The name of each DType's elements, as numpy and torch spell them.
DTYPE_NAME = {DType.F32: "float32", DType.F16: "float16", DType.BF16: "bfloat16"}

_DTYPE_NAMES = {
    "float32": DType.F32, "f32": DType.F32, "float": DType.F32,
    "float16": DType.F16, "f16": DType.F16, "half": DType.F16,
    "bfloat16": DType.BF16, "bf16": DType.BF16,
}
# The element types an array may have for each DType: numpy has no bfloat16,
# so bf16 data travels as uint16 (or int16) views, or ml_dtypes' bfloat16.
_STORAGE = {
    DType.F32: ("float32",),
    DType.F16: ("float16",),
    DType.BF16: ("bfloat16", "uint16", "int16"),
}


def _type_name(d: Any) -> str:
    """The element type name of a numpy type or dtype object (``np.float32`` -> ``"float32"``), else ``str(d)``.

    numpy is not imported for it: such an object exists only once numpy is.
    A string is taken as it is (numpy reads ``"float"`` as float64, the sums' names as float32).
    """
    np = sys.modules.get("numpy")
    if np is not None and isinstance(d, (type, np.dtype)):
        try:
            return str(np.dtype(d).name)
        except (TypeError, ValueError):  # a type numpy does not know: its str() below
            pass
    return str(d)


def as_dtype(d: DTypeLike) -> DType:
    """``DType`` from a DType, a name (``"float32"``, ``"f16"``, ``"bfloat16"``, ...), a numpy type or
    dtype (``np.float32``, ``np.dtype("float16")``) or a torch dtype (``torch.bfloat16``).

    Raises ValueError naming ``d`` for any other element type.
    """
    if isinstance(d, DType):
        return d
    name = _type_name(d)
    key = name.replace("torch.", "").replace("numpy.", "").lower()
    if key not in _DTYPE_NAMES:
        shown = repr(d) if isinstance(d, str) else name if name == str(d) else f"{name} ({d!r})"
        raise ValueError(f"dtype {shown}: the sums take float32, float16 and bfloat16")
    return _DTYPE_NAMES[key]


class HostBuffer(NamedTuple):
    """One host buffer as the C ABI sees it."""

    ptr: int
    nbytes: int
    count: int  # elements
    itemsize: int
    dtype: str  # numpy / torch element type name without prefix: "float32", "uint16", "bfloat16"


def host_buffer(x: Any, what: str, *, writable: bool = False) -> HostBuffer:
    """Describe ``x`` (a numpy array or a CPU torch tensor), refusing what the library cannot take.

    Raises TypeError for other objects and for arrays holding Python objects
    (``dtype.hasobject``), and ValueError for non-contiguous,
    read-only (when ``writable``) or non-CPU buffers. Alignment is left to the
    library, which raises :class:`tpfabric.Misaligned`.
    """
    iface = getattr(x, "__array_interface__", None)
    if iface is not None:  # numpy (or anything exposing the array interface)
        dtype = x.dtype
        # Object arrays hold PyObject pointers into this process: copied to another rank they
        # are addresses of nothing there (the reader crashes), summed they are nonsense.
        if getattr(dtype, "hasobject", False):
            raise TypeError(
                f"{what}: an {dtype} array holds Python objects (pointers valid only in this process); "
                "the collectives take arrays of plain numbers or bytes (float, int, uint, bool, fixed-size "
                "records without objects): serialise objects to a uint8 array first"
            )
        # A byte-swapped array (">f4" here) has numpy's name of the native one:
        # summed, its bytes would be read as native numbers (wrong sums, no error).
        if not getattr(dtype, "isnative", True):
            raise ValueError(
                f"{what}: a {dtype.str} array is not in this machine's byte order; "
                f"convert it first: x.astype(x.dtype.newbyteorder('='))"
            )
        flags = getattr(x, "flags", None)
        if flags is not None and not flags["C_CONTIGUOUS"]:
            fix = (
                "pass a C-contiguous array (tpfabric.empty()): the results go into this very array, so a copy would take them"
                if writable
                else "np.ascontiguousarray, or tpfabric.aligned"
            )
            raise ValueError(f"{what}: the array is not C-contiguous ({fix})")
        ptr, readonly = iface["data"]
        if writable and readonly:
            raise ValueError(f"{what}: the array is read-only")
        return HostBuffer(int(ptr or 0), int(x.nbytes), int(x.size), int(dtype.itemsize), str(dtype.name))
    if hasattr(x, "data_ptr") and hasattr(x, "is_contiguous") and type(x).__module__.startswith("torch"):
        if x.device.type != "cpu":
            raise ValueError(f"{what}: a {x.device} tensor on a host group (use tpfabric.torch.Communicator)")
        if not x.is_contiguous():
            fix = (
                "pass a contiguous tensor (torch.empty()): the results go into this very tensor, so a copy would take them"
                if writable
                else ".contiguous()"
            )
            raise ValueError(f"{what}: the tensor is not contiguous ({fix})")
        n, size = int(x.numel()), int(x.element_size())
        return HostBuffer(int(x.data_ptr()), n * size, n, size, str(x.dtype).replace("torch.", ""))
    raise TypeError(f"{what}: expected a numpy array or a CPU torch tensor, got {type(x).__name__}")


def reduce_dtype(buf: HostBuffer, dtype: Optional[DTypeLike], what: str) -> DType:
    """The DType of a sum over ``buf``: ``dtype`` if given (checked against the storage), else the array's own."""
    if dtype is None:
        if buf.dtype in ("uint16", "int16"):
            raise ValueError(f"{what}: a {buf.dtype} array: numpy has no bfloat16; pass dtype='bfloat16' for bf16 data")
        if buf.dtype not in _DTYPE_NAMES:
            raise ValueError(f"{what}: {buf.dtype}: the sums take float32, float16 and bfloat16")
        return _DTYPE_NAMES[buf.dtype]
    d = as_dtype(dtype)
    if buf.dtype not in _STORAGE[d]:
        raise ValueError(f"{what}: a {buf.dtype} array cannot hold {DTYPE_NAME[d]} data (expected {' or '.join(_STORAGE[d])})")
    return d


NUMPY_HINT = "the host path needs numpy: apt-get install python3-numpy or pip install numpy"


def _numpy(what: str) -> Any:
    """numpy, imported on first use (``import tpfabric`` does not need it); an ImportError naming ``what`` and the fix without it.

    Raised as ModuleNotFoundError (an ImportError), as a plain ``import numpy`` would be.
    """
    try:
        import numpy
    except ImportError as e:
        raise ModuleNotFoundError(f"tpfabric.{what} needs numpy ({e}); {NUMPY_HINT}", name="numpy") from e
    return numpy


def _numpy_dtype(np: Any, dtype: Any) -> Any:
    if isinstance(dtype, DType):
        dtype = DTYPE_NAME[dtype]
    if isinstance(dtype, str) and dtype.lower() in ("bfloat16", "bf16"):
        return np.dtype(np.uint16)  # numpy has no bfloat16: its bits, as the sums take them
    if type(dtype).__module__ == "torch":  # torch.bfloat16 & co.: numpy cannot read them
        raise TypeError(
            f"dtype={dtype}: a torch dtype; empty() and zeros() make numpy arrays (dtype 'float32', 'float16' or "
            f"'bfloat16'). For tensors use torch.empty(..., dtype={dtype}): torch's allocators align every tensor "
            f"to at least {ALIGNMENT} bytes"
        )
    return np.dtype(dtype)


def empty(shape: Union[int, Sequence[int]], dtype: Any = "float32", *, align: int = 64) -> NumpyArray:
    """An uninitialised C-contiguous numpy array whose data starts on an ``align``-byte boundary.

    ``dtype="bfloat16"`` gives uint16 storage (numpy has no bfloat16); pass
    ``dtype="bfloat16"`` to :meth:`Group.all_reduce_sum` with it. Needs numpy
    (ModuleNotFoundError, an ImportError, saying how to install it otherwise).
    """
    np = _numpy("empty()")
    if align < ALIGNMENT or align & (align - 1):
        raise ValueError(f"align {align}: a power of two of at least {ALIGNMENT}")
    dt = _numpy_dtype(np, dtype)
    # An int, numpy's too (np.int64 is no int), or a sequence of them, as np.empty takes.
    shape_t = (operator.index(shape),) if hasattr(shape, "__index__") else tuple(operator.index(n) for n in shape)
    # As np.empty: reshape would take a -1 as "infer" and hand back an empty array of another shape.
    if any(n < 0 for n in shape_t):
        raise ValueError(f"shape {shape!r}: negative dimensions are not allowed")
    nbytes = int(np.prod(shape_t, dtype=np.int64)) * dt.itemsize
    raw = np.empty(nbytes + align + 1, dtype=np.uint8)
    skip = (-raw.ctypes.data) % align
    # [skip : skip + 1][:0]: numpy gives an empty slice the base's address, an empty slice of a non-empty one its own.
    return raw[skip : skip + max(nbytes, 1)][:nbytes].view(dt).reshape(shape_t)


def zeros(shape: Union[int, Sequence[int]], dtype: Any = "float32", *, align: int = 64) -> NumpyArray:
    """As :func:`empty`, filled with zeros."""
    _numpy("zeros()")
    a = empty(shape, dtype, align=align)
    a.fill(0)
    return a


def aligned(a: NumpyArray, *, align: int = 64) -> NumpyArray:
    """``a`` itself when C-contiguous and 16-byte aligned, else an aligned copy (write results back yourself)."""
    if not hasattr(a, "flags") or not hasattr(a, "ctypes"):
        raise TypeError(f"aligned() takes a numpy array, not {type(a).__name__}")
    if a.flags["C_CONTIGUOUS"] and a.ctypes.data % ALIGNMENT == 0:
        return a
    out = empty(a.shape, a.dtype, align=align)
    out[...] = a
    return out


def is_aligned(x: Any) -> bool:
    """Whether a numpy array or tensor's data address is 16-byte aligned."""
    if hasattr(x, "data_ptr"):
        ptr = x.data_ptr()
    elif hasattr(x, "__array_interface__"):
        ptr = x.__array_interface__["data"][0]
    else:
        raise TypeError(f"is_aligned() takes a numpy array or a torch tensor, not {type(x).__name__}")
    return int(ptr) % ALIGNMENT == 0
