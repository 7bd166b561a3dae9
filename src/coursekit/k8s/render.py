"""Kubernetes manifests for the course's jobs, from the same launch contract as ``slurm/``.

Three kinds, one pod template:
  job         batch/v1 Indexed Job + headless Service: no operator. torchrun's static rendezvous, node rank = the pod's
              index (JOB_COMPLETION_INDEX), the store on pod 0, reached through the Service. Fails fast (like
              slurm/torchrun-multi-node.sbatch): a resubmission resumes from the checkpoint volume.
  pytorchjob  Kubeflow PyTorchJob with an elastic policy: the operator sets torchrun's PET_* variables (c10d
              rendezvous, min:max nodes, max restarts); failed workers are restarted and rejoin.
  jobset      JobSet (kubernetes-sigs): the same Indexed Job as ``job``, with the Service managed for you and
              failurePolicy.maxRestarts restarting the whole gang (every pod, one resume) on any failure.

Only the course's facts are fixed here (the image's uid and working directory, the env contract); image, namespace,
sizes and storage class are parameters. ``render(params)`` returns ``{file name: YAML text}``.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

import yaml

KINDS = ("job", "pytorchjob", "jobset")
CONTAINER = "pytorch"  # the name Kubeflow's webhook requires; used for every kind so one pod template serves all
RDZV_PORT_NAME = {"job": "rdzv", "jobset": "rdzv", "pytorchjob": "pytorchjob-port"}  # the operator looks this up
CKPT_MOUNT = "/ckpt"
COURSE_UID = 1000  # docker/Dockerfile's NB_UID: fsGroup makes the checkpoint volume writable for it

# The environment contract of slurm/_common.sh, with the same defaults (tests/test_k8s.py compares the two).
# $(VAR) is Kubernetes' own expansion: a value may name a variable defined above it.
CONTRACT_ENV = {
    "COURSEKIT_RUN_DIR": f"{CKPT_MOUNT}/runs/$(COURSEKIT_JOB_NAME)",
    "COURSEKIT_RESULTS_DIR": "$(COURSEKIT_RUN_DIR)/results",
    "PYTHONUNBUFFERED": "1",
    "NCCL_DEBUG": "WARN",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "TORCH_FR_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_FR_DUMP_TEMP_FILE": "$(COURSEKIT_RUN_DIR)/flight-recorder/rank_",
}
DEFAULT_PROGRAM = ("-m", "coursekit.train", "--strategy", "ddp", "--steps", "200", "--save-every", "20",
                   "--ckpt-dir", "$(COURSEKIT_RUN_DIR)/checkpoints")  # slurm/requeue.sbatch's default
_RUN_DIR_VARS = ("COURSEKIT_JOB_NAME", "COURSEKIT_RUN_DIR", "COURSEKIT_RESULTS_DIR")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, kw_only=True)
class Params:
    kind: str
    """job, pytorchjob or jobset."""
    image: str
    """the course image (docker/Dockerfile), e.g. registry.example/coursekit:v1."""
    namespace: str
    nodes: int
    """pods (one per node); pytorchjob: the maximum."""
    gpus_per_node: int
    """nvidia.com/gpu per pod; 0 = a CPU-only job (COURSEKIT_DEVICE=cpu, gloo), e.g. on kind."""
    name: str = "coursekit-train"
    nproc_per_node: int | None = None
    """processes per pod (default: the GPUs, or 1); like COURSEKIT_NPROC_PER_NODE."""
    min_nodes: int | None = None
    """pytorchjob: elastic lower bound (default: nodes, i.e. no shrinking)."""
    max_restarts: int = 2
    """pytorchjob: torchrun worker-group restarts; jobset: whole-gang restarts. (job: none, it fails fast.)"""
    storage_class: str | None = None
    """the checkpoint PVC's storage class (default: the cluster's default class); must offer ReadWriteMany."""
    ckpt_claim: str = "coursekit-ckpt"
    ckpt_size: str = "50Gi"
    shm_size: str = "16Gi"
    cpus_per_node: int | None = None
    memory_per_node: str | None = None
    time_limit_s: int = 4 * 3600
    """activeDeadlineSeconds (Slurm's --time)."""
    rdzv_port: int = 29500
    workdir: str = "/opt/coursekit"
    """the image's working directory (docker/Dockerfile), so configs/ paths resolve."""
    program: tuple = field(default=DEFAULT_PROGRAM)
    """what python runs under torchrun, as for the sbatch scripts: ('-m', 'coursekit.train', ...) or a script."""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"--kind {self.kind!r}: choose one of {', '.join(KINDS)}")
        if not _DNS1035.match(self.name) or len(self.name) > 40:
            raise ValueError(f"--name {self.name!r}: lower-case letters, digits and '-', starting with a letter, "
                             "at most 40 characters (pod host names add a suffix and must stay under 64)")
        for what, v, lo in (("--nodes", self.nodes, 1), ("--gpus-per-node", self.gpus_per_node, 0),
                            ("--max-restarts", self.max_restarts, 0)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"{what} must be an integer >= {lo}, got {v!r}")
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.nodes:
            raise ValueError(f"--min-nodes {self.min_nodes} must be between 1 and --nodes {self.nodes}")
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise ValueError(f"--nproc-per-node must be >= 1, got {self.nproc_per_node}")
        if not self.image or not self.namespace:
            raise ValueError("--image and --namespace are required (nothing site-specific is assumed)")

    @property
    def nproc(self) -> int:
        return self.nproc_per_node or max(self.gpus_per_node, 1)

    @property
    def service(self) -> str:
        return self.name  # job: the headless Service; jobset: the subdomain it creates (the JobSet's name)

    @property
    def rdzv_host(self) -> str:
        """Pod 0's stable DNS name through the headless Service."""
        if self.kind == "jobset":
            return f"{self.name}-workers-0-0.{self.service}"
        return f"{self.name}-0.{self.service}"


