"""The local node's streaming server, without a cluster: WebSocket frames both ways, the
outcome a client reads on channel 3, and how a command exec'd into a container is run."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from agentrun_devcluster import streaming
from agentrun_devcluster.process import ExecContext


def masked(opcode: int, payload: bytes, mask: bytes, *, fin: bool = True) -> bytes:
    """A frame as a client sends it (masked)."""
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


@given(payload=st.binary(max_size=70_000), mask=st.binary(min_size=4, max_size=4))
def test_a_clients_masked_frame_is_read_back_whole(payload: bytes, mask: bytes) -> None:
    buf = bytearray(masked(2, payload, mask) + b"\x81")
    assert streaming._parse_frame(buf) == (True, 2, payload)
    assert buf == bytearray(b"\x81")  # the next frame's first byte stays


@given(payload=st.binary(max_size=70_000))
def test_a_servers_frame_is_unmasked_and_parses(payload: bytes) -> None:
    frame = streaming._frame(2, payload)
    assert not frame[1] & 0x80
    buf = bytearray(frame)
    assert streaming._parse_frame(buf) == (True, 2, payload)


def test_an_incomplete_frame_waits_for_the_rest() -> None:
    frame = masked(2, b"\x00hello", b"abcd")
    for cut in range(len(frame)):
        buf = bytearray(frame[:cut])
        assert streaming._parse_frame(buf) is None
        assert len(buf) == cut


def test_fragments_make_one_channel_message() -> None:
    class Silent:
        def sendall(self, data: bytes) -> None:
            raise AssertionError("nothing to answer")

    data = masked(2, b"\x00hel", b"abcd", fin=False) + masked(0, b"lo", b"efgh")
    channels = streaming._Channels(Silent(), bytearray(data), "v4.channel.k8s.io")  # type: ignore[arg-type]
    assert channels.messages() == [(0, b"hello")]
    assert channels.open


def test_the_outcome_on_channel_3_is_what_clients_parse() -> None:
    assert json.loads(streaming._status(0)) == {"metadata": {}, "status": "Success"}
    failed = json.loads(streaming._status(3))
    assert failed["status"] == "Failure" and failed["reason"] == "NonZeroExitCode"
    assert failed["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]
    error = json.loads(streaming._status("no such file"))
    assert error["reason"] == "InternalError" and error["message"] == "no such file"


def test_stream_flags_use_the_names_the_api_server_sends() -> None:
    query = {"output": ["1"], "error": ["1"], "command": ["ls"]}
    assert streaming._flag(query, "stdout") and streaming._flag(query, "stderr")
    assert not streaming._flag(query, "stdin") and not streaming._flag(query, "tty")


def test_an_exec_runs_with_the_containers_environment_and_paths(tmp_path: Path) -> None:
    message = tmp_path / "step.termination-log"
    context = ExecContext(
        env={"PATH": os.environ["PATH"], "GREETING": "hi"},
        cwd=tmp_path,
        paths={"/dev/termination-log": str(message)},
        log_path=tmp_path / "step.log",
        running=lambda: True,
    )
    argv = context.argv(["sh", "-c", "echo $GREETING > /dev/termination-log"])
    assert argv == ["sh", "-c", f"echo $GREETING > {message}"]


def test_log_requests_read_their_own_flags() -> None:
    """``follow`` and ``previous`` are a log request's flags, not a stream's: read as given."""
    assert streaming._asked({"follow": ["true"]}, "follow")
    assert not streaming._asked({}, "previous") and not streaming._asked(
        {"follow": ["0"]}, "follow"
    )
