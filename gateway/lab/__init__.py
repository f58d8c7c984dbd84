"""The load lab and real local backends.

- `simulator`: a deterministic Chat Completions server for load tests (`gateway simulate-backend`).
- `loadtest`: concurrent streams with precise latency, silence and server CPU/RSS figures (`gateway loadtest`).
- `bench`: the standard scenarios side by side in one run (`gateway bench`, `just bench`).
- `llamacpp`: llama.cpp (xllamacpp) with SmolLM2-135M, for the demo and end-to-end tests.
"""

__all__: list[str] = []
