# The uninstall hook's first step (templates/uninstall-hook.yaml), run by the operator image's
# Python before `agentrun release`: stop the operator, so that none is left to add a finalizer
# to a run, or to start a step Job, after the release has swept.
#
# 1. Scale the operator's Deployment to 0 (nothing to do when it is gone or already at 0).
# 2. Wait until its pods are gone, at most AGENTRUN_OPERATOR_GRACE_SECONDS.
# 3. Exit 0 whatever happened (printing what): the release that follows works with or without an
#    operator, and a step that failed here must not keep the runs' finalizers in place.
#
# Environment: AGENTRUN_OPERATOR_NAMESPACE, AGENTRUN_OPERATOR_DEPLOYMENT,
# AGENTRUN_OPERATOR_SELECTOR (the operator pods' labels), AGENTRUN_OPERATOR_GRACE_SECONDS.
# In a pod: the ServiceAccount's token; elsewhere (tests): $KUBECONFIG.
import os
import sys
import time

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException


def say(message):
    print(f"stop-operator: {message}", flush=True)


def main():
    namespace = os.environ["AGENTRUN_OPERATOR_NAMESPACE"]
    deployment = os.environ["AGENTRUN_OPERATOR_DEPLOYMENT"]
    selector = os.environ["AGENTRUN_OPERATOR_SELECTOR"]
    grace = float(os.environ.get("AGENTRUN_OPERATOR_GRACE_SECONDS", "60"))
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:
        config.load_kube_config()
    apps, core = client.AppsV1Api(), client.CoreV1Api()
    try:
        apps.patch_namespaced_deployment_scale(deployment, namespace, {"spec": {"replicas": 0}})
        say(f"scaled deployment {namespace}/{deployment} to 0")
    except ApiException as error:
        # 404: no operator (uninstalled by hand, or another release's); 403: rbac.create=false,
        # the operator's own ServiceAccount may not scale it.
        say(f"deployment {namespace}/{deployment} not scaled: HTTP {error.status} {error.reason}")
    deadline = time.monotonic() + grace
    while True:
        try:
            pods = core.list_namespaced_pod(namespace, label_selector=selector).items
        except ApiException as error:
            say(f"operator pods not listed: HTTP {error.status} {error.reason}; not waiting")
            return 0
        if not pods:
            say("no operator pod left")
            return 0
        if time.monotonic() >= deadline:
            names = ", ".join(p.metadata.name for p in pods)
            say(f"operator pods still there after {grace:.0f}s ({names}): releasing anyway")
            return 0
        time.sleep(2)


if __name__ == "__main__":
    sys.exit(main())
