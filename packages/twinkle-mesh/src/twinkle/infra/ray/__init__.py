"""Ray mode: the driver's runtime, the rank workers, remote components and lazy results.

Layers, bottom first. A module imports only modules of the layers below its own,
function-local imports included (``tests/test_ray_layering.py`` of twinkle-mesh reads
this list and checks every import):

1. ``errors``, ``env``, ``resources``, ``handles``: pure values and rules, no Ray: a
   worker's failure and the driver's line, a worker's environment, what a group asks
   of the cluster, what stands for data left on the workers.
2. ``calls``, ``traffic``: fetching a call's results (its failure raised at the
   caller's line) and the ledger of unchecked lazy calls; the bytes that pass the driver.
3. ``lazy``: LazyResult, a call's result left in the object store, and resolving
   inputs that hold such results.
4. ``rank_worker``: the Ray actor behind one rank.
5. ``worker_group``: a DeviceGroup's placement group and its rank workers.
6. ``runtime``: the driver's cluster connection and groups (``start``, ``shutdown``).
7. ``component``: RemoteComponent, what ``Cls(..., remote_group=...)`` returns.

A lower layer that must reach a higher one is handed a callback instead (``runtime``
sets ``calls.on_dead_worker``; ``component`` gives each LazyResult the runtime's
ledger of pending calls). The rest of ``twinkle.infra`` imports only layer 1 at module
level, so that importing it needs no Ray; ``initialize`` and ``remote`` import
``runtime`` and ``component`` inside the functions that run in ray mode.
"""
