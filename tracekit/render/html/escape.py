"""What may enter the page from a trace, and how: JSON in a script, HTML, chart text, links.

Stage, span, service and release names come from whoever sent the spans, and a Jaeger URL
from the command line; none of it may end a ``<script>``, add markup or become a
``javascript:`` link. Each way into the page has one function here:

* :func:`script_json` — JSON inside ``<script>``: still valid JSON whatever the strings
  hold, with nothing the HTML parser or a JavaScript parser reads as more than a string;
* :func:`e` — HTML text and attribute values;
* :func:`plot_text` — strings plotly.js draws, which it reads as a small HTML dialect
  (``<b>``, ``<a href>``, entities) and as ``%{…}`` templates in a hover template;
* :func:`link_url` — a URL that may become an ``href``: http(s) only.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any
from urllib.parse import urlsplit

import numpy as np

LINK_SCHEMES = frozenset({"http", "https"})
"""Schemes a URL from a flag or a span may have to become a link."""

# Outside strings JSON has none of these, so replacing them touches string contents only.
# ``<`` alone covers ``</script>``, ``<!--`` and ``<script``; ``>`` covers ``-->`` and
# ``]]>``; U+2028 and U+2029 end a line in older JavaScript parsers.
_SCRIPT_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)
# plotly.js decodes entities in what it draws, so these show as the characters they stand for.
_PLOT_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "%": "&#37;"})


def clean(obj: Any) -> Any:
    """JSON-ready: NaN/inf → null, numpy → Python, floats rounded as ``--format json``."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [clean(v) for v in obj.tolist()]
    if isinstance(obj, np.generic):
        return clean(obj.item())
    if isinstance(obj, float):
        return None if not math.isfinite(obj) else round(obj, 6)
    return obj


def script_json(obj: Any) -> str:
    """``obj`` as JSON safe inside ``<script>``: ``JSON.parse`` and ``json.loads`` read the
    strings back unchanged, and no string can end the element or open a comment in it."""
    text = json.dumps(clean(obj), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.translate(_SCRIPT_ESCAPES)


def e(text: object) -> str:
    """HTML text or a quoted attribute value."""
    return html.escape(str(text), quote=True)


def plot_text(text: object) -> str:
    """A name as plotly.js should draw it: literally, never as markup, a link or a template."""
    return str(text).translate(_PLOT_ESCAPES)


def link_url(url: str | None) -> str | None:
    """``url`` when it may become a link (http or https with a host), else None.

    A URL holding a space or a control character is refused outright: browsers drop some
    of those before reading the scheme (``java\\tscript:``), so what is checked here would
    not be what the browser follows.
    """
    if not url or any(c <= " " or c == "\x7f" for c in url):
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return url if parts.scheme.lower() in LINK_SCHEMES and parts.netloc else None
