"""Turn a pod's container spec into a local process launch.

Resolves what the real kubelet resolves before starting a container: the
environment (literal values, ``$(VAR)`` references, downward-API ``fieldRef``,
``secretKeyRef`` / ``configMapKeyRef``, ``envFrom``), volumes (materialised as
directories under the kubelet's state dir) and the command line.  The image is
ignored: executables come from ``PATH``, whose first entry is the bin dir of
the Python running the kubelet (the project's venv), so ``sluice-target``,
``python`` or ``kopf`` resolve to the project's.

``volumeMounts`` become real paths with ``unshare --mount`` and bind mounts
(needs root); where that is not allowed the container runs without them and
each mount's directory is exported as ``SLUICE_VOLUME_<NAME>`` instead.
"""

from __future__ import annotations

import base64
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.k8s.api import Api, ApiError

JSON = dict[str, Any]
VENV_BIN = str(Path(sys.executable).parent)
BASE_PATH = f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
# What a real node would have in the container image: the project and the
# Python it runs on. A volume mounted over a parent of one of these (an
# emptyDir at /tmp while the checkout lives in /tmp/...) must not hide it.
_roots = sorted({str(Path(p).resolve()) for p in (Path(__file__).parents[2], sys.prefix)})
_roots.append(str(Path(sys.base_prefix).resolve()))
IMAGE_ROOTS = tuple(
    r for r in dict.fromkeys(_roots) if not any(r.startswith(o + "/") for o in _roots)
)
IMAGE_STASH = "/run/sluice-kubelet-image"  # inside each pod's private mount namespace


class LaunchError(RuntimeError):
    """A container cannot be started (bad reference, missing executable...)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: ``$$`` escapes, unknown names stay as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and (end := text.find(")", i + 2)) != -1:
            name = text[i + 2 : end]
            out.append(env.get(name, text[i : end + 1]))
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def field_value(pod: JSON, path: str) -> str:
    """Value of a downward-API ``fieldRef.fieldPath``."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": status.get("podIP", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.podIPs": ",".join(p["ip"] for p in status.get("podIPs", [])),
        "status.hostIPs": ",".join(p["ip"] for p in status.get("hostIPs", [])),
    }
    if path in simple:
        return str(simple[path])
    for prefix, key in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return str(meta.get(key, {}).get(path[len(prefix) + 2 : -2], ""))
        if path == prefix:
            items = sorted(meta.get(key, {}).items())
            return "\n".join(f'{k}="{v}"' for k, v in items)
    raise LaunchError("CreateContainerConfigError", f"unsupported fieldRef {path!r}")


def object_data(api: Api, kind: str, namespace: str, name: str) -> dict[str, str] | None:
    """The decoded data of a Secret or ConfigMap (None when it does not exist)."""
    plural = "secrets" if kind == "secret" else "configmaps"
    obj = api.get_or_none(f"/api/v1/namespaces/{namespace}/{plural}/{name}")
    if obj is None:
        return None
    data: dict[str, str] = dict(obj.get("data") or {})
    if kind == "secret":
        data = {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in data.items()}
    else:
        for k, v in (obj.get("binaryData") or {}).items():
            data[k] = base64.b64decode(v).decode("utf-8", "replace")
    return data


def _key_ref(api: Api, pod: JSON, kind: str, ref: JSON) -> str | None:
    ns = pod["metadata"]["namespace"]
    data = object_data(api, kind, ns, ref["name"])
    what = f"{kind} {ns}/{ref['name']}"
    if data is None or ref["key"] not in data:
        if ref.get("optional"):
            return None
        missing = what if data is None else f"key {ref['key']!r} in {what}"
        raise LaunchError("CreateContainerConfigError", f"{missing} not found")
    return data[ref["key"]]


