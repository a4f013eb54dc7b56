"""Tiny argparse front end shared by the examples: every config field becomes ``--field``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing


def _none_or(cast):
    return lambda text: None if text == "None" else cast(text)


def _parser_for(hint):
    """A string → value converter for a field's type hint (Optional and tuples included)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if hint is bool:
        return lambda text: text.lower() in ("1", "true", "yes")
    if hint in (int, float):
        return hint
    if typing.get_origin(hint) is tuple:
        return lambda text: tuple(int(x) for x in text.split(","))
    if args and all(a in (int, float) for a in args):
        return _none_or(float if float in args else int)
    return _none_or(str)


def parse_config(config_cls, description: str, argv=None, defaults=None):
    """Build ``config_cls`` from command-line flags named after its fields.

    ``defaults`` overrides the config's own defaults for this script (a flag still wins).
    """
    defaults = defaults or {}
    parser = argparse.ArgumentParser(description=description)
    hints = typing.get_type_hints(config_cls)
    for field in dataclasses.fields(config_cls):
        if field.name in ("transform_factory", "reshape_reward"):
            continue
        parser.add_argument(
            f"--{field.name}",
            type=_parser_for(hints[field.name]),
            default=defaults.get(field.name, field.default),
            help=f"(default: {defaults.get(field.name, field.default)})",
        )
    args = parser.parse_args(argv)
    return config_cls(**vars(args))


def report(metrics: dict, every: int, index: int) -> None:
    """Print one line of the headline metrics every ``every`` batches."""
    if index % every == 0:
        keys = ("time/frames", "train/return_window", "time/fps")
        print(json.dumps({k: round(metrics[k], 1) for k in keys if k in metrics}), flush=True)
    sys.stdout.flush()
