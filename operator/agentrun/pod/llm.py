"""``agentrun step llm``: one model turn of an agent run, inside its step's pod.

The operator runs it as the step ``t{turn}-model`` in its own image. It

1. reads the context the operator assembled for the turn: the parts of the context document
   in ``AGENTRUN_CONTEXT_PART_0`` ... (environment variables taken from a ConfigMap of the
   run), checked against ``AGENTRUN_CONTEXT_SHA256`` (see :mod:`agentrun.core.context`);
2. calls the model once with the official ``openai`` client: ``OpenAI(base_url=
   $AGENTRUN_MODEL_BASE_URL, api_key=$AGENTRUN_MODEL_API_KEY)``,
   ``chat.completions.create(model=..., messages=..., tools=..., max_tokens=...)``, with no
   retries of its own (retries are the operator's: ``spec.agent.model.retry``);
3. writes the turn's output as the step's result envelope, as ``agentrun step --`` does: the
   assistant message's content, the proposed tool calls (id, name, arguments), the finish
   reason and the token usage (``usage.tokens``: prompt plus completion, which the token budget
   counts). An envelope too large for the termination message goes to a ConfigMap of the run
   (the pod's ServiceAccount must be allowed to create one, as for ``agentrun step --``).

It never runs a tool: the operator validates the proposed calls and runs them as steps.

A turn fails (exit code 1, with a one-line reason as the termination message) when the context
cannot be read, the endpoint cannot be reached, answers with an error status, or answers with
something that is not a chat completion. The API key is never printed.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentrun import settings as s
from agentrun.core import agent_loop as loop
from agentrun.core import context as cx
from agentrun.core import naming
from agentrun.pod import runner

NO_KEY = "none"
"""Sent as the API key when the run names none (a local server that checks nothing)."""
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 600.0


class TurnFailed(Exception):
    """The turn cannot produce an output; the message says why, in one line."""


def read_context(env: Mapping[str, str]) -> cx.Context:
    """The context document from the environment, checked against its digest."""
    try:
        count = int(env.get(loop.ENV_CONTEXT_PARTS, ""))
    except ValueError:
        raise TurnFailed(
            f"{loop.ENV_CONTEXT_PARTS} is not set: this command runs as a model turn of an "
            "agent run, which the operator starts"
        ) from None
    parts = []
    for i in range(count):
        name = f"{loop.ENV_CONTEXT_PART}{i}"
        if name not in env:
            raise TurnFailed(f"{name} (part {i + 1} of {count} of the context) is not set")
        parts.append(env[name])
    text = "".join(parts)
    expected = env.get(loop.ENV_CONTEXT_SHA256, "")
    if naming.sha256_text(text) != expected:
        raise TurnFailed(
            "the context does not match the digest the operator committed "
            f"({expected[:12] or 'none'}): its ConfigMap was changed"
        )
    doc = cx.Context.from_parts(parts)
    if isinstance(doc, str):
        raise TurnFailed(doc)
    return doc


def _settings(env: Mapping[str, str]) -> tuple[str, str, int, float | None]:
    base_url = env.get(loop.ENV_MODEL_BASE_URL, "")
    model = env.get(loop.ENV_MODEL_NAME, "")
    if not base_url or not model:
        raise TurnFailed(f"{loop.ENV_MODEL_BASE_URL} and {loop.ENV_MODEL_NAME} must be set")
    try:
        max_tokens = int(env.get(loop.ENV_MODEL_MAX_OUTPUT_TOKENS, "1024"))
        raw_temperature = env.get(loop.ENV_MODEL_TEMPERATURE)
        temperature = float(raw_temperature) if raw_temperature else None
    except ValueError as error:
        raise TurnFailed(f"a model setting is not a number: {error}") from None
    return base_url, model, max_tokens, temperature


def default_client(base_url: str, api_key: str) -> Any:
    """The official client, without retries of its own."""
    import httpx
    from openai import OpenAI

    return OpenAI(
        base_url=base_url,
        api_key=api_key,
        max_retries=0,
        timeout=httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT),
    )


def call_model(
    env: Mapping[str, str],
    context: cx.Context,
    client_factory: Callable[[str, str], Any] = default_client,
) -> cx.Output:
    """One chat completion for ``context``; its output, or :class:`TurnFailed`."""
    import openai

    base_url, model, max_tokens, temperature = _settings(env)
    client = client_factory(base_url, env.get(loop.ENV_MODEL_API_KEY) or NO_KEY)
    request: dict[str, Any] = {
        "model": model,
        "messages": [cx.sendable(m) for m in context.messages],
        "max_tokens": max_tokens,
    }
    if context.tools:
        request["tools"] = context.tools
    if temperature is not None:
        request["temperature"] = temperature
    try:
        response = client.chat.completions.create(**request)
    except openai.APITimeoutError:
        raise TurnFailed(f"the model endpoint {base_url} did not answer in time") from None
    except openai.APIConnectionError as error:
        cause = error.__cause__ or error
        raise TurnFailed(
            f"the model endpoint {base_url} cannot be reached: {_one_line(cause)}"
        ) from None
    except openai.APIStatusError as error:
        raise TurnFailed(
            f"the model endpoint {base_url} answered HTTP {error.status_code}: "
            f"{_one_line(_error_message(error))}"
        ) from None
    except openai.APIError as error:  # e.g. a body that is not JSON
        raise TurnFailed(
            f"the model endpoint {base_url} gave no chat completion: {_one_line(error)}"
        ) from None
    try:
        return _output(response)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as error:
        raise TurnFailed(
            f"the model endpoint {base_url} answered with something that is not a chat "
            f"completion ({type(error).__name__}: {_one_line(error)})"
        ) from None


def _error_message(error: Any) -> str:
    body = getattr(error, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
    return str(getattr(error, "message", "") or error)


def _one_line(value: object, limit: int = 300) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _output(response: Any) -> cx.Output:
    """The turn's output from a ChatCompletion (strictly: anything else raises)."""
    if isinstance(response, str | bytes):  # the client hands over a body it could not parse
        raise ValueError(f"the body is not JSON: {_one_line(response, 80)}")
    choices = response.choices
    if not isinstance(choices, list) or not choices:
        raise ValueError("it has no choices")
    choice = choices[0]
    message = choice.message
    content = message.content
    if content is not None and not isinstance(content, str):
        raise TypeError("the message's content is not text")
    calls: list[cx.ToolCall] = []
    for index, tool_call in enumerate(message.tool_calls or []):
        function = tool_call.function
        if not isinstance(function.name, str):
            raise TypeError(f"tool call {index} has no function name")
        arguments = function.arguments
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        calls.append(cx.ToolCall(str(tool_call.id or ""), function.name, arguments))
    usage = response.usage
    prompt = int(getattr(usage, "prompt_tokens", 0) or 0) if usage is not None else 0
    completion = int(getattr(usage, "completion_tokens", 0) or 0) if usage is not None else 0
    finish = choice.finish_reason
    return cx.Output(
        content=content or "",
        tool_calls=tuple(calls),
        finish_reason=str(finish) if finish is not None else None,
        prompt_tokens=max(prompt, 0),
        completion_tokens=max(completion, 0),
        model=str(response.model) if getattr(response, "model", None) else None,
    )


