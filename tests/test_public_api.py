"""The public surface is explicit, and stays so."""

from __future__ import annotations

import importlib
import pkgutil

import gateway


def test_the_package_exports_exactly_the_documented_api():
    assert sorted(gateway.__all__) == [
        "ConfigError",
        "GatewayError",
        "ResponseTranslator",
        "Settings",
        "create_app",
        "load_settings",
        "parse_create_request",
        "plan_chat_request",
        "serve",
    ]
    for name in gateway.__all__:
        assert getattr(gateway, name) is not None


def test_every_module_declares_its_public_names():
    for info in pkgutil.walk_packages(gateway.__path__, "gateway."):
        if info.name.endswith(("__main__", ".asgi")):
            continue  # entry points, not libraries
        module = importlib.import_module(info.name)
        assert hasattr(module, "__all__"), info.name
        for name in module.__all__:
            assert hasattr(module, name), f"{info.name}.{name}"


def test_the_pure_core_loads_no_io_framework_or_client():
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "import gateway.streams.translator, gateway.streams.sse, gateway.streams.chunks\n"
        "import gateway.streams.session, gateway.streams.chat_session\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'quart', 'hypercorn', 'werkzeug', 'httpx2', 'httpcore', 'cryptography', 'trio', 'redis', 'mcp'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
