"""Kubernetes: the course's jobs as manifests (``render``), checked offline (``validate``), runnable here (``local``).

    coursekit k8s render --kind job --image IMG --namespace NS --nodes 2 --gpus-per-node 8 --out k8s/mine
    coursekit k8s validate k8s/mine/*.yaml

See docs/clusters.md (Kubernetes) for the instructor's steps.
"""
from coursekit.k8s.render import KINDS, Params, render

__all__ = ["KINDS", "Params", "render"]
