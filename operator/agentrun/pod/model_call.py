"""One call of the model, for ``agentrun step llm`` (:mod:`agentrun.pod.llm`): the turn's
settings and API key from its environment, the chat completion request posted with the
official ``openai`` client's own ``post``, and the answer read strictly into the turn's
output: its usage checked (a count the endpoint did not report estimated, a negative one
refused) and the tool choice held to. Whatever goes wrong is a :class:`TurnFailed` with its
reason, one of :data:`agentrun.api.names.TURN_FAILURES`, and one line saying why; the API key
is never printed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from agentrun.api import names
from agentrun.core import context as cx
from agentrun.core import pod_env
from agentrun.core.envelope import clean

NO_KEY = "none"
"""Sent as the API key when the run names none (a local server that checks nothing)."""


CHAT_COMPLETIONS = "/chat/completions"
"""The path the client's ``chat.completions.create`` posts to, under the base URL."""


CONNECT_TIMEOUT = 10.0


READ_TIMEOUT = 600.0


class TurnFailed(Exception):
    """The turn cannot produce an output: why (``reason``, one of
    :data:`agentrun.api.names.TURN_FAILURES`), and one line saying what was wrong and what to
    do about it."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _settings(env: Mapping[str, str]) -> tuple[str, str, int, float | None, str | None]:
    base_url = env.get(pod_env.ENV_MODEL_BASE_URL, "")
    model = env.get(pod_env.ENV_MODEL_NAME, "")
    if not base_url or not model:
        raise TurnFailed(
            names.TURN_MODEL_SETTINGS_INVALID,
            f"{pod_env.ENV_MODEL_BASE_URL} and {pod_env.ENV_MODEL_NAME} must be set",
        )
    try:
        max_tokens = int(env.get(pod_env.ENV_MODEL_MAX_OUTPUT_TOKENS, "1024"))
        raw_temperature = env.get(pod_env.ENV_MODEL_TEMPERATURE)
        temperature = float(raw_temperature) if raw_temperature else None
    except ValueError as error:
        raise TurnFailed(
            names.TURN_MODEL_SETTINGS_INVALID, f"a model setting is not a number: {error}"
        ) from None
    tool_choice = env.get(pod_env.ENV_MODEL_TOOL_CHOICE) or None
    return base_url, model, max_tokens, temperature, tool_choice


def api_key(env: Mapping[str, str]) -> str:
    """The API key the turn sends (:data:`NO_KEY` when the run names none), once it is known
    that an HTTP header can carry it. Else :class:`TurnFailed` saying what is wrong with it,
    never what it is: the HTTP client's own error would quote the header, key and all."""
    key = env.get(pod_env.ENV_MODEL_API_KEY) or NO_KEY
    bad = next((i for i, c in enumerate(key) if not " " <= c <= "~"), None)
    if key.endswith(("\n", "\r")):
        problem = "ends with a line break (a Secret made from a file that ends with a newline?)"
    elif key != key.strip():
        problem = "begins or ends with whitespace"
    elif bad is not None:
        problem = f"has a character that is not printable ASCII (its character {bad + 1})"
    else:
        return key
    raise TurnFailed(
        names.TURN_MODEL_API_KEY_INVALID,
        f"the API key (the Secret key spec.agent.model.apiKeySecretRef names) {problem}, "
        "so no HTTP header can carry it: put the key alone in the Secret, e.g. kubectl create "
        "secret generic NAME --from-literal=api-key=KEY (the key is never printed)",
    )


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


def request_for(env: Mapping[str, str], context: cx.Context) -> dict[str, Any]:
    """The chat completion request of this turn (:func:`agentrun.core.context.request_body`)."""
    _, model, max_tokens, temperature, tool_choice = _settings(env)
    return cx.request_body(context, model, max_tokens, temperature, tool_choice)


