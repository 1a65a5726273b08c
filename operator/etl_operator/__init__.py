"""Sluice Kubernetes operator: ETL custom resources -> transformer pods."""
