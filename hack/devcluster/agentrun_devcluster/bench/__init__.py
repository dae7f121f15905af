"""``make bench``: what the operator costs, beside bare Jobs doing the same work, on the local
control plane.

* :mod:`~agentrun_devcluster.bench.main`: the command line and the order of the cases;
* :mod:`~agentrun_devcluster.bench.cases`: the cases (runs, bare Jobs, the operator at rest);
* :mod:`~agentrun_devcluster.bench.session`: the cluster they run on;
* :mod:`~agentrun_devcluster.bench.workloads`: the runs and Jobs they create;
* :mod:`~agentrun_devcluster.bench.watch`: waiting for many objects with one watch;
* :mod:`~agentrun_devcluster.bench.cpulimit`: the replicas' CPU limits (cgroups);
* :mod:`~agentrun_devcluster.bench.audit`, :mod:`~agentrun_devcluster.bench.procstat`,
  :mod:`~agentrun_devcluster.bench.stats`: reading the audit log and /proc, percentiles;
* :mod:`~agentrun_devcluster.bench.report`: the printed figures, and the run's data file;
* :mod:`~agentrun_devcluster.bench.plots`: the plots, drawn from the data files.

docs/benchmarks.md explains what each figure measures and shows the latest figures;
docs/bench-runs/ holds every recorded run's figures.
"""
