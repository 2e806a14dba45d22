"""recalld.ipc: the JSON-RPC protocol, the clients and the command line.

This package never imports recalld.daemon, numpy or hnswlib, so an agent process
that only queries stays light.
"""

__version__ = "0.1.0"
