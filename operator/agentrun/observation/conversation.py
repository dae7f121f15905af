"""Reading the conversation an agent run continues (``spec.agent.resumeFrom``) from the run it
names, for the core (:class:`agentrun.core.ResumeSource`).

The checks are :mod:`agentrun.core.resume`'s; this module makes the reads in their order:

1. a LocalSubjectAccessReview: may the run's creator ``get`` the source run? (before anything
   of it is read, so a refusal says nothing about it);
2. the source run, by name in the run's own namespace: its uid, that it is an agent run that
   closed the turn, and the digest of its newest context from its status;
3. its context ConfigMaps from the newest back to the one after the turn, each checked against
   the digest the one after it names (the newest against status); after the turn the source
   answered in (a follow-up question), its newest context, which that turn saw, and its answer
   (inline in its status, else the transcript record its status names, checked against the
   answer's digest in status);
4. a LocalSubjectAccessReview: may the creator ``get`` the ConfigMaps whose messages the run
   takes?

Read on every pass until the run's first turn has taken the conversation, then never again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from agentrun.access import authz
from agentrun.api import models as m
from agentrun.core import ResumeSource, rights
from agentrun.core import resume as checks
from agentrun.kubeapi import tolerate

log = logging.getLogger("agentrun.resume")

PURPOSE = "a run continues another's conversation only with its creator's rights to read it"

ReadRun = Callable[[str, str], m.AgentRun | None]
"""(namespace, name) -> the run, None when there is none (or it cannot be read as one)."""


def read_source(
    run: m.AgentRun, core_api: Any, read_run: ReadRun, authorizer: authz.Authorizer
) -> ResumeSource | None:
    """What ``run``'s ``spec.agent.resumeFrom`` names, read and verified; None when the run
    does not need it (no resumeFrom, or its first turn has taken it)."""
    resume = checks.wanted(run)
    if resume is None:
        return None
    namespace = run.metadata.namespace
    found = ResumeSource(run=f"{namespace}/{resume.run}", uid=resume.uid, turn=resume.turn)

    def refused(problem: str) -> ResumeSource:
        log.info("cannot continue %s: %s", found.run, problem,
                 extra={"agentrun": {"run": f"{namespace}/{run.metadata.name}"}})  # fmt: skip
        return ResumeSource(found.run, found.uid, found.turn, problem=problem)

    source_check = rights.Check("get", m.PLURAL, resume.run, "spec.agent.resumeFrom", group=m.GROUP)
    denied = authorizer.denied(run, [source_check], PURPOSE)
    if denied is not None:
        return refused(denied)
    source = read_run(namespace, resume.run)
    problem = checks.source_problem(run, resume, source)
    if problem is not None or source is None:
        return refused(problem or "the run cannot be read")
    turn, digest = checks.anchor(source)
    wanted = checks.context_turn(source, resume.turn)
    while True:
        name = checks.context_map(source, turn, digest)
        verified = checks.verified_document(_config_map(core_api, namespace, name), source,
                                            turn, digest)  # fmt: skip
        if isinstance(verified, str):
            return refused(verified)
        document, doc = verified
        if turn == wanted:
            break
        link = checks.previous_link(doc, turn, source)
        if isinstance(link, str):
            return refused(link)
        turn, digest = link
    map_checks = [rights.Check("get", "configmaps", name, f"the context of {found.run}")]
    answer: tuple[str, str] | None = None
    if wanted == resume.turn:  # after its answer: the answer follows that context
        answer_map = checks.answer_map(source)
        read = _config_map(core_api, namespace, answer_map) if answer_map is not None else None
        said = checks.verified_answer(source, read)
        if isinstance(said, str):
            return refused(said)
        answer = said
        if answer_map is not None:
            map_checks.append(rights.Check("get", "configmaps", answer_map,
                                           f"the answer of {found.run}"))  # fmt: skip
    denied = authorizer.denied(run, map_checks, PURPOSE)
    if denied is not None:
        return refused(denied)
    return ResumeSource(
        found.run,
        found.uid,
        found.turn,
        document=document,
        digest=digest,
        earlier_turns=checks.earlier_turns(source),
        answer=answer[0] if answer is not None else None,
        answer_digest=answer[1] if answer is not None else None,
    )


def _config_map(core_api: Any, namespace: str, name: str) -> dict[str, Any] | None:
    """A ConfigMap as plain JSON (metadata included), None when there is none."""
    with tolerate(404) as missing:
        response = core_api.read_namespaced_config_map(name, namespace, _preload_content=False)
    if missing:
        return None
    body: dict[str, Any] = json.loads(response.data)
    return body
