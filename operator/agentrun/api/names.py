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

# Why a model turn failed (``agentrun step llm``): the reason of its step's error and Warning
# Events, and of the run's condition when no retry is left. The turn's pod begins its one-line
# termination message with it (``ModelUnreachable: the model endpoint ...``); the operator
# takes it from a model turn's message only, and only when it is one of these.
TURN_MODEL_UNREACHABLE = "ModelUnreachable"
"""The endpoint could not be reached (connection refused, no such host, TLS)."""
TURN_MODEL_TIMEOUT = "ModelTimeout"
"""The endpoint did not answer in time."""
TURN_MODEL_ERROR_STATUS = "ModelErrorStatus"
"""The endpoint answered an HTTP error status (4xx or 5xx)."""
TURN_MODEL_EMPTY_ANSWER = "ModelEmptyAnswer"
"""The endpoint answered 200 with an empty body."""
TURN_MODEL_ANSWER_NOT_UTF8 = "ModelAnswerNotUTF8"
"""The body of its answer is not UTF-8 text."""
TURN_MODEL_ANSWER_NOT_JSON = "ModelAnswerNotJSON"
"""The body of its answer is not JSON (an HTML error page, a cut-off body)."""
TURN_MODEL_ANSWER_INVALID = "ModelAnswerInvalid"
"""The body is JSON, but not a chat completion (no choices, a message that is not one)."""
TURN_MODEL_USAGE_INVALID = "ModelUsageInvalid"
"""The answer's usage has a token count that is negative or not a number."""
TURN_TOOL_CHOICE_IGNORED = "ToolChoiceIgnored"
"""toolChoice is required or names a tool, and the answer has no call, or another tool's."""
TURN_MODEL_API_KEY_INVALID = "ModelAPIKeyInvalid"
"""The API key cannot be sent in an HTTP header (a line break, a character not ASCII)."""
TURN_MODEL_SETTINGS_INVALID = "ModelSettingsInvalid"
"""The turn's model settings (endpoint, name, numbers) are missing or not numbers."""
TURN_CONTEXT_INVALID = "TurnContextInvalid"
"""The turn's context is missing, or does not match the digest the operator committed."""
TURN_REQUEST_MISSING = "TurnRequestMissing"
"""No request for the turn reached its pod while it waited."""
TURN_OUTPUT_TOO_LARGE = "TurnOutputTooLarge"
"""The turn's output is larger than a turn may return, or than its pod can hand back."""
TURN_FAILED = "TurnFailed"
"""Anything else (the message names the error)."""
TURN_FAILURES = (
    TURN_MODEL_UNREACHABLE,
    TURN_MODEL_TIMEOUT,
    TURN_MODEL_ERROR_STATUS,
    TURN_MODEL_EMPTY_ANSWER,
    TURN_MODEL_ANSWER_NOT_UTF8,
    TURN_MODEL_ANSWER_NOT_JSON,
    TURN_MODEL_ANSWER_INVALID,
    TURN_MODEL_USAGE_INVALID,
    TURN_TOOL_CHOICE_IGNORED,
    TURN_MODEL_API_KEY_INVALID,
    TURN_MODEL_SETTINGS_INVALID,
    TURN_CONTEXT_INVALID,
    TURN_REQUEST_MISSING,
    TURN_OUTPUT_TOO_LARGE,
    TURN_FAILED,
)
"""Every reason a model turn's pod may fail its attempt with (besides ResultTampered)."""
