"""MkDocs hooks (`mkdocs.yml`): the pages generated from the code when the site is built.

- ``<!-- include: FILE -->``: a file of the repository root (the README as the home page, the
  changelog), its links into ``docs/`` made relative to the site;
- ``<!-- cli-reference -->``: every command's ``--help``, from the Typer app;
- ``<!-- study-file-reference -->``: every study-file key, from the study file's schema and the
  knobs' definitions.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = re.compile(r"<!-- include: ([A-Za-z0-9_.-]+) -->")


def on_page_markdown(markdown: str, **_: Any) -> str:
    markdown = INCLUDE.sub(lambda m: _included(m.group(1)), markdown)
    if "<!-- cli-reference -->" in markdown:
        markdown = markdown.replace("<!-- cli-reference -->", cli_reference())
    if "<!-- study-file-reference -->" in markdown:
        markdown = markdown.replace("<!-- study-file-reference -->", study_file_reference())
    return markdown


def _included(name: str) -> str:
    text = (ROOT / name).read_text()
    return text.replace("](docs/", "](")


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path of a click group, depth first, in the group's order."""
    import click

    paths = []
    for name, command in group.commands.items():
        if command.hidden:
            continue
        paths.append((*path, name))
        if isinstance(command, click.Group):
            paths.extend(_commands(command, (*path, name)))
    return paths


def cli_reference() -> str:
    """``budgettune --help`` and every command's, as plain text at 100 columns."""
    import typer.main
    from typer.testing import CliRunner

    from budgettune.cli.app import app

    env = {"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}
    sections = []
    for path in [(), *_commands(typer.main.get_command(app))]:
        result = CliRunner().invoke(app, [*path, "--help"], env=env, prog_name="budgettune")
        if result.exit_code != 0:
            raise RuntimeError(f"budgettune {' '.join(path)} --help: exit {result.exit_code}")
        title = " ".join(("budgettune", *path))
        sections.append(f"## `{title}`\n\n```text\n{result.output.rstrip()}\n```\n")
    return "\n".join(sections)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def study_file_reference() -> str:
    """The top-level keys (type, what they allow, what they do), then each table's keys."""
    from budgettune.study.study_schema import StudyTable
    from budgettune.trial.spec import KNOBS

    schema = StudyTable.model_json_schema()
    rows = ["| key | what | allowed |", "|---|---|---|"]
    for name, field in schema["properties"].items():
        allowed = field.get("allowed") or _type_of(field)
        rows.append(f"| `{name}` | {_cell(field.get('description', ''))} | {_cell(allowed)} |")
    knobs = ["| `[space]` key | `[fix]` key | what |", "|---|---|---|"]
    for knob in KNOBS:
        plural = f"`{knob.plural}`" if knob.plural else "-"
        knobs.append(f"| {plural} | `{knob.name}` | {_cell(knob.help)} |")
    return "\n".join(["## Top level", "", *rows, "", "## `[space]` and `[fix]`", "", *knobs])


def _type_of(field: dict[str, Any]) -> str:
    """A JSON schema's type in a few words (``integer >= 0``, ``string``...)."""
    options = field.get("anyOf", [field])
    words = []
    for option in options:
        kind = option.get("type")
        if kind in (None, "null"):
            continue
        bounds = [
            f"{sign} {option[key]}"
            for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="))
            if key in option
        ]
        words.append(" ".join([kind, *bounds]) if bounds else kind)
    return ", or ".join(words) or "any"