def _env(p: Params) -> list[dict]:
    env = [{"name": "COURSEKIT_JOB_NAME", "value": p.name},
           {"name": "COURSEKIT_DEVICE", "value": "cuda" if p.gpus_per_node else "cpu"}]
    env += [{"name": k, "value": v} for k, v in CONTRACT_ENV.items()]
    env.append({"name": "OMP_NUM_THREADS", "value": str(max(1, (p.cpus_per_node or p.nproc) // p.nproc))})
    if p.kind != "pytorchjob":  # the operator sets the rendezvous itself (PET_RDZV_ENDPOINT)
        env += [{"name": "COURSEKIT_RDZV_HOST", "value": p.rdzv_host},
                {"name": "COURSEKIT_RDZV_PORT", "value": str(p.rdzv_port)}]
    else:  # restarted gloo workers must not reuse the previous attempt's store (as slurm/requeue.sbatch)
        env.append({"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"})
    return env


def torchrun_args(p: Params) -> list[str]:
    if p.kind == "pytorchjob":
        return []  # torchrun reads PET_NNODES, PET_NPROC_PER_NODE, PET_RDZV_* and PET_MAX_RESTARTS
    # static rendezvous: pod index = node rank, and pod 0 hosts the store for certain (a c10d rendezvous would pick
    # its host by a DNS look-up that can race with the Service's records, and ignores --node-rank)
    return [f"--nnodes={p.nodes}", f"--nproc-per-node={p.nproc}", "--rdzv-backend=static",
            "--node-rank=$(JOB_COMPLETION_INDEX)", "--master-addr=$(COURSEKIT_RDZV_HOST)",
            "--master-port=$(COURSEKIT_RDZV_PORT)"]


def pod_template(p: Params) -> dict:
    resources: dict = {}
    if p.gpus_per_node:
        resources = {"limits": {"nvidia.com/gpu": p.gpus_per_node}, "requests": {"nvidia.com/gpu": p.gpus_per_node}}
    for key, v in (("cpu", p.cpus_per_node), ("memory", p.memory_per_node)):
        if v:
            resources.setdefault("requests", {})[key] = v
            if key == "memory":
                resources.setdefault("limits", {})[key] = v
    dirs = ["$(COURSEKIT_RESULTS_DIR)", "$(COURSEKIT_RUN_DIR)/flight-recorder", "$(COURSEKIT_RUN_DIR)/checkpoints"]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "ckpt", "mountPath": CKPT_MOUNT}]
    env = _env(p)
    container = {
        "name": CONTAINER, "image": p.image, "imagePullPolicy": "IfNotPresent", "workingDir": p.workdir,
        "command": ["python", "-m", "torch.distributed.run"], "args": [*torchrun_args(p), *p.program],
        "env": env, "ports": [{"name": RDZV_PORT_NAME[p.kind], "containerPort": p.rdzv_port}],
        "resources": resources, "volumeMounts": mounts,
    }
    spec: dict = {
        "restartPolicy": "Never",
        "securityContext": {"fsGroup": COURSE_UID},
        # folders that slurm/_common.sh makes with mkdir -p: the trainer writes results and dumps there
        "initContainers": [{"name": "run-dir", "image": p.image, "imagePullPolicy": "IfNotPresent",
                            "command": ["mkdir", "-p", *dirs],
                            "env": [e for e in env if e["name"] in _RUN_DIR_VARS],
                            "volumeMounts": [mounts[1]]}],
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": p.shm_size}},
                    {"name": "ckpt", "persistentVolumeClaim": {"claimName": p.ckpt_claim}}],
    }
    if p.kind == "job":
        spec["subdomain"] = p.service  # pod host names <name>-<index>.<service> resolve through the Service
    if p.gpus_per_node:  # GPU nodes are commonly tainted so; tolerating it is harmless where they are not
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"metadata": {"labels": _labels(p)}, "spec": spec}


