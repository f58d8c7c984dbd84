"""`gateway doctor [--route NAME] [--model NAME] [--json] [--timeout SECONDS]`: the options, the
routes chosen from the configuration, the run under `trio.run`, and the exit status.

Exit status 0 when every check a client needs is ok (warnings allowed), 1 when one failed, 2
for a bad invocation: an unknown route, or a configuration that cannot be read (one line on
stderr).  It owns the adapters it builds and closes them; what a check means is `checks`'.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import trio

from ...config import ConfigError, Settings, load_settings
from ...ops.redact import Redactor
from ..config import BackendConfig, GatewayConfig, Route, RouteTarget, load_config
from .checks import CHECKS
from .probes import Target, examine
from .render import Report, exit_status, render_json, render_table

__all__ = ["UnknownRoute", "add_arguments", "main", "targets_of"]

_DEFAULT_TIMEOUT = 30.0


class UnknownRoute(Exception):
    """`--route` names no route of the configuration."""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    needed = {check.name: ", ".join(check.needed_by) or "nice to have" for check in CHECKS}
    parser.epilog = "checks:\n" + "\n".join(f"  {c.name:<20} {c.what} ({needed[c.name]})" for c in CHECKS)
    parser.add_argument("--route", metavar="NAME", help="only this route (a route's model, or a name one of its globs matches)")
    parser.add_argument("--model", metavar="NAME", help="the model to try on a glob route (default: the first the backend lists that matches)")
    parser.add_argument("--json", action="store_true", help="print a JSON document instead of the table")
    parser.add_argument(
        "--timeout", type=_seconds, default=_DEFAULT_TIMEOUT, metavar="SECONDS",
        help=f"how long each probe may take (default: {_DEFAULT_TIMEOUT:g})",
    )  # fmt: skip


def targets_of(config: GatewayConfig | None, settings: Settings, *, route: str | None = None, model: str | None = None) -> list[Target]:
    """The backends to try, route by route: the routes file's (every backend of each route, in its
    order), or the one backend of the settings as the route `*`.

    Raises:
        UnknownRoute: `route` names no route, and no glob of one matches it.
    """
    if config is None:
        backend = BackendConfig("default", "openai", settings.openai_base_url_internal, api_key=settings.openai_api_key)
        return [Target("*", backend, route or model)]
    routes = list(config.routes) or [Route("*", tuple(RouteTarget(name) for name in config.backends))]
    if route is not None:
        chosen = next((r for r in routes if r.model == route), None) or next((r for r in routes if r.matches(route)), None)
        if chosen is None:
            known = ", ".join(r.model for r in routes)
            raise UnknownRoute(f"no route {route!r} in {config.path} (its routes: {known})")
        routes = [chosen]
        if chosen.model != route:
            model = route  # a name a glob matches: the model a client would ask for
    targets = []
    for each in routes:
        for target in each.targets:
            asked = target.model or (None if each.is_glob else each.model) or model
            targets.append(
                Target(each.model, config.backends[target.backend], asked, each.context_window, where=config.path, in_file=True)
            )
    return targets


def main(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(connect_timeout=args.timeout, stream_timeout=args.timeout)
        config = load_config(settings.gateway_config) if settings.gateway_config else None
        targets = targets_of(config, settings, route=args.route, model=args.model)
    except (ConfigError, UnknownRoute) as error:
        print(f"gateway doctor: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    reports = trio.run(_run, targets, config, settings, args.timeout)
    print(render_json(reports) if args.json else render_table(reports))
    return exit_status(reports)


async def _run(targets: list[Target], config: GatewayConfig | None, settings: Settings, timeout: float) -> list[Report]:
    redactor = Redactor.from_settings(settings).with_secrets(t.backend.api_key for t in targets if t.backend.api_key)
    adapters: dict[str, Any]
    if config is None:
        from ..openai import OpenAICompatibleBackend

        adapters = {"default": OpenAICompatibleBackend(settings, redactor=redactor, name="default")}
        close = adapters["default"].aclose
    else:
        from .. import routing

        router = routing.build_router(config, settings, redactor)
        adapters = {name: state.adapter for name, state in router.backends.items()}
        close = router.aclose
    try:
        return await examine(targets, adapters, redactor, timeout=timeout)
    finally:
        with trio.CancelScope(shield=True):
            await close()
