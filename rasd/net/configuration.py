"""This process's configuration, as it answers a DIAGNOSTICS gather (``rasd.report.diagnostics`` compares them).

Runs on the RAS thread, at each diagnostics request, so it must be quick and must never start anything: the GPU
fields are read only from a torch that this process has already imported and whose CUDA it has already started
(starting CUDA from the RAS thread would cost seconds and a context the training did not ask for); otherwise
``gpu_note`` says why they are empty. The settings are the environment's ``NCCL_*``, ``TORCH_*``, ``CUDA_*`` and
``TORCHRAS_*`` variables, read afresh each time. A variable whose name says it holds a secret (``SECRET``,
``TOKEN``, ``PASSWORD``, ``KEY`` in it) is shown as a digest, so two ranks can be compared without its value ever
leaving the process. Settings beyond what one answer holds (``wire.MAX_ANSWER_BYTES``) are dropped, longest first,
and the answer says it was cut (NCCL cuts its ``NCCL_*`` list at 16 KiB the same way, reference §9.1.4).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from rasd.core.peers import PeerInfo
from rasd.core.wire import MAX_ANSWER_BYTES, Answer
from rasd.report.diagnostics import SETTING_PREFIXES, Configuration
from torchras_formats.version import __version__

log = logging.getLogger("rasd")

SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL")
#: Ours, set to a different value in every process by design (``rasd launch`` gives each worker its own event
#: file): never compared.
PER_PROCESS = frozenset({"TORCHRAS_LAUNCH_EVENTS"})


def settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The compared settings of ``environ``, secrets as digests."""
    out = {}
    for name, value in environ.items():
        if not name.startswith(SETTING_PREFIXES) or name in PER_PROCESS:
            continue
        if any(word in name.upper() for word in SECRET_WORDS):
            value = "<secret sha256:" + hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()[:12] + ">"
        out[name] = value
    return out


def _gpu(torch: Any) -> dict[str, Any]:
    """The GPU fields from an imported torch, without starting CUDA."""
    if torch is None:
        return {"gpu_note": "torch not imported in this process"}
    fields: dict[str, Any] = {"cuda_runtime": getattr(torch.version, "cuda", None)}
    if not fields["cuda_runtime"]:
        fields["gpu_note"] = "no CUDA device: a CPU-only torch build"
        return fields
    cuda = torch.cuda
    if not cuda.is_initialized():
        fields["gpu_note"] = "CUDA not started in this process yet"
        return fields
    device = cuda.current_device()
    props = cuda.get_device_properties(device)
    fields.update(gpu_count=cuda.device_count(), gpu_model=props.name, gpu_memory_bytes=int(props.total_memory))
    try:
        fields["cuda_driver"] = str(torch._C._cuda_getDriverVersion())  # the driver's CUDA version, e.g. 12080
    except Exception:  # a private call: the field is left unknown
        log.debug("rasd: no CUDA driver version", exc_info=True)
    try:
        fields["nccl"] = ".".join(str(n) for n in cuda.nccl.version())
    except Exception:  # a torch built without NCCL
        log.debug("rasd: no NCCL version", exc_info=True)
    return fields


def collect(me: PeerInfo, environ: Mapping[str, str] | None = None, torch: Any = None) -> Configuration:
    """This process's configuration now. ``torch``: the imported module (default: ``sys.modules``'s, if any)."""
    environ = os.environ if environ is None else environ
    torch = sys.modules.get("torch") if torch is None else torch
    try:
        gpu = _gpu(torch)
    except Exception as e:  # noqa: BLE001 - a torch that cannot tell: the fields stay unknown
        gpu = {"gpu_note": f"could not read the GPU ({type(e).__name__}: {e})"}
    return Configuration(
        host=me.hostname,
        pid=me.pid,
        rank=me.rank,
        wall=time.time(),
        python=platform.python_version(),
        torch=getattr(torch, "__version__", None) if torch is not None else None,
        torchras=__version__,
        settings=settings(environ),
        **gpu,
    )


def fitted(config: Configuration, limit: int = MAX_ANSWER_BYTES) -> bytes:
    """``config`` encoded within ``limit`` bytes: the longest settings are dropped until it fits, and it says so."""
    data = config.encode()
    if len(data) <= limit:
        return data
    kept = dict(config.settings)
    for name in sorted(kept, key=lambda n: len(n) + len(kept[n]), reverse=True):
        del kept[name]
        data = dataclasses.replace(config, settings=kept, truncated=True).encode()
        if len(data) <= limit:
            return data
    return b""


def provider(me: PeerInfo) -> Callable[[], Answer]:
    """What the node calls at each diagnostics gather (``Node.answers``); never raises. The configuration is the
    answer's own part: it names the process (host, pid), so no two processes share it byte for byte."""

    def answer() -> Answer:
        try:
            return Answer(own=fitted(collect(me)))
        except Exception:  # an empty answer; the root reports this process as not answering
            log.warning("rasd: could not describe this process for diagnostics", exc_info=True)
            return Answer()

    return answer
