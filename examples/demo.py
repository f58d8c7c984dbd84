"""The main job on an embedded default: a real small model behind the gateway.

Starts llama.cpp (xllamacpp) with SmolLM2-135M-Instruct on a free port, the
gateway in front of it (with the example MCP server of examples/ configured,
as MCP_SERVERS_CONFIG_PATH would), and streams a reply through the official
openai SDK's Responses API, printing the text as it arrives and the events it
came in; then it shows the MCP server the gateway connected and its tools.
(SmolLM2's chat template has no tools, so the model itself never calls them.)

    ./dev demo           # or: ./dev demo "your prompt", .venv/bin/python examples/demo.py "your prompt"
"""

from __future__ import annotations

import collections
import functools
import json
import os
import pathlib
import sys
import tempfile

import openai
import trio

import gateway
from gateway.lab.llamacpp import run_llama_server
from gateway.mcp import MCPManager


async def main(prompt: str) -> None:
    async with trio.open_nursery() as nursery:
        print("starting llama.cpp with SmolLM2-135M-Instruct ...", flush=True)
        backend_url = await nursery.start(run_llama_server)
        example = pathlib.Path(__file__).with_name("mcp_server.py")
        config = pathlib.Path(tempfile.mkdtemp()) / "mcp_servers.json"
        config.write_text(json.dumps({"mcpServers": {"example": {"command": sys.executable, "args": [str(example)]}}}))
        settings = gateway.Settings(
            _env_file=None,
            openai_base_url_internal=backend_url,
            api_adapter_host="127.0.0.1",
            api_adapter_port=0,
            log_file_path="",
            store_backend="memory",
            mcp_servers_config_path=str(config),
        )
        app = gateway.create_app(settings)
        gateway_url = await nursery.start(functools.partial(gateway.serve, settings, app=app))
        print(f"gateway on {gateway_url}, backend on {backend_url}\n", flush=True)

        client = openai.AsyncOpenAI(base_url=gateway_url + "/v1", api_key="not-needed")
        counts: collections.Counter[str] = collections.Counter()
        print(f"> {prompt}\n", flush=True)
        async with client.responses.stream(
            model="SmolLM2-135M-Instruct",
            instructions="You are a concise, friendly assistant.",
            input=prompt,
            max_output_tokens=int(os.environ.get("DEMO_MAX_OUTPUT_TOKENS", "120")),
            temperature=0.2,
        ) as stream:
            final = None
            async for event in stream:
                counts[event.type] += 1
                if event.type == "response.output_text.delta":
                    print(event.delta, end="", flush=True)
                elif event.type in ("response.completed", "response.incomplete", "response.failed"):
                    # (the SDK's get_final_response() knows only `completed`: a reply cut at
                    # max_output_tokens ends `incomplete`, and is a reply all the same)
                    final = event.response
        if final is None:
            raise SystemExit("the stream ended without a terminal event")
        print("\n")
        print(f"status={final.status} id={final.id} usage: in={final.usage.input_tokens} "
              f"out={final.usage.output_tokens} total={final.usage.total_tokens}")
        print("events: " + ", ".join(f"{name} x{n}" for name, n in counts.items()))
        manager = app.shared.resources.mcp  # the MCP manager the gateway started
        if isinstance(manager, MCPManager):
            with trio.move_on_after(20):
                await manager.wait_settled()
            for server in manager.status():
                print(f"MCP server {server.name!r} ({server.type}): {server.state}; tools offered: {', '.join(server.tools)}")
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main, " ".join(sys.argv[1:]) or "Write two sentences about the sea.")
