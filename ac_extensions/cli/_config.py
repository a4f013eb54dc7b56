"""Recipes by name, and recipe config dataclasses as command-line flags.

Recipes are imported lazily (:func:`load_recipe`), so one that fails to import does not break
the others. Every dataclass field becomes ``--field-name`` (and ``--field_name``); its help is
the field's attribute docstring and default.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import itertools
import json
import re
import textwrap
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

RECIPES: dict[str, tuple[str, str]] = {
    "a2c": ("ac_extensions.recipes.a2c", "A2CConfig"),
    "ppo": ("ac_extensions.recipes.ppo", "PPOConfig"),
    "acer": ("ac_extensions.recipes.acer", "ACERConfig"),
    "reactor": ("ac_extensions.recipes.reactor", "ReactorConfig"),
}
"""Algorithm name → (module with ``train``/``build``/``make_env``, config class name)."""

SKIPPED = frozenset({"algorithm", "transform_factory", "reshape_reward"})
"""Fields that are not flags: fixed by the algorithm, or Python callables."""

ALIASES = {"env_id": ("--env",)}
"""Extra spellings of some flags."""


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit status 2."""


def load_recipe(name: str) -> tuple[types.ModuleType, type]:
    """The recipe module and its config class for algorithm ``name``."""
    if name not in RECIPES:
        raise UsageError(f"unknown algorithm {name!r} (choose from {', '.join(RECIPES)})")
    module_name, class_name = RECIPES[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"algorithm {name!r} is not available: {error}") from error
    return module, getattr(module, class_name)


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (a string literal right after the field) of ``cls`` and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _converter(hint) -> tuple[Callable[[str], Any], list | None]:
    """A string → value converter for a field's type hint, and its choices (Literal)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    optional = type(None) in typing.get_args(hint)
    if optional and len(args) == 1:
        inner, choices = _converter(args[0])

        def none_or(text: str):
            return None if text in ("None", "none", "null") else inner(text)

        none_or.__name__ = getattr(inner, "__name__", "value")
        return none_or, None if choices is None else [*choices, None]
    if hint is bool:
        return _boolean, None
    if hint in (int, float, str):
        return hint, None
    if typing.get_origin(hint) is typing.Literal:
        return str, list(args)
    if typing.get_origin(hint) is tuple:
        item = args[0] if args else str

        def sequence(text: str):
            return tuple(item(x) for x in text.split(",") if x.strip())

        sequence.__name__ = f"comma-separated {item.__name__}s"
        return sequence, None
    return str, None


FAMILIES = {"minatar": "MinAtar", "atari": "Atari"}
"""Env families whose defaults differ from a config's own (``FAMILY_DEFAULTS``), as named in
the flags' help."""


def _family_help(config_cls: type) -> dict[str, str]:
    """Per field, ``"; MinAtar: v; Atari: w"`` for the families that change its default."""
    tables = {
        label: config_cls.defaults_for_family(family)
        for family, label in FAMILIES.items()
        if hasattr(config_cls, "defaults_for_family")
    }
    notes: dict[str, str] = {}
    for label, table in tables.items():
        for name, value in table.items():
            value = ",".join(map(str, value)) if isinstance(value, tuple) else value
            notes[name] = notes.get(name, "") + f"; {label}: {value}"
    return notes


class Toggle(argparse.Action):
    """A boolean flag: ``--name`` (true), ``--no-name`` (false), or ``--name true|false``."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        kwargs.pop("type", None)
        super().__init__(option_strings, dest, nargs="?", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if option_string.startswith("--no-"):
            if values is not None:
                parser.error(f"{option_string} takes no value")
            setattr(namespace, self.dest, False)
            return
        try:
            setattr(namespace, self.dest, True if values is None else _boolean(values))
        except argparse.ArgumentTypeError as error:
            parser.error(f"{option_string}: {error}")


class HelpFormatter(argparse.HelpFormatter):
    """One spelling per flag, ``--flag/--no-flag`` for booleans, no repeated defaults."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, Toggle):
            return "/".join(action.option_strings)
        if action.option_strings and action.nargs != 0:
            return f"{action.option_strings[0]} {self._format_args(action, action.dest.upper())}"
        return super()._format_action_invocation(action)


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def help_sentence(doc: str) -> str:
    """The first sentence of a field's docstring, without reStructuredText markup.

    Example:
        >>> help_sentence("Steps per ``[B, T]`` window (see :class:`~a.b.Config`). More.")
        'Steps per [B, T] window (see Config)'
    """

    def target(match: re.Match) -> str:  # :class:`~a.b.C` → C, :mod:`a.b` → a.b
        return match.group(1).rsplit(".", 1)[-1] if "~" in match.group(0) else match.group(1)

    text = _ROLE.sub(target, doc)
    text = text.replace("``", "")
    for abbreviation in ("e.g.", "i.e.", "vs.", "cf.", "et al."):
        text = text.replace(abbreviation, abbreviation.replace(".", "\0"))
    first = re.split(r"(?<=[a-z0-9)\]`'])\.\s", text, maxsplit=1)[0]
    return first.rstrip(".").strip().replace("\0", ".")


