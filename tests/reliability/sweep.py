"""Simulator sweeps: one random fault schedule per seed, the mesh's properties checked at every step.

Issue 14, item 4 (docs/reliability.md). ``check_seed(seed)`` builds a job of 64 to 1,024 nodes on the
deterministic simulator (``rasd.sim``), lays out a schedule drawn from the seed (loss, kills, short pauses, one
pause past the dead limit, a partition), runs it in steps of one keepalive and checks after every step:

* **no reachable node declared dead**: every new PEER_DEAD is about a node killed by then, or paused past the dead
  limit, or cut off by a partition that had lasted the dead limit (``Scenario.may_be_declared_dead``);
* **gathers terminate**: a status query is started every few steps from a random live node; each must end within
  its timeout plus the hard extra (plus slack), unless its root was paused, killed or expelled meanwhile;

and at the end, after the schedule has settled:

* **every dead node is known to all live nodes** and **dead lists converge**: every survivor's dead set is exactly
  the doomed set, the tables agree, no survivor expelled itself. After a partition past the dead limit, the
  processes of the smaller side that left the job are doomed too, and no process of the larger side may leave.

A violation is returned as text with a one-line reproduction command. Timers are compressed (the dead limit is 18
keepalives, not 60) so that a schedule costs less; the rules and their order are those of ``Timers``.

    python tests/reliability/sweep.py --seed 1234          # one seed, verbose
    python tests/reliability/sweep.py --seeds 0:100        # a range
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
for extra in (HERE.parent / "sim", HERE.parents[1]):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from rasd.core.config import Timers  # noqa: E402 - after sys.path takes the helpers' folders
from rasd.core.events import Kind  # noqa: E402 - likewise
from rasd.sim import Simulation  # noqa: E402 - likewise
from sim_scenario import Scenario  # noqa: E402 - likewise

#: The ladder compressed: keepalive 0.2 s, unresponsive 1 s, hang 1.6 s, reset 2.4 s, dead 3.6 s (virtual).
SWEEP_TIMERS = Timers(
    keepalive=0.2,
    unresponsive=1.0,
    hang=1.6,
    reset=2.4,
    dead=3.6,
    connect_retry=0.2,
    connect_warn=1.0,
    handshake=1.0,
    idle=3.6,
    leg_timeout=1.0,
    gather_extra=1.0,
    in_flight=0.4,
    stuck=4.0,
    sweep=1.0,
    tick=0.1,
)
RETRANSMIT = 0.04  # TCP's minimum RTO, scaled like the timers
#: A verdict's time after the dead limit: our HUNG standing (CONFIRM unresponsive limits) and a reachability gather.
GRACE = SWEEP_TIMERS.unresponsive + SWEEP_TIMERS.leg_timeout + SWEEP_TIMERS.gather_extra
#: Job sizes and how often each is drawn: most seeds small, some large (the sweep's cost is about linear in n).
SIZES = ((64, 0.80), (128, 0.12), (256, 0.05), (512, 0.02), (1024, 0.01))
GATHER_EVERY = 5  # steps
GATHER_SLACK = 0.5  # seconds beyond timeout + extra


@dataclass
class Outcome:
    seed: int
    nodes: int
    violations: list[str] = field(default_factory=list)
    gathers: int = 0
    steps: int = 0
    seconds: float = 0.0
    messages: int = 0  # sent by all nodes: with the verdicts' digest, what shows that a seed replays exactly
    verdicts: str = ""  # a digest of every PEER_DEAD (observer, subject, virtual time)

    def repro(self) -> str:
        return f"python tests/reliability/sweep.py --seed {self.seed}"


def size_of(seed: int, sizes=SIZES) -> int:
    rng = random.Random(f"size-{seed}")
    roll, acc = rng.random(), 0.0
    for n, weight in sizes:
        acc += weight
        if roll < acc:
            return n
    return sizes[-1][0]


def _schedule(
    rng: random.Random, n: int, t: Timers, long_rng: random.Random | None = None
) -> list[tuple[float, str, list[int]]]:
    """(time, action, nodes): every node is the subject of at most one fault, and chained silences (a pause
    seen through a partition) stay under 0.8 dead limits, so the only deaths justified are kills, long pauses and
    a *long partition*: with ``long_rng``, a quarter of the schedules without a short partition get one of one to a
    quarter of the hosts for 0.9 to 2.5 dead limits (drawn from ``long_rng``, so the other faults of a seed are the
    same with or without it)."""
    pool = list(range(n))
    rng.shuffle(pool)

    def take(k: int) -> list[int]:
        return [pool.pop() for _ in range(min(k, len(pool)))]

    start, span = 0.5, t.dead
    plan: list[tuple[float, str, list[int]]] = []
    for victim in take(rng.randint(0, 3)):
        plan.append((start + rng.uniform(0, span), "kill", [victim]))
    for victim in take(rng.randint(0, 2)):
        at = start + rng.uniform(0, span)
        plan += [(at, "pause", [victim]), (at + rng.uniform(0.1, 0.4) * t.dead, "resume", [victim])]
    if rng.random() < 0.5:
        (victim,) = take(1)
        at = start + rng.uniform(0, span)
        # Past the dead limit and the time a verdict may take after it (``Scenario.grace``): doomed.
        past = rng.uniform(1.15, 1.4) * t.dead + GRACE
        plan += [(at, "pause", [victim]), (at + past, "resume", [victim])]
    if rng.random() < 0.6:
        per_host = 8
        hosts = max(1, rng.randint(1, max(1, n // per_host // 4)))
        first = rng.randrange(0, n // per_host) * per_host
        group = [i for i in range(first, min(n, first + hosts * per_host)) if i in pool]
        for i in group:
            pool.remove(i)
        if group:
            at = start + rng.uniform(0, span)
            plan += [(at, "partition", group), (at + rng.uniform(0.1, 0.4) * t.dead, "heal", group)]
    elif long_rng is not None and long_rng.random() < 0.25:
        per_host = 8
        hosts = long_rng.randint(1, max(1, n // per_host // 4))
        first = long_rng.randrange(0, n // per_host) * per_host
        group = [i for i in range(first, min(n, first + hosts * per_host)) if i in pool]
        if group:
            at = start + long_rng.uniform(0, span)
            plan += [(at, "partition", group), (at + long_rng.uniform(0.9, 2.5) * t.dead, "heal", group)]
    return sorted(plan, key=lambda p: p[0])


def check_seed(seed: int, n: int | None = None, timers: Timers = SWEEP_TIMERS) -> Outcome:
    began = time.monotonic()
    n = n or size_of(seed)
    rng = random.Random(seed)
    loss = rng.choice((0.0, 0.0, 0.01, 0.05))
    sim = Simulation(
        n,
        seed=seed,
        timers=timers,
        procs_per_host=8,
        loss=loss,
        retransmit=RETRANSMIT,
        record=frozenset({Kind.PEER_DEAD}),
    )
    sc = Scenario(sim)
    out = Outcome(seed, n)
    plan = _schedule(rng, n, timers, random.Random(f"long-{seed}"))
    end = (plan[-1][0] if plan else 1.0) + 1.5 * timers.dead + timers.unresponsive
    partitions: dict[tuple[int, ...], object] = {}
    gathers: dict[int, tuple[int, float]] = {}  # query id -> (root, started)
    disturbed: dict[int, float] = {}  # root -> when it was paused or killed
    seen_dead = 0
    sim.start(bootstrap="quiet")
    step = timers.keepalive
    while sim.now < end - 1e-9:
        target = min(end, sim.now + step)
        while plan and plan[0][0] <= target:
            at, action, nodes = plan.pop(0)
            sc.run_until(at)
            if action == "kill":
                sc.kill(nodes)
                disturbed.update({i: at for i in nodes})
            elif action == "pause":
                sc.pause(nodes)
                disturbed.update({i: at for i in nodes})
            elif action == "resume":
                sc.resume(nodes)
            elif action == "partition":
                partitions[tuple(nodes)] = sc.partition(nodes, set(range(n)) - set(nodes))
            elif action == "heal":
                sc.heal(partitions.pop(tuple(nodes)))
        sc.run_until(target)
        out.steps += 1
        # Property: no reachable node declared dead (only the verdicts new since the last step).
        verdicts = sc.dead_verdicts()
        for observer, subject, at in verdicts[seen_dead:]:
            if not sc.may_be_declared_dead(subject, at, observer):
                out.violations.append(f"t={at:.2f}: node {observer} declared reachable node {subject} dead")
        seen_dead = len(verdicts)
        # Property: gathers terminate.
        limit = timers.leg_timeout + timers.gather_extra + GATHER_SLACK
        for qid, (root, started) in list(gathers.items()):
            if (root, qid) in sim.gathers_done:
                del gathers[qid]
            elif sim.now - started > limit:
                node = sim.nodes[root]
                if root in disturbed or node.node.expelled or not node.alive:
                    del gathers[qid]  # a root that stopped or died answers nobody; not a hang of the gather
                else:
                    out.violations.append(
                        f"t={sim.now:.2f}: gather {qid} from node {root} still open after {sim.now - started:.2f}s"
                    )
                    del gathers[qid]
        if out.steps % GATHER_EVERY == 0:
            candidates = [s.index for s in sim.nodes if s.alive and not s.paused and not s.node.expelled]
            if candidates:
                root = rng.choice(candidates)
                qid = out.steps
                sim.gather(root, qid)
                gathers[qid] = (root, sim.now)
                out.gathers += 1
        if len(out.violations) > 20:
            break
    # At the end: every dead node known to all live nodes, dead lists and tables converged. The smaller side of a
    # partition past the dead limit may have left the job (expelled), as a whole or in part: the rest agree on it.
    cut_off = {i for x, y, a, b in sc.rec.partitions if b - a >= timers.dead - sc.slack() for i in min(x, y, key=len)}
    gone_with_partition = {i for i in cut_off if sim.nodes[i].node.expelled}
    # A pause that ended just past the dead limit may end either way, but the same way everywhere (Scenario.undecided):
    # it counts as dead if it expelled itself.
    grace = sc.grace()
    undecided_dead = {i for i in sc.undecided(grace) if sim.nodes[i].node.expelled}
    doomed = {sim.key(i) for i in sc.doomed(grace) | gone_with_partition | undecided_dead}
    survivor_ids = [i for i in sc.survivors(grace) if i not in gone_with_partition | undecided_dead]
    survivors = [sim.nodes[i].node for i in survivor_ids]
    for i, node in zip(survivor_ids, survivors, strict=True):
        if node.expelled:
            out.violations.append(f"end: survivor {i} expelled itself")
        elif node.dead != doomed:
            missing = sorted(str(k.addr) for k in doomed - node.dead)
            extra = sorted(str(k.addr) for k in node.dead - doomed)
            out.violations.append(f"end: survivor {i} dead list differs: lacks {missing[:4]} has extra {extra[:4]}")
    if len({node.table.hash for node in survivors}) > 1:
        out.violations.append("end: the survivors' peer tables differ")
    out.messages = sim.messages_sent
    out.verdicts = hashlib.sha1(repr(sc.dead_verdicts()).encode()).hexdigest()[:12]
    out.seconds = time.monotonic() - began
    return out


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sweep.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, help="one seed")
    parser.add_argument("--seeds", default="0:10", help="a range A:B of seeds")
    parser.add_argument("--nodes", type=int, help="force the job size")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(*map(int, args.seeds.split(":")))
    failed = 0
    for seed in seeds:
        out = check_seed(seed, args.nodes)
        status = "ok" if not out.violations else "VIOLATED"
        print(
            f"seed {seed}: {out.nodes} nodes, {out.steps} steps, {out.gathers} gathers, {out.seconds:.1f}s {status}"
            f" ({out.messages} messages, verdicts {out.verdicts})"
        )
        for v in out.violations:
            print(f"  {v}")
        if out.violations:
            failed += 1
            print(f"  repro: {out.repro()}" + (f" --nodes {args.nodes}" if args.nodes else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
