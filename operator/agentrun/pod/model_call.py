"""One call of the model, for ``agentrun step llm`` (:mod:`agentrun.pod.llm`): the turn's
settings and API key from its environment, the chat completion request posted with the
official ``openai`` client's own ``post``, and the answer read strictly into the turn's
output: its usage checked (a count the endpoint did not report estimated, a negative one
refused) and the tool choice held to. Whatever goes wrong is a :class:`TurnFailed` with its
reason, one of :data:`agentrun.api.names.TURN_FAILURES`, and one line saying why; the API key
is never printed.

**Fallbacks** (spec.agent.model.fallbacks, :func:`models_of`): the models are asked in order,
each with its own base URL, name, temperature and API key (its own variable, from its own
Secret), until one answers. Only a model that is *unavailable* (:class:`Unavailable`: an HTTP
5xx, no connection, no answer in time, or a 429 once the turn's patience is over) makes the
next one asked. In a turn with fallbacks, a 429 with a Retry-After is waited for and the
model asked again first, at most :data:`PATIENCE_SECONDS` in all per model and only while the
wait leaves :data:`MIN_CALL_SECONDS` of the turn's deadline (``AGENTRUN_MODEL_TIMEOUT_SECONDS``,
the model's timeoutSeconds, counted from when the turn began). Any other failure (a 4xx, an
answer that is not a chat completion) ends the turn with its reason: the next model would be
sent the same request. The output names the model that answered
(:class:`agentrun.core.context.Answerer`) and, for each before it, one line saying why it
failed; a turn whose every model failed fails with the reason of the last one, its message
naming each. A turn without fallbacks asks its model once, as it always did (a 429 fails the
attempt, and spec.agent.model.retry decides what follows), and its output names no model: it
has only the one.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
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


PATIENCE_SECONDS = 60.0
"""Most seconds one model's 429s are waited for in a turn (each wait as its Retry-After asks),
before the next model is asked (or the turn fails)."""


MIN_CALL_SECONDS = 5.0
"""A wait for a 429's Retry-After is taken only when it leaves this much of the turn's deadline
for the request after it; and no further model is asked with less than this left."""


class TurnFailed(Exception):
    """The turn cannot produce an output: why (``reason``, one of
    :data:`agentrun.api.names.TURN_FAILURES`), and one line saying what was wrong and what to
    do about it."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Unavailable(TurnFailed):
    """The model could not answer now (an HTTP 5xx or 429, no connection, no answer in time),
    which makes the next model of the turn asked. ``why``: a short line saying so."""

    def __init__(
        self, reason: str, message: str, why: str, retry_after: float | None = None
    ) -> None:
        super().__init__(reason, message)
        self.why = why
        self.retry_after = retry_after
        """The seconds a 429's Retry-After asks to wait (None: not a 429, or none said)."""


@dataclass(frozen=True)
class Model:
    """One model a turn may ask: spec.agent.model (``index`` 0) or one of its fallbacks (1, 2,
    ... in order), with the variable holding its API key."""

    index: int
    base_url: str
    name: str
    temperature: float | None
    key_env: str

    @property
    def label(self) -> str:
        """How lines about it name it: ``NAME at URL`` (``fallback 1 NAME at URL``)."""
        which = f"fallback {self.index} " if self.index else ""
        return f"{which}{self.name} at {self.base_url}"

    @property
    def key_field(self) -> str:
        """The field naming its API key's Secret, for messages."""
        if not self.index:
            return "spec.agent.model.apiKeySecretRef"
        return f"spec.agent.model.fallbacks[{self.index - 1}].apiKeySecretRef"


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


def models_of(env: Mapping[str, str]) -> list[Model]:
    """The models the turn may ask, in order: spec.agent.model, then each of its fallbacks
    (``AGENTRUN_MODEL_FALLBACKS`` of them, :func:`agentrun.core.pod_env.fallback_env`)."""
    base_url, name, _, temperature, _ = _settings(env)
    found = [Model(0, base_url, name, temperature, pod_env.ENV_MODEL_API_KEY)]
    try:
        count = int(env.get(pod_env.ENV_MODEL_FALLBACKS) or 0)
        for i in range(1, count + 1):
            url = env.get(pod_env.fallback_env(i, "BASE_URL"), "")
            model = env.get(pod_env.fallback_env(i, "NAME"), "")
            if not url or not model:
                raise TurnFailed(
                    names.TURN_MODEL_SETTINGS_INVALID,
                    f"{pod_env.fallback_env(i, 'BASE_URL')} and {pod_env.fallback_env(i, 'NAME')} "
                    f"must be set ({pod_env.ENV_MODEL_FALLBACKS} is {count})",
                )
            raw = env.get(pod_env.fallback_env(i, "TEMPERATURE"))
            key_env = pod_env.fallback_env(i, "API_KEY")
            found.append(Model(i, url, model, float(raw) if raw else None, key_env))
    except ValueError as error:
        raise TurnFailed(
            names.TURN_MODEL_SETTINGS_INVALID, f"a fallback's setting is not a number: {error}"
        ) from None
    return found


