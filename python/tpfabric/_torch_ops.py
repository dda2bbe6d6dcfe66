"""The Communicator's collectives as ``torch.library`` custom ops, so that ``torch.compile`` traces them.

Six ops in the ``tpfabric`` namespace, each taking the communicator as an
int (``comm``: its number in this process's registry, :func:`register`),
not as a Python object, which Dynamo cannot pass to an op:

* ``tpfabric::all_reduce(Tensor input, int comm) -> Tensor``,
  ``tpfabric::all_gather_into_tensor(Tensor input, int comm, int world) -> Tensor`` and
  ``tpfabric::all_gather_v(Tensor input, int[] counts, int comm) -> Tensor``:
  functional (a new output, nothing mutated), as torch's own functional
  collectives and vLLM's ops are: the form ``torch.compile`` handles best,
  with no auto-functionalisation and no copies to re-inplace. The gather's
  output is ``input`` concatenated along dim 0, ``(world * d0, *rest)``
  (``(world,)`` for a 0-dim input); all-gather-v's ``counts[r]`` rows of
  rank r packed in rank order, ``(sum(counts), *rest)``. A compiled
  ``Communicator.all_reduce(x)`` is ``x.copy_(tpfabric::all_reduce(x))``, as
  torch traces an in-place ``dist.all_reduce``; Inductor removes that copy
  where ``x`` is an intermediate.
* ``tpfabric::all_reduce_out(Tensor input, Tensor(a!) out, int comm) -> ()``,
  ``tpfabric::all_gather_into_tensor_out(Tensor(a!) out, Tensor input, int comm) -> ()`` and
  ``tpfabric::all_gather_v_out(Tensor(a!) out, Tensor input, int[] counts, int comm) -> ()``:
  the in-place forms, for code that traces its own calls, writing into the
  caller's tensor with no copy; ``out`` may be ``input``. The Communicator's
  eager methods call the implementation directly instead, without the
  dispatcher's per-call host cost of a Python custom op.

Every op runs the Communicator's own implementation at run time: the
choice between the fabric and torch.distributed, the stream
(``torch.cuda.current_stream()``, read inside the op, so Dynamo never sees
it), the checks for a closed or forked communicator. Fake (meta)
implementations give the output's shape, dtype, device and (contiguous)
strides without running anything.

Registered only where torch has ``torch.library.custom_op`` and
``torch.library.register_fake`` (torch 2.4 and later): elsewhere
:data:`REGISTERED` is False, :data:`SKIPPED` says why, and the Communicator
calls its implementation directly.
"""

import itertools
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .errors import Closed

_comms: Dict[int, "weakref.ReferenceType[Any]"] = {}
_numbers = itertools.count(1)


def register(comm: Any) -> int:
    """A new number for ``comm`` (held weakly: the registry keeps no communicator alive)."""
    n = next(_numbers)
    _comms[n] = weakref.ref(comm)
    return n


def lookup(number: int) -> Any:
    """The communicator registered as ``number``; :class:`tpfabric.Closed` when it is gone."""
    ref = _comms.get(number)
    comm = ref() if ref is not None else None
    if comm is None:
        _comms.pop(number, None)
        raise Closed(f"Closed: no communicator {number} in this process (closed and collected, or never opened here)")
    return comm


def gathered_shape(shape: Tuple[int, ...], world: int) -> Tuple[int, ...]:
    """The functional all-gather's output shape: ``shape`` concatenated ``world`` times along dim 0."""
    if len(shape) == 0:
        return (world,)
    return (world * shape[0],) + tuple(shape[1:])


# -- the kernels: run time, eager or inside a compiled graph --------------------------------------------
def _all_reduce(input: torch.Tensor, comm: int) -> torch.Tensor:
    out = torch.empty(input.shape, dtype=input.dtype, device=input.device)
    if input.numel():
        lookup(comm)._all_reduce_into(input, out)
    return out


def _all_reduce_fake(input: torch.Tensor, comm: int) -> torch.Tensor:
    return torch.empty(input.shape, dtype=input.dtype, device=input.device)


def _all_reduce_out(input: torch.Tensor, out: torch.Tensor, comm: int) -> None:
    lookup(comm)._all_reduce_into(input, out)


def _all_gather(input: torch.Tensor, comm: int, world: int) -> torch.Tensor:
    c = lookup(comm)
    if world != c.world:
        raise ValueError(f"tpfabric::all_gather_into_tensor: world {world}, but communicator {comm} has {c.world} ranks")
    out = torch.empty(gathered_shape(tuple(input.shape), world), dtype=input.dtype, device=input.device)
    if input.numel():
        c._all_gather_into(out, input)
    return out


def _all_gather_fake(input: torch.Tensor, comm: int, world: int) -> torch.Tensor:
    return torch.empty(gathered_shape(tuple(input.shape), world), dtype=input.dtype, device=input.device)


def _all_gather_out(out: torch.Tensor, input: torch.Tensor, comm: int) -> None:
    lookup(comm)._all_gather_into(out, input)


