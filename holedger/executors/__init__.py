"""holedger.executors: trials on other machines.

The server hands an executor each trial's sandbox to run (``server/executor.py``). This
room holds what a remote executor needs below the server: candidate trees that travel by
their git tree id (``trees.py``), the TLS way from a node to the gateway (``tls.py``,
``relay.py``), what a node does with a trial (``node.py``), and the Ray executor
(``ray_cluster.py``, imported only when chosen, with its driver process in
``ray_driver.py``: Ray is an optional extra, imported only there). See
docs/SCALING.md.
"""
