"""What the local cluster's parts that run as child processes share
(:class:`~agentrun_devcluster.controlplane.ControlPlane`'s components,
:class:`~agentrun_devcluster.node.NodeProcess`,
:class:`~agentrun_devcluster.operator.OperatorProcess`): waiting until a started process
answers (:func:`wait_answer`, :func:`http_answer`), and the ``with`` protocol
(:class:`StartStop`)."""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import TracebackType
from typing import Self

__all__ = ["StartStop", "http_answer", "wait_answer"]


def wait_answer(
    answer: Callable[[], str | None],
    *,
    exit_code: Callable[[], int | None],
    timeout: float,
    what: str,
    where: str = "",
    error: Callable[[str], Exception],
) -> None:
    """Call ``answer`` every 0.2 s until it returns None (ready; otherwise it returns what it
    got instead, for the error message). Raise ``error(message)``
    when ``exit_code()`` says the process has exited, or after ``timeout`` seconds, with
    ``what`` (the process) and ``where`` (how it was asked, e.g. ``at URL``) and the last
    answer in the message; ``error`` adds the log tail."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while True:
        code = exit_code()
        if code is not None:
            raise error(f"{what} exited with code {code} while starting")
        got = answer()
        if got is None:
            return
        last = got
        if time.monotonic() > deadline:
            at = f" {where}" if where else ""
            raise error(f"{what} not ready{at} after {timeout:.0f}s (last: {last})")
        time.sleep(0.2)


def http_answer(
    url: str,
    ok: Callable[[bytes], bool] | None = None,
    *,
    context: ssl.SSLContext | None = None,
    timeout: float = 5.0,
) -> str | None:
    """An answer function for :func:`wait_answer`: None if ``url`` answers 200 (with a body
    that ``ok`` accepts, if given); otherwise the status and the start of the body, or the
    error."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:
            body: bytes = resp.read()
        if resp.status == 200 and (ok is None or ok(body)):
            return None
        return f"HTTP {resp.status}: {body[:300]!r}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}: {e.read()[:300]!r}"
    except (OSError, ssl.SSLError) as e:
        return repr(e)


class StartStop(ABC):
    """Started by :meth:`start` (which returns once the part answers) and stopped by
    :meth:`stop`. As a context manager, ``with`` starts it and stops it at the end; a start
    that fails or is interrupted stops what it had launched before the error propagates."""

    @abstractmethod
    def start(self) -> Self: ...

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
