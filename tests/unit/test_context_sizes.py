"""The context's message sizes (``messageBytes``): kept as a turn adds and pages messages, so
that a turn does not encode the whole conversation again, and always the sizes counting would
give (the request's byte count, the paging) whatever the messages."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.core import context as cx
from agentrun.core import naming

TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
MEMBER = st.sampled_from(["x-turn", "x-summary", "x-paged", "name", "tool_call_id"])


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["system", "user", "user", "assistant", "tool"]))
    content: Any = draw(st.one_of(TEXT, st.none(), st.lists(st.fixed_dictionaries({"text": TEXT}))))
    message: dict[str, Any] = {"role": role, "content": content}
    for key in draw(st.lists(MEMBER, max_size=3, unique=True)):
        message[key] = draw(st.one_of(TEXT, st.integers(1, 50)))
    return message


CONVERSATIONS = st.lists(messages(), max_size=12)
TOOLS = cx.tool_definitions([("echo", "Echoes.", {"type": "object", "properties": {}})])


@settings(max_examples=300, deadline=None)
@given(
    listed=CONVERSATIONS,
    tools=st.sampled_from([[], TOOLS]),
    temperature=st.one_of(st.none(), st.floats(0, 2)),
    choice=st.sampled_from([None, "auto", "echo"]),
)
def test_the_request_size_is_the_size_of_the_request_sent(
    listed: list[dict[str, Any]], tools: list[dict[str, Any]], temperature: float | None,
    choice: str | None,
) -> None:  # fmt: skip
    ctx = cx.Context(turn=3, messages=listed, tools=tools)
    body = cx.request_body(ctx, "m", 64, temperature, choice)
    assert cx.request_size(ctx, "m", 64, temperature, choice) == cx.request_bytes(body)
    assert ctx.bytes == cx.messages_bytes(listed)


@settings(max_examples=200, deadline=None)
@given(listed=CONVERSATIONS, added=CONVERSATIONS, limit=st.integers(2, 600))
def test_paging_with_the_sizes_kept_is_paging_with_them_counted(
    listed: list[dict[str, Any]], added: list[dict[str, Any]], limit: int
) -> None:
    for turn, message in enumerate(listed + added):
        if message["role"] in ("assistant", "tool"):
            message["x-turn"] = 1 + turn % 4
    kept = cx.Context(turn=5, messages=listed).extended(6, added)
    counted = cx.Context(turn=6, messages=[*listed, *added])
    assert kept.sizes == [cx.message_bytes(m) for m in kept.messages]
    before = json.dumps(kept.messages)
    paged, again = cx.page(kept, limit), cx.page(counted, limit)
    assert json.dumps(kept.messages) == before, "paging changed the context it was given"
    assert paged.to_json() == again.to_json()
    assert paged.sizes == [cx.message_bytes(m) for m in paged.messages]
    assert paged.bytes == cx.messages_bytes(paged.messages)


def test_the_sizes_are_stored_with_the_document_and_read_back_only_when_they_fit() -> None:
    ctx = cx.Context(
        turn=2,
        messages=[{"role": "user", "content": "goal"}, {"role": "assistant", "content": "é"}],
    )
    parts, _ = ctx.encoded()
    document = json.loads("".join(parts))
    assert document["messageBytes"] == [cx.message_bytes(m) for m in ctx.messages]
    read = cx.Context.from_parts(parts)
    assert not isinstance(read, str) and read.sizes == document["messageBytes"]
    for wrong in ([1, 2], [9], None, ["30", 30], [True, 30]):
        document["messageBytes"] = wrong
        read = cx.Context.from_parts([json.dumps(document)])
        assert not isinstance(read, str) and read.sizes is None, wrong
        assert read.bytes == cx.messages_bytes(read.messages)  # counted again


# -- the messages' texts (Context.texts) ---------------------------------------------------------


def _text(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)


def _whole(ctx: cx.Context) -> str:
    """The document encoded at once, as a whole (what :meth:`Context.to_json` must give)."""
    body: dict[str, Any] = {
        "turn": ctx.turn,
        "messages": ctx.messages,
        "tools": ctx.tools,
        "omittedTurns": ctx.omitted_turns,
        "pagedResults": ctx.paged_results,
    }
    if ctx.previous is not None:
        body["previous"] = ctx.previous
    body["messageBytes"] = [cx.message_bytes(m) for m in ctx.messages]
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


@settings(max_examples=200, deadline=None)
@given(
    listed=CONVERSATIONS,
    added=CONVERSATIONS,
    more=CONVERSATIONS,
    limit=st.integers(2, 600),
    tools=st.sampled_from([[], TOOLS]),
    previous=st.one_of(st.none(), TEXT),
)
def test_the_texts_kept_through_turns_and_paging_give_the_document_encoded_at_once(
    listed: list[dict[str, Any]],
    added: list[dict[str, Any]],
    more: list[dict[str, Any]],
    limit: int,
    tools: list[dict[str, Any]],
    previous: str | None,
) -> None:
    for turn, message in enumerate(listed + added + more):
        if message["role"] in ("assistant", "tool"):
            message["x-turn"] = 1 + turn % 4
    first = cx.Context(turn=5, messages=listed, tools=tools, previous=previous)
    assert first.to_json() == _whole(first)  # and its texts are known from now on
    assert first.texts == [_text(m) for m in listed]
    paged = cx.page(first.extended(6, added), limit)
    assert paged.texts is not None, "the texts known are kept through a turn and its paging"
    assert paged.to_json() == _whole(paged)
    again = cx.page(paged.extended(7, more, previous="p"), limit)
    assert again.texts == [_text(m) for m in again.messages]
    parts, digest = again.encoded()
    assert "".join(parts) == _whole(again) and digest == again.digest()
    assert digest == naming.sha256_text("".join(parts))
    # Without texts known (a document read from its parts), the same document.
    read = cx.Context.from_parts(cx.page(paged, limit).encoded()[0])
    assert not isinstance(read, str) and read.texts is None
    assert read.to_json() == cx.page(paged, limit).to_json()


def test_a_message_changed_by_paging_is_encoded_anew_and_the_others_are_not() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "goal"},
        {"role": "assistant", "content": None, "x-turn": 1},
        {"role": "tool", "content": "r" * 300, "x-turn": 1, "x-summary": "ok"},
    ]
    ctx = cx.Context(turn=2, messages=messages)
    ctx.to_json()
    nxt = ctx.extended(2, [{"role": "assistant", "content": "é", "x-turn": 2}])
    assert nxt.texts is not None and nxt.texts[:4] == ctx.texts
    paged = cx.page(nxt, 300)
    assert paged.messages[3]["x-paged"] is True
    assert paged.texts is not None and paged.texts[3] == _text(paged.messages[3])
    assert paged.texts[:3] == ctx.texts[:3] and paged.to_json() == _whole(paged)


def test_the_parts_of_a_document_that_fits_one_part_are_its_text() -> None:
    assert cx.split_bytes("", 10) == [""]
    assert cx.split_bytes("abcé", 5) == ["abcé"]
    assert cx.split_bytes("abcé", 4) == ["abc", "é"]
    assert cx.split_bytes("\ud800x", 3) == ["\ud800", "x"]  # a lone surrogate: 3 bytes


def test_a_result_is_paged_out_only_when_its_replacement_is_shorter_in_bytes() -> None:
    summary = "é" * 3  # 6 bytes
    replacement = f"[result paged out to fit the context; its summary: {summary}]"
    size = len(replacement.encode())
    for content, paged in (("ü" * (size // 2), False), ("ü" * (size // 2) + "xy", True)):
        if size % 2:
            content += "x"
        ctx = cx.Context(
            turn=3,
            messages=[
                {"role": "user", "content": "goal"},
                {"role": "tool", "content": content, "x-turn": 1, "x-summary": summary},
                {"role": "tool", "content": "new", "x-turn": 2, "x-summary": "s"},
            ],
        )
        out = cx.page(ctx, ctx.bytes - 1)  # over by one byte: turn 1's result paged, or left out
        assert len(content.encode()) - size == (2 if paged else 0)
        assert (out.paged_results, out.omitted_turns) == ((1, 0) if paged else (0, 1))
        assert (out.messages[1]["content"] == replacement) is paged