def container_env(api: Api, pod: JSON, container: JSON, base: dict[str, str]) -> dict[str, str]:
    """The full environment of a container, in Kubernetes precedence order."""
    env = dict(base)
    for src in container.get("envFrom", []):
        if "configMapRef" in src:
            kind, ref = "configmap", src["configMapRef"]
        elif "secretRef" in src:
            kind, ref = "secret", src["secretRef"]
        else:
            continue
        data = object_data(api, kind, pod["metadata"]["namespace"], ref["name"])
        if data is None and not ref.get("optional"):
            raise LaunchError("CreateContainerConfigError", f"{kind} {ref['name']} not found")
        env.update({src.get("prefix", "") + k: v for k, v in (data or {}).items()})
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
            continue
        source = var.get("valueFrom", {})
        value: str | None = ""
        if "fieldRef" in source:
            value = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in source:
            value = _key_ref(api, pod, "secret", source["secretKeyRef"])
        elif "configMapKeyRef" in source:
            value = _key_ref(api, pod, "configmap", source["configMapKeyRef"])
        elif "resourceFieldRef" in source:
            res = source["resourceFieldRef"]["resource"]  # e.g. limits.cpu
            section, _, name = res.partition(".")
            value = str(container.get("resources", {}).get(section, {}).get(name, "0"))
        if value is not None:
            env[var["name"]] = value
    return env


@dataclass
class Launch:
    """Everything needed to start one container as a process."""

    argv: list[str]
    env: dict[str, str]
    cwd: str


def _write_files(target: Path, files: dict[str, str | bytes]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)


def _items(data: dict[str, str], items: list[JSON] | None) -> dict[str, str | bytes]:
    if not items:
        return dict(data)
    return {i["path"]: data[i["key"]] for i in items if i["key"] in data}


def volume_dir(api: Api, pod: JSON, volume: JSON, pod_dir: Path, state_dir: Path) -> Path:
    """Materialise one pod volume as a local directory and return it."""
    name, ns = volume["name"], pod["metadata"]["namespace"]
    local = pod_dir / "volumes" / name
    if "hostPath" in volume:
        path = Path(volume["hostPath"]["path"])
        if volume["hostPath"].get("type", "") in ("", "DirectoryOrCreate"):
            path.mkdir(parents=True, exist_ok=True)
        return path
    if "persistentVolumeClaim" in volume:
        claim = volume["persistentVolumeClaim"]["claimName"]
        pvc = api.get_or_none(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}")
        if pvc is None:
            raise LaunchError("CreateContainerConfigError", f"PVC {ns}/{claim} not found")
        pv_name = pvc["spec"].get("volumeName")
        pv = api.get_or_none(f"/api/v1/persistentvolumes/{pv_name}") if pv_name else None
        for kind in ("hostPath", "local"):
            if pv and kind in pv["spec"]:
                path = Path(pv["spec"][kind]["path"])
                break
        else:  # unbound or another PV type: a stable per-claim directory
            path = state_dir / "pvc" / ns / claim
        path.mkdir(parents=True, exist_ok=True)
        return path
    if "emptyDir" in volume:
        local.mkdir(parents=True, exist_ok=True)
        return local
    files: dict[str, str | bytes] = {}
    for kind in ("secret", "configMap"):
        if kind in volume:
            src = volume[kind]
            ref = src.get("secretName") or src.get("name")
            data = object_data(api, kind.lower(), ns, ref)
            if data is None and not src.get("optional"):
                raise LaunchError("CreateContainerConfigError", f"{kind} {ns}/{ref} not found")
            files = _items(data or {}, src.get("items"))
    if "downwardAPI" in volume:
        items = volume["downwardAPI"]["items"]
        files = {i["path"]: field_value(pod, i["fieldRef"]["fieldPath"]) for i in items}
    if "projected" in volume:
        files = _projected(api, pod, volume["projected"]["sources"])
    _write_files(local, files)
    return local


