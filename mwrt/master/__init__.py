"""The master's side: the cluster of nodes a script drives, tensor handles, placement,
streams and events, transfers, remote functions and master-issued collectives.

Its modules stand in layers, each importing only its own layer and those below (tests/
test_layers.py holds this, and docs/developing.md draws it):

    connection   limits, progress, sites, client, local, heartbeat, cluster
    places       context, ordering, streams, queries, methods, mesh/device_mesh,
                 mesh/placement: where new work goes and in which order
    handles      tensor, issue, element, remote, arrayfunc, transfer, creation,
                 collectives, naming: DistributedTensor and the ops it issues
    meshes       mesh/plan, fetch, moves, shapes, rules, dispatch, tensor, creation,
                 saving: ShardedTensor, its placement rules and data moves
    programs     graph, profile, checkpoint

A handle's methods issue ops, and issuing makes handles: where a lower module must call up
it names the function with upcalls.unbound(), and this module binds each one, here, once.
"""

from . import arrayfunc, creation, element, issue, methods, remote, tensor, transfer
from .mesh import creation as mesh_creation
from .mesh import dispatch as mesh_dispatch
from .mesh import tensor as mesh_tensor  # noqa: F401 (binds its module's results' class)
from .upcalls import bind

bind(tensor, call=issue.call, fetch=transfer.fetch, move=transfer.move,
     array_function=arrayfunc.array_function, array_ufunc=arrayfunc.array_ufunc,
     Element=element.Element)
methods.install(tensor.DistributedTensor, issue.call)
bind(creation, create_on_mesh=mesh_creation.create)
bind(transfer, put_on_mesh=mesh_creation.put)
bind(remote, remote_on_mesh=mesh_dispatch.remote_call)
