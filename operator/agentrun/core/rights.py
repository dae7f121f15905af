"""The permissions a step uses on its creator's behalf (what :mod:`agentrun.access.authz`
reviews before the step is launched).

Pure: the shell asks the API server whether the creator has each (a LocalSubjectAccessReview)
and tells the core the answers (:attr:`agentrun.core.Observed.refusals` and
:attr:`~agentrun.core.Observed.granted`); the core computes the same list for a step of the
loop it makes in a pass, to launch it in that pass when every permission is among those the
shell found granted (:func:`agentrun.core.turns.rights_confirmed`).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrun.api import models as m

Permission = tuple[str, str, str]
"""(verb, resource with its group, name)."""


@dataclass(frozen=True)
class Check:
    """One permission a step needs its creator to have, in the run's namespace."""

    verb: str
    resource: str
    name: str
    source: str
    """Where the step asks for it, for the message (e.g. ``env DB_PASSWORD``)."""
    group: str = ""
    """The resource's API group ("" for the core group)."""

    @property
    def permission(self) -> Permission:
        resource = f"{self.resource}.{self.group}" if self.group else self.resource
        return (self.verb, resource, self.name)

    def describe(self) -> str:
        return f"{self.verb} {self.permission[1]}/{self.name}"


def checks_for(run: m.AgentRun, step: m.Step) -> list[Check]:
    """The permissions launching ``step`` uses on the creator's behalf, each once, in the order
    the step names them (env, then the ServiceAccount)."""
    found: dict[Permission, Check] = {}
    for env in step.container.env or []:
        source = env.value_from
        if source is None:
            continue
        if source.secret_key_ref is not None:
            check = Check("get", "secrets", source.secret_key_ref.name, f"env {env.name}")
            found.setdefault(check.permission, check)
        if source.config_map_key_ref is not None:
            check = Check("get", "configmaps", source.config_map_key_ref.name, f"env {env.name}")
            found.setdefault(check.permission, check)
    template = run.spec.step_template
    if template is not None and template.service_account_name:
        name = template.service_account_name
        check = Check("impersonate", "serviceaccounts", name, "stepTemplate.serviceAccountName")
        found.setdefault(check.permission, check)
    return list(found.values())
