"""Cluster: who is in the cluster and where things go (above ``core`` and ``wire``).

``records`` (targets, transformers, ETL records and the protocols of their
stores), ``clustermap`` (the versioned member list and bucket props),
``hrw`` (placement), ``reconcile`` (desired transformers for an ETL, shared by
the kopf operator and the local controller), and the stores behind them:
``kube`` (custom resources, pods, a ConfigMap) and ``local`` (files on one machine).
"""
