"""Memory that evolves: file operations for models, auto_memory, auto_dream, auto_resource,
and the inbox."""
