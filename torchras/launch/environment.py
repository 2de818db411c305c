"""The environment of one worker: torchrun's, variable for variable, plus what a replacement needs to join.

torchrun's (torch 2.13, ``LocalElasticAgent._start_workers``), for a worker of local rank ``l`` on node ``g`` of a
job of ``n`` nodes with ``p`` workers each:

==================================  ===============================================================================
``RANK``, ``ROLE_RANK``             ``g * p + l`` (one role, so the role rank is the rank)
``LOCAL_RANK``                      ``l`` (``--virtual-local-rank``: 0, and ``CUDA_VISIBLE_DEVICES`` its one GPU)
``GROUP_RANK``                      ``g``, the node rank
``WORLD_SIZE``, ``ROLE_WORLD_SIZE`` ``n * p``
``LOCAL_WORLD_SIZE``                ``p``
``GROUP_WORLD_SIZE``                ``n``
``ROLE_NAME``                       ``--role`` (``default``)
``MASTER_ADDR``, ``MASTER_PORT``    the store the launcher of node 0 serves (``init_process_group("env://")``)
``TORCHELASTIC_USE_AGENT_STORE``    ``True``: env:// connects to that store as a client, no worker hosts it
``TORCHELASTIC_RUN_ID``             ``--rdzv-id`` (``none``), a fresh uuid with ``--standalone``
``TORCHELASTIC_RESTART_COUNT``      ``0``, or how many times the group was restarted (a worker lost at start-up;
                                    a job without the Wrapper: ``--max-restarts``, ``torchras.launch.restarts``).
                                    A replacement keeps the group's: the Wrapper finds the running job by run id
                                    and restart count
``TORCHELASTIC_MAX_RESTARTS``       ``--max-restarts`` (0 on several nodes, where it is not used)
``TORCHELASTIC_ERROR_FILE``         where torch's ``@record`` writes a worker's uncaught exception
``TORCHELASTIC_SIGNALS_TO_HANDLE``  ``--signals-to-handle``
``TORCH_NCCL_ASYNC_ERROR_HANDLING`` the launcher's, else ``1``
``OMP_NUM_THREADS``                 the launcher's, else ``1`` when a node runs more than one worker
==================================  ===============================================================================

Added by rasd launch:

====================================  =============================================================================
``TORCHRAS_LAUNCH_EVENTS``            the file the worker's Wrapper tells the launcher things in
                                      (``inprocess.launch_events``: joining on, admitted, refused)
``INPROCESS_JOINING``                 with respawns on: a Wrapper built without ``joining=`` takes newcomers
                                      (``inprocess.elastic.Joining.from_environment``); the user's value wins
``TORCHRAS_JOURNAL_DIR``              the workers' verdict journal, where the launcher reads the verdicts that
                                      restart a job without the Wrapper: the user's, else the attempt's folder
                                      (``torchras.launch.ras_node``, set by ``main`` with the RAS node on)
``TORCHRAS_LAUNCH_RESTART``           after a group restart: its cause, for the new group's nodes to record
                                      (``torchras.launch.worker_main``)
``INPROCESS_JOIN=1``                  a replacement only: it joins the running job as a newcomer (docs/elastic.md
                                      section 5); it keeps its slot's ``RANK`` for code that reads it before the
                                      Wrapper, which gives it its rank in the job when a round admits it
====================================  =============================================================================
"""

from __future__ import annotations

from collections.abc import Mapping

from .args import Plan

#: The Wrapper's joining under rasd launch: a round after a kill waits 0.2 s (not 1 s) for more processes, since
#: a replacement needs seconds to start and is admitted at a later commit anyway.
JOINING_DEFAULT = "last_call=0.2"


def worker_environment(
    plan: Plan,
    base: Mapping[str, str],
    *,
    local_rank: int,
    node_rank: int,
    master_addr: str,
    master_port: int,
    run_id: str,
    error_file: str,
    events_file: str,
    newcomer: bool,
    restart_count: int = 0,
) -> dict[str, str]:
    """The environment of the worker of ``local_rank`` (``newcomer``: a replacement that joins the running job;
    ``restart_count``: how many times the launcher restarted its group at start-up, ``torchras.launch.main``)."""
    env = dict(base)
    rank = node_rank * plan.nproc_per_node + local_rank
    env.update(
        RANK=str(rank),
        GROUP_RANK=str(node_rank),
        ROLE_RANK=str(rank),
        ROLE_NAME=plan.role,
        LOCAL_WORLD_SIZE=str(plan.nproc_per_node),
        WORLD_SIZE=str(plan.world_size),
        GROUP_WORLD_SIZE=str(plan.nnodes),
        ROLE_WORLD_SIZE=str(plan.world_size),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        TORCHELASTIC_RESTART_COUNT=str(restart_count),
        TORCHELASTIC_MAX_RESTARTS=str(plan.max_restarts),
        TORCHELASTIC_RUN_ID=run_id,
        TORCHELASTIC_USE_AGENT_STORE="True",
        TORCHELASTIC_ERROR_FILE=error_file,
        TORCHELASTIC_SIGNALS_TO_HANDLE=",".join(plan.signals),
        TORCH_NCCL_ASYNC_ERROR_HANDLING=base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        TORCHRAS_LAUNCH_EVENTS=events_file,
    )
    if plan.virtual_local_rank:
        env["LOCAL_RANK"] = "0"
        visible = base.get("CUDA_VISIBLE_DEVICES")
        devices = visible.split(",") if visible is not None else None
        if devices is not None and local_rank >= len(devices):
            raise ValueError(f"local_rank {local_rank} exceeds available GPUs in CUDA_VISIBLE_DEVICES={visible}")
        env["CUDA_VISIBLE_DEVICES"] = devices[local_rank].strip() if devices is not None else str(local_rank)
    else:
        env["LOCAL_RANK"] = str(local_rank)
    if "OMP_NUM_THREADS" not in base and plan.nproc_per_node > 1:
        env["OMP_NUM_THREADS"] = "1"
    if plan.max_respawns > 0:
        env.setdefault("INPROCESS_JOINING", JOINING_DEFAULT)
    env.pop("TORCHRAS_LAUNCH_RESTART", None)  # the launcher sets it for a restarted group only
    env.pop("INPROCESS_JOIN", None)  # inherited from a shell that started a newcomer: not for these workers
    if newcomer:
        env["INPROCESS_JOIN"] = "1"
    return env


def omp_warning(base: Mapping[str, str], plan: Plan) -> str | None:
    """torchrun's warning when it sets ``OMP_NUM_THREADS=1`` for the workers."""
    if "OMP_NUM_THREADS" in base or plan.nproc_per_node <= 1:
        return None
    return (
        "setting OMP_NUM_THREADS=1 for each worker (torchrun's default with more than one worker per node) so the "
        "system is not overloaded; set it yourself to tune it"
    )