def _all_gather_v(input: torch.Tensor, counts: List[int], comm: int) -> torch.Tensor:
    out = torch.empty((sum(counts),) + tuple(input.shape[1:]), dtype=input.dtype, device=input.device)
    if out.numel():
        lookup(comm)._all_gather_v_into(out, input, list(counts))
    return out


def _all_gather_v_fake(input: torch.Tensor, counts: List[int], comm: int) -> torch.Tensor:
    return torch.empty((sum(counts),) + tuple(input.shape[1:]), dtype=input.dtype, device=input.device)


def _all_gather_v_out(out: torch.Tensor, input: torch.Tensor, counts: List[int], comm: int) -> None:
    lookup(comm)._all_gather_v_into(out, input, list(counts))


# The *_out ops' fakes: nothing to make, the caller's out is the output (signatures as the schemas').
def _all_reduce_out_fake(input: torch.Tensor, out: torch.Tensor, comm: int) -> None:
    return None


def _all_gather_out_fake(out: torch.Tensor, input: torch.Tensor, comm: int) -> None:
    return None


def _all_gather_v_out_fake(out: torch.Tensor, input: torch.Tensor, counts: List[int], comm: int) -> None:
    return None


# name: (schema, mutated argument names, kernel, fake)
_OPS: Dict[str, Tuple[str, Tuple[str, ...], Callable[..., Any], Callable[..., Any]]] = {
    "all_reduce": ("(Tensor input, int comm) -> Tensor", (), _all_reduce, _all_reduce_fake),
    "all_reduce_out": ("(Tensor input, Tensor(a!) out, int comm) -> ()", ("out",), _all_reduce_out,
                       _all_reduce_out_fake),
    "all_gather_into_tensor": ("(Tensor input, int comm, int world) -> Tensor", (), _all_gather, _all_gather_fake),
    "all_gather_into_tensor_out": ("(Tensor(a!) out, Tensor input, int comm) -> ()", ("out",), _all_gather_out,
                                   _all_gather_out_fake),
    "all_gather_v": ("(Tensor input, int[] counts, int comm) -> Tensor", (), _all_gather_v, _all_gather_v_fake),
    "all_gather_v_out": ("(Tensor(a!) out, Tensor input, int[] counts, int comm) -> ()", ("out",), _all_gather_v_out,
                         _all_gather_v_out_fake),
}

NAMES = tuple(f"tpfabric::{name}" for name in _OPS)
"""The ops' qualified names."""


def _register() -> Optional[str]:
    """Register the ops; None on success, else why they are not (this torch lacks the API, or refused)."""
    library = getattr(torch, "library", None)
    custom_op = getattr(library, "custom_op", None)
    if custom_op is None or not hasattr(library, "register_fake"):
        return (f"torch {torch.__version__} has no torch.library.custom_op / register_fake (torch 2.4 and later): "
                "the Communicator calls its implementation directly, and torch.compile cannot trace it")
    try:
        for name, (schema, mutates, kernel, fake) in _OPS.items():
            op = custom_op(f"tpfabric::{name}", kernel, mutates_args=mutates, schema=schema)
            op.register_fake(fake)
    except Exception as e:  # noqa: BLE001 - an import must not fail for it: eager calls need no op
        return f"registering the tpfabric ops failed ({type(e).__name__}: {e}); the Communicator calls its implementation directly"
    return None


SKIPPED: Optional[str] = _register()
"""Why the ops are not registered (None when they are)."""

REGISTERED: bool = SKIPPED is None
"""Whether ``torch.ops.tpfabric.*`` exist in this process."""

if REGISTERED:
    all_reduce = torch.ops.tpfabric.all_reduce.default
    all_reduce_out = torch.ops.tpfabric.all_reduce_out.default
    all_gather_into_tensor = torch.ops.tpfabric.all_gather_into_tensor.default
    all_gather_into_tensor_out = torch.ops.tpfabric.all_gather_into_tensor_out.default
    all_gather_v = torch.ops.tpfabric.all_gather_v.default
    all_gather_v_out = torch.ops.tpfabric.all_gather_v_out.default
else:  # the same kernels, called directly: one implementation either way
    # Where torch.compile exists without custom_op (torch 2.0 to 2.3), Dynamo runs them eagerly behind a
    # graph break instead of tracing into the stream and the C ABI (torch._disable_dynamo: 2.1 and later).
    _eager: Callable[[Callable[..., Any]], Callable[..., Any]] = getattr(torch, "_disable_dynamo", lambda f: f)
    all_reduce, all_reduce_out = _eager(_all_reduce), _eager(_all_reduce_out)
    all_gather_into_tensor, all_gather_into_tensor_out = _eager(_all_gather), _eager(_all_gather_out)
    all_gather_v, all_gather_v_out = _eager(_all_gather_v), _eager(_all_gather_v_out)


def _compiling_check() -> Callable[[], bool]:
    """``torch.compiler.is_compiling`` (which Dynamo folds to True while tracing), or one answering False."""
    f = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return f if callable(f) else (lambda: False)


compiling = _compiling_check()
