"""Clients of the API, for people and programs, never imported by the operator: the typed
Python client (:mod:`.typed`), making a fork (:mod:`.forks`) and the kubectl plugin
(:mod:`.plugin`).
Rule: imports the API models, the core, settings, :mod:`agentrun.kubeapi`, access and
execution's objects; never the loop, the observation or the in-pod programs.
"""
