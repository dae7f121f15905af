"""The copy of a run's status that a pass changes: its steps share their values with the
status read, so every value a step holds must be immutable or copied with the step."""

from __future__ import annotations

import types
import typing
from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel

from agentrun.api import models as m
from agentrun.core import machine
from tests.support.sim import T0

IMMUTABLE = (str, int, bool, float, datetime, type(None))


def _leaf_types(annotation: Any) -> list[Any]:
    """The types a field annotated ``annotation`` may hold (``Annotated`` and unions opened)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _leaf_types(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _leaf_types(arg)]
    return [annotation]


def _immutable(kind: Any) -> bool:
    return isinstance(kind, type) and (issubclass(kind, IMMUTABLE) or issubclass(kind, Enum))


def test_every_field_of_a_step_status_is_immutable_or_a_model_copied_with_the_step() -> None:
    for name, field in m.StepStatus.model_fields.items():
        for kind in _leaf_types(field.annotation):
            if _immutable(kind):
                continue
            assert isinstance(kind, type) and issubclass(kind, BaseModel), (name, kind)
            assert name in machine._STEP_MODELS, f"StepStatus.{name} holds {kind}: copy it"
            for inner, inner_field in kind.model_fields.items():
                kinds = _leaf_types(inner_field.annotation)
                assert all(_immutable(k) for k in kinds), (name, inner, kinds)


def test_the_models_a_step_copy_copies_have_no_extra_fields_nor_private_attributes() -> None:
    # machine._shallow copies a model's fields and the set of those set, nothing else.
    for model in (m.StepStatus, m.StepError, m.StepUsage, m.ResultRef):
        assert model.model_config.get("extra") == "forbid", model
        assert not model.__private_attributes__, model


def _status() -> m.AgentRunStatus:
    return m.AgentRunStatus(
        phase=m.RunPhase.RUNNING,
        steps=[
            m.StepStatus(
                name="a",
                phase=m.StepPhase.FAILED,
                attempt=2,
                started_at=T0,
                error=m.StepError(reason="Crashed", message="exit 1", exit_code=1),
                usage=m.StepUsage(tokens=5),
                result_ref=m.ResultRef(name="cm", key="k"),
            ),
            m.StepStatus(name="b", phase=m.StepPhase.PENDING),
        ],
    )


def test_changing_the_copy_leaves_the_status_read_as_it_was() -> None:
    read = _status()
    before = read.model_dump()
    copy = machine._copy_status(read)
    assert copy == read
    assert copy.steps is not None
    a, b = copy.steps
    a.phase, a.attempt, b.job_name = m.StepPhase.RUNNING, 3, "job-b"
    assert a.error is not None and a.usage is not None and a.result_ref is not None
    a.error.reason, a.usage.tokens, a.result_ref.key = "BudgetExceeded", 9, "other"
    copy.steps.append(m.StepStatus(name="c", phase=m.StepPhase.PENDING))
    assert read.model_dump() == before
    assert copy != read
    # Each copy has its own set of the fields set.
    assert read.steps is not None
    assert b.model_fields_set == {"name", "phase", "job_name"}
    assert read.steps[1].model_fields_set == {"name", "phase"}


def test_a_step_left_alone_compares_equal_to_the_one_read() -> None:
    read = _status()
    copy = machine._copy_status(read)
    assert copy.steps is not None and read.steps is not None
    assert [st.to_wire() for st in copy.steps] == [st.to_wire() for st in read.steps]
