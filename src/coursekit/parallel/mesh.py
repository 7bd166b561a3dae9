"""One named ``DeviceMesh`` from a ``ParallelDims``, with the derived sub-meshes (torchtitan's ``build_mesh``).

    mesh = build_mesh(dims, "cpu")
    mesh["tp"], mesh["pp"]                       # one axis
    mesh["batch"], mesh["loss"], mesh["fsdp"]    # flattened groups (coursekit.spec.dims.DERIVED)
    mesh["ep"], mesh["ep_rest"]                  # a borrowed parallelism's groups, when it is on

Every axis is in the mesh, size 1 included, so code asks for ``mesh["tp"]`` without checking whether TP is on.
The flattened groups are made once here (every rank must create the same groups in the same order) and kept
here, as torch asks (slicing a flattened axis from the root mesh is deprecated).
"""
from __future__ import annotations

from coursekit.spec.dims import AXES, BORROWED, DERIVED, ParallelDims


class Mesh:
    def __init__(self, root, derived: dict):
        self.root, self.derived = root, derived

    def __getitem__(self, name):
        if isinstance(name, str) and name in self.derived:
            return self.derived[name]
        return self.root[name]

    def group(self, name: str):
        """The process group of an axis or derived group, for plain ``torch.distributed`` calls."""
        return self[name].get_group()


def build_mesh(dims: ParallelDims, device_type: str) -> Mesh:
    from torch.distributed.device_mesh import init_device_mesh

    root = init_device_mesh(device_type, tuple(dims.degrees[a] for a in AXES), mesh_dim_names=AXES)
    derived = {name: root[axes]._flatten(name) for name, axes in DERIVED.items()}
    for name, host in BORROWED.items():  # ep: the host group split as (rest, ep), ep innermost (ParallelDims.coord)
        n = dims.degree(name)
        if n > 1:
            two = derived[host]._unflatten(0, (dims.size(host) // n, n), (f"{name}_rest", name))
            derived |= {name: two[name], f"{name}_rest": two[f"{name}_rest"]}
    return Mesh(root, derived)
