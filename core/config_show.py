"""What ``bergstream config show`` prints: a loaded config as the programs see it, every default
filled in, ``${VAR}`` substituted, each plugin's settings (``{type, config}`` choices and the
sections plugins define) as that plugin validated them, and every secret masked.

A value is masked when pydantic holds it as a secret (``SecretStr``), when its key names a secret
(password, secret, token, JAAS line, private key, credentials), and where a URL carries a password
(``scheme://user:password@host``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, SecretBytes, SecretStr

from bergstream.core.choices import PluginChoice

if TYPE_CHECKING:
    from bergstream.core.config import BergstreamConfig

__all__ = ["MASK", "mask_secrets", "resolved_config"]

MASK = "**********"
_SECRET_KEY = re.compile(r"(?i)password|secret|token|jaas|private[._-]?key|credential")
#: Keys naming a secret's file, lifetime or place rather than the secret itself.
_NOT_A_SECRET = ("_file", "_path", "_dir", "_seconds", "_ttl", "_url", "_endpoint", ".location")
_URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)[^@\s]+@")


def resolved_config(config: BergstreamConfig) -> dict[str, Any]:
    """``config`` as plain data (what YAML or JSON can print), secrets masked."""
    tree = _dump(config)
    for dotted, settings in config.sections.items():
        *parents, key = dotted.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[key] = _dump(settings)
    return mask_secrets(tree)


def _dump(value: Any) -> Any:
    if isinstance(value, PluginChoice):
        settings = value.settings
        return {"type": value.type, "config": _dump(settings) if settings else value.config}
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        # Keys as the file spells them (the Kafka settings' librdkafka names are aliases).
        out = {
            field.serialization_alias or field.alias or name: _dump(getattr(value, name))
            for name, field in fields.items()
            if not field.exclude
        }
        out.update({k: _dump(v) for k, v in (value.model_extra or {}).items()})
        return out
    if isinstance(value, SecretStr | SecretBytes):
        return MASK
    if isinstance(value, dict):
        return {str(k): _dump(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_dump(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)  # paths, enums


def mask_secrets(value: Any, key: str = "") -> Any:
    """``value`` with every secret replaced by :data:`MASK` (see the module's rules)."""
    if isinstance(value, dict):
        return {k: mask_secrets(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_secrets(v, key) for v in value]
    if isinstance(value, str):
        if value and _SECRET_KEY.search(key) and not key.lower().endswith(_NOT_A_SECRET):
            return MASK
        return _URL_PASSWORD.sub(rf"\g<1>{MASK}@", value)
    return value
