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
import shutil
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

METAVARS = {"env_id": "ENV_ID"}
"""Placeholders other than the type's (``INT``, ``FLOAT``, ``STR``) in the help."""


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


class _Choices(list):
    """A flag's choices as shown (``none`` for an optional one), which also hold ``None``."""

    def __contains__(self, value) -> bool:
        return super().__contains__("none" if value is None else value)


NONE_SPELLINGS = ("none", "None", "null")
"""What the command line accepts for ``None`` (an optional field, an empty tuple)."""


def _converter(hint) -> tuple[Callable[[str], Any], list | None]:
    """A string → value converter for a field's type hint, and its choices (Literal).

    An optional field also takes ``none`` (shown among the choices as ``none``, never
    ``None``); a tuple field takes comma-separated items, or ``none`` for the empty tuple.
    """
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    optional = type(None) in typing.get_args(hint)
    if optional and len(args) == 1:
        inner, choices = _converter(args[0])

        def none_or(text: str):
            return None if text in NONE_SPELLINGS else inner(text)

        none_or.__name__ = getattr(inner, "__name__", "value")
        return none_or, None if choices is None else _Choices([*choices, "none"])
    if hint is bool:
        return _boolean, None
    if hint in (int, float, str):
        return hint, None
    if typing.get_origin(hint) is typing.Literal:
        return str, list(args)
    if typing.get_origin(hint) is tuple:
        item = args[0] if args else str

        def sequence(text: str):
            if text.strip() in NONE_SPELLINGS:
                return ()
            return tuple(item(x) for x in text.split(",") if x.strip())

        sequence.__name__ = f"comma-separated {item.__name__}s"
        return sequence, None
    return str, None


_METAVARS = {int: "INT", float: "FLOAT", str: "STR"}


def _metavar(hint) -> str:
    """A short placeholder for a field's value: ``INT``, ``FLOAT``, ``STR``, ``INT,...``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is tuple:
        return f"{_METAVARS.get(args[0] if args else str, 'STR')},..."
    if type(None) in typing.get_args(hint) and len(args) == 1:
        return _metavar(args[0])
    return _METAVARS.get(hint, "VALUE")


def shown(value) -> str:
    """A default as the help shows it: ``none``, ``on``/``off``, comma-separated tuples.

    Example:
        >>> [shown(v) for v in (None, True, (64, 64), (), 0.5)]
        ['none', 'on', '64,64', 'none', '0.5']
    """
    if value is None or value == ():
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


FAMILIES = {"minatar": "MinAtar", "atari": "Atari", "mujoco": "MuJoCo"}
"""Env families whose defaults differ from a config's own (``FAMILY_DEFAULTS``), as named in
the flags' help."""


def _family_help(config_cls: type, defaults: dict[str, Any]) -> dict[str, str]:
    """Per field, ``"; MinAtar: v; Atari: w"`` for the families whose value differs.

    ``defaults`` are the values shown as ``default:``; a family value equal to it is left out,
    and families with the same value share one entry (``"; MinAtar, Atari: 0.99"``).
    """
    if not hasattr(config_cls, "defaults_for_family"):
        return {}
    values: dict[str, dict[str, list[str]]] = {}  # field → shown value → family labels
    for family, label in FAMILIES.items():
        for name, value in config_cls.defaults_for_family(family).items():
            if name in defaults and value == defaults[name]:
                continue
            values.setdefault(name, {}).setdefault(shown(value), []).append(label)
    return {
        name: "".join(f"; {', '.join(labels)}: {value}" for value, labels in by_value.items())
        for name, by_value in values.items()
    }


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


_NBSP = "\N{NO-BREAK SPACE}"


