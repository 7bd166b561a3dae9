"""k8s/: the course's jobs as Kubernetes manifests, checked offline against the real schemas, and the Indexed Job's
pod command run here as processes (no Kubernetes can run on this machine).

Schemas: core objects against the Kubernetes OpenAPI schemas of the `kubernetes-validate` package (offline, strict);
PyTorchJob and JobSet against the operators' CRDs vendored in src/coursekit/k8s/crds/. What no schema can see (GPU
counts, the rendezvous port, the env contract) is checked by coursekit.k8s.validate.contract; every mutation below
must fail with a message naming the field.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from coursekit.k8s import cli
from coursekit.k8s.render import CONTRACT_ENV, KINDS, Params, render
from coursekit.k8s.validate import CRD_DIR, load, problems

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "k8s"


def docs_of(files: dict) -> list[dict]:
    return [d for name, text in files.items() for d in yaml.safe_load_all(text) if d]


def rendered(kind: str, gpus: int = 4, **kw) -> list[dict]:
    return docs_of(render(Params(kind=kind, image="coursekit:test", namespace="ck", nodes=2, gpus_per_node=gpus,
                                 **kw)))


def pod(docs: list[dict]) -> dict:
    d = [x for x in docs if x["kind"] in ("Job", "PyTorchJob", "JobSet")][0]
    return {"Job": lambda: d["spec"]["template"],
            "PyTorchJob": lambda: d["spec"]["pytorchReplicaSpecs"]["Worker"]["template"],
            "JobSet": lambda: d["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]}[d["kind"]]()


def container(docs):
    return pod(docs)["spec"]["containers"][0]


# ---- what the manifests say ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("gpus", [4, 0])
@pytest.mark.parametrize("kind", KINDS)
def test_rendered_manifests_pass_the_schemas_and_the_contract(kind, gpus):
    docs = rendered(kind, gpus, storage_class="fast-rwx", program=("-m", "coursekit.dist"))
    assert problems(docs) == []
    c = container(docs)
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["COURSEKIT_DEVICE"] == ("cuda" if gpus else "cpu")
    assert c["resources"].get("limits", {}).get("nvidia.com/gpu") == (gpus or None)
    assert c["args"][-2:] == ["-m", "coursekit.dist"]
    vols = {v["name"]: v for v in pod(docs)["spec"]["volumes"]}
    assert vols["dshm"]["emptyDir"]["medium"] == "Memory"
    pvc = [d for d in docs if d["kind"] == "PersistentVolumeClaim"][0]
    assert pvc["spec"]["storageClassName"] == "fast-rwx" and pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert vols["ckpt"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Kustomization"} == {"ck"}


def test_pytorchjob_is_elastic_and_jobset_restarts_the_gang():
    pj = rendered("pytorchjob", min_nodes=1, max_restarts=5)[0]
    assert pj["spec"]["elasticPolicy"] == {"rdzvBackend": "c10d", "minReplicas": 1, "maxReplicas": 2,
                                           "maxRestarts": 5}
    assert pj["spec"]["nprocPerNode"] == "4" and pj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    js = rendered("jobset", max_restarts=3)[0]
    assert js["spec"]["failurePolicy"] == {"maxRestarts": 3}
    assert js["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] == 0


def _common_sh_defaults() -> dict:
    text = (REPO / "slurm" / "_common.sh").read_text()
    return {m[0]: m[1] for m in re.findall(r"^export (\w+)=\$\{\1:-(.*)\}$", text, re.M)}


def test_env_contract_is_the_one_of_slurm_common_sh():
    slurm = _common_sh_defaults()
    # Site- or scheduler-specific there, given by the manifest here: the rendezvous (the Service), the run folder
    # (on the checkpoint volume, not $COURSEKIT_REPO/runs/<name>-<jobid>) and the results folder inside it.
    own = {"MASTER_ADDR", "MASTER_PORT", "COURSEKIT_RUN_DIR", "COURSEKIT_RESULTS_DIR"}
    assert {"NCCL_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE",
            "TORCH_NCCL_DUMP_ON_TIMEOUT"} <= set(slurm)
    for var, default in slurm.items():
        if var in own:
            continue
        assert var in CONTRACT_ENV, f"{var} is set by slurm/_common.sh but not in the pods' env"
        assert CONTRACT_ENV[var] == re.sub(r"\$(\w+)", r"$(\1)", default), var
    assert CONTRACT_ENV["COURSEKIT_RESULTS_DIR"] == "$(COURSEKIT_RUN_DIR)/results"  # same layout below the run dir
    for kind in KINDS:
        env = [e["name"] for e in container(rendered(kind))["env"]]
        assert set(CONTRACT_ENV) | {"COURSEKIT_DEVICE", "OMP_NUM_THREADS"} <= set(env)
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" in str(container(rendered("pytorchjob")))  # as requeue.sbatch


def test_committed_k8s_folder_is_what_the_render_command_writes(tmp_path):
    # one source of truth: every committed file names the command that wrote it; re-running it changes nothing
    files = sorted(K8S.glob("*/*.yaml"))
    assert {f.parent.name for f in files} >= set(KINDS)
    for kind in KINDS:
        first = (K8S / kind / f"{kind}.yaml").read_text()
        cmd = re.search(r"^# Generated by: coursekit k8s (.*)$", first, re.M).group(1)
        out = tmp_path / kind
        assert cli.main([*shlex.split(cmd), "--out", str(out)]) == 0
        for f in sorted(out.iterdir()):
            assert (K8S / kind / f.name).read_text() == f.read_text(), f"k8s/{kind}/{f.name} differs: re-render"
        assert problems(load(sorted((K8S / kind).glob("*.yaml")))) == []


def test_vendored_crds_are_the_published_files():
    sources = (CRD_DIR / "SOURCES.md").read_text()
    for f in sorted(CRD_DIR.glob("*.yaml")):
        row = [ln for ln in sources.splitlines() if ln.startswith(f"| `{f.name}`")]
        assert row, f"{f.name} has no row in SOURCES.md"
        assert hashlib.sha256(f.read_bytes()).hexdigest() in row[0], f"{f.name} differs from the published file"
        assert re.search(r"\| v\d+\.\d+\.\d+ \([0-9a-f]{40}\) \|", row[0]), "tag and commit must be stated"


# ---- mutated manifests fail, each with a message that names the problem ---------------------------------------------

def _args(c):
    return c["args"]


MUTATIONS = {
    "job-wrong-field": ("job", lambda d: pod(d)["spec"].update(restartPolicyy="Never"),
                        "spec.template.spec: Additional properties are not allowed ('restartPolicyy' was unexpected)"),
    "pytorchjob-wrong-field": ("pytorchjob", lambda d: d[0]["spec"]["elasticPolicy"].update(maxRestart=3),
                               "'maxRestart' was unexpected"),
    "jobset-wrong-field": ("jobset", lambda d: d[0]["spec"]["failurePolicy"].update(maxRestart=3),
                           "'maxRestart' was unexpected"),
    "jobset-wrong-field-in-pod": ("jobset", lambda d: container(d).update(resource={}),
                                  "containers.0: Additional properties are not allowed ('resource' was unexpected)"),
    "job-gpus-as-string": ("job", lambda d: container(d)["resources"]["limits"].update({"nvidia.com/gpu": "4"}),
                           "resources.limits.nvidia.com/gpu is '4' (str): GPUs are whole devices"),
    "pytorchjob-gpus-as-word": ("pytorchjob",
                                lambda d: container(d)["resources"]["limits"].update({"nvidia.com/gpu": "four"}),
                                "nvidia.com/gpu: 'four' does not match"),
    "job-count-as-string": ("job", lambda d: d[1]["spec"].update(parallelism="2"),
                            "spec.parallelism: '2' is not of type 'integer'"),
    "pytorchjob-replicas-as-string": ("pytorchjob",
                                      lambda d: d[0]["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas="2"),
                                      "pytorchReplicaSpecs.Worker.replicas: '2' is not of type 'integer'"),
    "job-gpus-without-processes": ("job", lambda d: _args(container(d)).__setitem__(1, "--nproc-per-node=2"),
                                   "4 GPUs but '2' processes per pod"),
    "job-no-rendezvous-port": ("job", lambda d: _args(container(d)).remove("--master-port=$(COURSEKIT_RDZV_PORT)"),
                               "no rendezvous port: torchrun needs --master-port"),
    "job-service-without-port": ("job", lambda d: d[0]["spec"].pop("ports"),
                                 "Service coursekit-train: does not expose the rendezvous port 29500"),
    "jobset-no-dns-hostnames": ("jobset", lambda d: d[0]["spec"]["network"].update(enableDNSHostnames=False),
                                "must be pod 0 of job 0 through the JobSet's Service (coursekit-train-workers-0-0."),
    "jobset-no-container-port": ("jobset", lambda d: container(d).pop("ports"),
                                 "rendezvous port 29500 is not a containerPort"),
    "pytorchjob-no-rendezvous-port": ("pytorchjob", lambda d: container(d).pop("ports"),
                                      "no rendezvous port: the operator builds PET_RDZV_ENDPOINT"),
    "job-no-shm": ("job", lambda d: container(d)["volumeMounts"].pop(0), "/dev/shm is not an emptyDir"),
    # what the API server checks beyond the schemas (coursekit.k8s.rules)
    "job-no-image": ("job", lambda d: container(d).pop("image"), "spec.template.spec.containers.0.image: required"),
    "job-name-not-dns": ("job", lambda d: d[1]["metadata"].update(name="Coursekit_Train"),
                         "Job 'Coursekit_Train': metadata.name: not a DNS-1123 subdomain"),
    "service-name-not-dns1035": ("job", lambda d: d[0]["metadata"].update(name="1-train"),
                                 "Service '1-train': metadata.name: a Service name is a DNS-1035 label"),
    "job-namespace-not-dns": ("job", lambda d: d[1]["metadata"].update(namespace="My NS"),
                              "metadata.namespace: 'My NS' is not a DNS-1123 label"),
    "pytorchjob-nproc-missing": ("pytorchjob", lambda d: d[0]["spec"].pop("nprocPerNode"),
                                 "spec.nprocPerNode: None: processes per pod"),
    "pytorchjob-nproc-word": ("pytorchjob", lambda d: d[0]["spec"].update(nprocPerNode="abc"),
                              "spec.nprocPerNode: 'abc': processes per pod"),
    "pytorchjob-nproc-zero": ("pytorchjob", lambda d: d[0]["spec"].update(nprocPerNode="0"),
                              "spec.nprocPerNode: '0': processes per pod"),
    "pytorchjob-elastic-never-restarts": ("pytorchjob", lambda d: d[0]["spec"]["pytorchReplicaSpecs"]["Worker"].update(
        restartPolicy="Never"), "Worker.restartPolicy: Never stops an elastic job's workers from coming back"),
    "job-restart-always": ("job", lambda d: pod(d)["spec"].update(restartPolicy="Always"),
                           "spec.template.spec.restartPolicy: a Job's pods restart OnFailure or Never, not 'Always'"),
    "job-negative-deadline": ("job", lambda d: d[1]["spec"].update(activeDeadlineSeconds=-5),
                              "spec.activeDeadlineSeconds: -5 must be > 0"),
    "job-mount-of-no-volume": ("job", lambda d: container(d)["volumeMounts"].append({"name": "data",
                                                                                     "mountPath": "/data"}),
                               "volumeMounts: 'data' is not a volume of the pod"),
    "jobset-zero-replicas": ("jobset", lambda d: d[0]["spec"]["replicatedJobs"][0].update(replicas=0),
                             "spec.replicatedJobs.0.replicas: 0 must be >= 1"),
    "job-shm-size-with-a-space": ("job", lambda d: pod(d)["spec"]["volumes"][0]["emptyDir"].update(sizeLimit="16 GiB"),
                                  "emptyDir.sizeLimit: '16 GiB' is not a Kubernetes quantity"),
    "job-no-nccl-knob": ("job", lambda d: container(d).update(
        env=[e for e in container(d)["env"] if e["name"] != "TORCH_NCCL_ASYNC_ERROR_HANDLING"]),
        "env lacks TORCH_NCCL_ASYNC_ERROR_HANDLING"),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_a_mutated_manifest_fails_with_a_clear_message(case):
    kind, mutate, needle = MUTATIONS[case]
    docs = copy.deepcopy([d for d in rendered(kind) if d["kind"] != "PersistentVolumeClaim"])
    assert problems(docs) == []
    mutate(docs)
    found = problems(docs)
    assert any(needle in p for p in found), "\n".join(found)


@pytest.mark.parametrize("text,needle", [
    ("", "empty: no manifest in it"),
    ("apiVersion: v1\nkind: Service\nmetadata:\n\tname: x\n", "not valid YAML (line 4, column 1)"),
    ("- apiVersion: v1\n  kind: Service\n", "document 0: a manifest is a mapping"),
    ("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: ckpt}\nspec:\n  accessModes: [ReadWriteMany]\n"
     "  resources: {requests: {storage: 50 GiB}}\n", "spec.resources.requests.storage: '50 GiB' is not a Kubernetes "
                                                      "quantity"),
])
def test_files_that_are_not_manifests_are_named_not_crashed_on(tmp_path, capsys, text, needle):
    f = tmp_path / "m.yaml"
    f.write_text(text)
    assert cli.main(["validate", str(f)]) == 1
    printed = capsys.readouterr().out
    assert needle in printed and "problem(s) in 1 file(s)" in printed, printed
    if "tabs" not in needle and "\t" in text:
        assert "this file has tabs" in printed


def test_validate_command_lists_the_problems(tmp_path, capsys):
    out = tmp_path / "m"
    assert cli.main(["render", "--kind", "job", "--image", "i", "--namespace", "n", "--nodes", "2",
                     "--gpus-per-node", "1", "--out", str(out)]) == 0
    text = (out / "job.yaml").read_text().replace("nvidia.com/gpu: 1", "nvidia.com/gpu: '1'")
    (out / "job.yaml").write_text(text)
    capsys.readouterr()
    assert cli.main(["validate", str(out / "job.yaml")]) == 1
    printed = capsys.readouterr().out
    assert "nvidia.com/gpu is '1' (str)" in printed and "problem(s) in 1 file(s)" in printed


@pytest.mark.parametrize("argv,needle", [
    (["--nodes", "0"], "--nodes must be an integer >= 1"),
    (["--name", "Bad_Name"], "--name 'Bad_Name'"),
    (["--min-nodes", "3"], "--min-nodes 3 must be between 1 and --nodes 2"),
])
def test_render_rejects_bad_sizes_with_one_line(argv, needle, capsys):
    base = ["render", "--kind", "pytorchjob", "--image", "i", "--namespace", "n", "--nodes", "2",
            "--gpus-per-node", "1"]
    assert cli.main(base + argv) == 2
    assert needle in capsys.readouterr().err


# ---- kubectl, where there is one ----------------------------------------------------------------------------------

def _kubectl():
    k = shutil.which("kubectl")
    if not k:
        pytest.skip("kubectl not installed")
    return k


def test_kubectl_kustomize_builds_every_kind_and_the_site_overlay(tmp_path):
    k = _kubectl()
    for kind in KINDS:  # kubectl's own parser and Kustomize, offline
        built = subprocess.run([k, "kustomize", str(K8S / kind)], capture_output=True, text=True, timeout=60)
        assert built.returncode == 0, built.stderr
        assert problems([d for d in yaml.safe_load_all(built.stdout) if d]) == []
    text = (K8S / "overlays" / "example" / "kustomization.yaml").read_text()
    for kind in KINDS:  # the site overlay pointed at each kind: namespace and image change, nothing else breaks
        overlay = tmp_path / "site" / kind
        overlay.mkdir(parents=True)
        (overlay / "kustomization.yaml").write_text(text.replace("- ../../jobset", f"- {os.path.relpath(K8S / kind, overlay)}"))
        built = subprocess.run([k, "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
        assert built.returncode == 0, built.stderr
        docs = [d for d in yaml.safe_load_all(built.stdout) if d]
        assert problems(docs) == []
        assert {d["metadata"]["namespace"] for d in docs} == {"my-course"}
        spec = pod(docs)["spec"]
        assert {c["image"] for c in spec["containers"] + spec["initContainers"]} == {
            "registry.example.org/course/coursekit:v1"}


def test_kubectl_client_dry_run():
    k = _kubectl()
    probe = subprocess.run([k, "version", "--request-timeout=5s", "-o", "json"], capture_output=True, text=True,
                           timeout=30)
    if probe.returncode != 0 or '"serverVersion"' not in probe.stdout:
        pytest.skip("kubectl is installed but reaches no API server: `apply --dry-run=client` needs the server's "
                    "discovery and OpenAPI documents (the schema checks above run without one)")
    for kind in KINDS:  # the CRD kinds need the operators installed on that cluster
        r = subprocess.run([k, "apply", "--dry-run=client", "-k", str(K8S / kind)], capture_output=True, text=True,
                           timeout=60)
        if kind != "job" and "no matches for kind" in r.stderr:
            continue
        assert r.returncode == 0, r.stderr


# ---- the pods' command lines, run here -------------------------------------------------------------------------------

TRAIN = ["--model", "tiny-llama", "--steps", "3", "--seq", "32", "--global-batch", "8", "--dtype", "fp32",
         "--seed", "3"]
# fp32: DDP sums the two ranks' gradients in another order than one process sums the whole batch, so the losses
# agree to rounding (~1e-7 relative per step, through Adam); 1e-5 on a loss of ~5.5 catches any real error (a
# wrong data slice or averaging factor moves it by > 1e-2). The same tolerance as tests/test_train.py.
LOSS_ATOL = 1e-5


def _single(tmp_path, train_args) -> dict:
    """The baseline: one plain process (coursekit.dist's single mode), no launcher needed."""
    base = tmp_path / "single"
    base.mkdir()
    subprocess.run([sys.executable, "-m", "coursekit.train", "--strategy", "single", *train_args, "--quiet"],
                   check=True, timeout=120, cwd=REPO, env={**os.environ, "COURSEKIT_RESULTS_DIR": str(base)})
    return json.loads((base / "rank-0.json").read_text())


@pytest.mark.timeout(240)
def test_indexed_job_pod_commands_train_here_and_equal_one_process(tmp_path, no_orphans):
    from coursekit.k8s.local import run_pods

    out = tmp_path / "manifests"
    program = ["-m", "coursekit.train", "--strategy", "ddp", *TRAIN, "--ckpt-dir", "$(COURSEKIT_RUN_DIR)/checkpoints"]
    assert cli.main(["render", "--kind", "job", "--image", "coursekit:test", "--namespace", "ck", "--nodes", "2",
                     "--gpus-per-node", "0", "--out", str(out), "--", *program]) == 0
    docs = load([out / "job.yaml"])
    assert problems(docs) == []
    root = tmp_path / "node"
    pods = run_pods(docs, root=root, workdir=REPO, timeout=180, bin_dir=str(Path(sys.executable).parent))
    assert [p.returncode for p in pods] == [0, 0], "\n\n".join(p.log[-3000:] for p in pods)
    # pod index -> node rank: pod 0 is node 0 and holds global rank 0, the only rank that prints per-step lines
    assert '"step": 0' in pods[0].log and '"step": 0' not in pods[1].log
    run_dir = root / "ckpt" / "runs" / "coursekit-train"  # COURSEKIT_RUN_DIR on the shared checkpoint volume
    recs = [json.loads((run_dir / "results" / f"rank-{r}.json").read_text()) for r in range(2)]
    assert (run_dir / "checkpoints" / "step-3" / ".metadata").exists()
    single = _single(tmp_path, TRAIN)
    want = [s["loss"] for s in single["steps"]]
    assert len(want) == 3 and want[-1] != want[0]
    for rank, rec in enumerate(recs):  # every rank, not only rank 0
        assert rec["rank"] == rank and rec["final"]["world_size"] == 2 and rec["final"]["backend"] == "gloo"
        assert [s["loss"] for s in rec["steps"]] == pytest.approx(want, abs=LOSS_ATOL)


@pytest.mark.slow  # ~2x the Job's test: two agents, an injected crash, a restart round and a resume (~40 s idle)
@pytest.mark.timeout(300)
def test_elastic_pytorchjob_pods_restart_after_a_crash_and_resume(tmp_path, no_orphans):
    # Module 5 on the PyTorchJob's own command line: the operator's PET_* env (c10d rendezvous, PET_MAX_RESTARTS),
    # every rank raises at step 2, torchrun restarts the workers, they resume from the step-2 checkpoint on the
    # shared volume and finish equal to an uninterrupted single process.
    from coursekit.k8s.local import run_pods

    train = [*TRAIN[:2], "--steps", "4", *TRAIN[4:]]
    out = tmp_path / "manifests"
    program = ["-m", "coursekit.train", "--strategy", "ddp", *train, "--ckpt-dir", "$(COURSEKIT_RUN_DIR)/checkpoints",
               "--save-every", "1", "--crash-at-step", "2"]
    assert cli.main(["render", "--kind", "pytorchjob", "--image", "coursekit:test", "--namespace", "ck",
                     "--nodes", "2", "--gpus-per-node", "0", "--max-restarts", "1", "--out", str(out),
                     "--", *program]) == 0
    docs = load([out / "pytorchjob.yaml"])
    assert problems(docs) == []
    root = tmp_path / "node"
    pods = run_pods(docs, root=root, workdir=REPO, timeout=240, bin_dir=str(Path(sys.executable).parent))
    logs = "\n\n".join(p.log[-3000:] for p in pods)
    assert [p.returncode for p in pods] == [0, 0], logs
    assert "injected failure at step 2" in logs  # it did crash, and recovered inside the job
    run_dir = root / "ckpt" / "runs" / "coursekit-train"
    recs = [json.loads((run_dir / "results" / f"rank-{r}.json").read_text()) for r in range(2)]
    want = [s["loss"] for s in _single(tmp_path, train)["steps"]]
    for rank, rec in enumerate(recs):
        assert rec["rank"] == rank and rec["final"]["world_size"] == 2
        assert [s["step"] for s in rec["steps"]] == [2, 3]  # the restarted workers resumed at the checkpoint
        assert [s["loss"] for s in rec["steps"]] == pytest.approx(want[2:], abs=LOSS_ATOL)
