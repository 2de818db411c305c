"""Blobs in shared memory: a rank's part of a sharded commit, which the other ranks of its machine hold and read in
place instead of copying it through sockets.

A ``SharedBlob`` lives in an anonymous in-memory file (``memfd_create``). Once written it is *sealed*: the kernel
refuses every later write, shrink or growth (``F_SEAL_WRITE``, ``F_SEAL_SHRINK``, ``F_SEAL_GROW``), so the bytes of a
commit can no longer change, whoever maps them. Another process of the same machine opens it through
``/proc/<pid>/fd/<fd>`` (a ``BlobHandle``: the holder's pid and descriptor, the file's name, its size), and then:

* a *guard* on the same machine keeps the descriptor (``SharedBlob.adopt``) instead of receiving a copy: the blob
  outlives its owner's kill -9 exactly as a copy would, at no cost in memory or time (a copy beside its original
  dies with the machine either way; guards on other machines still receive copies);
* a *restore* maps the parts it needs read-only (``open_blob``) and ``dcp.load`` copies them once into the new
  shards, as a load from a local page cache does, where a fetch over gloo's TCP on loopback copied every byte twice
  through the kernel.

The kernel frees a blob when the last process holding or mapping it lets go, a kill -9 included; nothing is named
in a file system, so nothing can be left behind. The name carries a random token, which a reader checks on the
descriptor it opened: a pid or a descriptor number reused by then names another file, never a wrong blob.

Where memfd is missing (not Linux) or ``/proc/<pid>/fd`` cannot be opened (another machine, another pid namespace,
a container that hides /proc), a blob is plain memory, guards receive copies and restores fetch by network.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import logging
import mmap
import os
import secrets
import warnings
import weakref

import torch

log = logging.getLogger(__name__)

_PREFIX = "torchras-blob-"
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # fault a mapping's pages in at once: its reader reads all of them


@dataclasses.dataclass(frozen=True)
class BlobHandle:
    """How another process of this machine opens a blob: ``/proc/<pid>/fd/<fd>``, whose file must be named
    ``name`` and hold ``size`` bytes."""

    pid: int
    fd: int
    name: str
    size: int


class SharedBlob:
    """``size`` bytes of memory that this process writes once (``write``, or a receive into ``writable()``), then
    ``seal()``s and reads as ``tensor`` (uint8); in an in-memory file other processes of the machine can open
    (``handle``; None where the blob is plain memory). The descriptor closes when the blob is collected; the memory
    goes when the last process that holds or maps it lets go."""

    __slots__ = ("__weakref__", "_mapping", "adopted", "handle", "nbytes", "tensor")

    def __init__(self, size: int) -> None:
        self.adopted = False  # True: another process's blob, held by descriptor (its memory is counted there)
        self.nbytes = size
        self.handle: BlobHandle | None = None
        self._mapping: mmap.mmap | None = None
        if size and hasattr(os, "memfd_create"):
            self._create(size)
        if self.handle is None:
            self.tensor = torch.empty(size, dtype=torch.uint8)

    @classmethod
    def adopt(cls, handle: BlobHandle) -> SharedBlob | None:
        """Hold the sealed blob of another process of this machine (a guard's "copy" of its ward's blob): its
        descriptor, kept open, and a read-only mapping; the handle is then this process's. None where it cannot
        be opened: the caller receives a copy instead."""
        fd = open_fd(handle)
        if fd is None:
            return None
        blob = cls.__new__(cls)
        blob._mapping = None
        blob.adopted = True
        blob.nbytes = handle.size
        try:
            blob.tensor = _read_only(fd, handle.size)
        except (OSError, ValueError):
            os.close(fd)
            return None
        blob.handle = BlobHandle(os.getpid(), fd, handle.name, handle.size)
        weakref.finalize(blob, os.close, fd)
        return blob

    def write(self, offset: int, data: torch.Tensor) -> None:
        """Write ``data``'s bytes (a CPU tensor of any dtype) at ``offset``, before ``seal()``. Into the file with
        ``pwrite``: the kernel fills the pages as it copies, about twice as fast as faulting them in through a
        mapping."""
        raw = data.detach().contiguous().reshape(-1).view(torch.uint8)
        if self.handle is None:
            self.tensor[offset : offset + raw.numel()].copy_(raw)
            return
        view = raw.numpy().data
        while view:
            written = os.pwrite(self.handle.fd, view, offset)
            view, offset = view[written:], offset + written

    def writable(self) -> torch.Tensor:
        """The blob as a writable uint8 tensor, before ``seal()`` (what a receive writes into)."""
        if self.handle is not None and self._mapping is None:
            flags = mmap.MAP_SHARED | _POPULATE
            self._mapping = mmap.mmap(self.handle.fd, self.nbytes, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            self.tensor = torch.frombuffer(self._mapping, dtype=torch.uint8)
        return self.tensor

    def seal(self) -> None:
        """Written: from now on nobody can change the bytes (the kernel refuses writes to the file), and this
        process reads them as ``tensor``, through a read-only mapping. The caller holds no view of ``writable()``
        any more. A blob that cannot be sealed stays writable here, and is still shared."""
        if self.handle is None:
            return
        fd, size = self.handle.fd, self.nbytes
        mapping, self._mapping = self._mapping, None
        if mapping is not None:
            del self.tensor  # the writable mapping's last reference: it can be closed now
        try:
            if mapping is not None:
                mapping.close()
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        except (OSError, BufferError) as error:  # a view still lives, or an old kernel: unsealed
            warn_once("could not seal a sharded blob (%s): it stays writable in its own process", error)
            if mapping is not None and not mapping.closed:
                self.tensor = torch.frombuffer(mapping, dtype=torch.uint8)
                return
        self.tensor = _read_only(fd, size)

    def _create(self, size: int) -> None:
        name = _PREFIX + secrets.token_hex(8)
        try:
            fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError as error:  # out of descriptors, a seccomp filter: plain memory still serves
            warn_once("memfd_create failed (%s): sharded blobs stay in plain memory, shared by copies", error)
            return
        try:
            os.ftruncate(fd, size)
        except OSError as error:
            os.close(fd)
            warn_once("sizing a memfd failed (%s): sharded blobs stay in plain memory, shared by copies", error)
            return
        self.handle = BlobHandle(os.getpid(), fd, name, size)
        weakref.finalize(self, os.close, fd)


def open_fd(handle: BlobHandle) -> int | None:
    """A descriptor of the blob ``handle`` names, opened read-only; None when it cannot be opened (another machine
    or pid namespace, a holder that exited, no permission) or the descriptor names another file by now."""
    try:
        fd = os.open(f"/proc/{handle.pid}/fd/{handle.fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        named = os.readlink(f"/proc/self/fd/{fd}") == f"/memfd:{handle.name} (deleted)"
        if named and os.fstat(fd).st_size == handle.size:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def open_blob(handle: BlobHandle) -> torch.Tensor | None:
    """Map the blob ``handle`` names, read-only, as a uint8 tensor (the mapping holds the file); None where
    ``open_fd`` gives none."""
    fd = open_fd(handle)
    if fd is None:
        return None
    try:
        return _read_only(fd, handle.size)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


@functools.cache
def machine() -> str:
    """What names this machine and pid namespace: processes whose values are equal can try each other's handles
    (the boot id, and the pid namespace's inode)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            boot = file.read().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return f"no-proc:{os.getpid()}"  # no /proc: nobody else can open this process's blobs


def _read_only(fd: int, size: int) -> torch.Tensor:
    mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    with warnings.catch_warnings():  # torch warns that it cannot write through read-only memory; nothing does
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(mapping, dtype=torch.uint8)


_warned: set[str] = set()


def warn_once(message: str, *args: object) -> None:
    """Log ``message`` as a warning the first time this process meets it (a commit's fallback would repeat it at
    every commit)."""
    if message not in _warned:
        _warned.add(message)
        log.warning(message, *args)


__all__ = ["BlobHandle", "SharedBlob", "machine", "open_blob", "open_fd", "warn_once"]