def _labels(p: Params) -> dict:
    return {"app.kubernetes.io/name": "coursekit", "app.kubernetes.io/component": p.kind,
            "coursekit/job": p.name}


def _meta(p: Params, name: str | None = None) -> dict:
    return {"name": name or p.name, "namespace": p.namespace, "labels": _labels(p)}


def indexed_job_spec(p: Params, backoff_limit: int) -> dict:
    return {"completionMode": "Indexed", "completions": p.nodes, "parallelism": p.nodes,
            "backoffLimit": backoff_limit, "activeDeadlineSeconds": p.time_limit_s, "template": pod_template(p)}


def job(p: Params) -> list[dict]:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(p, p.service),
               "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,  # DNS before readiness
                        "selector": {"coursekit/job": p.name},
                        "ports": [{"name": "rdzv", "port": p.rdzv_port, "targetPort": p.rdzv_port}]}}
    # backoffLimit 0: a static rendezvous cannot take a replacement pod; the Job fails and is resubmitted
    return [service, {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(p),
                      "spec": indexed_job_spec(p, backoff_limit=0)}]


def pytorchjob(p: Params) -> list[dict]:
    tmpl = pod_template(p)
    del tmpl["spec"]["restartPolicy"]  # the operator sets the replica's restartPolicy on every pod
    worker = {"replicas": p.nodes, "restartPolicy": "OnFailure", "template": tmpl}
    return [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": _meta(p), "spec": {
        "nprocPerNode": str(p.nproc),  # a string in this CRD (it also takes auto/cpu/gpu)
        "elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": p.min_nodes or p.nodes, "maxReplicas": p.nodes,
                          "maxRestarts": p.max_restarts},
        "runPolicy": {"backoffLimit": 3 * p.nodes, "activeDeadlineSeconds": p.time_limit_s,
                      "cleanPodPolicy": "Running"},
        "pytorchReplicaSpecs": {"Worker": worker}}}]


def jobset(p: Params) -> list[dict]:
    return [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": _meta(p), "spec": {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "failurePolicy": {"maxRestarts": p.max_restarts},
        "replicatedJobs": [{"name": "workers", "replicas": 1, "template": {
            "spec": indexed_job_spec(p, backoff_limit=0)}}]}}]


def checkpoint_pvc(p: Params) -> dict:
    spec = {"accessModes": ["ReadWriteMany"],  # every pod writes its own shards into the same folder
            "resources": {"requests": {"storage": p.ckpt_size}}}
    if p.storage_class:
        spec["storageClassName"] = p.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(p, p.ckpt_claim), "spec": spec}


BUILDERS = {"job": job, "pytorchjob": pytorchjob, "jobset": jobset}
PURPOSE = {
    "job": "Indexed Job + headless Service: torchrun on every pod, static rendezvous on pod 0; fails fast",
    "pytorchjob": "Kubeflow PyTorchJob, elastic (c10d): failed workers restart and rejoin, resuming",
    "jobset": "JobSet: the Indexed Job with a managed Service; any failure restarts the whole gang, resuming",
}


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data):  # the env shared by two containers is written out twice, not as &anchors
        return True


def dump(docs: list[dict], header: str = "") -> str:
    body = "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=120) for d in docs)
    return header + body


def render(p: Params, command: str | None = None) -> dict[str, str]:
    """The files of one job: the workload, the checkpoint PVC and a kustomization listing both."""
    head = f"# {PURPOSE[p.kind]}.\n# Generated by: {command or render_command(p)}\n"
    workload = f"{p.kind}.yaml"
    kustom = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
              "resources": ["checkpoint-pvc.yaml", workload]}
    return {workload: dump(BUILDERS[p.kind](p), head),
            "checkpoint-pvc.yaml": dump([checkpoint_pvc(p)], "# Apply once; it outlives the jobs that use it.\n"
                                        f"# Generated by: {command or render_command(p)}\n"),
            "kustomization.yaml": dump([kustom], head)}


def render_command(p: Params) -> str:
    """The `coursekit k8s render` command line that reproduces ``p`` (stored in every file's header)."""
    default = Params(kind=p.kind, image="x", namespace="x", nodes=1, gpus_per_node=0)
    args = ["coursekit", "k8s", "render", "--kind", p.kind, "--image", p.image, "--namespace", p.namespace,
            "--nodes", str(p.nodes), "--gpus-per-node", str(p.gpus_per_node)]
    for f in ("name", "nproc_per_node", "min_nodes", "max_restarts", "storage_class", "ckpt_claim", "ckpt_size",
              "shm_size", "cpus_per_node", "memory_per_node", "time_limit_s", "rdzv_port", "workdir"):
        if getattr(p, f) != getattr(default, f):
            args += ["--" + f.replace("_", "-"), str(getattr(p, f))]
    if tuple(p.program) != DEFAULT_PROGRAM:
        args += ["--", *p.program]
    return shlex.join(args)
