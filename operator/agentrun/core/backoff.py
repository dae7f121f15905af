"""Exponential backoff with deterministic jitter.

The jitter is derived from a hash of (seed, run uid, step, attempt) rather than drawn from a
random generator: re-deriving a decision after a conflict or a restart gives the same
``nextAttemptAt``, and a fixed seed and clock make every delay reproducible.
"""

from __future__ import annotations

import hashlib
import math

from agentrun.api.models import Backoff

DEFAULT_BACKOFF = Backoff()
JITTER = 0.2
"""Delays vary by up to this fraction below the nominal value (spreads retry storms)."""


def jitter_fraction(seed: int, run_uid: str, step: str, attempt: int) -> float:
    """A number in [0, 1) fixed by its inputs."""
    digest = hashlib.sha256(f"{seed}:{run_uid}:{step}:{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def backoff_seconds(
    policy: Backoff | None, failed_attempt: int, *, seed: int, run_uid: str, step: str
) -> int:
    """Seconds to wait after attempt ``failed_attempt`` (1-based) failed, jitter included."""
    policy = policy or DEFAULT_BACKOFF
    nominal = policy.initial_seconds * policy.factor ** max(failed_attempt - 1, 0)
    capped = min(float(policy.max_seconds), nominal)
    fraction = jitter_fraction(seed, run_uid, step, failed_attempt)
    return math.ceil(capped * (1.0 - JITTER * fraction))
