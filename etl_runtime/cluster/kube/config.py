"""Where the Kubernetes API is: in-cluster service account, else ``KUBECONFIG``."""

from __future__ import annotations

import os

from kubernetes import client, config


def api_client() -> client.ApiClient:
    """A fresh API client: in-cluster if ``KUBERNETES_SERVICE_HOST`` is set, else kubeconfig.

    Each caller gets its own client (and connection pool), so a watch thread
    never competes with request-path calls for connections.
    """
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(
            config_file=os.environ.get("KUBECONFIG") or None,
            client_configuration=configuration,
        )
    return client.ApiClient(configuration)


def default_namespace() -> str:
    """``SLUICE_NAMESPACE``, else the pod's own ``POD_NAMESPACE``, else ``default``."""
    return os.environ.get("SLUICE_NAMESPACE") or os.environ.get("POD_NAMESPACE") or "default"
