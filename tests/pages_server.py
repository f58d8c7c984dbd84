"""A small web site on loopback for the page-fetching tests (hypercorn, port 0).

    /article          an HTML article (navigation, a script and a footer around it)
    /plain.txt        plain text
    /moved            302 to /article
    /to-private       302 to a private address (10.0.0.7), which must never be fetched
    /image.png        an image (not text)
    /huge             HTML larger than any fetch reads
"""

from __future__ import annotations

import functools
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from asgi_helpers import answer_lifespan

ARTICLE = """<!doctype html><html><head><title>Nurseries in Trio</title><script>var tracker = 1;</script></head>
<body><nav><a href="/">Home</a> | <a href="/about">About</a></nav>
<article><h1>Nurseries in Trio</h1>
<p>A nursery is where child tasks live: the block that opens it does not exit until every task it started has finished.</p>
<p>When one child raises, the nursery cancels its siblings and the error propagates to the owner.</p>
<p>This is what people mean by structured concurrency: every task has an owner you can name.</p>
</article><footer>Copyright nobody. Cookie settings.</footer></body></html>"""


class Pages:
    def __init__(self) -> None:
        self.url = ""
        self.hits: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        path = scope["path"]
        self.hits.append(path)
        if path == "/article":
            await _answer(send, 200, "text/html; charset=utf-8", ARTICLE.encode())
        elif path == "/plain.txt":
            await _answer(send, 200, "text/plain", b"line one\nnurseries own tasks\nline three\n")
        elif path == "/moved":
            await _answer(send, 302, "text/plain", b"", [(b"location", b"/article")])
        elif path == "/to-private":
            await _answer(send, 302, "text/plain", b"", [(b"location", b"http://10.0.0.7/secret")])
        elif path == "/image.png":
            await _answer(send, 200, "image/png", b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
        elif path == "/huge":
            await _answer(send, 200, "text/html", b"<html><body><p>" + b"word " * 1_000_000 + b"</p></body></html>")
        else:
            await _answer(send, 404, "text/plain", b"no such page")


async def _answer(send: Any, status: int, kind: str, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", kind.encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def serve_pages(pages: Pages, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = 0.1
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve, pages, config, mode="asgi"))
        pages.url = binds[0]
        task_status.started(binds[0])