class HelpFormatter(argparse.HelpFormatter):
    """One spelling per flag, ``--flag/--no-flag`` for booleans, words never split.

    The width follows the terminal (``COLUMNS``), at most :data:`MAX_WIDTH`; the help column
    starts at 32 (a third of a narrower terminal), so most flags fit on one line with their
    help beside them.
    """

    MAX_WIDTH = 120
    """Widest help, even on a wider terminal (long lines are hard to read)."""

    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 32, width=None
    ) -> None:
        if width is None:
            width = min(shutil.get_terminal_size().columns, self.MAX_WIDTH) - 2
        # On a narrow terminal the help column moves left, leaving the help two thirds.
        super().__init__(prog, indent_increment, min(max_help_position, width // 3), width)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, Toggle):
            return "/".join(action.option_strings)
        if action.option_strings and action.nargs != 0:
            return f"{action.option_strings[0]} {self._format_args(action, action.dest.upper())}"
        return super()._format_action_invocation(action)

    _LABEL = re.compile(rf"\b({'|'.join(['default', *FAMILIES.values()])}): ")

    def _split_lines(self, text: str, width: int) -> list[str]:
        # argparse's textwrap splits at hyphens ("feed-" / "forward") and inside long words;
        # a no-break space (textwrap's whitespace is ASCII) keeps "default: 10" together.
        text = self._whitespace_matcher.sub(" ", text).strip()
        text = self._LABEL.sub(rf"\1:{_NBSP}", text)
        lines = textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False)
        return [line.replace(_NBSP, " ") for line in lines]


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def help_sentence(doc: str) -> str:
    """The first sentence of a field's docstring, without reStructuredText markup.

    ``None`` reads ``none``, as the command line spells it.

    Example:
        >>> help_sentence("Steps per ``[B, T]`` window (see :class:`~a.b.Config`). More.")
        'Steps per [B, T] window (see Config)'
        >>> help_sentence("Clip (Eq. 7; ``None``: off). More.")
        'Clip (Eq. 7; none: off)'
    """

    def target(match: re.Match) -> str:  # :class:`~a.b.C` → C, :mod:`a.b` → a.b
        return match.group(1).rsplit(".", 1)[-1] if "~" in match.group(0) else match.group(1)

    text = _ROLE.sub(target, doc)
    text = text.replace("``", "")
    for abbreviation in ("e.g.", "i.e.", "vs.", "cf.", "et al.", "Eq.", "Fig.", "resp."):
        text = text.replace(abbreviation, abbreviation.replace(".", "\0"))
    first = re.split(r"(?<=[A-Za-z0-9)\]}`'])\.\s", text, maxsplit=1)[0]
    first = re.sub(r"\bNone\b", "none", first)
    return first.rstrip(".").strip().replace("\0", ".")


def add_config_flags(parser: argparse.ArgumentParser, config_cls: type, defaults=None) -> None:
    """One flag per field of ``config_cls``; values absent from the command line are left out.

    The parsed namespace holds only the flags given (``argparse.SUPPRESS``), so a caller can
    layer them over the config's defaults or over a saved config (``--resume``). The help is
    the first sentence of the field's docstring and its default, with the values of the env
    families (``FAMILY_DEFAULTS``) that differ from it beside it. Booleans are
    ``--flag/--no-flag`` (``--flag true|false`` still works); the ``--field_name`` spelling is
    accepted but not shown. ``None`` is shown and typed as ``none``.
    """
    defaults = defaults or {}
    hints = typing.get_type_hints(config_cls)
    docs = field_docs(config_cls)
    fields = [f for f in dataclasses.fields(config_cls) if f.name not in SKIPPED]
    values = {f.name: defaults.get(f.name, f.default) for f in fields}
    family_notes = _family_help(config_cls, values)
    group = parser.add_argument_group(f"{config_cls.__name__} fields")
    for field in fields:
        convert, choices = _converter(hints[field.name])
        dashed = f"--{field.name.replace('_', '-')}"
        spellings = [*ALIASES.get(field.name, ()), dashed, f"--{field.name}"]
        first, hidden = spellings[0], [n for n in dict.fromkeys(spellings) if n != spellings[0]]
        text = help_sentence(docs.get(field.name, "")).replace("%", "%%")
        note = f"{shown(values[field.name])}{family_notes.get(field.name, '')}".replace("%", "%%")
        text = f"{text} (default: {note})"
        common = dict(dest=field.name, default=argparse.SUPPRESS)
        if hints[field.name] is bool:
            negative = f"--no-{first[2:]}"
            group.add_argument(first, negative, action=Toggle, help=text, **common)
            if hidden:
                group.add_argument(*hidden, action=Toggle, help=argparse.SUPPRESS, **common)
            continue
        typed = dict(type=convert, choices=choices, **common)
        metavar = METAVARS.get(field.name, _metavar(hints[field.name]))
        group.add_argument(first, metavar=None if choices else metavar, help=text, **typed)
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