def api_keys(env: Mapping[str, str]) -> list[str]:
    """Every API key the turn holds (of each of its models), to keep them out of what it
    says."""
    return [v for k, v in env.items() if is_key_env(k) and v and v != NO_KEY]


def is_key_env(name: str) -> bool:
    """Whether the variable ``name`` holds a model's API key (spec.agent.model's or a
    fallback's)."""
    return name == pod_env.ENV_MODEL_API_KEY or (
        name.startswith(pod_env.ENV_MODEL_FALLBACK) and name.endswith("_API_KEY")
    )


def redacted(text: str, keys: Sequence[str]) -> str:
    """``text`` with each of ``keys`` replaced by ``[the API key]`` (a server's error that
    quotes it)."""
    for key in sorted(keys, key=len, reverse=True):
        text = text.replace(key, "[the API key]")
    return text


def _deadline(env: Mapping[str, str], now: float) -> float | None:
    """When the turn's time is up (its timeoutSeconds from ``now``); None without one."""
    raw = env.get(pod_env.ENV_MODEL_TIMEOUT_SECONDS)
    try:
        seconds = float(raw) if raw else 0.0
    except ValueError:
        seconds = 0.0
    return now + seconds if seconds > 0 else None


def api_key(env: Mapping[str, str], model: Model | None = None) -> str:
    """The API key the turn sends to ``model`` (spec.agent.model's when None; :data:`NO_KEY`
    when the run names none), once it is known that an HTTP header can carry it. Else
    :class:`TurnFailed` saying what is wrong with it, never what it is: the HTTP client's own
    error would quote the header, key and all."""
    key_env = model.key_env if model is not None else pod_env.ENV_MODEL_API_KEY
    field = model.key_field if model is not None else "spec.agent.model.apiKeySecretRef"
    key = env.get(key_env) or NO_KEY
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
        f"the API key (the Secret key {field} names) {problem}, "
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


def request_for(
    env: Mapping[str, str], context: cx.Context, model: Model | None = None
) -> dict[str, Any]:
    """The chat completion request of this turn (:func:`agentrun.core.context.request_body`)
    to ``model`` (spec.agent.model when None): its name and temperature, the rest the turn's."""
    _, name, max_tokens, temperature, tool_choice = _settings(env)
    if model is not None:
        name, temperature = model.name, model.temperature
    return cx.request_body(context, name, max_tokens, temperature, tool_choice)


