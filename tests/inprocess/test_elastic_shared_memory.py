"""Blobs in shared memory (``inprocess.elastic.shared_memory``): what a process of the same machine maps or adopts
through a handle; a sealed blob that nobody can write again; and every way a handle stops naming the blob (the blob
collected, its descriptor reused by another file, another size, a process gone) gives None, never other bytes."""

from __future__ import annotations

import dataclasses
import gc
import mmap
import os
import subprocess
import sys

import pytest
import torch

from inprocess.elastic import shared_memory
from inprocess.elastic.shared_memory import SharedBlob, open_blob


def pattern(size: int) -> torch.Tensor:
    return torch.arange(size, dtype=torch.int64).remainder(251).to(torch.uint8)


def filled(size: int) -> SharedBlob:
    blob = SharedBlob(size)
    blob.write(0, pattern(size))
    blob.seal()
    return blob


def test_a_handle_maps_the_blob_read_only_in_place() -> None:
    blob = filled(10_000)
    assert blob.handle is not None and blob.handle.size == 10_000 and blob.handle.pid == os.getpid()
    mapped = open_blob(blob.handle)
    assert mapped is not None and torch.equal(mapped, blob.tensor) and torch.equal(mapped, pattern(10_000))


def test_a_receive_writes_through_a_mapping_that_readers_share() -> None:
    blob = SharedBlob(4096)
    assert blob.handle is not None
    blob.writable().copy_(pattern(4096))
    mapped = open_blob(blob.handle)
    assert mapped is not None and torch.equal(mapped, pattern(4096))
    blob.writable()[7] = 200  # the same pages: a write before the seal shows through the reader's mapping
    assert int(mapped[7]) == 200


def test_items_of_any_dtype_and_layout_are_written_as_their_bytes() -> None:
    weights = torch.randn(6, 5).to(torch.bfloat16).t()  # no numpy dtype, not contiguous
    counts = torch.arange(7, dtype=torch.int32)
    blob = SharedBlob(64 + 28)
    blob.write(0, weights)
    blob.write(64, counts)
    blob.seal()
    assert torch.equal(blob.tensor[:60].view(torch.bfloat16).view(5, 6), weights)
    assert torch.equal(blob.tensor[64:].view(torch.int32), counts)


def test_another_process_maps_the_blob() -> None:
    blob = filled(4096)
    assert blob.handle is not None
    reader = (
        "import os, sys\n"
        f"fd = os.open('/proc/{os.getpid()}/fd/{blob.handle.fd}', os.O_RDONLY)\n"
        "sys.stdout.write(os.read(fd, 8).hex())\n"
    )
    done = subprocess.run([sys.executable, "-c", reader], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == bytes(blob.tensor[:8].tolist()).hex()


def test_a_stale_or_wrong_handle_maps_nothing() -> None:
    blob = filled(4096)
    handle = blob.handle
    assert handle is not None
    assert open_blob(dataclasses.replace(handle, size=4097)) is None
    assert open_blob(dataclasses.replace(handle, name=handle.name + "0")) is None
    assert open_blob(dataclasses.replace(handle, pid=2**22 + 7)) is None  # beyond pid_max: no such process
    with open(__file__, "rb") as other:  # a descriptor that names another file
        assert open_blob(dataclasses.replace(handle, fd=other.fileno())) is None
    del blob
    gc.collect()
    assert open_blob(handle) is None  # collected: the descriptor is closed


def test_an_empty_blob_is_plain_memory() -> None:
    blob = SharedBlob(0)
    assert blob.handle is None and blob.nbytes == 0


def test_the_machine_is_named_by_boot_and_pid_namespace() -> None:
    assert shared_memory.machine() == shared_memory.machine()
    with open("/proc/sys/kernel/random/boot_id") as file:
        assert shared_memory.machine().startswith(file.read().strip() + ":")


def test_a_sealed_blob_refuses_every_write_and_keeps_its_bytes() -> None:
    blob = filled(8192)
    before = pattern(8192)
    assert blob.handle is not None and torch.equal(blob.tensor, before)
    with pytest.raises(PermissionError):
        os.pwrite(blob.handle.fd, b"x", 0)
    with pytest.raises(PermissionError):
        mmap.mmap(blob.handle.fd, 8192, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    with pytest.raises(PermissionError):
        os.ftruncate(blob.handle.fd, 0)  # a reader's mapping can never lose its pages under it
    mapped = open_blob(blob.handle)
    assert mapped is not None and torch.equal(mapped, before)


def test_a_blob_with_a_live_view_stays_readable_unsealed() -> None:
    blob = SharedBlob(4096)
    blob.writable().copy_(pattern(4096))
    view = blob.writable()[:16]  # a caller that kept a view: the writable mapping cannot be closed
    blob.seal()
    assert torch.equal(blob.tensor[:16], view) and open_blob(blob.handle) is not None  # type: ignore[arg-type]


def test_a_guard_adopts_the_blob_and_outlives_its_owner_object() -> None:
    owner = filled(4096)
    expected = owner.tensor.clone()
    assert owner.handle is not None
    guard = SharedBlob.adopt(owner.handle)
    assert guard is not None and guard.adopted and not owner.adopted
    assert guard.handle is not None and guard.handle.fd != owner.handle.fd and guard.handle.name == owner.handle.name
    del owner
    gc.collect()  # the owner's descriptor and mapping are gone; the guard's descriptor keeps the file
    mapped = open_blob(guard.handle)
    assert mapped is not None and torch.equal(mapped, expected) and torch.equal(guard.tensor, expected)
    assert SharedBlob.adopt(dataclasses.replace(guard.handle, name="torchras-blob-0")) is None