def _projected(api: Api, pod: JSON, sources: list[JSON]) -> dict[str, str | bytes]:
    meta = pod["metadata"]
    files: dict[str, str | bytes] = {}
    for src in sources:
        if "serviceAccountToken" in src:
            tok = src["serviceAccountToken"]
            sa = pod["spec"].get("serviceAccountName", "default")
            req = {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "audiences": [tok["audience"]] if tok.get("audience") else None,
                    "expirationSeconds": tok.get("expirationSeconds", 3607),
                    "boundObjectRef": {
                        "apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]
                    },
                },
            }  # fmt: skip
            path = f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token"
            try:
                files[tok["path"]] = api.post(path, req)["status"]["token"]
            except ApiError as e:
                raise LaunchError("CreateContainerConfigError", f"token for {sa}: {e}") from e
        for kind in ("secret", "configMap"):
            if kind in src:
                ref = src[kind]
                data = object_data(api, kind.lower(), meta["namespace"], ref["name"])
                if data is None and not ref.get("optional"):  # e.g. kube-root-ca.crt not yet made
                    what = f"{kind} {meta['namespace']}/{ref['name']}"
                    raise LaunchError("CreateContainerConfigError", f"{what} not found")
                files.update(_items(data or {}, ref.get("items")))
        if "downwardAPI" in src:
            for item in src["downwardAPI"]["items"]:
                files[item["path"]] = field_value(pod, item["fieldRef"]["fieldPath"])
    return files


def can_unshare() -> bool:
    """Whether private mount namespaces with bind mounts work here."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             "mount --bind / /mnt && umount /mnt"]  # fmt: skip
    return subprocess.run(probe, capture_output=True).returncode == 0


def _mount_order(mount_path: str, mounts: dict[str, Path]) -> tuple[bool, str]:
    """Parents before children; a mount that would hide another's source last."""
    hides = any(str(src).startswith(mount_path.rstrip("/") + "/") for src in mounts.values())
    return hides, mount_path


def launch(
    container: JSON, env: dict[str, str], mounts: dict[str, Path], use_unshare: bool
) -> Launch:
    """The argv/env/cwd that run ``container`` with its volume mounts.

    ``mounts`` maps each volumeMount's ``mountPath`` to the local directory
    (already including ``subPath``); read-only mounts are remounted read-only.
    """
    cmd = [expand(c, env) for c in container.get("command", [])]
    args = [expand(a, env) for a in container.get("args", [])]
    if not cmd:
        raise LaunchError(
            "CreateContainerError",
            f"container {container['name']!r} has no command: the process kubelet ignores "
            "images, so it cannot use the image's entrypoint",
        )
    exe = shutil.which(cmd[0], path=env.get("PATH", BASE_PATH))
    if exe is None:
        raise LaunchError("StartError", f'exec: "{cmd[0]}": executable file not found in $PATH')
    argv = [exe, *cmd[1:], *args]
    cwd = container.get("workingDir") or "/"
    if not mounts:
        return Launch(argv, env, cwd)
    if not use_unshare:
        for mount_path, src in mounts.items():
            env[f"SLUICE_VOLUME_{mount_path.strip('/').replace('/', '_').upper()}"] = str(src)
        return Launch(argv, env, cwd if Path(cwd).is_dir() else "/")
    readonly = {m["mountPath"] for m in container.get("volumeMounts", []) if m.get("readOnly")}
    # Image roots a volume would hide are stashed first and put back after.
    hidden = [r for r in IMAGE_ROOTS if any(r.startswith(m.rstrip("/") + "/") for m in mounts)]
    script = []
    for i, root in enumerate(hidden):
        stash = shlex.quote(f"{IMAGE_STASH}/{i}")
        script.append(f"mkdir -p {stash} && mount --bind {shlex.quote(root)} {stash} || exit 111")
    for mount_path, src in sorted(mounts.items(), key=lambda m: _mount_order(m[0], mounts)):
        dst, s = shlex.quote(mount_path), shlex.quote(str(src))
        make = f"mkdir -p {dst}" if src.is_dir() else f"mkdir -p $(dirname {dst}); touch {dst}"
        script.append(f"{make} && mount --bind {s} {dst} || exit 111")
        if mount_path in readonly:
            script.append(f"mount -o remount,bind,ro {dst} || exit 111")
    for i, root in enumerate(hidden):
        stash, r = shlex.quote(f"{IMAGE_STASH}/{i}"), shlex.quote(root)
        script.append(f"mkdir -p {r} && mount --bind {stash} {r} || exit 111")
    script.append(f'cd {shlex.quote(cwd)} && exec "$@"')
    wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)]
    return Launch([*wrapper, "sh", *argv], env, "/")
