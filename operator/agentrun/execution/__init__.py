"""Execution: what the operator creates for a run to carry out its steps.

Step Jobs built from the core's ``CreateJob`` and their outcome read back (:mod:`.jobs`), and
the objects a run owns: labels, owner references, result and audit ConfigMaps (:mod:`.objects`).
Rule: builders and parsers of objects; the calls that create them belong to the loop.
Imports the API models, the core, settings and :mod:`agentrun.kubeapi`, nothing else of the
shell.
"""
