"""Deterministic names, keys and hashes."""

from __future__ import annotations

import re

import yaml
from hypothesis import given
from hypothesis import strategies as st

from agentrun.core import naming
from tests.support.paths import ADMISSION_DIR

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
names = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)

# What the API server's SimpleNameGenerator appends to a generateName (k8s.io/apimachinery
# util/rand's alphanums: no vowels, no 0, 1 or 3), and the longest generateName it keeps
# (MaxGeneratedNameLength: 63 - 5).
RANDOM_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
MAX_GENERATED_NAME = 58
random_suffixes = st.text(alphabet=RANDOM_ALPHABET, min_size=5, max_size=5)


def job_pod_name(job: str, random: str) -> str:
    """The name the Job controller gives a pod of (non-indexed) Job ``job``: generateName
    ``job + "-"`` (getPodsPrefix), cut by the API server to 58 characters, plus 5 random."""
    return f"{job}-"[:MAX_GENERATED_NAME] + random


def pod_doors_pattern() -> re.Pattern[str]:
    """The regex the agentrun-pod-doors policy matches ``request.name`` with, read from the
    shipped YAML (CEL's ``matches`` is RE2's partial match: :meth:`re.Pattern.search`)."""
    docs = yaml.safe_load_all((ADMISSION_DIR / "pod-doors-policy.yaml").read_text())
    [policy] = [d for d in docs if d and d["kind"] == "ValidatingAdmissionPolicy"]
    [condition] = [
        c for c in policy["spec"]["matchConditions"] if c["name"] == "step-or-executor-pod"
    ]
    found = re.fullmatch(r"request\.name\.matches\('([^']+)'\)", condition["expression"].strip())
    assert found, condition["expression"]
    return re.compile(found.group(1))


POD_DOORS = pod_doors_pattern()


@given(run=names, uid=st.uuids(), step=names, attempt=st.integers(1, 10_000))
def test_job_names_are_dns_labels_and_deterministic(
    run: str, uid: object, step: str, attempt: int
) -> None:
    name = naming.job_name(run, str(uid), step, attempt)
    assert len(name) <= naming.MAX_JOB_NAME == 57 and DNS_LABEL.match(name), name
    assert name == naming.job_name(run, str(uid), step, attempt)
    assert name.endswith(f"-{attempt}")
    ref = naming.result_object_name(run, str(uid), step, attempt)
    assert len(ref) <= 63 and DNS_LABEL.match(ref) and ref != name


@given(uid=st.uuids(), step=names, a=st.integers(1, 50), b=st.integers(1, 50))
def test_job_names_differ_per_attempt_and_run(uid: object, step: str, a: int, b: int) -> None:
    if a != b:
        assert naming.job_name("r", str(uid), step, a) != naming.job_name("r", str(uid), step, b)
    other = "00000000-0000-0000-0000-000000000000"
    if str(uid) != other:
        assert naming.job_name("r", str(uid), step, a) != naming.job_name("r", other, step, a)


def test_long_names_keep_a_readable_prefix() -> None:
    name = naming.job_name("investigate-latency-of-the-checkout-service", "u", "collect", 3)
    assert name.startswith("investigate-latency-of-the-checkout-service-")
    assert re.fullmatch(r"investigate-latency-of-the-checkout-service-[0-9a-f]{10}-3", name)
    assert len(name) <= naming.MAX_JOB_NAME


def test_dns_label_takes_a_length() -> None:
    assert naming.dns_label("a" * 80, "suffix") == "a" * 56 + "-suffix"
    assert naming.dns_label("a" * 80, "suffix", 20) == "a" * 13 + "-suffix"
    assert naming.dns_label("abc--", "suffix", 11) == "abc-suffix"


@given(
    run=names,
    uid=st.uuids(),
    step=names,
    attempt=st.integers(1, 10_000),
    random=random_suffixes,
)
def test_every_step_jobs_pod_is_named_as_the_pod_doors_policy_knows_it(
    run: str, uid: object, step: str, attempt: int, random: str
) -> None:
    """The pods the Job controller makes of a step or executor Job keep the Job's whole name
    (at most 57 characters), whose ``-<hash>-<attempt>`` the policy recognises."""
    job = naming.job_name(run, str(uid), step, attempt)
    pod = job_pod_name(job, random)
    assert pod == f"{job}-{random}" and len(pod) <= 63, pod
    assert POD_DOORS.search(pod), pod
    # A proxy request names it with a port, and a scheme: still the step's pod.
    assert POD_DOORS.search(f"{pod}:8080") and POD_DOORS.search(f"https:{pod}:http"), pod


