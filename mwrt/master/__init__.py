"""The master's side: the cluster of nodes a script drives, tensor handles, placement,
streams and events, transfers, remote functions and master-issued collectives.

Its modules stand in layers, each importing only its own layer and those below (tests/
test_layers.py holds this, and docs/developing.md draws it):

    connection   limits, progress, sites, waits, client, local, heartbeat, cluster
    places       context, ordering, streams, queries, methods, mesh/device_mesh,
                 mesh/placement, mesh/plan: where new work goes and in which order
    verbs        handle, issue, collectives, transfer, mesh/fetch, moves, shapes, rules,
                 dispatch, remote, arrayfunc, torchissue: the fields of a handle and what
                 issues its ops
    handles      tensor (DistributedTensor, one class for one place and a mesh), creation,
                 mesh/mesh_creation, reattach, mesh/saving, torchtensor (TorchTensor, a torch
                 tensor's handle), torchcreation, torchmodule
    programs     graph, profile, checkpoint

A handle's methods call the verbs, which make their results of the class of their operands
(Handle.results): every import points down.
"""
