"""The reconcile loop: kopf's wiring (:mod:`.handlers`), the passes that observe, ask the
core, commit and act (:mod:`.reconciler`), the status ledger with its resourceVersion fence
(:mod:`.ledger`), how much runs at once (:mod:`.concurrency`) and the deletions nobody else
finishes (:mod:`.janitor`).
Rule: the top of the operator; it may import every other package of the shell but the clients
and the in-pod programs, and nothing imports it but :mod:`agentrun.cli`.
"""
