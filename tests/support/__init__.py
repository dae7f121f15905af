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
* :mod:`tests.support.schema`: the CRD's schema as a JSON Schema validator.
"""