def test_a_job_name_of_58_characters_or_more_would_lose_its_attempt() -> None:
    """Why MAX_JOB_NAME: one character more, and the pod's name lacks the dash (or more)."""
    job = "r" * 45 + "-0123456789-1"
    assert len(job) == 58
    assert not POD_DOORS.search(job_pod_name(job, "x2k4p"))
    assert POD_DOORS.search(job_pod_name(job[1:], "x2k4p"))


def replicaset_hash(value: int) -> str:
    """A Deployment's pod-template-hash: ``rand.SafeEncodeString(fmt.Sprint(hash))``, each
    decimal digit mapped into the random alphabet (to 4-9, b, c, d, f: all hex digits)."""
    return "".join(RANDOM_ALPHABET[ord(ch) % len(RANDOM_ALPHABET)] for ch in str(value))


@given(
    deployment=st.from_regex(r"[a-z]([-a-z0-9]{0,30}[a-z0-9])?", fullmatch=True),
    value=st.integers(0, 2**32 - 1),
    random=random_suffixes,
)
def test_a_deployments_pods_are_not_taken_for_step_pods(
    deployment: str, value: int, random: str
) -> None:
    """``<deployment>-<hash>-<random>``: the hash may be 10 hex-looking characters, but no
    ``-<digits>-`` follows it. (A Deployment whose own name ends in ``-<10 hex>`` and whose hash
    is all digits would match: such names are left out here, and the policy's comment says so.)"""
    if re.search(r"(^|-)[0-9a-f]{10}$", deployment):
        return
    pod = job_pod_name(f"{deployment}-{replicaset_hash(value)}", random)
    assert not POD_DOORS.search(pod), pod


def test_ordinary_pod_names_are_not_taken_for_step_pods() -> None:
    assert replicaset_hash(3_859_462_718) == "7d9f8b6c5d"  # hex-looking, as in the name below
    for pod in (
        "web-7d9f8b6c5d-x2k4p",  # a Deployment's pod
        "web-7d9f8b6c5d-x2k4p-1",
        "coredns-5d78c9869d-4kq2z",
        "db-0",  # a StatefulSet's
        "backup-28912345-x2k4p",  # a CronJob's Job's pod
        "migrate-x2k4p",  # an ordinary Job's pod
        "migrate-0-x2k4p",  # an Indexed Job's
        "agentrun-operator-6b8f7c9d4f-x2k4p",
        "busybox",
        "0123456789-1-x2k4p-",
        "0123456789a-1-x2k4p",  # 11 hex characters before the attempt
        "r-0123456789-0-x2k4p",  # attempts start at 1
        "r-0123456789-1-x2k4pp",
        "r-0123456789-1-x2k4a",  # "a" is never random
    ):
        assert not POD_DOORS.search(pod), pod
    for pod in ("r-0123456789-1-x2k4p", "0123456789-12-bbbbb", "a-b-abcdef0123-7-99999"):
        assert POD_DOORS.search(pod), pod


def test_args_hash_depends_on_everything_that_decides_the_action() -> None:
    base = naming.args_hash("img", ["sh"], ["-c", "x"], [{"name": "A", "value": "1"}], {"I": "d"})
    assert len(base) == 64
    assert base == naming.args_hash(
        "img", ["sh"], ["-c", "x"], [{"value": "1", "name": "A"}], {"I": "d"}
    )
    assert base != naming.args_hash(
        "img2", ["sh"], ["-c", "x"], [{"name": "A", "value": "1"}], {"I": "d"}
    )
    assert base != naming.args_hash(
        "img", ["sh"], ["-c", "y"], [{"name": "A", "value": "1"}], {"I": "d"}
    )
    assert base != naming.args_hash(
        "img", ["sh"], ["-c", "x"], [{"name": "A", "value": "2"}], {"I": "d"}
    )
    assert base != naming.args_hash(
        "img", ["sh"], ["-c", "x"], [{"name": "A", "value": "1"}], {"I": "e"}
    )


def test_idempotency_key_shape() -> None:
    assert naming.idempotency_key("uid", "deploy", "img:1", "ab") == "uid:deploy:img:1:ab"
