"""Loading and rendering the jinja2 prompt templates.

Built-in prompts live in `prompts/*.j2` (shipped in the wheel as `opto/_prompts`). A
prompt is a system template plus a user template; each component that sends a prompt
takes a `template` argument that replaces them. Data (dataset text, model output) is
always passed as template variables, never compiled as a template.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from ..errors import MissingFileError, OptoValueError

__all__ = ["PromptTemplate", "render_json"]


def render_json(value: Any, indent: int | None = 2) -> str:
    """Values are shown to models as JSON (never Python repr), unescaped for HTML."""
    if not isinstance(value, (dict, list, tuple)):
        indent = None  # the same text, from the C encoder (an indent makes json use Python's)
    return json.dumps(value, ensure_ascii=False, indent=indent, default=str)


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=False,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["json"] = render_json
    return env


def _builtin_dir() -> Path:
    shipped = resources.files("opto") / "_prompts"
    if shipped.is_dir():
        return Path(str(shipped))
    # An editable install or a source checkout: the repository's prompts/ folder.
    return Path(__file__).resolve().parents[2] / "prompts"


def _read_source(source: str | Path) -> str:
    """A Path, or a str naming an existing file, is read; any other str is template text."""
    if isinstance(source, Path):
        return source.read_text(encoding="utf-8")
    if "\n" not in source and len(source) < 4096 and Path(source).is_file():
        return Path(source).read_text(encoding="utf-8")
    return source


class PromptTemplate:
    """A system and a user jinja2 template that render to chat messages.

    Args:
        user: the user message template: template text, or a path to a file.
        system: the system message template (text or path); None sends no system message.
    """

    def __init__(self, user: str | Path, system: str | Path | None = None) -> None:
        env = _environment()
        try:
            self._user = env.from_string(_read_source(user))
            self._system = env.from_string(_read_source(system)) if system is not None else None
        except jinja2.TemplateSyntaxError as exc:
            raise OptoValueError(f"prompt template has a syntax error at line {exc.lineno}: {exc.message}") from exc

    @classmethod
    def builtin(cls, name: str) -> PromptTemplate:
        """Load `prompts/<name>.system.j2` and `prompts/<name>.user.j2`."""
        folder = _builtin_dir()
        user = folder / f"{name}.user.j2"
        if not user.is_file():
            raise MissingFileError(f"no built-in prompt named {name!r} in {folder}")
        system = folder / f"{name}.system.j2"
        return cls(user, system if system.is_file() else None)

    @classmethod
    def resolve(cls, template: PromptTemplate | str | Path | None, builtin: str) -> PromptTemplate:
        """The user's template when given (a str or path replaces the user part only)."""
        if template is None:
            return cls.builtin(builtin)
        if isinstance(template, PromptTemplate):
            return template
        default = cls.builtin(builtin)
        replaced = cls(template)
        replaced._system = default._system
        return replaced

    def render_system(self, **context: Any) -> str | None:
        return self._render(self._system, context) if self._system is not None else None

    def render_user(self, **context: Any) -> str:
        return self._render(self._user, context)

    def render(self, **context: Any) -> list[dict[str, str]]:
        """Chat messages: the system message (if any) and the user message."""
        messages = []
        system = self.render_system(**context)
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": self.render_user(**context)})
        return messages

    @staticmethod
    def _render(template: jinja2.Template, context: dict[str, Any]) -> str:
        try:
            return template.render(**context).strip()
        except jinja2.UndefinedError as exc:
            raise OptoValueError(f"prompt template uses a variable that was not given: {exc.message}") from exc
