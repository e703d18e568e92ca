"""Scale-out on one machine: data-parallel engine replicas behind one API process.

``cpu_split`` divides the CPUs between replicas (along ``cpu_topology``), ``prefix_index`` and
``routing`` pick the replica for each request, ``dp_client`` presents the replicas to the API
process as one engine client, ``replica_set`` starts, watches and restarts them (each through a
launcher: local processes, or ``ray_executor``'s Ray actors), ``dp_metrics`` shows them one by
one.
"""
