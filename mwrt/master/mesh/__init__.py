"""Meshes and sharded tensors: one program over every worker (see device_mesh.py, tensor.py)."""
