"""Text to QEMU key events (QMP ``input-send-event``), for a US keyboard layout."""

from __future__ import annotations

from dsec.api.errors import InvalidArgument

__all__ = ["text_events", "key_events", "click_events"]

_PLAIN = {" ": "spc", "\n": "ret", "\t": "tab", "-": "minus", "=": "equal", "[": "bracket_left",
          "]": "bracket_right", ";": "semicolon", "'": "apostrophe", "`": "grave_accent",
          "\\": "backslash", ",": "comma", ".": "dot", "/": "slash"}
_SHIFTED = {"!": "1", "@": "2", "#": "3", "$": "4", "%": "5", "^": "6", "&": "7", "*": "8",
            "(": "9", ")": "0", "_": "minus", "+": "equal", "{": "bracket_left",
            "}": "bracket_right", ":": "semicolon", '"': "apostrophe", "~": "grave_accent",
            "|": "backslash", "<": "comma", ">": "dot", "?": "slash"}


def _key(qcode: str, down: bool) -> dict:
    return {"type": "key", "data": {"down": down, "key": {"type": "qcode", "data": qcode}}}


def _qcode(ch: str) -> tuple[str, bool]:
    """(qcode, needs shift) for one character."""
    if ch.isascii() and (ch.islower() or ch.isdigit()):
        return ch, False
    if ch.isascii() and ch.isupper():
        return ch.lower(), True
    if ch in _PLAIN:
        return _PLAIN[ch], False
    if ch in _SHIFTED:
        return _SHIFTED[ch], True
    raise InvalidArgument(f"cannot type {ch!r}: only printable ASCII, tab and newline")


def text_events(text: str) -> list[list[dict]]:
    """One batch of events per character: press (with shift if needed), release."""
    out = []
    for ch in text:
        code, shift = _qcode(ch)
        batch = [_key("shift", True)] if shift else []
        batch += [_key(code, True), _key(code, False)]
        if shift:
            batch.append(_key("shift", False))
        out.append(batch)
    return out


def key_events(keys: list[str]) -> list[dict]:
    """A chord of QEMU qcodes (e.g. ``["ctrl", "alt", "delete"]``): press all, release all."""
    return [_key(k, True) for k in keys] + [_key(k, False) for k in reversed(keys)]


def click_events(x: int, y: int, width: int, height: int, button: str = "left") -> list[list[dict]]:
    """Move the absolute pointer to pixel (x, y) of a ``width`` x ``height`` display, click."""
    if not (0 <= x < width and 0 <= y < height):
        raise InvalidArgument(f"click at ({x}, {y}) is outside the {width}x{height} display")
    if button not in ("left", "right", "middle"):
        raise InvalidArgument(f"button must be left, right or middle; got {button!r}")
    move = [{"type": "abs", "data": {"axis": "x", "value": x * 32767 // max(width - 1, 1)}},
            {"type": "abs", "data": {"axis": "y", "value": y * 32767 // max(height - 1, 1)}}]
    btn = [{"type": "btn", "data": {"down": d, "button": button}} for d in (True, False)]
    return [move, btn[:1], btn[1:]]
