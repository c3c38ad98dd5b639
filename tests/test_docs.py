"""The documentation a user reads holds: README.md and docs/*.md.

- every ``relaxc ...`` command they show parses with the real CLI parser (``relaxc.cli.build_parser``),
  and every ``relaxc-bench ...`` line of a code block with ``relaxc.benchmarks.bench.build_parser``;
- every relative link points to a file (and heading) of the repository;
- the README stays short, and lists the options all or none;
- docs/api.md documents every name ``relaxc`` exports, every field of ``relaxc.Options`` and
  ``relaxc.TuneOptions`` (and no other) with its CLI flag, and the public members of
  ``relaxc.Artifact`` and ``relaxc.Deployed``; docs/cli.md every flag of each subcommand (and no other);
- no reference to the project's internal history (issue numbers, seed documents).

Read from the files and the code's definitions; nothing is compiled.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import io
import os
import re
import shlex
import sys
from typing import Callable

import pytest

import relaxc
from tests.helpers import ROOT

README = os.path.join(ROOT, "README.md")
API = os.path.join(ROOT, "docs", "api.md")
CLI = os.path.join(ROOT, "docs", "cli.md")
README_MAX_LINES = 220
DOCS = [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))

# what a command line of relaxc starts with, and the arguments that follow
CLI_PREFIXES = (".venv/bin/python -m relaxc ", "python -m relaxc ", ".venv/bin/relaxc ", "relaxc ")
BENCH_PREFIXES = (".venv/bin/relaxc-bench ", "relaxc-bench ")

FENCE = re.compile(r"^(```|~~~)")
INLINE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HISTORY = re.compile(r"\bissues?\s+#?\d+|\bseeds?\s+0\d\d\b|\bseeds/", re.I)
FLAG = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*")
CELL = re.compile(r"(?<!\\)\|")  # a table's cell boundary: a pipe not escaped


def _rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


def _split(text: str) -> tuple[list[tuple[int, str]], str]:
    """The lines inside fenced code blocks (with their line numbers), and the prose with those
    blocks blanked out (so inline code is found only where it is inline)."""
    code, prose, fenced = [], [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            prose.append("")
        elif fenced:
            code.append((number, line))
            prose.append("")
        else:
            prose.append(line)
    return code, "\n".join(prose)


def _joined(code: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Code lines with backslash continuations joined, and a leading shell prompt dropped."""
    joined, pending, start = [], "", 0
    for number, line in code:
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        text = (pending + line).strip()
        pending = ""
        joined.append((start, text[2:] if text.startswith("$ ") else text))
    return joined


def _arguments(snippet: str, prefixes: tuple[str, ...]) -> list[str] | None:
    """The arguments of a command line that starts with one of ``prefixes`` (comments dropped)."""
    for prefix in prefixes:
        if snippet.startswith(prefix):
            return shlex.split(snippet[len(prefix):], comments=True)
    return None


def commands(prefixes: tuple[str, ...], inline: bool = True) -> list[tuple[str, list[str]]]:
    """Every command line of the docs that starts with one of ``prefixes``: from code blocks, and
    (``inline``) from inline code. Each as ("file:line: text", its arguments)."""
    found = []
    for path in DOCS:
        text = open(path, encoding="utf-8").read()
        code, prose = _split(text)
        snippets = _joined(code)
        if inline:
            snippets += [(prose.count("\n", 0, m.start()) + 1, " ".join(m.group(2).split()))
                         for m in INLINE.finditer(prose)]
        for number, snippet in snippets:
            args = _arguments(snippet, prefixes)
            if args is not None:
                found.append((f"{_rel(path)}:{number}: {snippet}", args))
    return found


