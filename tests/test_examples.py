"""The example configuration in examples/ works as shipped.

`examples/gateway.toml` is a backends file a new user can point `GATEWAY_CONFIG` at with nothing
else set, and `examples/.env.example` a `.env` whose every line is a setting the gateway knows,
with values it accepts.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from dotenv import dotenv_values

from gateway.config import Settings, load_settings

ROOT = pathlib.Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"
ROUTES = EXAMPLES / "gateway.toml"
ENV_EXAMPLE = EXAMPLES / ".env.example"
SETTINGS = {name.upper() for name in Settings.model_fields}


def test_the_example_routes_file_passes_config_check_offline_with_nothing_else_set(tmp_path):
    # Only the file is configured: no backend variables (a LOCAL_API_KEY, OPENAI_*), no .env (the
    # working directory is empty).
    env = {
        name: value
        for name, value in os.environ.items()
        if name.upper() not in SETTINGS and not name.upper().startswith(("BACKEND", "OPENAI_", "LOCAL_"))
    }
    env["GATEWAY_CONFIG"] = str(ROUTES)
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "config", "check", "--offline"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "1 backends" in done.stdout and "route smollm2 -> local as SmolLM2-135M-Instruct" in done.stdout


def test_every_variable_the_env_example_sets_is_a_setting_with_a_value_it_accepts(monkeypatch):
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    values = dotenv_values(ENV_EXAMPLE)
    assert values, "examples/.env.example sets nothing"
    assert sorted(name for name in values if name.upper() not in SETTINGS) == []
    settings = load_settings(_env_file=str(ENV_EXAMPLE))  # a near miss or a bad value raises ConfigError
    for name, value in values.items():
        assert str(getattr(settings, name.lower())) in {value, value.rstrip("/")} or name == "OPENAI_BASE_URL_INTERNAL"
    # The values are the ones `./dev llama` and `./dev serve` need on loopback.
    assert values["OPENAI_BASE_URL_INTERNAL"] == "http://127.0.0.1:8000/v1"
    assert settings.api_adapter_host == "127.0.0.1" and settings.api_adapter_port == 8080


def test_the_env_example_names_the_example_routes_file_by_a_path_that_exists():
    text = ENV_EXAMPLE.read_text()
    assert "# GATEWAY_CONFIG=examples/gateway.toml" in text
    assert (ROOT / "examples" / "gateway.toml").is_file()
