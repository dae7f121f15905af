"""``kubectl agentrun``: the kubectl plugin for AgentRuns.

Installed as the ``kubectl-agentrun`` console script, so ``kubectl agentrun ...`` finds it
on PATH. Commands: approve, reject, suspend, resume, cancel, status, tree, history, result,
transcript, fork, release, wait, logs, completion (and ``--version``). ``kubectl`` hands the
plugin only what follows its name, so cluster flags (``-n``, ``--context``, ``--kubeconfig``)
go after ``agentrun``; the commands are :mod:`.commands`.
"""

from __future__ import annotations

from agentrun.clients.plugin.commands import build_parser, main

__all__ = ["build_parser", "main"]
