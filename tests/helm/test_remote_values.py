"""The chart's remote settings for each provider reach the targets and the gateways."""

from __future__ import annotations

from tests.helm.chart import container, env_of, render


def test_gcp_and_azure_settings_and_secrets_reach_targets_and_gateways() -> None:
    m = render(
        {
            "remote.secretName": "s3-keys",
            "remote.gcp.secretName": "gcs-key",
            "remote.gcp.endpoint": "http://fake-gcs.storage:4443",
            "remote.gcp.project": "data-lake-1",
            "remote.azure.secretName": "blob-key",
            "remote.azure.endpoint": "http://azurite.storage:10000/acct",
            "remote.azure.account": "acct",
        }
    )
    for kind, comp in (("StatefulSet", "target"), ("Deployment", "gateway")):
        c = container(m.component(kind, comp))
        env = env_of(c)
        assert env["STORAGE_EMULATOR_HOST"]["value"] == "http://fake-gcs.storage:4443"
        assert env["GOOGLE_CLOUD_PROJECT"]["value"] == "data-lake-1"
        assert env["AZURE_STORAGE_ENDPOINT"]["value"] == "http://azurite.storage:10000/acct"
        assert env["AZURE_STORAGE_ACCOUNT_NAME"]["value"] == "acct"
        refs = [e["secretRef"]["name"] for e in c["envFrom"]]
        assert refs == ["s3-keys", "gcs-key", "blob-key"], (comp, refs)


def test_without_remote_settings_no_provider_env_and_no_env_from() -> None:
    m = render()
    for kind, comp in (("StatefulSet", "target"), ("Deployment", "gateway")):
        c = container(m.component(kind, comp))
        env = env_of(c)
        for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT", "AZURE_STORAGE_ENDPOINT"):
            assert name not in env
        assert "envFrom" not in c
