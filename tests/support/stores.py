"""An in-memory result store for the step runner's unit tests; the real one
(:class:`agentrun.pod.runner.ResultStore`) is exercised against the API server in tests/e2e."""

from __future__ import annotations

from typing import Any

from agentrun.pod import runner


class FakeStore(runner.ResultStore):
    """In memory; the real one is exercised against the API server in tests/e2e."""

    def __init__(self, identity: runner.StepIdentity) -> None:
        super().__init__(None, identity)
        self.objects: dict[str, dict[str, Any]] = {}

    def store(self, result: str, summary: str, *, fields: bool = True) -> dict[str, Any]:
        name = f"{self.identity.step}-{self.identity.attempt}"
        self.objects[name] = {
            "result": result,
            "summary": summary,
            "key": self.identity.key_hash,
            "fields": fields,
        }
        return {"name": name, "key": "result"}
