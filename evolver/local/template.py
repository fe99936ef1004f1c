"""The chat template inside a GGUF file, and the fix the shipped 1.5B model needs.

Qwen2.5-Coder-1.5B's GGUF carries a template whose tool-call example is
`{{"name": <function-name>, "arguments": <args-json-object>}}` inside a Jinja
string literal, where the doubled braces are not an escape: the model is
shown doubled braces and sometimes writes them. The 0.5B's template has the
same text with single braces; the fix makes the 1.5B's match it.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO, Optional

TEMPLATE_KEY = "tokenizer.chat_template"
_DOUBLED = '{{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}}'
_SINGLE = '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}'

# GGUF metadata value types: fixed-size scalars by struct format.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def fixed_chat_template(path: Path) -> Optional[str]:
    """The GGUF's template with the doubled-brace example fixed, or None if it needs
    no fix or cannot be read (llama.cpp then reports the file itself when it loads it)."""
    try:
        template = read_chat_template(path)
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        return None
    if template and _DOUBLED in template:
        return template.replace(_DOUBLED, _SINGLE)
    return None


def read_chat_template(path: Path) -> Optional[str]:
    """Read tokenizer.chat_template from a GGUF file's metadata (None if absent)."""
    with open(path, "rb", buffering=1 << 20) as fh:
        if fh.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        _version, _tensors, kv_count = struct.unpack("<IQQ", fh.read(20))
        for _ in range(kv_count):
            key = _read_string(fh)
            kind = _unpack(fh, "<I")
            if key == TEMPLATE_KEY and kind == _STRING:
                return _read_string(fh)
            _skip_value(fh, kind)
    return None


def _unpack(fh: BinaryIO, fmt: str):
    return struct.unpack(fmt, fh.read(struct.calcsize(fmt)))[0]


def _read_string(fh: BinaryIO) -> str:
    return fh.read(_unpack(fh, "<Q")).decode("utf-8", errors="replace")


def _skip_value(fh: BinaryIO, kind: int) -> None:
    if kind in _SCALARS:
        fh.seek(struct.calcsize(_SCALARS[kind]), 1)
    elif kind == _STRING:
        fh.seek(_unpack(fh, "<Q"), 1)
    elif kind == _ARRAY:
        item_kind, count = _unpack(fh, "<I"), _unpack(fh, "<Q")
        if item_kind in _SCALARS:
            fh.seek(count * struct.calcsize(_SCALARS[item_kind]), 1)
        else:
            for _ in range(count):
                _skip_value(fh, item_kind)
    else:
        raise ValueError(f"unknown GGUF metadata type {kind}")
