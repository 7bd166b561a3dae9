"""Offline checks of the manifests: the real schemas first, then the launch contract the schemas cannot see.

  * core objects (Service, Job, PVC, and every pod template inside a CRD) against the Kubernetes OpenAPI schemas
    shipped by the ``kubernetes-validate`` package, strict (an unknown field is an error, as ``kubectl
    --validate=strict``);
  * PyTorchJob and JobSet against the operators' own CRD schemas, vendored in ``crds/`` (see crds/SOURCES.md),
    strict in the same sense; CEL rules (x-kubernetes-validations) are not evaluated;
  * ``contract()``: GPUs as whole numbers matching the processes per pod, /dev/shm in memory, the env of
    slurm/_common.sh, the checkpoint volume, and a rendezvous port that the command, the container and the Service
    agree on. ``problems(docs)`` returns every message; an empty list means valid.
"""
from __future__ import annotations

import copy
import functools
import re
from pathlib import Path

import yaml

from coursekit.k8s import rules
from coursekit.k8s.render import CONTAINER, CONTRACT_ENV

K8S_VERSIONS = ("1.31", "1.37")  # an older release still common on clusters, and the newest the package ships
CRD_DIR = Path(__file__).parent / "crds"
CRDS = {("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml",
        ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.x-k8s.io_jobsets.yaml"}
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(s: str, env: dict) -> str:
    """Kubernetes' $(VAR) expansion in command, args and env values: unknown names stay, $$ escapes a $."""
    return _VAR.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), s)


def _where(doc: dict) -> str:
    return f"{doc.get('kind', '?')} {doc.get('metadata', {}).get('name', '?')}"


def _path(err) -> str:
    return ".".join(str(p) for p in err.absolute_path) or "(top)"


def _message(err) -> str:
    # anyOf/oneOf ("not valid under any of the given schemas"): say what each branch wanted
    if err.context:
        return err.message + " (" + "; ".join(sorted({c.message for c in err.context})) + ")"
    return err.message


@functools.lru_cache(maxsize=None)
def core_validator(version: str, api_version: str, kind: str):
    """kubernetes-validate's strict schema for one kind, built once (its own validate() re-reads them per call)."""
    import jsonschema
    from kubernetes_validate.utils import schema_contents
    from referencing import Registry, Resource

    root = f"kubernetes-json-schema/v{version}.0-local-strict"
    api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)  # batch/v1 -> batch-v1, as the package names them
    schema = schema_contents(f"{root}/{kind.lower()}-{api}.json", version)
    registry = Resource.from_contents(_core_defs(version)) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


@functools.lru_cache(maxsize=None)
def _core_defs(version: str):
    from kubernetes_validate.utils import schema_contents

    return schema_contents(f"kubernetes-json-schema/v{version}.0-local-strict/_definitions.json", version)


