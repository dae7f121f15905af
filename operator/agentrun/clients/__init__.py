"""Clients of the API, for people and programs, never imported by the operator: the typed
Python client (:mod:`.typed`), the kubectl plugin (:mod:`.plugin`), and what both do alike with
their own API calls passed in: reading a run (:mod:`.reading`) and making a fork
(:mod:`.forks`, planned by :mod:`agentrun.core.fork_plan`).
Rule: imports the API models, the core, settings, :mod:`agentrun.kubeapi`, access and
execution's objects; never the observation or the in-pod programs, and the loop only where
``kubectl agentrun release`` runs the operator's own release (:mod:`agentrun.loop.janitor`,
inside that command). Within it, the plugin imports the shared modules, never the other way
round.
"""
