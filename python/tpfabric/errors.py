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
from typing import Dict, Optional, Type, TypeVar

# The one table of status codes: ``enum tpf_status_code`` of <tpfabric/errc.h>, in its order, each
# TPF_NAME_IN_CAPS spelled as tpf_status_name() spells it. Every class below takes its code from
# here (@_status), and a name here without its class fails the import; tests/python/test_library.py
# parses errc.h and fails when this table differs from it.
STATUS_CODES: Dict[str, int] = {
    "Unsupported": 1,
    "Misaligned": 2,
    "Timeout": 3,
    "PeerLost": 4,
    "DaemonLost": 5,
    "Aborted": 6,
    "CapMismatch": 7,
    "NonOneToOnePairing": 8,
    "BadMessage": 9,
    "VersionMismatch": 10,
    "BadMagic": 11,
    "Truncated": 12,
    "TooLarge": 13,
    "OutOfRange": 14,
    "Unavailable": 15,
    "AuthFailed": 16,
    "QpError": 17,
    "RegistrationFailed": 18,
    "CudaError": 19,
    "NcclError": 20,
    "ConfigError": 21,
    "DaemonUnreachable": 22,
    "GroupMismatch": 23,
    "PermissionDenied": 24,
    "Closed": 25,
    "ProbeFailed": 26,
    "SystemError": 27,
    "InvalidArgument": 28,
    "Busy": 29,
}

# Not SystemError (it would shadow the builtin under a star import) nor error_class: see above.
__all__ = ["Error"] + [name for name in STATUS_CODES if name != "SystemError"]


_E = TypeVar("_E", bound="Error")


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


_BY_CODE: Dict[int, Type["Error"]] = {}


def _status(cls: Type[_E]) -> Type[_E]:
    """Give ``cls`` its code and name from :data:`STATUS_CODES` (KeyError at import for a name not there)."""
    cls.code, cls.name = STATUS_CODES[cls.__name__], cls.__name__
    _BY_CODE[cls.code] = cls
    return cls


# One class per code. Breaking failures and caller mistakes differ in
# docs/integration.md ("Failures, check() and reopening"); the caller's three
# (Misaligned, CapMismatch, InvalidArgument) leave the group usable and are
# also ValueErrors; Timeout is also a TimeoutError.
@_status
class Unsupported(Error):
    """Not supported by this build or machine (e.g. stream calls on a host group)."""


@_status
class Misaligned(Error, ValueError):
    """A buffer is not 16-byte aligned; allocate with :func:`tpfabric.empty`. The group stays usable."""


@_status
class Timeout(Error, builtins.TimeoutError):
    """A peer did not deliver within the group's timeout; the group is broken."""


@_status
class PeerLost(Error):
    """A rank of the group or its node died; the group is broken."""


@_status
class DaemonLost(Error):
    """The local tpfabricd went away mid-call; the group is broken."""


@_status
class Aborted(Error):
    """Some rank called abort(); the group is broken."""


@_status
class CapMismatch(Error, ValueError):
    """A size above the group's agreed cap. The group stays usable."""


@_status
class NonOneToOnePairing(Error):
    """HCAs of two nodes do not pair one to one by subnet."""


@_status
class BadMessage(Error):
    """A malformed record."""


@_status
class VersionMismatch(Error):
    """Library and daemon, or the libraries of two ranks, speak different protocol versions: run one release."""


@_status
class BadMagic(Error):
    """Not a tpfabric peer, or a record layout of another release."""


@_status
class Truncated(Error):
    """A record shorter than its header says."""


@_status
class TooLarge(Error):
    """A length above the protocol's maximum."""


@_status
class OutOfRange(Error, ValueError):
    """A rank, world (1..16) or index outside its bounds."""


@_status
class Unavailable(Error):
    """The fabric path is refused for this group (no daemon, TPF_DISABLE=1, ...); the message says why.

    Raised by ``Group(...)``, :attr:`may_fall_back` says whether the group
    agreed that its caller may take its own path (``tpf_last_open_may_fall_back``):
    False when some rank asked for ``fallback="error"`` / ``TPF_FALLBACK=error``.
    """
    may_fall_back: bool = False


@_status
class AuthFailed(Error):
    """A peer daemon did not prove the cluster key."""


@_status
class QpError(Error):
    """An RDMA queue pair failed."""


@_status
class RegistrationFailed(Error):
    """Memory registration failed."""


@_status
class CudaError(Error):
    """A CUDA call failed; the detail names the call and site."""


@_status
class NcclError(Error):
    """An NCCL call failed; the detail names the call and site."""


@_status
class ConfigError(Error):
    """A bad TPF_* variable or configuration key on some rank; the detail names it."""


@_status
class DaemonUnreachable(Error):
    """No tpfabricd answers on the socket."""


@_status
class GroupMismatch(Error):
    """Ranks of one group disagree.

    At open: world, rank, or host against device buffers (the open fails on
    every rank). Within a call: a rank passed another size, dtype or op than
    the others, or other all-gather-v counts; nothing is written, on every
    rank, and the group is broken.
    """


@_status
class PermissionDenied(Error):
    """The caller may not do this."""


@_status
class Closed(Error):
    """The group is closed."""


@_status
class ProbeFailed(Error):
    """The load-time probe disagreed with the reference."""


@_status
class SystemError(Error):  # noqa: A001 - the library's name; builtins.SystemError stays reachable
    """An operating-system call failed (errno in the detail).

    Named as the C ABI names the status (``TPF_SYSTEM_ERROR``, ``Errc::SystemError``), so it is
    ``tpfabric.SystemError``; it is left out of ``__all__``, so that ``from tpfabric import *``
    does not shadow Python's builtin :class:`SystemError` (which this class does not derive from).
    """


@_status
class InvalidArgument(Error, ValueError):
    """An argument was refused by the library. The group stays usable."""


@_status
class Busy(Error):
    """tpfabricd serves as many clients as it allows (``daemon.max_clients``, or this user's share)."""


_missing = sorted(set(STATUS_CODES.values()) - set(_BY_CODE))
if _missing:  # a code in the table without its class
    raise ImportError(f"tpfabric.errors: no exception class for status {_missing}")


def error_class(code: int) -> Type[Error]:
    """The exception class of status ``code`` (:class:`Error` itself for a code this package does not know)."""
    return _BY_CODE.get(code, Error)
