"""Fakes at the process boundary: real loopback servers speaking real wire formats."""
