"""Lab harnesses: real local backends (llama.cpp via xllamacpp) for end-to-end tests and demos."""

__all__: list[str] = []
