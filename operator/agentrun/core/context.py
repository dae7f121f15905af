"""What a model turn sees and says: the context document, its paging, and the turn's output.

The **context document** of turn N is what the operator assembled for it from committed records
only, stored as JSON in a ConfigMap owned by the run (keys ``part-0`` ... ``part-{k-1}``: the
text split so that each part fits one environment variable). It holds the messages in Chat
Completions form, each with a few bookkeeping members whose names start with ``x-``
(``x-turn``: the turn a message belongs to; ``x-summary``: a tool result's summary;
``x-paged``: the result was replaced by its summary) and the tools::

    {"turn": N, "messages": [...], "tools": [...], "omittedTurns": k, "pagedResults": p,
     "previous": "<sha256 of the context of turn N-1>", "messageBytes": [...]}

``previous`` (absent in a run's first context) chains each context to the one it was made
from. Only the newest context's digest is committed in status; the chain lets an older one be
checked against it, which is how a fork (``spec.agent.resumeFrom``) verifies the conversation
it continues (:mod:`agentrun.core.resume`). ``messageBytes`` (absent in documents written
before it was kept) gives each message's bytes as sent, so that the next turn's paging and
byte count do not encode every message again: a turn costs what it adds, not what the
conversation holds.

``agentrun step llm`` drops the ``x-`` members and sends the rest. The context of turn N+1 is
the one of turn N, plus turn N's assistant message and one tool message per call, paged to
``spec.agent.contextBytes`` (bytes of the messages as sent):

1. the tool results of older turns are replaced by their summaries, oldest first;
2. if that is not enough, the oldest turns are left out whole (a note says which), then the
   newest turn's results are replaced by their summaries too;
3. as a last resort the longest message is cut short (a turn whose tool call arguments alone
   exceed the limit stays over it: arguments are never cut).

The system message (``spec.agent.instructions``) and the first user message (the goal and the
plan's results) always stay.

The **output** of a model turn is the result of its step: JSON
``{"content": ..., "toolCalls": [{"id", "name", "arguments"}], "finishReason": ...,
"usage": {"promptTokens", "completionTokens", "totalTokens"}, "model": ...}`` (``usage`` with
``"estimated": ["prompt_tokens", ...]`` naming the counts the endpoint did not report;
``"answeredBy": {"index", "name", "baseURL"}``, the model that answered, 0 spec.agent.model and
1 on its fallbacks, with ``"fallbackFrom"``, one line per model that failed before it; written
by :func:`output_result`, read back by :func:`parse_output`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentrun.api.names import TOOL_CHOICE_MODES
from agentrun.core.envelope import clean, summary_line
from agentrun.core.naming import canonical_json, sha256_text

PART_BYTES = 96 * 1024
"""Most bytes of one part of a context document (one environment variable of the pod; the
kernel allows 128 KiB per variable)."""
MAX_CALLS_KEPT = 64
"""Tool calls of one turn beyond this many are dropped from the output (never run, never
shown to the model again)."""
NOTE = "x-note"
MAX_REPORTED_TOKENS = 2**53 - 1
"""Token counts read from an endpoint are clamped to this (exact in any JSON reader)."""
BYTES_PER_TOKEN = 4
"""How tokens are estimated from bytes: a turn's prompt before it starts (for the budget), and
the usage counts an endpoint did not report (:attr:`Output.unreported`)."""
USAGE_COUNTS = ("prompt_tokens", "completion_tokens")
"""The usage counts of a chat completion that a turn is counted for."""

Message = dict[str, Any]


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def sendable(message: Mapping[str, Any]) -> dict[str, Any]:
    """``message`` as sent to the model: without the ``x-`` bookkeeping members."""
    return {k: v for k, v in message.items() if not k.startswith("x-")}


def message_bytes(message: Mapping[str, Any]) -> int:
    return len(_json(sendable(message)).encode())


def messages_bytes(messages: Sequence[Mapping[str, Any]]) -> int:
    """Bytes of the messages as a JSON array, the way they are sent."""
    return array_bytes([message_bytes(m) for m in messages])


def array_bytes(sizes: Sequence[int]) -> int:
    """Bytes of a JSON array of items of these sizes: brackets, and a comma between two."""
    return 2 + sum(sizes) + max(len(sizes) - 1, 0)


# ---------------------------------------------------------------------------------------------
# The turn's output
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """A call the model proposed."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Answerer:
    """The model that answered a turn: ``index`` 0 is spec.agent.model itself, 1 and on its
    fallbacks in order (spec.agent.model.fallbacks)."""

    index: int
    name: str
    base_url: str


