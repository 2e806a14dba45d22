"""recalld daemon: supervisor, RPC server, workspaces, index and jobs."""