def call_model(
    env: Mapping[str, str],
    context: cx.Context,
    client_factory: Callable[[str, str], Any] = default_client,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> cx.Output:
    """One chat completion for ``context`` from the first of the turn's models that answers
    (see the module docstring); its output, or :class:`TurnFailed` with its reason and one
    line saying why, whatever the endpoints answered."""
    models = models_of(env)
    deadline = _deadline(env, clock())
    keys = api_keys(env)
    patient = len(models) > 1  # without fallbacks a turn is as it always was: one request
    failed: list[tuple[Model, Unavailable]] = []
    for model in models:
        if failed and deadline is not None and deadline - clock() < MIN_CALL_SECONDS:
            break  # no time left to ask it: the turn fails with what the last one said
        try:
            output = _ask(env, context, model, client_factory, deadline, clock, sleep, patient)
        except Unavailable as failure:
            failed.append((model, failure))
            continue
        except TurnFailed as failure:
            if not failed:
                raise
            raise TurnFailed(
                failure.reason, _every_failed(failed, model, failure, models)
            ) from None
        if not patient:  # no fallbacks: the one model answered, as every output says
            return output
        return replace(
            output,
            answered_by=cx.Answerer(model.index, model.name, model.base_url),
            fallback_from=tuple(
                redacted(_one_line(f"{m.label}: {f.reason}: {f.why}"), keys)[: cx.MAX_FALLBACK_LINE]
                for m, f in failed
            ),
        )
    model, last = failed[-1]
    if len(models) == 1:
        raise last
    raise TurnFailed(last.reason, _every_failed(failed[:-1], model, last, models))


def _every_failed(
    before: Sequence[tuple[Model, Unavailable]],
    last_model: Model,
    last: TurnFailed,
    models: Sequence[Model],
) -> str:
    """The message of a turn none of whose models answered: each one's short line, the last
    one's whole message, and the models left untried (the turn's deadline was near)."""
    said = [f"{m.label}: {f.reason}: {_one_line(f.why, 160)}" for m, f in before]
    said.append(f"{last_model.label}: {last}")
    untried = [m.label for m in models if m.index > last_model.index]
    tail = f" ({', '.join(untried)} not asked: too little of the turn's deadline left)"
    return (
        f"no model of the turn answered ({len(before) + 1} asked): "
        + "; then ".join(said)
        + (tail if untried and isinstance(last, Unavailable) else "")
    )


def _ask(
    env: Mapping[str, str],
    context: cx.Context,
    model: Model,
    client_factory: Callable[[str, str], Any],
    deadline: float | None,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    patient: bool = True,
) -> cx.Output:
    """``model``'s answer, asking again after a 429's Retry-After while the turn's patience
    lasts (:data:`PATIENCE_SECONDS`, and the deadline less :data:`MIN_CALL_SECONDS`), when
    ``patient``."""
    waited = 0.0
    while True:
        left = None if deadline is None else deadline - clock()
        try:
            return _call_once(env, context, model, client_factory, left)
        except Unavailable as failure:
            wait = failure.retry_after
            if wait is None or not patient:
                raise
            left = None if deadline is None else deadline - clock()
            fits = left is None or wait + MIN_CALL_SECONDS <= left
            if fits and waited + wait <= PATIENCE_SECONDS:
                sleep(wait)
                waited += wait
                continue
            if waited + wait > PATIENCE_SECONDS:
                more = f"it asks to wait {wait:g} s more, past the {PATIENCE_SECONDS:g} s patience"
            else:
                more = f"it asks to wait {wait:g} s, more than the turn's deadline leaves"
            if waited:
                more = f"waited {waited:g} s as its Retry-After asked; {more}"
            raise Unavailable(
                failure.reason, f"{failure} ({more})", f"{failure.why} ({more})"
            ) from None


def _call_once(
    env: Mapping[str, str],
    context: cx.Context,
    model: Model,
    client_factory: Callable[[str, str], Any],
    left: float | None,
) -> cx.Output:
    """One chat completion from ``model`` within ``left`` seconds (None: the client's own
    timeouts)."""
    import openai

    request = request_for(env, context, model)
    client = client_factory(model.base_url, api_key(env, model))
    endpoint = f"the model endpoint {model.base_url}"
    timeout = READ_TIMEOUT if left is None else max(min(READ_TIMEOUT, left), 1.0)
    try:
        # The raw response: its body is read here, strictly, not by the client's parser
        # (which raises whatever its JSON decoder raises on an empty body or bytes that are
        # not UTF-8). An answer that is not 2xx raises openai.APIStatusError, as from create.
        body = post_completion(client, request, None if left is None else timeout)
    except openai.APITimeoutError:
        raise Unavailable(
            names.TURN_MODEL_TIMEOUT,
            f"{endpoint} did not answer within {timeout:.0f} s: the server is overloaded "
            "or the model slow",
            f"no answer within {timeout:.0f} s",
        ) from None
    except openai.APIConnectionError as error:
        cause = error.__cause__ or error
        raise Unavailable(
            names.TURN_MODEL_UNREACHABLE,
            f"{endpoint} cannot be reached: {_one_line(cause)}: check "
            "spec.agent.model.baseURL, that the server runs, and that the run's pods may reach "
            "it (DNS, a NetworkPolicy)",
            f"cannot be reached: {_one_line(cause, 160)}",
        ) from None
    except openai.APIStatusError as error:
        code = error.status_code
        message = (
            f"{endpoint} answered HTTP {code}: {_one_line(_error_message(error))}: "
            f"{_status_hint(code)}"
        )
        if code >= 500 or code == 429:
            why = f"HTTP {code}: {_one_line(_error_message(error), 160)}"
            wait = _retry_after(error) if code == 429 else None
            raise Unavailable(names.TURN_MODEL_ERROR_STATUS, message, why, wait) from None
        raise TurnFailed(names.TURN_MODEL_ERROR_STATUS, message) from None
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


def _retry_after(error: Any) -> float | None:
    """The seconds a 429's Retry-After asks to wait (seconds, or an HTTP date); None when it
    says nothing usable."""
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    raw = headers.get("retry-after") if headers is not None else None
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    if seconds != seconds or seconds == float("inf"):
        return None
    return max(seconds, 0.0)


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


def post_completion(client: Any, request: Mapping[str, Any], timeout: float | None = None) -> Any:
    """POST ``request`` to the endpoint's ``/chat/completions`` with the ``openai`` client
    (within ``timeout`` seconds, when given: what is left of the turn's deadline); the
    answer's body (bytes)."""
    import httpx

    options: dict[str, Any] = {}
    if timeout is not None:
        options["timeout"] = httpx.Timeout(timeout, connect=min(CONNECT_TIMEOUT, timeout))
    response = client.post(
        CHAT_COMPLETIONS, body=dict(request), cast_to=httpx.Response, options=options
    )
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
