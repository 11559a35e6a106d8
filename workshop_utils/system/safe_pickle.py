"""Unpickling that cannot run code: only the classes a file format is known to hold.

``pickle.load`` builds whatever a file names: a file that says "call ``os.system`` with
this string" runs that command while it is read. A data set or a checkpoint copied from
somewhere else must not be able to do that, so every pickle the kit reads itself goes
through ``restricted_load`` with the few names its format really contains (CIFAR-10 batches:
NumPy arrays; the ``.metadata`` of a distributed checkpoint: DCP's own dataclasses and
a few torch types). Any other name stops the read before anything is built, with
``RefusedPickle`` saying which name it was; the caller turns it into a ``WorkshopError``
that names the file.

Before unpickling, the opcodes are read once with ``pickletools``: a stream that claims
more bytes than it holds, or uses the out-of-band buffer, persistent-id or extension-registry
opcodes that no such file needs, is refused before the C unpickler sees it.
"""

from __future__ import annotations

import _compat_pickle
import io
import pickle
import pickletools
from typing import Callable

Resolver = Callable[[str, str], object]  # (module, name) -> the object, or None: refused


class RefusedPickle(pickle.UnpicklingError):
    """The pickle names something outside the allowed set; nothing it names was built or called."""

    def __init__(self, module: str, name: str, opcode: str | None = None):
        self.global_name = f"{module}.{name}" if opcode is None else None
        what = f"refers to {self.global_name}" if opcode is None else f"uses the pickle opcode {opcode}"
        super().__init__(f"it {what}, which this kind of file never contains")


def python2_name(module: str, name: str) -> tuple[str, str]:
    """Python 2 spellings (``__builtin__``, ``copy_reg``) as Python 3 knows them, as pickle itself maps them."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, resolve: Resolver, **kwargs):
        super().__init__(file, **kwargs)
        self._resolve = resolve

    def find_class(self, module, name):  # every global (GLOBAL, STACK_GLOBAL, INST, OBJ, EXT*) comes here
        module, name = python2_name(module, name)
        found = self._resolve(module, name)
        if found is None:
            raise RefusedPickle(module, name)
        return found

    def persistent_load(self, pid):  # nothing the kit reads uses persistent ids
        raise RefusedPickle("persistent_id", type(pid).__name__)


# Opcodes none of the formats read here needs: out-of-band buffers (protocol 5), persistent ids, the
# copyreg extension registry. BYTEARRAY8 with a bogus length once made CPython's unpickler complain
# about freed memory; NEXT_BUFFER and friends hand the unpickler objects it did not build.
_REFUSED_OPCODES = {"BYTEARRAY8", "NEXT_BUFFER", "READONLY_BUFFER", "PERSID", "BINPERSID", "EXT1", "EXT2", "EXT4"}


def check_opcodes(data: bytes) -> None:
    """Walk the opcodes without building anything: refuse unneeded ones, and lengths past the end."""
    try:
        for opcode, _, _ in pickletools.genops(data):
            if opcode.name in _REFUSED_OPCODES:
                raise RefusedPickle("", "", opcode=opcode.name)
    except RefusedPickle:
        raise
    except ValueError as err:  # "expected N bytes ... but only M remain", "exhausted before seeing STOP"
        if "remain" in str(err) or "exhausted" in str(err):
            raise EOFError("it ends early (truncated, or a length in it is damaged)") from None
        raise pickle.UnpicklingError(str(err)) from None


def restricted_loads(data: bytes, resolve: Resolver, *, encoding: str = "ASCII"):
    """``pickle.loads(data)`` that builds only what ``resolve(module, name)`` hands back (None: refused)."""
    check_opcodes(data)
    return _RestrictedUnpickler(io.BytesIO(data), resolve, encoding=encoding).load()


def restricted_load(file, resolve: Resolver, *, encoding: str = "ASCII"):
    """``pickle.load(file)``, restricted as ``restricted_loads``."""
    return restricted_loads(file.read(), resolve, encoding=encoding)


def latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """What ``_codecs.encode`` does in a protocol-2 pickle of ``bytes`` (Python 3 writes them so), and only that."""
    if not isinstance(text, str) or encoding.lower().replace("_", "-") not in ("latin1", "latin-1", "iso-8859-1"):
        raise RefusedPickle("_codecs", f"encode with {encoding!r}")
    return text.encode("latin1")


def describe_pickle_failure(err: BaseException) -> str:
    """Why a pickle could not be read, as one short phrase."""
    if isinstance(err, RefusedPickle):
        if err.global_name is None:
            return f"{err} (refused before unpickling, nothing was run)"
        return f"{err} (it would run code when unpickled; refused, nothing was run)"
    if isinstance(err, EOFError) or "truncated" in str(err).lower() or "ran out of input" in str(err).lower():
        return str(err) if str(err).startswith("it ends early") else "it ends early (truncated)"
    first = (str(err).strip().splitlines() or [""])[0][:120]
    return f"it is not a valid pickle ({type(err).__name__}{': ' + first if first else ''})"
