"""What the API server checks beyond the OpenAPI schemas (Kubernetes' ``pkg/apis/*/validation`` and the operators'
webhooks), for the kinds the course renders: each rule a message naming the path in the manifest.

    object names and namespaces        DNS-1123 (a Service's name: a DNS-1035 label), at most 63 / 253 characters
    containers                         an image; every volumeMount names a volume of the pod
    Job                                restartPolicy OnFailure or Never; durations and counts not negative
    PyTorchJob                         nprocPerNode a positive number (or auto, cpu, gpu); an elastic job's workers
                                       restart (restartPolicy not Never: a worker that exits must come back)
    JobSet                             every replicatedJob at least one replica
    quantities                         resources, emptyDir sizeLimit, PVC storage: Kubernetes quantities ("50Gi",
                                       not "50 GiB")

Pure Python, offline (``coursekit.k8s.validate.problems`` runs it after the schemas). Where a real API server can
run, ``kubectl apply --dry-run=server`` is the referee (tests/test_k8s.py, slow tier).
"""
from __future__ import annotations

import re

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?$")  # apimachinery's
NPROC = re.compile(r"^([1-9]\d*|auto|cpu|gpu)$")


def _name_problems(doc: dict) -> list[str]:
    kind, meta = doc.get("kind", "?"), doc.get("metadata")
    if not isinstance(meta, dict):
        return [f"{kind}: metadata: required (a name at least)"]
    out, name, ns = [], meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name:
        out.append(f"{kind}: metadata.name: required")
    elif kind == "Service" and (len(name) > 63 or not DNS1035_LABEL.match(name)):
        out.append(f"{kind} {name!r}: metadata.name: a Service name is a DNS-1035 label (lower-case letters, digits "
                   "and '-', starting with a letter, at most 63 characters)")
    elif len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
        out.append(f"{kind} {name!r}: metadata.name: not a DNS-1123 subdomain (lower-case letters, digits, '-' and "
                   "'.', starting and ending alphanumeric, at most 253 characters)")
    if ns is not None and (not isinstance(ns, str) or len(ns) > 63 or not DNS1123_LABEL.match(ns)):
        out.append(f"{kind} {name!r}: metadata.namespace: {ns!r} is not a DNS-1123 label (lower-case letters, "
                   "digits and '-', at most 63 characters)")
    return out


def _quantity(value, where: str, out: list) -> None:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) or
                                       (isinstance(value, str) and QUANTITY.match(value))):
        out.append(f"{where}: {value!r} is not a Kubernetes quantity (e.g. 50Gi, 500m, 2)")


def _pod_problems(where: str, tmpl: dict, *, job: bool) -> list[str]:
    spec = (tmpl or {}).get("spec") or {}
    out = []
    if job and spec.get("restartPolicy") not in ("OnFailure", "Never"):
        out.append(f"{where}.spec.restartPolicy: a Job's pods restart OnFailure or Never, not "
                   f"{spec.get('restartPolicy')!r}")
    volumes = {v.get("name") for v in spec.get("volumes") or [] if isinstance(v, dict)}
    for v in spec.get("volumes") or []:
        if isinstance(v, dict) and isinstance(v.get("emptyDir"), dict) and "sizeLimit" in v["emptyDir"]:
            _quantity(v["emptyDir"]["sizeLimit"], f"{where}.spec.volumes.{v.get('name')}.emptyDir.sizeLimit", out)
    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group) or []):
            w = f"{where}.spec.{group}.{i}"
            if not isinstance(c, dict):
                continue
            if not isinstance(c.get("image"), str) or not c["image"].strip():
                out.append(f"{w}.image: required (the container image to run)")
            for m in c.get("volumeMounts") or []:
                if isinstance(m, dict) and m.get("name") not in volumes:
                    out.append(f"{w}.volumeMounts: {m.get('name')!r} is not a volume of the pod (spec.volumes)")
            for part in ("limits", "requests"):
                for k, v in ((c.get("resources") or {}).get(part) or {}).items():
                    _quantity(v, f"{w}.resources.{part}.{k}", out)
    return out


def _not_negative(spec: dict, keys, where: str, out: list, *, positive=()) -> None:
    for k in keys:
        v = spec.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and (v < 0 or (k in positive and v == 0)):
            out.append(f"{where}.{k}: {v} must be {'> 0' if k in positive else '>= 0'}")


def problems(doc: dict) -> list[str]:
    """The API server's rules for one manifest (a mapping) that its schema does not express."""
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    out = _name_problems(doc)
    head = f"{kind} {(doc.get('metadata') or {}).get('name')!r}"
    if not isinstance(spec, dict):
        return out
    if kind == "Job":
        _not_negative(spec, ("activeDeadlineSeconds", "backoffLimit", "completions", "parallelism",
                             "ttlSecondsAfterFinished"), f"{head}: spec", out, positive=("activeDeadlineSeconds",))
        out += [f"{head}: {p}" for p in _pod_problems("spec.template", spec.get("template"), job=True)]
    elif kind == "PyTorchJob":
        n = spec.get("nprocPerNode")
        if not isinstance(n, str) or not NPROC.match(n):
            out.append(f"{head}: spec.nprocPerNode: {n!r}: processes per pod, a positive number as a string (or "
                       "auto, cpu, gpu)")
        elastic = isinstance(spec.get("elasticPolicy"), dict)
        for role, rs in (spec.get("pytorchReplicaSpecs") or {}).items():
            if not isinstance(rs, dict):
                continue
            if elastic and rs.get("restartPolicy") == "Never":
                out.append(f"{head}: spec.pytorchReplicaSpecs.{role}.restartPolicy: Never stops an elastic job's "
                           "workers from coming back (OnFailure or ExitCode)")
            where = f"spec.pytorchReplicaSpecs.{role}.template"
            out += [f"{head}: {p}" for p in _pod_problems(where, rs.get("template"), job=False)]
    elif kind == "JobSet":
        for i, rj in enumerate(spec.get("replicatedJobs") or []):
            if not isinstance(rj, dict):
                continue
            r = rj.get("replicas", 1)
            if not isinstance(r, int) or isinstance(r, bool) or r < 1:
                out.append(f"{head}: spec.replicatedJobs.{i}.replicas: {r!r} must be >= 1")
            js = (rj.get("template") or {}).get("spec") or {}
            _not_negative(js, ("activeDeadlineSeconds", "backoffLimit", "completions", "parallelism"),
                          f"{head}: spec.replicatedJobs.{i}.template.spec", out, positive=("activeDeadlineSeconds",))
            where = f"spec.replicatedJobs.{i}.template.spec.template"
            out += [f"{head}: {p}" for p in _pod_problems(where, js.get("template"), job=True)]
    elif kind == "PersistentVolumeClaim":
        storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
        if storage is None:
            out.append(f"{head}: spec.resources.requests.storage: required")
        else:
            _quantity(storage, f"{head}: spec.resources.requests.storage", out)
    return out