def call_model(
    env: Mapping[str, str],
    context: cx.Context,
    client_factory: Callable[[str, str], Any] = default_client,
) -> cx.Output:
    """One chat completion for ``context``; its output, or :class:`TurnFailed` with its
    reason and one line saying why, whatever the endpoint answered."""
    import openai

    base_url = _settings(env)[0]
    request = request_for(env, context)
    client = client_factory(base_url, api_key(env))
    endpoint = f"the model endpoint {base_url}"
    try:
        # The raw response: its body is read here, strictly, not by the client's parser
        # (which raises whatever its JSON decoder raises on an empty body or bytes that are
        # not UTF-8). An answer that is not 2xx raises openai.APIStatusError, as from create.
        body = post_completion(client, request)
    except openai.APITimeoutError:
        raise TurnFailed(
            names.TURN_MODEL_TIMEOUT,
            f"{endpoint} did not answer within {READ_TIMEOUT:.0f} s: the server is overloaded "
            "or the model slow",
        ) from None
    except openai.APIConnectionError as error:
        cause = error.__cause__ or error
        raise TurnFailed(
            names.TURN_MODEL_UNREACHABLE,
            f"{endpoint} cannot be reached: {_one_line(cause)}: check "
            "spec.agent.model.baseURL, that the server runs, and that the run's pods may reach "
            "it (DNS, a NetworkPolicy)",
        ) from None
    except openai.APIStatusError as error:
        code = error.status_code
        raise TurnFailed(
            names.TURN_MODEL_ERROR_STATUS,
            f"{endpoint} answered HTTP {code}: {_one_line(_error_message(error))}: "
            f"{_status_hint(code)}",
        ) from None
    except openai.APIError as error:
        raise TurnFailed(
            names.TURN_MODEL_ANSWER_INVALID,
            f"{endpoint} gave no chat completion: {_one_line(error)}",
        ) from None
    except Exception as error:  # anything else the client raises: still one line
        raise TurnFailed(
            names.TURN_FAILED,
            f"{endpoint} gave no chat completion ({type(error).__name__}: {_one_line(error)})",
        ) from None
    data = _completion(body, endpoint)
    try:
        output = _output(data)
    except UsageInvalid as error:
        raise TurnFailed(
            names.TURN_MODEL_USAGE_INVALID,
            f"{endpoint} reported {error} for turn {env.get(pod_env.ENV_TURN, '?')}: a token "
            "count is a number of at least 0, so this answer cannot be counted against "
            "spec.budget.maxTokens and is not taken (the attempt counts no tokens); fix the "
            "server (or the proxy in front of it) to report usage as Chat Completions defines it",
        ) from None
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as error:
        raise TurnFailed(
            names.TURN_MODEL_ANSWER_INVALID,
            f"{endpoint} answered JSON that is not a chat completion: {_one_line(error)}: is "
            "spec.agent.model.baseURL an OpenAI-compatible Chat Completions API (up to its "
            "version path, e.g. http://HOST:8000/v1)?",
        ) from None
    output = estimated(output, request)
    check_tool_choice(request, output, endpoint, env.get(pod_env.ENV_TURN, "?"))
    return output


def _status_hint(code: int) -> str:
    """What to do about an answer with HTTP status ``code``."""
    if code in (401, 403):
        return (
            "check the API key (spec.agent.model.apiKeySecretRef) and that it may use "
            "spec.agent.model.name"
        )
    if code == 404:
        return (
            "check spec.agent.model.baseURL (the API's base up to its version path, e.g. "
            "http://HOST:8000/v1) and spec.agent.model.name"
        )
    if code == 429:
        return (
            "the server limits requests: a retry with a longer backoff may pass "
            "(spec.agent.model.retry)"
        )
    if code >= 500:
        return "the server failed: a retry may pass (spec.agent.model.retry)"
    return "the server refused the request (its message says why)"


def post_completion(client: Any, request: Mapping[str, Any]) -> Any:
    """POST ``request`` to the endpoint's ``/chat/completions`` with the ``openai`` client;
    the answer's body (bytes)."""
    import httpx

    response = client.post(CHAT_COMPLETIONS, body=dict(request), cast_to=httpx.Response)
    return response.content