MAX_FALLBACK_LINE = 400
"""Characters kept of the line saying why a model before the one that answered failed."""


@dataclass(frozen=True)
class Output:
    """What a model turn returned."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str | None = None
    dropped_calls: int = 0
    reported_tokens: int | None = None
    """What the endpoint reported, when more than the turn could have used (then the token
    counts are bounded)."""
    unreported: tuple[str, ...] = ()
    """The usage counts (of :data:`USAGE_COUNTS`) the endpoint did not report: those counts
    are estimates, at :data:`BYTES_PER_TOKEN` bytes a token of the request and of the output."""
    answered_by: Answerer | None = None
    """The model that answered (None in the output of a pod from before fallbacks)."""
    fallback_from: tuple[str, ...] = ()
    """For each model tried before the one that answered, in order, one line saying why it
    failed (``scripted at http://...: ModelErrorStatus: HTTP 500: overloaded``)."""


def output_result(output: Output) -> dict[str, Any]:
    """The JSON result of a model turn's step (see the module docstring)."""
    body: dict[str, Any] = {
        "content": output.content,
        "toolCalls": [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in output.tool_calls
        ],
        "finishReason": output.finish_reason,
        "usage": {
            "promptTokens": output.prompt_tokens,
            "completionTokens": output.completion_tokens,
            "totalTokens": output.prompt_tokens + output.completion_tokens,
        },
    }
    if output.unreported:
        body["usage"]["estimated"] = list(output.unreported)
    if output.model:
        body["model"] = output.model
    if output.answered_by is not None:
        by = output.answered_by
        body["answeredBy"] = {"index": by.index, "name": by.name, "baseURL": by.base_url}
    if output.fallback_from:
        body["fallbackFrom"] = list(output.fallback_from)
    return body


def _count(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return min(value, 2**53 - 1)
    return 0


def parse_output(text: str, turn: int) -> Output | str:
    """The output of turn ``turn`` from its step's result; or why it is not one.

    Call ids are made usable: an empty, overlong or repeated id is replaced by
    ``t{turn}-call-{index}``, so that every call gets exactly one answer.
    """
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return "the model turn's result is not JSON"
    if not isinstance(data, dict):
        return "the model turn's result is not a JSON object"
    content = data.get("content")
    if content is not None and not isinstance(content, str):
        return "content is not a string"
    raw_calls = data.get("toolCalls") or []
    if not isinstance(raw_calls, list):
        return "toolCalls is not a list"
    calls: list[ToolCall] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_calls[:MAX_CALLS_KEPT]):
        if not isinstance(raw, dict):
            return f"toolCalls[{index}] is not an object"
        name, arguments, call_id = raw.get("name"), raw.get("arguments"), raw.get("id")
        if not isinstance(name, str):
            return f"toolCalls[{index}].name is not a string"
        if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
            arguments = "{}"  # no arguments at all: an empty object, as servers read it
        if not isinstance(arguments, str):
            arguments = canonical_json(arguments)
        if not isinstance(call_id, str) or not call_id or len(call_id) > 128 or call_id in seen:
            call_id = f"t{turn}-call-{index}"
        seen.add(call_id)
        calls.append(ToolCall(clean(call_id), clean(name)[:128], clean(arguments)))
    raw_usage = data.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    finish = data.get("finishReason")
    model = data.get("model")
    return Output(
        content=clean(content or ""),
        tool_calls=tuple(calls),
        finish_reason=clean(finish)[:64] if isinstance(finish, str) else None,
        prompt_tokens=_count(usage.get("promptTokens")),
        completion_tokens=_count(usage.get("completionTokens")),
        model=clean(model)[:253] if isinstance(model, str) else None,
        dropped_calls=max(len(raw_calls) - MAX_CALLS_KEPT, 0),
        unreported=_estimated(usage.get("estimated")),
        answered_by=_answerer(data.get("answeredBy")),
        fallback_from=_fallback_from(data.get("fallbackFrom")),
    )


def _answerer(value: Any) -> Answerer | None:
    """``answeredBy`` of an output; None when it is not one."""
    if not isinstance(value, dict):
        return None
    index, name, base_url = value.get("index"), value.get("name"), value.get("baseURL")
    if not (isinstance(index, int) and not isinstance(index, bool) and 0 <= index <= 16):
        return None
    if not (isinstance(name, str) and isinstance(base_url, str)):
        return None
    return Answerer(index, clean(name)[:253], clean(base_url)[:2048])


def _fallback_from(value: Any) -> tuple[str, ...]:
    """``fallbackFrom`` of an output: its lines (at most 16, each cut short)."""
    lines = value if isinstance(value, list) else []
    return tuple(clean(line)[:MAX_FALLBACK_LINE] for line in lines[:16] if isinstance(line, str))


def _estimated(value: Any) -> tuple[str, ...]:
    """The usage counts an output says are estimates (only names of :data:`USAGE_COUNTS`)."""
    named = value if isinstance(value, list) else []
    return tuple(key for key in USAGE_COUNTS if key in named)


def output_summary(output: Output) -> str:
    """One line saying what the turn did."""
    if output.tool_calls:
        names = ", ".join(c.name for c in output.tool_calls[:5])
        more = f" and {len(output.tool_calls) - 5} more" if len(output.tool_calls) > 5 else ""
        said = summary_line(output.content)
        return summary_line(f"calls {names}{more}" + (f": {said}" if said else ""))
    return summary_line(output.content) or "(an empty answer)"


# ---------------------------------------------------------------------------------------------
# The context document
# ---------------------------------------------------------------------------------------------


@dataclass
class Context:
    """A context document (see the module docstring)."""

    turn: int
    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    omitted_turns: int = 0
    paged_results: int = 0
    previous: str | None = None
    """sha256 of the context this one was made from (the previous turn's), if any."""
    sizes: list[int] | None = field(default=None, compare=False, repr=False)
    """Each message's bytes as sent (:func:`message_bytes`), when known: the document's
    ``messageBytes``, kept as messages are added and paged."""
    texts: list[str] | None = field(default=None, compare=False, repr=False)
    """Each message's JSON text as the document holds it (bookkeeping members and all), when
    known: kept as messages are added and paged, so that storing the next turn's context
    encodes only the messages it adds or changes."""

    def to_json(self) -> str:
        """The document's text: the JSON object of the module docstring (compact, members in
        that order), each message's text as kept (:meth:`message_texts`)."""
        previous = "" if self.previous is None else f',"previous":{_json(self.previous)}'
        return (
            f'{{"turn":{_json(self.turn)},"messages":[{",".join(self.message_texts())}],'
            f'"tools":{_json(self.tools)},"omittedTurns":{_json(self.omitted_turns)},'
            f'"pagedResults":{_json(self.paged_results)}{previous},'
            f'"messageBytes":{_json(self.message_sizes())}}}'
        )

    def message_sizes(self) -> list[int]:
        """Each message's bytes as sent: the sizes known, else counted (and kept)."""
        if self.sizes is None or len(self.sizes) != len(self.messages):
            self.sizes = [message_bytes(m) for m in self.messages]
        return self.sizes

    def message_texts(self) -> list[str]:
        """Each message's JSON text: the texts known, else encoded (and kept)."""
        if self.texts is None or len(self.texts) != len(self.messages):
            self.texts = [_json(m) for m in self.messages]
        return self.texts

    def extended(self, turn: int, messages: Sequence[Message], **changes: Any) -> Context:
        """The context of ``turn``: this one's messages and ``messages`` after them (only
        those are counted, and encoded when this one's texts are known), with ``changes``
        (tools, previous, ...)."""
        added = list(messages)
        known = self.texts is not None and len(self.texts) == len(self.messages)
        return replace(
            self,
            turn=turn,
            messages=[*self.messages, *added],
            sizes=[*self.message_sizes(), *(message_bytes(m) for m in added)],
            texts=[*(self.texts or []), *(_json(m) for m in added)] if known else None,
            **changes,
        )

    @property
    def bytes(self) -> int:
        """Bytes of the messages as sent."""
        return array_bytes(self.message_sizes())

    @property
    def tools_bytes(self) -> int:
        return len(_json(self.tools).encode())

    def encoded(self) -> tuple[list[str], str]:
        """The document split into parts of at most :data:`PART_BYTES` bytes each, and its
        digest (:meth:`digest`), from one encoding."""
        text = self.to_json()
        data = text.encode("utf-8", "surrogatepass")  # as sha256_text hashes it
        return _split(text, data, PART_BYTES), hashlib.sha256(data).hexdigest()

    def digest(self) -> str:
        return sha256_text(self.to_json())

    @classmethod
    def from_parts(cls, parts: Iterable[str]) -> Context | str:
        """The document from its parts; or why it cannot be read."""
        try:
            data = json.loads("".join(parts))
        except (ValueError, RecursionError):
            return "the context document is not JSON"
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            return "the context document has no messages"
        messages = [m for m in data["messages"] if isinstance(m, dict)]
        tools = [t for t in data.get("tools") or [] if isinstance(t, dict)]
        previous = data.get("previous")
        sizes = data.get("messageBytes")
        if not (
            isinstance(sizes, list)
            and len(sizes) == len(messages) == len(data["messages"])
            and all(type(n) is int and n >= 2 for n in sizes)
        ):
            sizes = None  # counted again when needed
        return cls(
            turn=_count(data.get("turn")),
            messages=messages,
            tools=tools,
            omitted_turns=_count(data.get("omittedTurns")),
            paged_results=_count(data.get("pagedResults")),
            previous=previous if isinstance(previous, str) else None,
            sizes=sizes,
        )


@dataclass(frozen=True)
class Stored:
    """A context document as the loop stored it: the parts it was written as, their digest,
    and the document itself. The shell keeps it beside the ConfigMap this process wrote
    (:mod:`agentrun.loop.written`, ``Observed.contexts``), so that the pass that continues
    from the document takes it as it was rather than parsing its parts again; only for parts
    that are exactly the ones it was stored as (:meth:`document`)."""

    parts: tuple[str, ...]
    digest: str
    """sha256 of the parts joined (:meth:`Context.encoded`)."""
    context: Context
    """Never changed: :meth:`document` hands out copies."""

    @classmethod
    def of(cls, context: Context) -> Stored:
        """``context`` encoded (:meth:`Context.encoded`), to be stored."""
        parts, digest = context.encoded()
        return cls(tuple(parts), digest, context)

    def document(self, parts: Sequence[str], digest: str) -> Context | None:
        """The document, as :meth:`Context.from_parts` of ``parts`` would read it, when
        ``parts`` are the ones it was stored as and ``digest`` is theirs; else None. A copy
        the caller may change as it likes (its messages are shared: they are copied before
        they are changed, as everywhere)."""
        if digest != self.digest or tuple(parts) != self.parts:
            return None
        ctx = self.context
        return replace(
            ctx,
            messages=list(ctx.messages),
            tools=list(ctx.tools),
            sizes=None if ctx.sizes is None else list(ctx.sizes),
            texts=None if ctx.texts is None else list(ctx.texts),
        )


def split_bytes(text: str, limit: int) -> list[str]:
    """``text`` cut into pieces of at most ``limit`` UTF-8 bytes, never inside a character."""
    return _split(text, text.encode("utf-8", "surrogatepass"), limit)


def _split(text: str, data: bytes, limit: int) -> list[str]:
    """:func:`split_bytes` of ``text``, whose UTF-8 bytes are ``data``."""
    if len(data) <= limit:
        return [text]  # one piece: the text itself
    parts: list[str] = []
    start = 0
    while start < len(data):
        end = min(start + limit, len(data))
        while end < len(data) and (data[end] & 0xC0) == 0x80:  # a continuation byte
            end -= 1
        parts.append(data[start:end].decode("utf-8", "surrogatepass"))
        start = end
    return parts or [""]


def tool_definitions(tools: Iterable[tuple[str, str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Tools as Chat Completions wants them, from (name, description, parameters)."""
    return [
        {
            "type": "function",
            "function": {"name": name, "description": description, "parameters": dict(params)},
        }
        for name, description, params in tools
    ]


def tool_choice_param(choice: str) -> str | dict[str, Any]:
    """``spec.agent.toolChoice`` as Chat Completions' ``tool_choice``: a mode as it is, a
    tool's name as ``{"type": "function", "function": {"name": ...}}``."""
    if choice in TOOL_CHOICE_MODES:
        return choice
    return {"type": "function", "function": {"name": choice}}


def request_body(
    context: Context,
    model: str,
    max_tokens: int,
    temperature: float | None = None,
    tool_choice: str | None = None,
) -> dict[str, Any]:
    """The chat completion request a model turn sends for ``context``: its messages without
    the bookkeeping members, its tools, and the settings (``tool_choice`` only with tools)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": sent_messages(context.messages),
        "max_tokens": max_tokens,
    }
    if context.tools:
        body["tools"] = context.tools
        if tool_choice is not None:
            body["tool_choice"] = tool_choice_param(tool_choice)
    if temperature is not None:
        body["temperature"] = temperature
    return body


def sent_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as sent: without their bookkeeping members, and a user message that
    follows another (the note of turns left out follows the goal) joined to it, since chat
    templates that want user and assistant to alternate (Gemma's, Mistral's) refuse two in a
    row."""
    sent: list[dict[str, Any]] = []
    for message in messages:
        out = sendable(message)
        last = sent[-1] if sent else None
        if (
            last is not None
            and out.get("role") == "user" == last.get("role")
            and isinstance(out.get("content"), str)
            and isinstance(last.get("content"), str)
        ):
            sent[-1] = {**last, "content": f"{last['content']}\n\n{out['content']}"}
            continue
        sent.append(out)
    return sent


def request_bytes(body: Mapping[str, Any]) -> int:
    """Bytes of a request body as JSON: what the token estimate of a turn counts."""
    return len(_json(body).encode())


def request_size(
    context: Context,
    model: str,
    max_tokens: int,
    temperature: float | None = None,
    tool_choice: str | None = None,
) -> int:
    """:func:`request_bytes` of :func:`request_body` of these, from the messages' known sizes
    (:meth:`Context.message_sizes`) rather than by encoding every message again."""
    empty = replace(context, messages=[], sizes=[], texts=[])
    shell = request_bytes(request_body(empty, model, max_tokens, temperature, tool_choice))
    return shell - len("[]") + sent_messages_bytes(context.messages, context.message_sizes())


def sent_messages_bytes(messages: Sequence[Mapping[str, Any]], sizes: Sequence[int]) -> int:
    """Bytes of :func:`sent_messages` of ``messages`` as a JSON array, each message's size
    given (:func:`message_bytes`): only user messages that are joined are encoded."""
    sent: list[int] = []
    last_user: dict[str, Any] | None = None
    """The last message sent, while it is a user message with text content (joinable)."""
    for message, size in zip(messages, sizes, strict=True):
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, str):
            last_user = None
        elif last_user is not None:
            last_user = {**last_user, "content": f"{last_user['content']}\n\n{content}"}
            sent[-1] = message_bytes(last_user)
            continue
        else:
            last_user = sendable(message)
        sent.append(size)
    return array_bytes(sent)


def first_messages(instructions: str | None, first_user_message: str) -> list[Message]:
    """The messages every context starts with."""
    messages: list[Message] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    messages.append({"role": "user", "content": first_user_message})
    return messages


SENT_FOR_INVALID = "{}"
"""The arguments an assistant message carries for a call whose own are not JSON text of an
object (cut off at the output limit, say)."""


def sendable_arguments(arguments: str) -> str:
    """A call's arguments as an assistant message may carry them back to the model: as they
    are when they are JSON text of an object, else :data:`SENT_FOR_INVALID`. Servers parse the
    arguments of every call in the conversation (llama.cpp's server fails the whole request
    with HTTP 500 on ones that are not JSON; chat templates read them as a mapping), so a
    call the model cut off must not go back verbatim. Such a call was never run, and its tool
    message says so and why."""
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):
        return SENT_FOR_INVALID
    return arguments if isinstance(parsed, dict) else SENT_FOR_INVALID


def assistant_message(turn: int, output: Output) -> Message:
    """A turn's assistant message as the next turns send it: any OpenAI-compatible server
    accepts it (content text or null with calls; each call's arguments JSON text of an
    object, see :func:`sendable_arguments`)."""
    content = output.content or None
    if content is None and not output.tool_calls:
        content = ""  # an assistant message without calls needs content
    message: Message = {"role": "assistant", "content": content, "x-turn": turn}
    if output.tool_calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": sendable_arguments(c.arguments)},
            }
            for c in output.tool_calls
        ]
    return message


