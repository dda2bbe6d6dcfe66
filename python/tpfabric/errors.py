"""Exceptions: one class per status code of ``<tpfabric/errc.h>``.

Every failure the library reports is raised as a subclass of :class:`Error`
named as the C and C++ APIs name it (``PeerLost``, ``Misaligned``, ...), with
the code in ``.code``, the name in ``.name`` and the library's detail
(``tpf_last_error()``) in the message. The classes and their codes are
checked against the loaded library's ``tpf_status_name`` at import, so a
renumbering cannot slip by.

Mistakes made in Python before the library is called (a wrong dtype, sizes
that do not match) raise :class:`ValueError` or :class:`TypeError` instead.

``__all__`` (what ``from tpfabric import *`` brings) leaves out
:class:`SystemError`, which would shadow the builtin of that name, and the
helper :func:`error_class`: use ``tpfabric.SystemError`` and
``tpfabric.errors.error_class``.
"""

from __future__ import annotations

import builtins
from typing import Dict, Optional, Type

__all__ = [
    "Error",
    "Unsupported",
    "Misaligned",
    "Timeout",
    "PeerLost",
    "DaemonLost",
    "Aborted",
    "CapMismatch",
    "NonOneToOnePairing",
    "BadMessage",
    "VersionMismatch",
    "BadMagic",
    "Truncated",
    "TooLarge",
    "OutOfRange",
    "Unavailable",
    "AuthFailed",
    "QpError",
    "RegistrationFailed",
    "CudaError",
    "NcclError",
    "ConfigError",
    "DaemonUnreachable",
    "GroupMismatch",
    "PermissionDenied",
    "Closed",
    "ProbeFailed",
    "InvalidArgument",
    "Busy",
]  # not SystemError (it would shadow the builtin under a star import) nor error_class: see above


class Error(Exception):
    """A failure reported by libtpfabric.

    Attributes:
        code: the status code (``enum tpf_status_code``; ``Errc`` in C++).
        name: its stable name, as in logs and JSON (``"PeerLost"``).
        detail: the library's description, ``"PeerLost: rank 3 ..."``.
    """

    code: int = -1
    name: str = "Unknown"

    def __init__(self, detail: str, code: Optional[int] = None, name: Optional[str] = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        if name is not None:
            self.name = name


# One class per code. Breaking failures and caller mistakes differ in
# docs/integration.md ("Failures, check() and reopening"); the caller's three
# (Misaligned, CapMismatch, InvalidArgument) leave the group usable and are
# also ValueErrors; Timeout is also a TimeoutError.
class Unsupported(Error):
    """Not supported by this build or machine (e.g. stream calls on a host group)."""

    code, name = 1, "Unsupported"


class Misaligned(Error, ValueError):
    """A buffer is not 16-byte aligned; allocate with :func:`tpfabric.empty`. The group stays usable."""

    code, name = 2, "Misaligned"


class Timeout(Error, builtins.TimeoutError):
    """A peer did not deliver within the group's timeout; the group is broken."""

    code, name = 3, "Timeout"


class PeerLost(Error):
    """A rank of the group or its node died; the group is broken."""

    code, name = 4, "PeerLost"


class DaemonLost(Error):
    """The local tpfabricd went away mid-call; the group is broken."""

    code, name = 5, "DaemonLost"


class Aborted(Error):
    """Some rank called abort(); the group is broken."""

    code, name = 6, "Aborted"


class CapMismatch(Error, ValueError):
    """A size above the group's agreed cap. The group stays usable."""

    code, name = 7, "CapMismatch"


class NonOneToOnePairing(Error):
    """HCAs of two nodes do not pair one to one by subnet."""

    code, name = 8, "NonOneToOnePairing"


class BadMessage(Error):
    """A malformed record."""

    code, name = 9, "BadMessage"


class VersionMismatch(Error):
    """Library and daemon, or the libraries of two ranks, speak different protocol versions: run one release."""

    code, name = 10, "VersionMismatch"


class BadMagic(Error):
    """Not a tpfabric peer, or a record layout of another release."""

    code, name = 11, "BadMagic"


class Truncated(Error):
    """A record shorter than its header says."""

    code, name = 12, "Truncated"


class TooLarge(Error):
    """A length above the protocol's maximum."""

    code, name = 13, "TooLarge"


class OutOfRange(Error, ValueError):
    """A rank, world (1..16) or index outside its bounds."""

    code, name = 14, "OutOfRange"


class Unavailable(Error):
    """The fabric path is refused for this group (no daemon, TPF_DISABLE=1, ...); the message says why.

    Raised by ``Group(...)``, :attr:`may_fall_back` says whether the group
    agreed that its caller may take its own path (``tpf_last_open_may_fall_back``):
    False when some rank asked for ``fallback="error"`` / ``TPF_FALLBACK=error``.
    """

    code, name = 15, "Unavailable"
    may_fall_back: bool = False


class AuthFailed(Error):
    """A peer daemon did not prove the cluster key."""

    code, name = 16, "AuthFailed"


class QpError(Error):
    """An RDMA queue pair failed."""

    code, name = 17, "QpError"


class RegistrationFailed(Error):
    """Memory registration failed."""

    code, name = 18, "RegistrationFailed"


class CudaError(Error):
    """A CUDA call failed; the detail names the call and site."""

    code, name = 19, "CudaError"


class NcclError(Error):
    """An NCCL call failed; the detail names the call and site."""

    code, name = 20, "NcclError"


class ConfigError(Error):
    """A bad TPF_* variable or configuration key on some rank; the detail names it."""

    code, name = 21, "ConfigError"


class DaemonUnreachable(Error):
    """No tpfabricd answers on the socket."""

    code, name = 22, "DaemonUnreachable"


class GroupMismatch(Error):
    """Ranks of one group disagree.

    At open: world, rank, or host against device buffers (the open fails on
    every rank). Within a call: a rank passed another size, dtype or op than
    the others, or other all-gather-v counts; nothing is written, on every
    rank, and the group is broken.
    """

    code, name = 23, "GroupMismatch"


class PermissionDenied(Error):
    """The caller may not do this."""

    code, name = 24, "PermissionDenied"


class Closed(Error):
    """The group is closed."""

    code, name = 25, "Closed"


class ProbeFailed(Error):
    """The load-time probe disagreed with the reference."""

    code, name = 26, "ProbeFailed"


class SystemError(Error):  # noqa: A001 - the library's name; builtins.SystemError stays reachable
    """An operating-system call failed (errno in the detail).

    Named as the C ABI names the status (``TPF_SYSTEM_ERROR``, ``Errc::SystemError``), so it is
    ``tpfabric.SystemError``; it is left out of ``__all__``, so that ``from tpfabric import *``
    does not shadow Python's builtin :class:`SystemError` (which this class does not derive from).
    """

    code, name = 27, "SystemError"


class InvalidArgument(Error, ValueError):
    """An argument was refused by the library. The group stays usable."""

    code, name = 28, "InvalidArgument"


class Busy(Error):
    """tpfabricd serves as many clients as it allows (``daemon.max_clients``, or this user's share)."""

    code, name = 29, "Busy"


_BY_CODE: Dict[int, Type[Error]] = {
    cls.code: cls for cls in list(globals().values()) if isinstance(cls, type) and issubclass(cls, Error) and cls is not Error
}


def error_class(code: int) -> Type[Error]:
    """The exception class of status ``code`` (:class:`Error` itself for a code this package does not know)."""
    return _BY_CODE.get(code, Error)
