"""Inputs by reference, bound where a step's Job is built.

A result too large for status lives in a ConfigMap, and anyone who may edit ConfigMaps in the
namespace can change it, or delete it and create another under its name, after its digest was
committed (and approved: the args hash covers it). A Job that let kubelet read such an input
(``valueFrom.configMapKeyRef``) would run whatever the ConfigMap holds when the pod starts. So
the input is bound here: the ConfigMap is read, its content checked against the digest
committed in status (and its owner against the run's uid), and the verified bytes go into the
Job as the variable's value; an entry of one field is derived from the verified result, never
read from the object's other entries. What cannot be verified is not passed on: the attempt
fails (reason ResultTampered).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from agentrun.api import models as m
from agentrun.core import CreateJob
from agentrun.execution import objects

ReadConfigMap = Callable[[str, str], Mapping[str, Any] | None]
"""``read(namespace, name)``: the ConfigMap as stored now (the API's JSON), None when absent."""


def committed_digests(run: m.AgentRun) -> dict[str, str | None]:
    """ConfigMap name -> digest committed for it, for every step result kept by reference."""
    steps = (run.status.steps if run.status else None) or []
    return {st.result_ref.name: st.result_digest for st in steps if st.result_ref is not None}


def bind_inputs(run: m.AgentRun, action: CreateJob, read: ReadConfigMap) -> CreateJob | str:
    """``action`` with each input taken from a step's result by reference replaced by its
    verified value; or why an input cannot be passed on."""
    digests = committed_digests(run)
    if not digests:
        return action
    env: list[m.EnvVar] = []
    for var in action.input_env:
        ref = var.value_from.config_map_key_ref if var.value_from else None
        if ref is None or ref.name not in digests:
            env.append(var)
            continue
        found = read(run.metadata.namespace, ref.name)
        if found is None:
            return (
                f"input {var.name} of step {action.step.name}: the result object {ref.name} is "
                "gone, so it was not passed on"
            )
        problem = objects.result_problem(run.metadata.uid, found, digests[ref.name])
        if problem is not None:
            return f"input {var.name} of step {action.step.name}: {problem}; it was not passed on"
        value = objects.result_entry(str((found.get("data") or {}).get("result")), ref.key)
        if value is None:
            return (
                f"input {var.name} of step {action.step.name}: the result in {ref.name} has no "
                f"entry {ref.key}"
            )
        # Not validated as a spec's variable is (at most 4 KiB): a result by reference is
        # larger by definition, and it is verified above.
        env.append(m.EnvVar.model_construct(name=var.name, value=value, value_from=None))
    return dataclasses.replace(action, input_env=tuple(env))
