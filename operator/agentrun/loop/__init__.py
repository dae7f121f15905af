"""The reconcile loop: kopf's wiring (:mod:`.handlers`), when each run gets its next pass
(:mod:`.scheduler`), the passes that observe (:mod:`.observe`, the runs' latest bodies in
:mod:`.run_bodies`), ask the core (:mod:`.decide`), commit (:mod:`.commit`) and act
(:mod:`.act`), composed by :mod:`.reconciler` on what they share
(:mod:`.common`), the status ledger with its resourceVersion fence (:mod:`.ledger`), the key
that signs step Jobs (:mod:`.signing`), what deleting a run removes and how long a deletion
waits for it (:mod:`.cleanup`), how much runs at once (:mod:`.concurrency`) and the deletions
nobody else finishes (:mod:`.janitor`).
Rule: the top of the operator; it may import every other package of the shell but the clients
and the in-pod programs. Only :mod:`agentrun.cli` imports it, and ``kubectl agentrun release``
its janitor's release (the one exception tests/unit/test_layering.py names).
"""
