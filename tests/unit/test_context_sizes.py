"""The context's message sizes (``messageBytes``): kept as a turn adds and pages messages, so
that a turn does not encode the whole conversation again, and always the sizes counting would
give (the request's byte count, the paging) whatever the messages."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.core import context as cx

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
