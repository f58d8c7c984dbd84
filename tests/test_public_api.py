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
