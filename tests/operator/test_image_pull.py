"""A transformer image the kubelet cannot pull: an ETL condition and an Event, not a
silent ``Initializing``."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest

from etl_operator.controller import Controller, OperatorConfig
from etl_operator.status import pull_failure

from .fakes import FakeKube

IMAGE = "ghcr.io/sluice-dev/sluice-runtime:0.1.0"
PULL_ERROR = (
    'failed to pull and unpack image "ghcr.io/sluice-dev/sluice-runtime:0.1.0": failed to '
    'resolve reference "ghcr.io/sluice-dev/sluice-runtime:0.1.0": failed to do request: Head '
    '"https://ghcr.io/v2/sluice-dev/sluice-runtime/manifests/0.1.0": dial tcp: lookup ghcr.io: '
    "no such host"
)


def waiting_status(reason: str, message: str) -> dict:
    """``status`` of a pod whose container waits for its image, as the apiserver returns it
    (started a few seconds ago: an older pod would be past the ETL's init deadline)."""
    now = datetime.now(UTC)
    started = (now - timedelta(seconds=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = (now - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "phase": "Pending",
        "conditions": [
            {"type": "PodReadyToStartContainers", "status": "True",
             "lastTransitionTime": ready},
            {"type": "Initialized", "status": "True", "lastTransitionTime": started},
            {"type": "Ready", "status": "False", "lastTransitionTime": started,
             "reason": "ContainersNotReady",
             "message": "containers with unready status: [transformer]"},
            {"type": "ContainersReady", "status": "False",
             "lastTransitionTime": started, "reason": "ContainersNotReady",
             "message": "containers with unready status: [transformer]"},
            {"type": "PodScheduled", "status": "True",
             "lastTransitionTime": started},
        ],
        "hostIP": "10.200.0.2",
        "podIP": "10.244.1.7",
        "podIPs": [{"ip": "10.244.1.7"}],
        "startTime": started,
        "containerStatuses": [
            {
                "name": "transformer",
                "state": {"waiting": {"reason": reason, "message": message}},
                "lastState": {},
                "ready": False,
                "restartCount": 0,
                "image": IMAGE,
                "imageID": "",
                "started": False,
            }
        ],
        "qosClass": "Burstable",
    }  # fmt: skip


@pytest.fixture
def kube() -> FakeKube:
    k = FakeKube()
    for i in range(2):
        k.add_target(f"target-{i}", node=f"node-{i}")
    k.add_etl(
        "reverse",
        {
            "mode": "object",
            "code": {"entrypoint": "t", "source": "def t(d):\n    return d[::-1]\n"},
        },
    )
    return k


def status(kube: FakeKube) -> dict:
    return kube.etls[("ns", "reverse")]["status"]


def test_a_pod_waiting_for_its_image_names_the_image_pod_and_kubelet_reason() -> None:
    pod = {
        "metadata": {
            "name": "reverse-target-0",
            "annotations": {"sluice.dev/target": "target-0"},
        },
        "spec": {"containers": [{"name": "transformer", "image": IMAGE}]},
        "status": waiting_status("ErrImagePull", PULL_ERROR),
    }
    failure = pull_failure(pod)
    assert failure is not None and failure.reason == "ErrImagePull"
    text = failure.describe()
    assert IMAGE in text and "reverse-target-0" in text and "target-0" in text
    assert "no such host" in text
    # Starting normally (ContainerCreating) or running is not a pull failure.
    pod["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ContainerCreating"}}
    assert pull_failure(pod) is None


def test_unpullable_image_is_a_condition_and_one_event_until_it_is_fixed(kube: FakeKube) -> None:
    ctl = Controller(kube, OperatorConfig(image=IMAGE, cluster_key="k"))  # type: ignore[arg-type]
    ctl.reconcile("ns", "reverse")
    kube.events.clear()
    bad = kube.transformer("target-0")
    bad["status"] = waiting_status("ErrImagePull", PULL_ERROR)
    kube.set_ready(kube.transformer("target-1"))
    ctl.reconcile("ns", "reverse")

    st = status(kube)
    assert st["phase"] == "Initializing"
    name = bad["metadata"]["name"]
    assert IMAGE in st["message"] and name in st["message"]
    cond = {c["type"]: c for c in st["conditions"]}["ImagePulled"]
    assert cond["status"] == "False" and cond["reason"] == "ErrImagePull"
    assert IMAGE in cond["message"] and name in cond["message"]
    assert sorted(e["reason"] for e in kube.events) == ["ImagePullFailed", "TransformerReady"]
    (event,) = [e for e in kube.events if e["reason"] == "ImagePullFailed"]
    assert event["type"] == "Warning"
    assert IMAGE in event["message"] and name in event["message"]
    assert event["involvedObject"]["name"] == "reverse"

    # The kubelet backs off and retries: the condition stays, the Event is not repeated.
    kube.events.clear()
    bad["status"] = waiting_status("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"')
    ctl.reconcile("ns", "reverse")
    ctl.reconcile("ns", "reverse")
    assert kube.events == []
    cond = {c["type"]: c for c in status(kube)["conditions"]}["ImagePulled"]
    assert cond["status"] == "False" and cond["reason"] == "ImagePullBackOff"

    # The image is there now: the pod starts, the condition clears, the ETL runs.
    kube.set_ready(bad)
    ctl.reconcile("ns", "reverse")
    st = status(kube)
    assert st["phase"] == "Running"
    cond = {c["type"]: c for c in st["conditions"]}["ImagePulled"]
    assert cond["status"] == "True"
    assert [e["reason"] for e in kube.events] == ["TransformerReady"]


def test_invalid_image_name_is_reported_too(kube: FakeKube) -> None:
    ctl = Controller(kube, OperatorConfig(image="Not A/Ref", cluster_key="k"))  # type: ignore[arg-type]
    ctl.reconcile("ns", "reverse")
    for i in range(2):
        pod = kube.transformer(f"target-{i}")
        pod["status"] = copy.deepcopy(
            waiting_status("InvalidImageName", 'Failed to apply default image tag "Not A/Ref"')
        )
    kube.events.clear()
    ctl.reconcile("ns", "reverse")
    cond = {c["type"]: c for c in status(kube)["conditions"]}["ImagePulled"]
    assert cond["reason"] == "InvalidImageName" and "Not A/Ref" in cond["message"]
    assert "1 more" in cond["message"]
    assert [e["reason"] for e in kube.events] == ["ImagePullFailed"] * 2
