"""`gateway loadtest`: N concurrent streams against a Responses, Chat Completions or Messages endpoint.

The load generator measures each stream precisely (time to first byte, event and text; every
gap between events; the longest silence; the terminal event) and the server's CPU time and RSS,
at a cost per stream small enough to share a machine with the server under test. It speaks to
any server over the wire, the gateway (`--api responses`, or `--api messages` for Anthropic's
Messages API) or a backend directly (`--api chat`, for a baseline), as streams or JSON answers
(`--no-stream`), or as the Responses API's WebSocket mode (`--websocket`), and knows nothing of
the gateway's internals.

One idea per module, from the wire up:

- `framing`: HTTP/1.1 response heads and body framing (`ChunkedDecoder`).
- `frames`: SSE frames found and classified by bytes, with the per-stream counts; each API's
  event vocabulary (`DIALECTS`) is a classifier there, the framing is shared.
- `failures`: a failed request's error code and printable message.
- `config`: what a run does (`LoadConfig`) and where its requests go.
- `client`: one worker's kept-alive connection and the timing of each request.
- `wsclient`: one worker's WebSocket and the timing of each turn on it.
- `sampler`: the server's CPU time and RSS, through psutil (`ProcessSampler`).
- `report`: the measurements, their aggregate (`LoadReport`) and its JSON.
- `progress`: the live progress line on stderr.
- `run`: the workers, the warm-up, the ramp-up and the end of a run (`run_load`).
- `render`: the text summary and the HTML page.
- `cli`: the command's options, outputs and exit status.

This package's public API is `__all__`.
"""

from .cli import add_arguments, main
from .config import LoadConfig
from .framing import ChunkedDecoder
from .render import format_summary, render_html
from .report import LoadReport, Percentiles, RequestResult
from .run import run_load
from .sampler import ProcessSampler, ServerUsage

# Importable from here as they were when the load generator was one module: the bench uses
# `cpu_model`, the tests the defaults and a few private names.
from .config import DEFAULT_INPUT, DEFAULT_REQUESTS, ApiKind
from .report import cpu_model
from .failures import error_fields as _error_fields
from .frames import FrameScanner as _FrameScanner
from .frames import classify_chat as _classify_chat
from .frames import classify_messages as _classify_messages
from .frames import classify_responses as _classify_responses
from .report import Counters as _Counters
from .report import aggregate as _aggregate

__all__ = [
    "ChunkedDecoder",
    "LoadConfig",
    "LoadReport",
    "Percentiles",
    "ProcessSampler",
    "RequestResult",
    "ServerUsage",
    "add_arguments",
    "format_summary",
    "main",
    "render_html",
    "run_load",
]
