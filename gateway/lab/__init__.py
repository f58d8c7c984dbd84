"""The load lab and real local backends.

- `simulator`: a deterministic Chat Completions server for load tests (`gateway simulate-backend`).
- `loadtest`: concurrent streams with precise latency, silence and server CPU/RSS figures (`gateway loadtest`).
- `bench`: the standard scenarios side by side in one run (`gateway bench`, `just bench`).
- `llamacpp`: llama.cpp (xllamacpp) with SmolLM2-135M, for the demo and end-to-end tests.
- `fdlimit`: the open-file limit every lab command raises before opening thousands of sockets.
"""

__all__ = ["client_host"]


def client_host(host: str) -> str:
    """Where to connect to a server bound on ``host`` (wildcards → loopback)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "[::1]"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host