def envelope(output: cx.Output) -> dict[str, Any]:
    return {
        "ok": True,
        "summary": cx.output_summary(output),
        "result": cx.output_result(output),
        "usage": {"tokens": output.prompt_tokens + output.completion_tokens},
    }


def run_turn(
    env: dict[str, str] | None = None,
    client_factory: Callable[[str, str], Any] = default_client,
    store_factory: Callable[
        [runner.StepIdentity, dict[str, str]], runner.ResultStore | None
    ] = runner.default_store,
) -> int:
    """One model turn; its exit code."""
    env = dict(os.environ if env is None else env)
    termination = Path(env.get(s.ENV_TERMINATION_MESSAGE_PATH, "/dev/termination-log"))
    identity = runner.StepIdentity(env)
    store = store_factory(identity, env) if identity.complete() else None
    if store is not None and identity.idempotency_key:
        replay = store.previous()
        if replay is not None:  # this attempt's output was stored before its pod was lost
            termination.write_text(json.dumps(replay))
            return 0
    try:
        output = call_model(env, read_context(env), client_factory)
    except TurnFailed as failure:
        print(f"agentrun step llm: {failure}", file=sys.stderr)
        termination.write_text(str(failure)[: runner.TERMINATION_LIMIT])
        return 1
    body = envelope(output)
    text = json.dumps(body, separators=(",", ":"))
    if len(text.encode()) > runner.INLINE_LIMIT:
        full = naming.canonical_json(body["result"])
        if store is None:
            message = (
                f"the turn's output is {len(full.encode())} bytes, more than the termination "
                "message holds, and the pod has no API access to store it: give steps a "
                "ServiceAccount (stepTemplate.serviceAccountName) allowed to create ConfigMaps"
            )
            print(f"agentrun step llm: {message}", file=sys.stderr)
            termination.write_text(message)
            return 1
        try:
            ref = store.store(full, body["summary"])
        except runner.ResultTampered as error:  # never reference what the turn did not write
            print(f"agentrun step llm: {error}", file=sys.stderr)
            termination.write_text(str(error)[: runner.TERMINATION_LIMIT])
            return 1
        body = {
            "ok": True,
            "summary": body["summary"],
            "resultRef": ref,
            "resultDigest": naming.sha256_text(full),
            "usage": body["usage"],
        }
        text = json.dumps(body, separators=(",", ":"))
    termination.write_text(text[: runner.TERMINATION_LIMIT])
    print(
        f"agentrun step llm: turn {env.get(loop.ENV_TURN, '?')}: {body['summary']} "
        f"({body['usage']['tokens']} tokens)"
    )
    return 0


def main(argv: list[str]) -> int:
    if argv:
        print("usage: agentrun step llm (no arguments; see its --help)", file=sys.stderr)
        return 2
    return run_turn()
