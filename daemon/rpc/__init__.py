"""The RPC layer: listener, server, connection, dispatch and the method handlers.

It depends on the feature packages (index, memory, store, providers), the job manager and
the workspace registry; none of them depends on it.
"""
