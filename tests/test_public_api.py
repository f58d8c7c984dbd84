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
        "import gateway.streams.session, gateway.streams.chat, gateway.streams.messages\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'quart', 'hypercorn', 'werkzeug', 'httpx2', 'httpcore', 'cryptography', 'trio', 'redis', 'mcp'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- the layers' import rules -----------------------------------------------------------------------

import ast  # noqa: E402
import pathlib  # noqa: E402

PACKAGE = pathlib.Path(gateway.__file__).parent


def imported(path: pathlib.Path) -> set[str]:
    """Every module a source file imports (relative imports resolved), at any depth of the file."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
                names.update(f"{base}.{alias.name}" for alias in node.names)  # `from . import x` may be a module
            names.add(base)
    return names


def modules(folder: str = "") -> dict[str, set[str]]:
    root = PACKAGE / folder
    files = [root] if root.suffix == ".py" else sorted(root.rglob("*.py"))
    return {".".join(f.relative_to(PACKAGE.parent).with_suffix("").parts): imported(f) for f in files}


def breaking(found: dict[str, set[str]], *prefixes: str) -> dict[str, list[str]]:
    return {
        module: sorted(name for name in names if any(name == p or name.startswith(p + ".") for p in prefixes))
        for module, names in found.items()
        if any(name == p or name.startswith(p + ".") for p in prefixes for name in names)
    }


def test_the_request_planner_loads_no_io_framework_client_or_cipher():
    import subprocess
    import sys

    probe = (
        "import sys\nimport gateway.turn.plan, gateway.turn.conversation, gateway.wire.requests, gateway.turn.context, gateway.transport.render\n"
        "import gateway.turn.messages_plan, gateway.wire.messages\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'quart', 'hypercorn', 'werkzeug', 'httpx2', 'httpcore', 'cryptography', 'redis', 'mcp'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    planner = modules("turn/plan.py") | modules("turn/messages_plan.py") | modules("streams")
    assert breaking(planner, "trio", "httpx2", "quart", "hypercorn", "cryptography", "gateway.turn.sealing") == {}


def test_turns_never_import_transports_the_api_the_app_the_server_or_the_framework():
    found = breaking(modules("turn"), "gateway.transport", "gateway.api", "gateway.app", "gateway.server", "quart", "quart_trio")
    assert found == {}


def test_the_app_is_imported_only_by_the_package_face_and_the_entry_points():
    outside = {module: names for module, names in modules().items() if not module.startswith("gateway.app.")}
    users = sorted(breaking(outside, "gateway.app"))
    assert users == ["gateway.asgi", "gateway.serving"]  # (the package face loads it lazily, by name)
    assert (PACKAGE / "__init__.py").read_text().count('"create_app": ".app"') == 1


def test_the_api_never_imports_the_app():
    assert breaking(modules("api"), "gateway.app", "quart", "quart_trio") == {}


def test_transports_never_import_the_api_or_the_app():
    assert breaking(modules("transport"), "gateway.api", "gateway.app") == {}


def test_the_top_of_the_package_holds_only_its_face_its_entry_points_config_and_errors():
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "asgi.py", "cli.py", "config.py", "errors.py", "serving.py"]
    folders = sorted(path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").exists())
    assert folders == [
        "api", "app", "backends", "builtins", "console", "keys", "lab", "launch", "mcp", "observe", "ops", "server", "store", "streams",
        "transport", "turn", "wire",
    ]


def test_telemetry_never_imports_the_turn():
    assert breaking(modules("observe"), "gateway.turn") == {}


def test_settings_import_nothing_of_the_gateway():
    assert breaking(modules("config.py"), "gateway") == {}


def test_only_the_app_and_the_body_bridge_import_the_framework():
    users = breaking(modules(), "quart", "quart_trio")
    assert sorted(users) == ["gateway.app.__init__", "gateway.transport.asgi"]


def test_the_app_module_is_wiring_only():
    lines = (PACKAGE / "app" / "__init__.py").read_text().splitlines()
    assert len(lines) <= 250, "routes only route: behaviour belongs in api/, turn/, transport/"


def test_the_server_imports_nothing_of_the_app():
    # The HTTP server knows sockets and ASGI: of the gateway, only the settings and the errors;
    # what it needs from the app comes as hooks, what the app needs from it as ASGI extensions.
    found = modules("server")
    allowed = ("gateway.server", "gateway.config", "gateway.errors")
    outside = {
        module: sorted(name for name in names if name.startswith("gateway.") and not name.startswith(allowed))
        for module, names in found.items()
    }
    assert {module: names for module, names in outside.items() if names} == {}
    assert breaking(found, "quart", "quart_trio") == {}


def test_the_server_extensions_load_no_server():
    # An app asks for an extension (`gateway.server.ext`) without loading the server.
    import subprocess
    import sys

    probe = "import sys\nimport gateway.server.ext\nprint(sorted(m for m in sys.modules if m.startswith(('gateway.server.', 'hypercorn', 'httptools', 'trio'))))\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['gateway.server.ext']"


def test_docstrings_say_why_and_the_bench_says_how_much():
    """Measured figures go stale when the code changes: outside the load lab (and the route
    table's measured cost of the router, next to its rows) the code gives reasons, not timings."""
    import re

    figure = re.compile(r"[0-9](?:\.[0-9]+)? ?(?:µs|ns)\b|~[0-9]+(?:\.[0-9]+)? ?(?:us|ms|s|MiB|KiB|KB)\b|[0-9](?:\.[0-9]+)?×")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "lab") or path == PACKAGE / "api" / "__init__.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            text = line.split("#", 1)[1] if "#" in line and not line.lstrip().startswith(("'", '"')) else line
            if figure.search(text) and not re.search(r"rb?[\"'].*~0-9", line):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert found == []