def core_problems(doc: dict) -> list[str]:
    out = []
    for version in K8S_VERSIONS:
        try:
            v = core_validator(version, str(doc.get("apiVersion")), str(doc.get("kind")))
        except FileNotFoundError:
            out.append(f"{_where(doc)}: no Kubernetes {version} schema for {doc.get('apiVersion')} "
                       f"{doc.get('kind')}")
            continue
        errs = sorted(v.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
        out += [f"{_where(doc)}: {_path(e)}: {_message(e)} (Kubernetes {version} schema)" for e in errs]
    return sorted(set(out))


def _strict(schema):
    """Unknown fields are errors, except where the schema keeps them (x-kubernetes-preserve-unknown-fields)."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.lru_cache(maxsize=None)
def crd_validator(api_version: str, kind: str):
    import jsonschema

    crd = yaml.load((CRD_DIR / CRDS[(api_version, kind)]).read_text(), Loader=getattr(yaml, "CSafeLoader",
                                                                                           yaml.SafeLoader))
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v.get("served")]
    schema = _strict(copy.deepcopy(v["schema"]["openAPIV3Schema"]))
    schema["properties"]["metadata"] = {"type": "object"}  # the API server checks ObjectMeta itself
    return jsonschema.Draft7Validator(schema)


def crd_problems(doc: dict) -> list[str]:
    key = (doc.get("apiVersion"), doc.get("kind"))
    errs = sorted(crd_validator(*key).iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    out = [f"{_where(doc)}: {_path(e)}: {_message(e)} ({CRDS[key]})" for e in errs]
    for where, tmpl in pod_templates(doc):  # the embedded pods, also against the current core schema
        pt = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"}, "template": tmpl}
        out += [p.replace("PodTemplate x: template.", f"{_where(doc)}: {where}.") for p in core_problems(pt)]
    return out


def pod_templates(doc: dict) -> list[tuple[str, dict]]:
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    if kind == "Job":
        return [("spec.template", spec.get("template") or {})]
    if kind == "PyTorchJob":
        return [(f"spec.pytorchReplicaSpecs.{r}.template", (s or {}).get("template") or {})
                for r, s in (spec.get("pytorchReplicaSpecs") or {}).items()]
    if kind == "JobSet":
        return [(f"spec.replicatedJobs.{i}.template.spec.template",
                 ((rj.get("template") or {}).get("spec") or {}).get("template") or {})
                for i, rj in enumerate(spec.get("replicatedJobs") or [])]
    return []


def container_env(c: dict) -> dict:
    """Literal env values, expanded in order as the kubelet does (fieldRefs and the like are left out)."""
    env: dict = {}
    for e in c.get("env") or []:
        if "value" in e:
            env[e["name"]] = expand(str(e["value"]), env)
    return env


def _flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


def _gpus(c: dict, where: str, out: list) -> int:
    res = c.get("resources") or {}
    lim, req = (res.get("limits") or {}).get("nvidia.com/gpu"), (res.get("requests") or {}).get("nvidia.com/gpu")
    if lim is None and req is None:
        return 0
    for what, v in (("limits", lim), ("requests", req)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            out.append(f"{where}: resources.{what}.nvidia.com/gpu is {v!r} ({type(v).__name__}): GPUs are whole "
                       "devices, write an unquoted integer such as 4 (a quoted number passes the core schema, "
                       "which takes any quantity string, and the API server refuses a fraction only at submission)")
            return -1
    if lim is None or (req is not None and req != lim):
        out.append(f"{where}: nvidia.com/gpu needs limits, and requests equal to them (got limits={lim}, "
                   f"requests={req}): extended resources cannot be overcommitted")
    if (lim or req) < 1:
        out.append(f"{where}: nvidia.com/gpu must be >= 1, got {lim}")
    return lim or req


def _pod_problems(doc: dict, where: str, tmpl: dict, docs: list[dict]) -> list[str]:
    out: list[str] = []
    spec = tmpl.get("spec") or {}
    cs = [c for c in spec.get("containers") or [] if c.get("name") == CONTAINER]
    if not cs:
        return [f"{_where(doc)}: {where}: no container named {CONTAINER!r} (Kubeflow's webhook requires the name; "
                "every kind here uses it)"]
    c, w = cs[0], f"{_where(doc)}: container {CONTAINER}"
    env, args = container_env(c), c.get("args") or []
    missing = [k for k in ("COURSEKIT_DEVICE", *CONTRACT_ENV) if k not in env]
    if missing:
        out.append(f"{w}: env lacks {', '.join(missing)} (the contract of slurm/_common.sh)")
    gpus = _gpus(c, w, out)
    if gpus >= 0 and env.get("COURSEKIT_DEVICE") != ("cuda" if gpus else "cpu"):
        out.append(f"{w}: COURSEKIT_DEVICE={env.get('COURSEKIT_DEVICE')!r} with {gpus} nvidia.com/gpu: use cuda "
                   "with GPUs (a pod that sees none then fails instead of training on CPU), cpu without")
    nproc = doc["spec"].get("nprocPerNode") if doc.get("kind") == "PyTorchJob" else _flag(args, "--nproc-per-node")
    if gpus > 0 and str(nproc) != str(gpus):
        out.append(f"{w}: {gpus} GPUs but {nproc!r} processes per pod: one process per GPU")
    vols = {v.get("name"): v for v in spec.get("volumes") or []}
    mounts = {m.get("mountPath"): vols.get(m.get("name"), {}) for m in c.get("volumeMounts") or []}
    if (mounts.get("/dev/shm", {}).get("emptyDir") or {}).get("medium") != "Memory":
        out.append(f"{w}: /dev/shm is not an emptyDir with medium Memory (NCCL's shared-memory transport and "
                   "DataLoader workers need more than the runtime's 64 MiB)")
    run_dir = env.get("COURSEKIT_RUN_DIR", "")
    if not any(run_dir.startswith(p.rstrip("/") + "/") and "persistentVolumeClaim" in v for p, v in mounts.items()):
        out.append(f"{w}: COURSEKIT_RUN_DIR={run_dir!r} is not on a mounted persistentVolumeClaim: checkpoints "
                   "would die with the pod, and a restart could not resume")
    ports = [p.get("containerPort") for p in c.get("ports") or []]
    if doc.get("kind") == "PyTorchJob":
        names = [p.get("name") for p in c.get("ports") or []]
        if "pytorchjob-port" not in names and not (doc["spec"].get("elasticPolicy") or {}).get("rdzvPort"):
            out.append(f"{w}: no rendezvous port: the operator builds PET_RDZV_ENDPOINT from the container port "
                       "named 'pytorchjob-port' (without it: 'port not found', no pod starts)")
        return out
    args = [expand(a, {**env, "JOB_COMPLETION_INDEX": "0"}) for a in args]
    host, port = _flag(args, "--master-addr"), _flag(args, "--master-port")
    if port is None or not port.isdigit():
        out.append(f"{w}: no rendezvous port: torchrun needs --master-port=<port> (got {port!r}), the port pod 0 "
                   "listens on and the Service exposes")
        return out
    if int(port) not in ports:
        out.append(f"{w}: rendezvous port {port} is not a containerPort (has {ports})")
    if _flag(args, "--node-rank") != "0":
        out.append(f"{w}: --node-rank must be $(JOB_COMPLETION_INDEX), so pod i is node i and pod 0 hosts the store")
    if doc.get("kind") == "JobSet":
        i = int(where.split(".")[2])
        rj, net = doc["spec"]["replicatedJobs"][i]["name"], doc["spec"].get("network") or {}
        want = f"{doc['metadata']['name']}-{rj}-0-0.{net.get('subdomain') or doc['metadata']['name']}"
        if host != want or not net.get("enableDNSHostnames"):
            out.append(f"{w}: --master-addr {host!r} must be pod 0 of job 0 through the JobSet's Service ({want}), "
                       "with network.enableDNSHostnames true")
    if doc.get("kind") == "Job":
        sub = spec.get("subdomain")
        svc = [d for d in docs if d.get("kind") == "Service" and d["metadata"].get("name") == sub]
        if not svc:
            out.append(f"{w}: no headless Service named after the pod subdomain {sub!r}: pod host names would "
                       "not resolve")
            return out
        s = svc[0].get("spec") or {}
        labels = (tmpl.get("metadata") or {}).get("labels") or {}
        if s.get("clusterIP") != "None" or not s.get("selector") or any(
                labels.get(k) != v for k, v in s["selector"].items()):
            out.append(f"{_where(svc[0])}: must be headless (clusterIP: None) and select the Job's pods")
        if int(port) not in [p.get("port") for p in s.get("ports") or []]:
            out.append(f"{_where(svc[0])}: does not expose the rendezvous port {port}")
        if host != f"{doc['metadata']['name']}-0.{sub}":
            out.append(f"{w}: --master-addr {host!r} is not pod 0 through the Service "
                       f"({doc['metadata']['name']}-0.{sub})")
    return out


def contract(docs: list[dict]) -> list[str]:
    out = []
    for doc in docs:
        spec = doc.get("spec") or {}
        for where, tmpl in pod_templates(doc):
            out += _pod_problems(doc, where, tmpl, docs)
        jobs = [spec] if doc.get("kind") == "Job" else [
            ((rj.get("template") or {}).get("spec") or {}) for rj in spec.get("replicatedJobs") or []]
        for j in jobs if doc.get("kind") in ("Job", "JobSet") else []:
            nnodes = _flag((((j.get("template") or {}).get("spec") or {}).get("containers") or [{}])[0].get(
                "args") or [], "--nnodes")
            if j.get("completionMode") != "Indexed" or not (j.get("completions") == j.get("parallelism")
                                                            == (int(nnodes) if str(nnodes).isdigit() else nnodes)):
                out.append(f"{_where(doc)}: needs completionMode Indexed and completions = parallelism = --nnodes "
                           f"(got {j.get('completionMode')}, {j.get('completions')!r}, {j.get('parallelism')!r}, "
                           f"{nnodes})")
        if doc.get("kind") == "PyTorchJob":
            ep, w = spec.get("elasticPolicy") or {}, (spec.get("pytorchReplicaSpecs") or {}).get("Worker") or {}
            lo, hi, n = ep.get("minReplicas"), ep.get("maxReplicas"), w.get("replicas")
            if not (isinstance(lo, int) and isinstance(hi, int) and isinstance(n, int) and 1 <= lo <= n <= hi):
                out.append(f"{_where(doc)}: elastic needs 1 <= minReplicas <= Worker replicas <= maxReplicas "
                           f"(got {lo}, {n}, {hi})")
    return out


def problems(docs: list[dict]) -> list[str]:
    """Every schema, API-server rule (``coursekit.k8s.rules``) and contract problem of a set of manifests (one
    file's documents, or several)."""
    out: list[str] = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            out.append(f"document {i}: a manifest is a mapping (apiVersion, kind, metadata, ...), got "
                       f"{type(doc).__name__}")
            continue
        key = (doc.get("apiVersion"), doc.get("kind"))
        if key in CRDS:
            out += crd_problems(doc)
        elif doc.get("kind") != "Kustomization":
            out += core_problems(doc)
        if doc.get("kind") != "Kustomization":
            out += rules.problems(doc)
    return out + contract([d for d in docs if isinstance(d, dict)])


def load(paths, bad: list | None = None) -> list[dict]:
    """The documents of every file. A file that cannot be manifests (not YAML, tabs for indentation, empty) raises
    a ValueError naming it and the line, or, with ``bad`` given, is appended to it as that message."""
    docs = []
    for p in paths:
        try:
            text = Path(p).read_text()
            found = [d for d in yaml.safe_load_all(text) if d is not None]
            if not found:
                raise ValueError("empty: no manifest in it")
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            msg = f"{p}: not valid YAML{at}: {getattr(e, 'problem', None) or str(e).splitlines()[0]}"
            if "\t" in text:
                msg += "; YAML indents with spaces, and this file has tabs"
        except (OSError, UnicodeDecodeError, ValueError) as e:
            msg = f"{p}: {e}"
        else:
            docs += found
            continue
        if bad is None:
            raise ValueError(msg)
        bad.append(msg)
    return docs
