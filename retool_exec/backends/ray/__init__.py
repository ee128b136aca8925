"""The ``ray`` backend: one Sandbox over a fleet of Docker hosts that are Ray nodes.

``connect`` joins the Ray cluster, ``actor`` is what runs on each node (a
DockerBackend against that node's daemon), ``fleet`` tracks the nodes and
routes each call to the least-loaded one, ``backend`` is the Backend the
Sandbox drives (re-running calls whose node was lost), ``session`` pins a
stateful session to its node. See docs/scaling.md.
"""