def _completion(body: Any, endpoint: str) -> dict[str, Any]:
    """The body of a 200 answer as a JSON object; else :class:`TurnFailed` saying what it is."""
    if not isinstance(body, bytes):
        raise TurnFailed(
            names.TURN_MODEL_ANSWER_INVALID,
            f"{endpoint} answered with a {type(body).__name__}, not a body of bytes",
        )
    if not body.strip():
        raise TurnFailed(
            names.TURN_MODEL_EMPTY_ANSWER,
            f"{endpoint} answered HTTP 200 with an empty body, not a chat completion: the "
            "server (or a proxy in front of it) dropped its answer (its log may say why)",
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TurnFailed(
            names.TURN_MODEL_ANSWER_NOT_UTF8,
            f"{endpoint} answered with a body that is not UTF-8 text (byte {error.start} is "
            f"0x{body[error.start]:02x}): a chat completion is JSON in UTF-8, so the server or "
            "a proxy in front of it sent another encoding",
        ) from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise TurnFailed(
            names.TURN_MODEL_ANSWER_NOT_JSON,
            f"{endpoint} answered with a body that is not JSON ({_one_line(text, 80)}): is "
            "spec.agent.model.baseURL the API's base (e.g. http://HOST:8000/v1), not a web "
            "page or a proxy's error page?",
        ) from None
    if not isinstance(data, dict):
        raise TurnFailed(
            names.TURN_MODEL_ANSWER_INVALID,
            f"{endpoint} answered JSON that is {_json_type(data)}, not a chat completion object",
        )
    return data


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    kinds = {list: "an array", str: "a string", bool: "a boolean", int: "a number"}
    return kinds.get(type(value), "a number")


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


class UsageInvalid(ValueError):
    """A token count of the answer's usage is negative or not a number."""


def _tokens(usage: Mapping[str, Any], key: str) -> int | None:
    """``usage[key]``, None when the endpoint did not report it."""
    value = usage.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise UsageInvalid(f"usage.{key} {_one_line(json.dumps(value), 40)} (not a number)")
    if value < 0:
        raise UsageInvalid(f"usage.{key} {value:g}")
    return int(min(value, cx.MAX_REPORTED_TOKENS))


def _output(data: Mapping[str, Any]) -> cx.Output:
    """The turn's output from a chat completion (strictly: anything else raises). The usage
    counts the endpoint did not report are 0, and named in ``unreported``
    (:func:`estimated` counts them)."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ValueError("it has no choices")
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise TypeError("its first choice has no message")
    message = choice["message"]
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise TypeError("the message's content is not text")
    calls: list[cx.ToolCall] = []
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise TypeError("the message's tool_calls is not a list")
    for index, tool_call in enumerate(raw_calls):
        function = tool_call.get("function") if isinstance(tool_call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise TypeError(f"tool call {index} has no function name")
        arguments = function.get("arguments")
        if arguments is None:
            arguments = ""
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        call_id = tool_call.get("id")
        # clean: a lone surrogate (the JSON escape \ud800, half of a pair) is no character,
        # and UTF-8 cannot carry it; it becomes U+FFFD, as the operator reads it anyway.
        calls.append(
            cx.ToolCall(clean(str(call_id or "")), clean(function["name"]), clean(arguments))
        )
    raw_usage = data.get("usage")
    usage: Mapping[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    counts = {key: _tokens(usage, key) for key in cx.USAGE_COUNTS}
    finish = choice.get("finish_reason")
    model = data.get("model")
    return cx.Output(
        content=clean(content or ""),
        tool_calls=tuple(calls),
        finish_reason=clean(str(finish)) if finish is not None else None,
        prompt_tokens=counts["prompt_tokens"] or 0,
        completion_tokens=counts["completion_tokens"] or 0,
        model=clean(model) if isinstance(model, str) and model else None,
        unreported=tuple(key for key, count in counts.items() if count is None),
    )


def estimated(output: cx.Output, request: Mapping[str, Any]) -> cx.Output:
    """``output`` with each usage count the endpoint did not report estimated as the operator
    estimates a turn before it starts (:data:`agentrun.core.context.BYTES_PER_TOKEN` bytes a
    token): the prompt from the request sent, the completion from the output (at most the
    request's max_tokens). So a server that reports no usage is still held to
    spec.budget.maxTokens; the operator says so on the run (UsageNotReported)."""
    if not output.unreported:
        return output
    per = cx.BYTES_PER_TOKEN
    prompt, completion = output.prompt_tokens, output.completion_tokens
    if "prompt_tokens" in output.unreported:
        prompt = -(-cx.request_bytes(request) // per)
    if "completion_tokens" in output.unreported:
        said = output.content + "".join(c.name + c.arguments for c in output.tool_calls)
        completion = -(-len(said.encode()) // per)
        limit = request.get("max_tokens")
        if isinstance(limit, int):
            completion = min(completion, limit)
    return replace(output, prompt_tokens=prompt, completion_tokens=completion)


def check_tool_choice(
    request: Mapping[str, Any], output: cx.Output, endpoint: str, turn: str
) -> None:
    """:class:`TurnFailed` (ToolChoiceIgnored) when the request's tool_choice asked for a tool
    call (``required``) or for one tool's, and the answer has none, or another tool's. Such an
    answer is not taken as the run's result: the run asked that every turn call a tool."""
    choice = request.get("tool_choice")
    if choice == "required":
        wanted = None
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        wanted = str(choice["function"].get("name"))
    else:
        return
    called = sorted({c.name for c in output.tool_calls})
    if called and (wanted is None or called == [wanted]):
        return
    asked = "required" if wanted is None else f"{wanted} (a call of that tool)"
    got = f"called {', '.join(called)}" if called else "answered without calling a tool"
    if output.finish_reason == "length":
        got += " (cut off at maxOutputTokens, perhaps while writing a call)"
    raise TurnFailed(
        names.TURN_TOOL_CHOICE_IGNORED,
        f"turn {turn}: spec.agent.toolChoice is {asked}, but {endpoint} {got}: the server did "
        "not honour tool_choice; a retry (spec.agent.model.retry) may call a tool, else use a "
        "server that honours it (docs/agent.md lists some) or toolChoice auto",
    )
