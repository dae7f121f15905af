"""Programs that run inside a step's pod, never in the operator: ``agentrun step`` (runs the
step's command and writes its result envelope, :mod:`.runner`) and ``agentrun step llm`` (one
model turn of an agent run, :mod:`.llm`, which calls the model through :mod:`.model_call`).
Rule: imports the API models, the core, settings, :mod:`agentrun.kubeapi` and execution's
builder of the result ConfigMap (the layout the operator reads back); the operator never
imports this package.
"""
