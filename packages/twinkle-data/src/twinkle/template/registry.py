"""The template registry, so components can take a template by name: ``set_template(
'Qwen3_5Template', model_id=..., max_length=512)``."""

from __future__ import annotations

from typing import Any

from twinkle.template.base import Template
from twinkle.template.families import BUILT_IN_TEMPLATES
from twinkle.template.qwen import Qwen3_5Template
from twinkle.utils import Registry

TEMPLATES: Registry[type[Template]] = Registry("template", base=Template)
"""Templates by name; register your own with ``@TEMPLATES.register``."""

TEMPLATES.register(Template)
TEMPLATES.register(Qwen3_5Template)
for _template in BUILT_IN_TEMPLATES:
    TEMPLATES.register(_template)


def build_template(template: str | type[Template] | Template, **kwargs: Any) -> Template:
    """A Template from a registered name or a class built with ``kwargs`` (``model_id``
    and the Template arguments), or an instance returned as is.

    An unknown name raises a ValueError listing the known ones. Settings go with a name
    or class; an instance already has its own, so kwargs with one are a TypeError.
    """
    if isinstance(template, Template):
        if kwargs:
            raise TypeError(
                f"build_template got a {type(template).__name__} instance and settings "
                f"({', '.join(kwargs)}); pass the settings when building it, or pass its name"
            )
        return template
    cls = TEMPLATES.get(template)
    if "model_id" not in kwargs:
        raise TypeError(
            f"building {cls.__name__} needs model_id=... (the model whose tokenizer and chat "
            "template it uses)"
        )
    return cls(**kwargs)