def add_config_flags(parser: argparse.ArgumentParser, config_cls: type, defaults=None) -> None:
    """One flag per field of ``config_cls``; values absent from the command line are left out.

    The parsed namespace holds only the flags given (``argparse.SUPPRESS``), so a caller can
    layer them over the config's defaults or over a saved config (``--resume``). The help is
    the first sentence of the field's docstring and its default, with the defaults that
    differ per env family (``FAMILY_DEFAULTS``) beside it. Booleans are ``--flag/--no-flag``
    (``--flag true|false`` still works); the ``--field_name`` spelling is accepted but not
    shown.
    """
    defaults = defaults or {}
    hints = typing.get_type_hints(config_cls)
    docs = field_docs(config_cls)
    family_notes = _family_help(config_cls)
    group = parser.add_argument_group(f"{config_cls.__name__} fields")
    for field in dataclasses.fields(config_cls):
        if field.name in SKIPPED:
            continue
        convert, choices = _converter(hints[field.name])
        dashed = f"--{field.name.replace('_', '-')}"
        spellings = [*ALIASES.get(field.name, ()), dashed, f"--{field.name}"]
        shown, hidden = spellings[0], [n for n in dict.fromkeys(spellings) if n != spellings[0]]
        default = defaults.get(field.name, field.default)
        if isinstance(default, tuple):
            default = ",".join(map(str, default))
        text = help_sentence(docs.get(field.name, "")).replace("%", "%%")
        text = f"{text} (default: {default}{family_notes.get(field.name, '')})"
        common = dict(dest=field.name, default=argparse.SUPPRESS)
        if hints[field.name] is bool:
            negative = f"--no-{shown[2:]}"
            group.add_argument(shown, negative, action=Toggle, help=text, **common)
            if hidden:
                group.add_argument(*hidden, action=Toggle, help=argparse.SUPPRESS, **common)
            continue
        typed = dict(type=convert, choices=choices, **common)
        metavar = field.name.upper() if choices is None else None
        group.add_argument(shown, metavar=metavar, help=text, **typed)
        if hidden:
            group.add_argument(*hidden, help=argparse.SUPPRESS, **typed)


def make_config(config_cls: type, values: dict[str, Any]):
    """``config_cls(**values)``; an invalid value raises :class:`UsageError`."""
    try:
        return config_cls(**values)
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from error


def config_to_json(config) -> dict[str, Any]:
    """The config's fields as JSON values (callables as their repr)."""
    out = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, tuple):
            value = list(value)
        elif callable(value):
            value = repr(value)
        out[field.name] = value
    return out


def config_from_json(config_cls: type, values: dict[str, Any]):
    """Inverse of :func:`config_to_json` for configs without callables."""
    names = {f.name for f in dataclasses.fields(config_cls)}
    values = {
        k: tuple(v) if isinstance(v, list) else v
        for k, v in values.items()
        if k in names and k not in ("transform_factory", "reshape_reward")
    }
    return make_config(config_cls, values)


RUN_FILE = "run.json"
"""What ``ac-train`` writes first into its output directory: algorithm and config."""


def read_run(directory: str | Path) -> tuple[str, Any]:
    """(algorithm, config) of the run in ``directory``, from its ``run.json``."""
    path = Path(directory) / RUN_FILE
    if not path.is_file():
        raise UsageError(f"{directory} holds no ac-train run (no {RUN_FILE})")
    try:
        run = json.loads(path.read_text())
        name = run["algorithm"]
        _, config_cls = load_recipe(name)
        return name, config_from_json(config_cls, run["config"])
    except (KeyError, TypeError, json.JSONDecodeError) as error:
        raise UsageError(f"cannot read {path}: {error}") from error


def check_env_id(env_id: str) -> float | None:
    """Raise :class:`UsageError` for an unknown gymnasium id; return its reward threshold.

    Accepts ``gym.make``'s ``module:Id`` form too (the module, imported first, registers
    ``Id``; the collector workers import it the same way). Atari (``ALE/…``) and MinAtar
    (``MinAtar/…``, the ``minatar`` extra) ids are registered first, as the envs do.
    """
    import gymnasium as gym

    # (importing the module registers MaskedCartPole-v1, ...)
    from ac_extensions.runtime.envs import MINATAR_PREFIX, register_minatar

    if env_id.startswith("ALE/"):
        import ale_py

        gym.register_envs(ale_py)
    if env_id.startswith(MINATAR_PREFIX):
        try:
            register_minatar()
        except ImportError as error:
            raise UsageError(f"environment {env_id!r}: {error}") from error
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise UsageError(f"unknown environment {env_id!r}: {error}") from error
    try:
        spec = gym.spec(name)
    except gym.error.Error as error:
        raise UsageError(f"unknown environment {env_id!r}: {error}") from error
    return spec.reward_threshold
