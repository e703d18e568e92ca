"""argparse ``type=`` checks the CLI's numeric options share: a bad value is a usage error that
says what the option takes."""

from __future__ import annotations

import argparse


def _number(text: str, kind: type, what: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None


def positive_int(text: str) -> int:
    value = _number(text, int, "an integer >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = _number(text, int, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def non_negative(text: str) -> float:
    value = _number(text, float, "a number >= 0")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def fraction(text: str) -> float:
    value = _number(text, float, "a number within [0, 1]")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be within [0, 1], got {text}")
    return value


def port(text: str) -> int:
    value = _number(text, int, "a port number, 1-65535")
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number within 1-65535, got {text}")
    return value


def positive(text: str) -> float:
    value = _number(text, float, "a number > 0")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def positive_or_auto(text: str) -> float | None:
    """A number > 0, or ``auto`` (None: the program chooses)."""
    return None if text.strip().lower() == "auto" else positive(text)


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends with each option's default where its text does not name one already
    (and the default is a value: not None, False or suppressed)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text or action.default in (None, False, argparse.SUPPRESS)
                or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"