def tool_message(turn: int, call_id: str, content: str, summary: str) -> Message:
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "content": content,
        "x-turn": turn,
        "x-summary": summary,
    }


def _turn_of(message: Mapping[str, Any]) -> int | None:
    turn = message.get("x-turn")
    return turn if isinstance(turn, int) and not isinstance(turn, bool) else None


PAGED = "[result paged out to fit the context; its summary: {summary}]"
"""What a tool result paged out is replaced by."""
PAGED_BYTES = len(PAGED.format(summary=""))


def _utf8_len(text: str) -> int:
    """``len(text.encode())``, without encoding an ASCII text."""
    return len(text) if text.isascii() else len(text.encode())


def _note(first: int, last: int) -> Message:
    turns = f"turn {first} was" if first == last else f"turns {first} to {last} were"
    return {
        "role": "user",
        "content": f"[Earlier {turns} left out here to fit the context limit.]",
        NOTE: [first, last],
    }


def page(context: Context, limit: int) -> Context:
    """``context`` fit into ``limit`` bytes of messages (see the module docstring)."""
    messages = list(context.messages)  # a message is copied before it is changed
    sizes = list(context.message_sizes())
    # The messages' texts, when known, kept as they change (Context.texts).
    known = context.texts is not None and len(context.texts) == len(messages)
    texts = list(context.texts or []) if known else None
    # Bytes of the messages as a JSON array (brackets, messages, a comma between two), kept
    # as they change: each step below looks at it once per message at most.
    total = array_bytes(sizes)

    # Each message's turn (_turn_of), looked at by every step below.
    turn_of = [_turn_of(m) for m in messages]

    def resize(i: int) -> None:
        """Message ``i`` was replaced: its size and text anew."""
        nonlocal total
        size = message_bytes(messages[i])
        total += size - sizes[i]
        sizes[i] = size
        if texts is not None:
            texts[i] = _json(messages[i])

    turns = sorted({t for t in turn_of if t is not None})
    newest = turns[-1] if turns else None

    def page_results(newest_too: bool) -> None:
        for i, message in enumerate(messages):
            if total <= limit:
                break
            if message.get("role") != "tool" or message.get("x-paged"):
                continue
            if not newest_too and turn_of[i] == newest:
                continue
            summary = str(message.get("x-summary") or "")
            # The replacement's bytes, counted before it is made (most results are not paged).
            if PAGED_BYTES + _utf8_len(summary) >= _utf8_len(str(message.get("content", ""))):
                continue
            replacement = PAGED.format(summary=summary)
            messages[i] = {**message, "content": replacement, "x-paged": True}
            resize(i)

    # 1. Old tool results by their summaries, oldest first.
    page_results(newest_too=False)
    # 2. The oldest turns left out whole (never the newest), one note standing for them.
    omitted = context.omitted_turns
    for turn in turns[:-1]:
        if total <= limit:
            break
        first = turn
        old_note = next((i for i, m in enumerate(messages) if m.get(NOTE)), None)
        if old_note is not None:
            noted = messages[old_note][NOTE]
            if isinstance(noted, list) and noted and isinstance(noted[0], int):
                first = min(first, noted[0])
        keep = [i for i, m in enumerate(messages) if turn_of[i] != turn and not m.get(NOTE)]
        messages = [messages[i] for i in keep]
        sizes = [sizes[i] for i in keep]
        turn_of = [turn_of[i] for i in keep]
        if texts is not None:
            texts = [texts[i] for i in keep]
        omitted += 1
        at = next((i + 1 for i, m in enumerate(messages) if m.get("role") == "user"), 0)
        note = _note(first, turn)
        messages.insert(at, note)
        sizes.insert(at, message_bytes(note))
        turn_of.insert(at, None)
        if texts is not None:
            texts.insert(at, _json(note))
        total = array_bytes(sizes)
    # 2b. Then the newest turn's results too.
    page_results(newest_too=True)
    # 3. Cut the longest message short until it fits.
    while total > limit:
        longest = max(range(len(messages)), key=lambda i: sizes[i])
        content = messages[longest].get("content")
        if not isinstance(content, str) or not content:
            break
        excess = total - limit
        keep_chars = max(len(content) - excess - 64, 0)
        cut_short = content[:keep_chars] + " …[cut to fit the context]"
        messages[longest] = {**messages[longest], "content": cut_short}
        resize(longest)
        if keep_chars == 0:
            break
    return Context(
        turn=context.turn,
        messages=messages,
        tools=context.tools,
        omitted_turns=omitted,
        paged_results=sum(1 for m in messages if m.get("x-paged")),
        previous=context.previous,
        sizes=sizes,
        texts=texts,
    )
