"""Deterministic names, keys and hashes."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from agentrun.core import naming

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
names = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)


@given(run=names, uid=st.uuids(), step=names, attempt=st.integers(1, 10_000))
def test_job_names_are_dns_labels_and_deterministic(
    run: str, uid: object, step: str, attempt: int
) -> None:
    name = naming.job_name(run, str(uid), step, attempt)
    assert len(name) <= 63 and DNS_LABEL.match(name), name
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
    assert name.startswith("investigate-latency-of-the-checkout-servi")
    assert len(name) <= 63


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
