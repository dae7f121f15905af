"""Observation: what a reconcile pass reads besides the run itself.

The in-memory view of step Jobs, their pods and pod refusals, and which of their changes
matter to a pass (:mod:`.view`), the watches that keep it current (:mod:`.watches`), which of
those Jobs count as a step attempt's (:mod:`.adoption`), and the conversation an agent run
continues, read from the run it names (:mod:`.conversation`).
Rule: reads only; it never writes to the API (a LocalSubjectAccessReview is a read of rights).
Imports the API models, the core, settings, :mod:`agentrun.kubeapi`, the Job parsers of
:mod:`agentrun.execution` and the rights review of :mod:`agentrun.access`, nothing else of the
shell.
"""
