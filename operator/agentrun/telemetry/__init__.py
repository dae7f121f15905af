"""Telemetry: what the operator tells about itself and its runs.

What a committed pass changed (:mod:`.changes`, its facts in :mod:`.facts`), turned into
Prometheus metrics (:mod:`.metrics`), optional OpenTelemetry traces (:mod:`.tracing`),
Kubernetes Events on runs (:mod:`.events`) and JSON log lines (:mod:`.logs`); ``/metrics`` and
``/readyz`` (:mod:`.endpoints`).
Rule: imports the API models, the core, settings and :mod:`agentrun.kubeapi`; it never
decides anything a run does.
"""
