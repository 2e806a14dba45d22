"""Outbound providers: the asyncio bridge, retry policy, embedding and chat clients."""
