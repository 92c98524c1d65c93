"""Text from untrusted sources (a DNS name a harness asked for, a path, a model name, an
output) made safe to store and to show: every character that steers a terminal or hides
text (control characters, escape sequences, bidirectional overrides, zero-width and other
format characters, line separators, lone surrogates) becomes its backslash escape, ``\\x1b``,
``\\u202e``. Everything else, backslashes included, is left as it is, so text already
escaped (Python's ``repr``) is not escaped twice.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile(
    "["
    "\x00-\x1f\x7f-\x9f"  # C0, DEL, C1 (ESC, CSI, OSC, ...)
    "\u061c\u180e"  # Arabic letter mark, Mongolian vowel separator
    "\u200b-\u200f"  # zero-width characters, LRM, RLM
    "\u2028-\u202e"  # line and paragraph separators, bidi embeddings and overrides
    "\u2060-\u2064\u2066-\u206f"  # word joiner, invisible operators, bidi isolates, ...
    "\ufeff\ufff9-\ufffb"  # zero-width no-break space, interlinear annotations
    "\ud800-\udfff"  # lone surrogates
    "\U000e0000-\U000e007f"  # tag characters
    "]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape_text(text: str, keep: str = "") -> str:
    """``text`` with every unsafe character escaped, except those in ``keep`` (e.g.
    ``"\\n\\t"`` for a multi-line report)."""
    if keep:
        return _UNSAFE.sub(lambda m: m.group() if m.group() in keep else _escape(m), text)
    return _UNSAFE.sub(_escape, text)


def is_safe(text: str, keep: str = "") -> bool:
    """Whether ``text`` holds no unsafe character (other than those in ``keep``)."""
    return all(m.group() in keep for m in _UNSAFE.finditer(text))
