"""One named ``DeviceMesh`` from a ``ParallelDims``, with the derived sub-meshes (torchtitan's ``build_mesh``).

    mesh = build_mesh(dims, "cpu")
    mesh["tp"], mesh["pp"]                       # one axis
    mesh["batch"], mesh["loss"], mesh["fsdp"]    # flattened groups (coursekit.spec.dims.DERIVED)

Every axis is in the mesh, size 1 included, so code asks for ``mesh["tp"]`` without checking whether TP is on.
The flattened groups are made once here (every rank must create the same groups in the same order) and kept
here, as torch asks (slicing a flattened axis from the root mesh is deprecated).
"""
from __future__ import annotations

from coursekit.spec.dims import AXES, DERIVED, ParallelDims


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
    return Mesh(root, {name: root[axes]._flatten(name) for name, axes in DERIVED.items()})
