"""What the tests share, in one place: test modules import from here and never from each other
(fixtures live in the conftest.py files).

* :mod:`tests.support.paths`: where the repository's files are (chart, CRDs, manifests).
* :mod:`tests.support.runs`: AgentRun, step and result-envelope builders; reading runs.
* :mod:`tests.support.waiting`: waiting for a run or step to get somewhere, and
  :func:`~tests.support.waiting.assert_holds` for "nothing happens" over a window.
* :mod:`tests.support.cluster`: namespaces, roles, minted users, the operator's finalizers,
  the fixture types.
* :mod:`tests.support.jobs`: plain Jobs for testing the local node and control plane.
* :mod:`tests.support.helm`: helm with a home of its own, and rendered charts.
* :mod:`tests.support.admission`: the shipped admission policies, bound to one namespace.
* :mod:`tests.support.sim`: an in-memory cluster and ledger driving the pure core.
* :mod:`tests.support.phases`: a run in each phase (in memory or in the API server), and the
  conditions, kstatus and Argo CD health expected of it.
* :mod:`tests.support.passes`: the operator's passes over a sim, with its faults (crashes,
  stale reads, stalls, repeats), for the property tests.
* :mod:`tests.support.recorded`: a sim whose commits are derived as telemetry.
* :mod:`tests.support.agent_sim`: the sim for agent runs; :mod:`tests.support.agents`: their
  tools, and agent runs for the local cluster.
* :mod:`tests.support.stores`: an in-memory result store for the step runner.
* :mod:`tests.support.plugin`: ``kubectl agentrun`` and ``agentrun step llm`` as the suites
  run them.
* :mod:`tests.support.docker`: the hack/ scripts that bring up Docker and build the images,
  and when a test skips for want of Docker.
* :mod:`tests.support.chart` and :mod:`tests.support.pods`: the chart installed with the
  local images, and plain pods, for the container suite.
* :mod:`tests.support.schema`: the CRD's schema as a JSON Schema validator.
"""
