"""Settings files: a YAML or JSON mapping, YAML read strictly (plain scalars as in YAML 1.2's
core schema, and stricter still), so that a number is never a guess."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .numbers import DECIMAL, WHOLE

__all__ = ["load_mapping"]


def load_mapping(path: Path) -> dict[str, Any]:
    """The mapping a .yaml, .yml or .json settings file holds; ValueError naming the file."""
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise ValueError(f"{path}: settings file must end in .yaml, .yml or .json")
    import yaml  # only needed for settings files

    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if suffix == ".json" else yaml.load(text, _strict_yaml_loader())
    except (UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as error:
        raise ValueError(
            f"{path}: not a valid {suffix[1:].upper()} settings file: {error}"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: settings file must hold a mapping, got {type(data).__name__}")
    odd_keys = [key for key in data if not isinstance(key, str)]
    if odd_keys:
        raise ValueError(f"{path}: settings keys must be field names, got {odd_keys[0]!r}")
    return data


_YAML_LOADER: Any = None


def _strict_yaml_loader() -> Any:
    """A SafeLoader whose plain scalars are true/false, null, decimal integers and decimal
    floats only: yes/no/on/off, 010, 0o10, 0x10, 1_000, 1:30 and dates stay strings (which a
    number field then refuses, naming the field), instead of YAML 1.1's guesses."""
    global _YAML_LOADER
    if _YAML_LOADER is not None:
        return _YAML_LOADER
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    guessed = {f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float", "timestamp", "value")}
    StrictLoader.yaml_implicit_resolvers = {
        first: [(tag, regex) for tag, regex in resolvers if tag not in guessed]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    StrictLoader.add_implicit_resolver(
        "tag:yaml.org,2002:bool",
        re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
        list("tTfF"),
    )
    StrictLoader.add_implicit_resolver(
        "tag:yaml.org,2002:int", re.compile(rf"^{WHOLE.pattern}$"), list("-+0123456789")
    )
    StrictLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(rf"^(?:{DECIMAL.pattern}|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+0123456789."),
    )

    def decimal_int(loader: Any, node: Any) -> int:
        text = loader.construct_scalar(node)
        if not WHOLE.fullmatch(text):
            raise yaml.constructor.ConstructorError(
                None, None, f"{text!r} is not a decimal integer", node.start_mark
            )
        return int(text)

    StrictLoader.add_constructor("tag:yaml.org,2002:int", decimal_int)
    _YAML_LOADER = StrictLoader
    return StrictLoader
