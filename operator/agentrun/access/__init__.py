"""Access: whose rights a run acts with and what people decide on it.

The creator's rights checked by SubjectAccessReview (:mod:`.authz`), a person's decision on a
gated step (:mod:`.approvals`, one implementation for the plugin, the client and the tests,
the API calls passed in), and the hash-chained audit record (:mod:`.audit`).
Rule: imports the API models, the core, settings and :mod:`agentrun.kubeapi`, nothing else of
the shell.
"""
