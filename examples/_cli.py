"""Tiny argparse front end shared by the examples: every config field becomes ``--field``.

The flags come from :mod:`ac_extensions.cli._config`, as in ``ac-train`` (which adds logging,
a summary and checkpoints: ``ac-train ppo --help``).
"""

from __future__ import annotations

import argparse
import json
import sys

from ac_extensions.cli._config import add_config_flags


def parse_config(config_cls, description: str, argv=None, defaults=None):
    """Build ``config_cls`` from command-line flags named after its fields.

    ``defaults`` overrides the config's own defaults for this script (a flag still wins).
    """
    defaults = defaults or {}
    parser = argparse.ArgumentParser(description=description)
    add_config_flags(parser, config_cls, defaults)
    args = parser.parse_args(argv)
    return config_cls(**(defaults | vars(args)))


def report(metrics: dict, every: int, index: int) -> None:
    """Print one line of the headline metrics every ``every`` batches."""
    if index % every == 0:
        keys = ("time/frames", "train/return_window", "time/fps")
        print(json.dumps({k: round(metrics[k], 1) for k in keys if k in metrics}), flush=True)
    sys.stdout.flush()
