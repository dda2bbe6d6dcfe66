"""tpfabric: small, fast, deterministic collectives for tensor-parallel workers, from Python.

One process per rank, on a node with tpfabricd running (``host.py RANK WORLD``)::

    import sys, tpfabric

    rank, world = int(sys.argv[1]), int(sys.argv[2])
    with tpfabric.Group(rank, world, 64 * 1024, "127.0.0.1:29650") as g:  # rank 0 listens there
        x = tpfabric.empty(1000, "float32")                  # 64-byte aligned numpy array
        x[:] = rank + 1
        s = tpfabric.empty(1000, "float32")
        g.all_reduce_sum(s, x)                               # rank-order sum, bit-identical on every rank
        rows = tpfabric.empty((world, 1000), "float32")
        g.all_gather(rows, x)                                # rows[r] is rank r's x
    # PyTorch engines: tpfabric.torch.Communicator() over their torch.distributed group.

A pure-Python layer over libtpfabric's C ABI (``<tpfabric/tpfabric.h>``), by ctypes:

* host groups over numpy arrays or CPU tensors: :class:`Group` (``all_gather``,
  ``all_reduce_sum``, ``all_gather_v``, ``check``, ``healthy``, ``health``,
  ``abort``, ``close``);
* the torch communicator an engine opens over its ``torch.distributed``
  process group: :class:`tpfabric.torch.Communicator` (``import tpfabric.torch``);
* one exception class per status code (:class:`Error`, :class:`PeerLost`, ...).

Guide: docs/python.md. Importing this package loads the library
(``$TPF_LIBRARY``, else the one installed beside this package, else
``libtpfabric.so.0`` through the dynamic loader) and raises ImportError naming
what it tried when none loads. When the library is found but a library it
needs is not (``libnccl.so.2``: a pip-installed torch keeps it off the
loader's path), it imports torch, which loads it, and
tries once more; failing that, the ImportError names the missing library and
the fixes (docs/python.md, "Troubleshooting").
"""

from ._buffers import ALIGNMENT, DType, aligned, empty, is_aligned, zeros
from ._group import AllGatherFn, Group, Health, TcpBootstrap, library_path, library_version, status_name
from .errors import *  # noqa: F401,F403 - Error and one class per status
from .errors import SystemError  # noqa: A004 - as tpfabric.SystemError only: not in __all__ (errors.py)
from .errors import __all__ as _errors_all
from .errors import error_class  # noqa: F401 - kept importable; not in __all__

try:
    from ._build_info import VERSION as __version__  # written by meson install and by the wheel backend
except ImportError:  # a source tree: the library's release
    __version__ = library_version()

__all__ = [
    "ALIGNMENT",
    "AllGatherFn",
    "DType",
    "Group",
    "Health",
    "TcpBootstrap",
    "aligned",
    "empty",
    "is_aligned",
    "library_path",
    "library_version",
    "status_name",
    "zeros",
] + list(_errors_all)  # not __version__ (it would replace the importer's own), SystemError or error_class

