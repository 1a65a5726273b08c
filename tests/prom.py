"""Read a server's ``/metrics`` the way Prometheus does (``prometheus_client.parser``)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """One scrape: ``value(sample name, **labels)`` sums the samples that match."""

    def __init__(self, text: str) -> None:
        self.samples = [
            s for family in text_string_to_metric_families(text) for s in family.samples
        ]

    def value(self, name: str, **labels: str) -> float:
        return sum(
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def labels(self, name: str, label: str) -> set[str]:
        """Every value of ``label`` among the samples named ``name``."""
        return {s.labels[label] for s in self.samples if s.name == name and label in s.labels}


def scrape(base_url: str) -> Scrape:
    r = httpx.get(f"{base_url}/metrics", timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return Scrape(r.text)
