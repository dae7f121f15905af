"""The API's names and the few limits that programs outside the operator read too.

Plain constants, no imports: a step's pod (``agentrun step``) reads them without loading the
models and their validation (:mod:`agentrun.api.models` re-exports each of them).
"""

from __future__ import annotations

GROUP = "agentrun.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "AgentRun"
PLURAL = "agentruns"
SINGULAR = "agentrun"
SHORT_NAMES = ("ar",)
CATEGORIES = ("agentrun",)

MAX_FIELD_KEY = 240
"""Longest field name of a JSON result kept as its own ConfigMap key (``field.<name>``)."""

TOOL_CHOICE_MODES = ("auto", "none", "required")
"""The values of toolChoice that are not a tool's name (a tool may not be named like them)."""
