"""Which replica decides which runs: runs fall into a fixed number of shards, and each shard
is held by at most one replica at a time through a Lease (the shell keeps them:
agentrun/loop/shards.py).

* A run's shard is a stable hash of its namespace and name (:func:`shard_of`): the key every
  path that wakes a run already carries (a Job's labels, a timer, a watch event), fixed for
  the run's life like its uid, and the same in every replica and every version.
* A Lease is judged expired by the time this process *saw* it last change (its
  resourceVersion), on this process's monotonic clock, never by the renewTime written in it:
  clocks of other machines do not enter (as client-go's leader election does).
* Each replica aims to hold its fair share, ``ceil(shards / live members)``: it takes free or
  expired shards while under it and gives back (after draining) what is over it. Members are
  the replicas whose member Lease was seen renewed within the lease duration.

Pure: :func:`plan` decides from what was seen and the time; nothing here sends a request.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Set
from dataclasses import dataclass

SHARD_PREFIX = "agentrun-shard-"
MEMBER_PREFIX = "agentrun-member-"
RENEW_FRACTION = 2 / 3
"""A holder decides a shard's runs only while its last renewal was *sent* less than this
fraction of the lease duration ago: others take the shard only a whole duration after they
saw that renewal, which came later."""


def shard_of(namespace: str, name: str, count: int) -> int:
    """The shard of run ``namespace/name`` among ``count`` (0 when ``count`` < 2)."""
    if count < 2:
        return 0
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


def shard_label(shard: int, count: int) -> str:
    """The value of the ``agentrun.dev/shard`` label of a step Job (and its pods) whose run is
    in ``shard`` of ``count``: the count is part of it, so that a Job labelled under another
    count is told apart (every replica watches those, see agentrun/observation/watches.py)."""
    return f"{shard}-of-{count}"


def run_shard_label(namespace: str, name: str, count: int) -> str:
    """The ``agentrun.dev/shard`` label of run ``namespace/name``'s step Jobs."""
    return shard_label(shard_of(namespace, name, count), count)


def shard_lease(shard: int) -> str:
    return f"{SHARD_PREFIX}{shard}"


def shard_from_lease(name: str) -> int | None:
    """The shard a Lease named ``name`` stands for, or None (a member Lease, or another)."""
    rest = name.removeprefix(SHARD_PREFIX)
    return int(rest) if rest != name and rest.isdigit() else None


def member_lease(identity: str) -> str:
    """The member Lease of replica ``identity``: a valid object name whatever the identity
    (lower-cased, other characters replaced; a long one shortened with a hash kept)."""
    clean = re.sub(r"[^a-z0-9-]+", "-", identity.lower()).strip("-") or "replica"
    if len(clean) > 30 or clean != identity:
        digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
        clean = f"{clean[:30].strip('-')}-{digest}"
    return f"{MEMBER_PREFIX}{clean}"


@dataclass(frozen=True)
class Seen:
    """A Lease as this process saw it."""

    holder: str
    """``spec.holderIdentity`` ("" when nobody holds it)."""
    changed_at: float
    """When this process first saw the Lease at its current resourceVersion (monotonic)."""


def expired(seen: Seen, now: float, duration: float) -> bool:
    """Free to take: nobody holds it, or nobody renewed it for a whole ``duration``."""
    return not seen.holder or now - seen.changed_at > duration


def fair_share(count: int, members: int) -> int:
    return math.ceil(count / max(members, 1))


@dataclass(frozen=True)
class ShardPlan:
    """What a replica does with the shard Leases this tick."""

    take: tuple[int, ...] = ()
    """Free or expired shards to acquire."""
    keep: tuple[int, ...] = ()
    """Shards it holds and renews."""
    give: tuple[int, ...] = ()
    """Shards it holds over its share: stop deciding their runs, then release them."""


def plan(
    me: str,
    count: int,
    shards: Mapping[int, Seen],
    members: Set[str],
    now: float,
    duration: float,
) -> ShardPlan:
    """The shards replica ``me`` takes, keeps and gives, from the shard Leases seen
    (``shards``; a missing one is free) and the live ``members`` (``me`` counts anyway).

    Under its share it takes the free shards with the lowest numbers first; over it, it gives
    the highest it holds. A shard left free for two whole durations is taken whatever the
    share: members judged alive that hold nothing must not keep a shard undecided."""
    mine = sorted(i for i, seen in shards.items() if seen.holder == me and i < count)
    share = fair_share(count, len(set(members) | {me}))
    if len(mine) > share:
        return ShardPlan(keep=tuple(mine[:share]), give=tuple(mine[share:]))
    free = [i for i in range(count) if i not in mine and _free(shards.get(i), now, duration)]
    take = free[: share - len(mine)]
    abandoned = [
        i
        for i in free[len(take) :]
        if (seen := shards.get(i)) is not None and now - seen.changed_at > 2 * duration
    ]
    return ShardPlan(take=tuple(take + abandoned), keep=tuple(mine))


def _free(seen: Seen | None, now: float, duration: float) -> bool:
    return seen is None or expired(seen, now, duration)


def live_members(leases: Mapping[str, Seen], now: float, duration: float) -> set[str]:
    """Holders of the member Leases seen renewed within ``duration``."""
    return {seen.holder for seen in leases.values() if not expired(seen, now, duration)}
