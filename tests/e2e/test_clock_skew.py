"""The operator's wall clock minutes ahead of the API server's, or behind it (libfaketime,
installed by hack/faketime-up.sh), while runs use every timer the operator keeps: a run
deadline that must not pass, one that must, a retry's backoff, an approval given within its
timeout and one never given, and retention after the run ends (docs/design.md, "Clocks").

The operator measures each of these on its own clock from a timestamp it wrote itself, so a
steady skew moves nothing: a deadline or an approval's timeout neither fires minutes early nor
minutes late, a backoff of a second stays a second. The checks are of that kind: a deadline
or a timeout passes no earlier than its length after the run was made (by this test's clock),
and everything ends within the waits' timeouts, well under the skew (a timer read against
the API server's timestamps would be four minutes off). No timing is asserted beyond that.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentrun_devcluster.testing import KubeClients, wait_for
from tests.support.cluster import Kubectl, StartOperator
from tests.support.paths import REPO_ROOT
from tests.support.runs import (
    agentrun,
    condition,
    create,
    envelope,
    gone,
    patch_spec,
    status_of,
    step,
    step_status,
    timestamp,
)
from tests.support.waiting import wait_phase, wait_step_phase

pytestmark = pytest.mark.e2e

UNAVAILABLE = 3
"""hack/faketime-up.sh's exit code for "libfaketime cannot be had here"."""
SKEWS = {"+4m": 240, "-4m": -240}
"""Less than the local cluster's certificates allow (valid from five minutes before they were
made), so that TLS still works behind."""
DEADLINE_SECONDS = 8
RETRY = {"limit": 2, "backoff": {"initialSeconds": 1, "factor": 1, "maxSeconds": 2}}
RETENTION_SECONDS = 15
EXPIRY_SECONDS = 10
RESOLUTION = 1
"""Status timestamps have whole seconds (as metav1.Time): a timer counted from one fires up to
this much before its length counted from the real moment. The skews are minutes."""
WAIT = 90
"""Seconds each run may take to get where it must: well under the skew."""


@pytest.fixture(scope="session")
def faketime_library() -> Iterator[str]:
    script = REPO_ROOT / "hack" / "faketime-up.sh"
    done = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=1200, check=False
    )
    if done.returncode == UNAVAILABLE:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, f"{script} failed ({done.returncode}):\n{done.stderr}"
    yield done.stdout.strip()


@pytest.fixture(params=list(SKEWS))
def skew(
    request: pytest.FixtureRequest, start_operator: StartOperator, faketime_library: str
) -> int:
    """An operator whose wall clock is that far off; the skew in seconds."""
    env = {
        "LD_PRELOAD": faketime_library,
        "FAKETIME": str(request.param),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    start_operator(env=env)
    return SKEWS[str(request.param)]


def _approval(step_name: str, args_hash: str) -> dict[str, Any]:
    return {"step": step_name, "decision": "approve", "argsHash": args_hash, "by": "admin",
            "reason": "looked at it"}  # fmt: skip


def test_a_skewed_clock_moves_no_deadline_backoff_approval_expiry_or_retention(
    kube: KubeClients, kubectl: Kubectl, namespace: str, skew: int
) -> None:
    flaky = 'if [ "$AGENTRUN_ATTEMPT" = 1 ]; then exit 1; fi; ' + envelope("second time")
    made = time.monotonic()
    create(kube, namespace, agentrun("late", [step("forever", "sleep 300")],
                                     budget={"maxWallTimeSeconds": DEADLINE_SECONDS}))  # fmt: skip
    create(
        kube,
        namespace,
        agentrun(
            "kept",
            [step("a", "sleep 2; " + envelope("a")), step("b", envelope("b"), after=["a"])],
            budget={"maxWallTimeSeconds": 120},
            retention={"ttlSecondsAfterFinished": RETENTION_SECONDS},
        ),
    )
    create(kube, namespace, agentrun("retried", [step("flaky", flaky, retry=RETRY)]))
    create(
        kube,
        namespace,
        agentrun(
            "unanswered",
            [step("deploy", envelope("deployed"), approval="required")],
            policy={"approvalTimeoutSeconds": EXPIRY_SECONDS},
        ),
    )
    create(
        kube,
        namespace,
        agentrun(
            "gated",
            [step("deploy", envelope("deployed"), approval="required")],
            policy={"approvalTimeoutSeconds": 60},
        ),
    )

    # The run within its deadline succeeds.
    kept = wait_phase(kube, namespace, "kept", "Succeeded", timeout=WAIT)
    assert [step_status(kept, n)["summary"] for n in ("a", "b")] == ["a", "b"]
    finished = time.monotonic()
    # The operator's clock is off as meant: it stamped the run's start that far from the API
    # server's stamp of its creation.
    off = timestamp(status_of(kept)["startedAt"]) - timestamp(kept["metadata"]["creationTimestamp"])
    assert abs(off.total_seconds() - skew) < 30, f"the operator's clock is {off} off, not {skew}s"

    # The gate waits; approved, its step runs (no expiry read against another clock).
    waiting = wait_step_phase(kube, namespace, "gated", "deploy", "WaitingForApproval")
    args_hash = step_status(waiting, "deploy")["argsHash"]
    patch_spec(kubectl, namespace, "gated", approvals=[_approval("deploy", args_hash)])
    gated = wait_phase(kube, namespace, "gated", "Succeeded", timeout=WAIT)
    assert step_status(gated, "deploy")["decidedBy"] == "admin"

    # An approval nobody gives expires, no earlier than its timeout after the run was made
    # (less the second that whole-second status timestamps may take off: the pass that stamps
    # approvalRequestedAt and the one that expires it each read a now floored to the second).
    unanswered = wait_phase(kube, namespace, "unanswered", "Failed", timeout=WAIT)
    assert time.monotonic() - made >= EXPIRY_SECONDS - RESOLUTION
    assert "ApprovalExpired" in json.dumps(status_of(unanswered)), status_of(unanswered)

    # The retry waits its second of backoff, not minutes.
    retried = wait_phase(kube, namespace, "retried", "Succeeded", timeout=WAIT)
    assert step_status(retried, "flaky")["attempt"] == 2

    # The deadline passes, no earlier than its length after the run was made (as above).
    late = wait_phase(kube, namespace, "late", "Failed", timeout=WAIT)
    assert time.monotonic() - made >= DEADLINE_SECONDS - RESOLUTION
    assert condition(late)["reason"] == "DeadlineExceeded", status_of(late)

    # The run that succeeded goes once its retention is over, not before.
    wait_for("the finished run to be deleted after its retention", lambda: gone(
        kube, namespace, "kept"), timeout=WAIT)  # fmt: skip
    assert time.monotonic() - finished >= RETENTION_SECONDS - 2  # its end was seen late by <2 s