def parse_error(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """Why ``parser`` rejects ``args`` (argparse's message), or None if it accepts them. ``--help``
    counts as accepted."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            parser.parse_args(args)
    except SystemExit as stop:
        if stop.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {stop.code}"
    return None


def _cli_parser() -> argparse.ArgumentParser:
    from relaxc.cli import build_parser

    return build_parser()


def _bench_parser() -> argparse.ArgumentParser:
    from relaxc.benchmarks.bench import build_parser

    return build_parser()


def _check_commands(found: list[tuple[str, list[str]]], make_parser: Callable[[], argparse.ArgumentParser]):
    parser = make_parser()
    failures = [f"{where}\n    {error}" for where, args in found
                if (error := parse_error(parser, args)) is not None]
    assert not failures, "commands in the docs that the CLI rejects:\n" + "\n".join(failures)


def test_docs_show_relaxc_commands():
    """The extraction finds commands at all (README's set-up and CLI sections have several)."""
    found = commands(CLI_PREFIXES)
    assert sum(where.startswith("README.md") for where, _ in found) >= 5, found


def test_every_relaxc_command_in_the_docs_parses():
    _check_commands(commands(CLI_PREFIXES), _cli_parser)


def test_every_relaxc_bench_command_in_code_blocks_parses():
    _check_commands(commands(BENCH_PREFIXES, inline=False), _bench_parser)


@pytest.mark.parametrize("args", [
    ["compile", "onnx:resnet50", "--no-such-flag"],
    ["run", "onnx:resnet50", "--tuning", "sometimes"],
    ["frobnicate", "onnx:resnet50"],
    ["tune"],
])
def test_the_parse_check_rejects_a_bogus_command(args):
    """The check above can fail: a flag, a choice or a subcommand that does not exist, a missing
    model, are reported with argparse's reason."""
    error = parse_error(_cli_parser(), args)
    assert error is not None and "error" in error


def test_a_rejected_command_fails_naming_it():
    with pytest.raises(AssertionError, match=r"README.md:1: relaxc compile onnx:resnet50 --no-such-flag"):
        _check_commands([("README.md:1: relaxc compile onnx:resnet50 --no-such-flag",
                          ["compile", "onnx:resnet50", "--no-such-flag"])], _cli_parser)


def test_the_extraction_reads_blocks_inline_code_and_continuations(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("Run `relaxc inspect onnx:resnet50\n--memory` or `relaxcfoo`.\n\n```sh\n"
                    "$ relaxc compile onnx:vgg19 \\\n    -o vgg.so   # comment\n"
                    "relaxc-bench onnx:vgg19\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "DOCS", [str(page)])
    assert [args for _, args in commands(CLI_PREFIXES)] == [["compile", "onnx:vgg19", "-o", "vgg.so"],
                                                            ["inspect", "onnx:resnet50", "--memory"]]
    assert [args for _, args in commands(BENCH_PREFIXES, inline=False)] == [["onnx:vgg19"]]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and underscores dropped,
    spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: str) -> set[str]:
    _code, prose = _split(open(path, encoding="utf-8").read())
    seen: dict[str, int] = {}
    result = set()
    for line in prose.splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = _slug(match.group(1))
            result.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return result


def links(path: str) -> list[tuple[str, str]]:
    """The relative links of a page (outside code), as ("file:line", target)."""
    _code, prose = _split(open(path, encoding="utf-8").read())
    return [(f"{_rel(path)}:{prose.count(chr(10), 0, m.start()) + 1}", m.group(1))
            for m in LINK.finditer(INLINE.sub(lambda c: " " * len(c.group(0)), prose))
            if not re.match(r"[a-z][a-z0-9+.-]*:", m.group(1), re.I)]  # http:, mailto: ...


def broken_links(path: str, root: str = ROOT) -> list[str]:
    broken = []
    for where, target in links(path):
        file, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if os.path.relpath(resolved, root).startswith(".."):
            broken.append(f"{where}: {target} is outside the repository")
        elif not os.path.exists(resolved):
            broken.append(f"{where}: {target} does not exist")
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            broken.append(f"{where}: {target}: no heading #{anchor} in {_rel(resolved)}")
    return broken


@pytest.mark.parametrize("path", DOCS, ids=_rel)
def test_relative_links_point_into_the_repository(path):
    assert broken_links(path) == []


def test_the_link_check_reports_a_missing_file_and_heading(tmp_path):
    (tmp_path / "other.md").write_text("# A heading\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-heading) [gone](missing.md) [bad](other.md#nope) "
                    "[web](https://example.org) `[code](nowhere.md)`\n")
    found = broken_links(str(page), root=str(tmp_path))
    assert len(found) == 2 and "missing.md does not exist" in found[0] and "no heading #nope" in found[1]


def test_readme_is_short():
    with open(README, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; details belong in docs/"


@pytest.mark.parametrize("path", DOCS, ids=_rel)
def test_no_references_to_internal_history(path):
    """Issue numbers and the seed documents live outside the repository: the docs say what is true
    now, and docs/design.md holds the ideas the seeds contributed."""
    found = [f"{_rel(path)}:{number}: {line.strip()}"
             for number, line in enumerate(open(path, encoding="utf-8"), 1) if HISTORY.search(line)]
    assert found == []


def test_the_history_check_matches_what_it_must():
    assert HISTORY.search("as seed 000 asks") and HISTORY.search("(issue 15)") and HISTORY.search("seeds/")
    assert not HISTORY.search("--seed 0") and not HISTORY.search("seed 100000") and not HISTORY.search("tissue 3")


# --- the reference pages against the code ---------------------------------------------------------

def sections(path: str) -> dict[str, str]:
    """A page's prose by its ``## `` heading (backticks dropped; "" for what precedes the first),
    each with its ``###`` subsections."""
    _code, prose = _split(open(path, encoding="utf-8").read())
    found, heading = {"": []}, ""
    for line in prose.splitlines():
        if line.startswith("## "):
            heading = line[3:].replace("`", "").strip()
            found[heading] = []
        else:
            found[heading].append(line)
    return {heading: "\n".join(lines) for heading, lines in found.items()}


def table_rows(text: str) -> list[list[str]]:
    """The cells of every table row of ``text``, each table's header and separator rows left out."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.lstrip().startswith("|"):
            current.append([cell.strip() for cell in CELL.split(line.strip().strip("|"))])
        elif current:
            tables.append(current[2:])
            current = []
    return [row for table in tables for row in table]


def code_spans(text: str) -> list[str]:
    """The inline code of ``text``, in order."""
    return [" ".join(m.group(2).split()) for m in INLINE.finditer(text)]


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = _cli_parser()
    (choices,) = [a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(choices)


def _flags(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Each option's flags by its ``dest`` (``--help`` left out)."""
    return {a.dest: a.option_strings for a in parser._actions if a.option_strings and a.dest != "help"}


@pytest.mark.parametrize("name", relaxc.__all__)
def test_each_name_relaxc_exports_imports_from_it_and_api_md_documents_it(name):
    namespace: dict = {}
    exec(f"from relaxc import {name}", namespace)
    assert namespace[name] is getattr(relaxc, name)
    assert re.search(rf"`relaxc\.{name}\b", open(API, encoding="utf-8").read()), f"docs/api.md never names relaxc.{name}"


@pytest.mark.parametrize("name, command", [("Options", "compile"), ("TuneOptions", "tune")])
def test_api_md_documents_every_option_and_no_other_with_its_flag(name, command):
    """The table of ``relaxc.Options`` (``relaxc.TuneOptions``): a row per field, first cell its
    name, second the flag the CLI makes of it."""
    rows = {code_spans(row[0])[0]: row for row in table_rows(sections(API)[f"relaxc.{name}"])}
    assert set(rows) == {field.name for field in dataclasses.fields(getattr(relaxc, name))}
    flags = _flags(_subcommands()[command])
    wrong = {field: row[1] for field, row in rows.items() if code_spans(row[1])[:1] != flags[field][-1:]}
    assert wrong == {}, f"CLI flags in docs/api.md that are not the option's: {wrong}"


@pytest.mark.parametrize("name", ["Artifact", "Deployed"])
def test_api_md_lists_every_public_method_and_property_of_the_runners(name):
    documented = {re.match(r"\w+", span).group(0) for row in table_rows(sections(API)[f"relaxc.{name}"])
                  for span in code_spans(row[0])}
    public = {member for member in dir(getattr(relaxc, name)) if not member.startswith("_")}
    assert public - documented == set()


def test_cli_md_documents_every_flag_of_each_subcommand():
    """Where each subcommand's flags are told: the page's opening, the model and compile options
    every subcommand but ``cache`` takes, and the subcommand's own section."""
    pages = sections(CLI)
    shared = " ".join(code_spans(pages[""] + pages["Model and compile options"]))
    missing = {}
    for command, parser in _subcommands().items():
        told = set(FLAG.findall(shared + " " + " ".join(code_spans(pages[command]))))
        missing[command] = sorted({flag for flags in _flags(parser).values() for flag in flags} - told)
    assert missing == dict.fromkeys(_subcommands(), [])


def test_cli_md_tables_name_no_flag_the_subcommand_lacks():
    """The model and compile options' table against ``compile``, each subcommand's own against it."""
    pages, commands = sections(CLI), _subcommands()
    tables = {"compile": pages["Model and compile options"]} | {command: pages[command] for command in commands}
    extra = {}
    for command, text in tables.items():
        offered = {flag for flags in _flags(commands[command]).values() for flag in flags}
        extra[command] = sorted({flag for row in table_rows(text) for span in code_spans(row[0])
                                 for flag in FLAG.findall(span)} - offered)
    assert extra == dict.fromkeys(tables, [])


def partial_option_lists(text: str, names: set[str], least: int = 3) -> list[str]:
    """The paragraphs of ``text`` that name ``least`` or more of ``names`` in inline code (a name
    alone, ``name=...`` or a flag with its argument) but not all of them."""
    found = []
    for paragraph in _split(text)[1].split("\n\n"):
        named = {span.split("=")[0].split()[0] for span in code_spans(paragraph) if span} & names
        if least <= len(named) < len(names):
            found.append(f"names {len(named)} of {len(names)}: {' '.join(paragraph.split())[:120]}")
    return found


def test_readme_names_the_options_and_flags_all_or_none():
    """A partial list goes stale as options come: the README points to docs/api.md and docs/cli.md."""
    text, found = open(README, encoding="utf-8").read(), []
    for options, command in ((relaxc.Options, "compile"), (relaxc.TuneOptions, "tune")):
        fields = {field.name for field in dataclasses.fields(options)}
        flags = {flag for field, flags in _flags(_subcommands()[command]).items() if field in fields for flag in flags}
        found += partial_option_lists(text, fields) + partial_option_lists(text, flags)
    assert found == []


def test_the_option_list_check_finds_a_partial_list():
    text = "Options: `a`, `b=1` and\n`--c X`.\n\nAll: `a` `b` `--c` `d`.\n\n```\n`a` `b` `--c`\n```\n"
    assert partial_option_lists(text, {"a", "b", "--c", "d"}) == ["names 3 of 4: Options: `a`, `b=1` and `--c X`."]
