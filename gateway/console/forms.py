"""The console's forms read: a urlencoded body as fields, and a key's form as a name, limits and a flag (pure).

Each problem is reported by the field it belongs to (`FieldErrors`), for
the page to show next to that field; a form with any problem changes
nothing.  A limit is a whole number of 0 or more (0: none allowed), or
empty for no limit, as `gateway keys` takes them; a model list is names or
globs separated by commas, empty for all, `none` for none.

Knows no HTTP, store or template.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl

from ..config import check_key_name
from ..keys import KeyLimits

__all__ = ["LIMIT_FIELDS", "FieldErrors", "NewKey", "form_fields", "limit_text", "parse_limits", "parse_new_key"]

FieldErrors = dict[str, str]  # field name -> what is wrong with it
LIMIT_FIELDS = ("rpm", "tpm", "concurrency")
_LIMIT_CEILING = 10**12  # a limit past this is a typo, not a limit
_MODEL = re.compile(r"[A-Za-z0-9._:/@*?\[\]-]{1,200}")
_MAX_MODELS = 100


@dataclass(frozen=True)
class NewKey:
    name: str
    limits: KeyLimits
    admin: bool


def form_fields(body: bytes) -> dict[str, str]:
    """A urlencoded form's fields (the first of a repeated name; undecodable bytes replaced)."""
    fields: dict[str, str] = {}
    for name, value in parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=100):
        fields.setdefault(name, value)
    return fields


def parse_new_key(fields: Mapping[str, str]) -> tuple[NewKey | None, FieldErrors]:
    """The key a create form asks for, or the problems of each field."""
    errors: FieldErrors = {}
    name = fields.get("name", "").strip()
    try:
        check_key_name(name)
    except ValueError:
        errors["name"] = "Use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit."
    limits, limit_errors = parse_limits(fields, KeyLimits())
    errors.update(limit_errors)
    if errors or limits is None:
        return None, errors
    return NewKey(name, limits, fields.get("admin") in ("on", "true", "1", "yes")), {}


def parse_limits(fields: Mapping[str, str], base: KeyLimits) -> tuple[KeyLimits | None, FieldErrors]:
    """`base` with the form's rpm, tpm, concurrency and models (its other limits kept), or the
    problems of each field."""
    errors: FieldErrors = {}
    changes: dict[str, object] = {}
    for name in LIMIT_FIELDS:
        if name not in fields:
            continue
        text = fields[name].strip()
        if text.lower() in ("", "none", "unlimited"):
            changes[name] = None
        elif not text.isdigit() or not text.isascii() or int(text) > _LIMIT_CEILING:
            errors[name] = "Give a whole number of 0 or more (0: none allowed), or leave it empty for no limit."
        else:
            changes[name] = int(text)
    if "models" in fields:
        models, problem = _models(fields["models"])
        if problem:
            errors["models"] = problem
        else:
            changes["models"] = models
    if errors:
        return None, errors
    return dataclasses.replace(base, **changes), {}  # type: ignore[arg-type]


def _models(text: str) -> tuple[tuple[str, ...] | None, str | None]:
    word = text.strip()
    if not word or word.lower() == "all":
        return None, None
    if word.lower() == "none":
        return (), None
    names = tuple(part.strip() for part in word.split(",") if part.strip())
    if len(names) > _MAX_MODELS or not all(_MODEL.fullmatch(name) for name in names):
        return None, "Give model names or globs (qwen*) separated by commas, 'none', or leave it empty for all."
    return names, None


def limit_text(value: int | None) -> str:
    """A limit as its form field shows it (empty: no limit)."""
    return "" if value is None else str(value)
