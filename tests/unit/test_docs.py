"""The README and docs/ name only what exists.

For README.md and every page under docs/:

* every relative link points to a file or directory that exists, and an anchor to a heading
  of the target page;
* every ``make TARGET`` in code is a target of the Makefile;
* every ``agentrun ...`` and ``kubectl agentrun ...`` command in code names subcommands and
  ``--options`` that the parsers define (``agentrun.cli.build_parser()`` with its
  ``devcluster`` extension, and ``agentrun.clients.plugin.commands.build_parser()``);
* every repository path in code (``examples/foo.yaml``, ``hack/x.sh``, ``charts/...``) exists;
* every Python name in code (``agentrun.loop.reconciler.CHECKPOINTS``) can be imported, or is a
  span or attribute name that ``agentrun.telemetry.tracing`` emits (``agentrun.step_attempt``),
  or the name of one of the operator's loggers (``agentrun.reconciler``).

"In code" means inline code spans and fenced code blocks. Failures name the page, the line
and what is missing.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentrun import cli as agentrun_cli
from agentrun.clients.plugin import commands as plugin_commands

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
MAKE = re.compile(r"(?:^|[\s;&|(])make\s+([A-Za-z0-9_.-]+)")
PYTHON_NAME = re.compile(r"(?<![\w./-])agentrun(?:_devcluster)?(?:\.[A-Za-z_]\w*)+")
SEGMENT_BREAK = re.compile(r"&&|\|\||;|\s\|\s|\$\(")
PLACEHOLDER = re.compile(r"^(\.\.\.|[A-Z][A-Z0-9_-]*|[\[<{].*)$")
TOP_LEVEL_FILES = ("Makefile", "Dockerfile", "pyproject.toml", "uv.lock", "README.md")


@dataclass(frozen=True)
class Code:
    """A piece of code on one line of a page: an inline span or a line of a fenced block."""

    line: int
    text: str
    block: bool


@dataclass(frozen=True)
class Page:
    path: Path
    code: tuple[Code, ...]
    prose: tuple[tuple[int, str], ...]
    """Lines outside fenced blocks, with their code spans blanked out."""
    headings: tuple[str, ...]
    """The text of every heading, as written."""

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT))

    def at(self, line: int) -> str:
        return f"{self.name}:{line}"


def parse(path: Path, text: str | None = None) -> Page:
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    code: list[Code] = []
    prose: list[tuple[int, str]] = []
    headings: list[str] = []
    in_block = False
    for number, line in enumerate(lines, start=1):
        if FENCE.match(line):
            in_block = not in_block
            continue
        if in_block:
            code.append(Code(number, line, block=True))
            continue
        code += [Code(number, m.group(1), block=False) for m in CODE_SPAN.finditer(line)]
        prose.append((number, CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)))
        heading = HEADING.match(line)
        if heading:
            headings.append(heading.group(2))
    return Page(path, tuple(code), tuple(prose), tuple(headings))


def without_comment(text: str) -> str:
    """A shell line without its trailing ``# comment``."""
    return re.sub(r"(^|\s)#.*$", "", text)


# -- links ----------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Page) -> set[str]:
    """The anchors of a page's headings (a repeated heading gets -1, -2, ...)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in page.headings:
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def link_problems(page: Page) -> Iterator[str]:
    for number, line in page.prose:
        for match in LINK.finditer(line):
            target = match.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            if not file_part:
                target_page = page
            else:
                resolved = (page.path.parent / file_part).resolve()
                shown = resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved
                if not resolved.exists():
                    yield f"{page.at(number)}: link ({target}) points to {shown}: no such file"
                    continue
                if not anchor or resolved.suffix != ".md":
                    continue
                target_page = parse(resolved)
            if anchor and anchor not in anchors(target_page):
                yield (
                    f"{page.at(number)}: link ({target}): {target_page.name} has no heading with "
                    f"anchor #{anchor} (it has: {', '.join(sorted(anchors(target_page)))})"
                )


# -- make targets ---------------------------------------------------------------------------


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.MULTILINE)) - {".PHONY"}


def make_mentions(page: Page) -> Iterator[tuple[int, str]]:
    for code in page.code:
        for match in MAKE.finditer(without_comment(code.text) if code.block else code.text):
            if not match.group(1).startswith("-"):
                yield code.line, match.group(1)


def make_problems(page: Page) -> Iterator[str]:
    targets = makefile_targets()
    for line, target in make_mentions(page):
        if target not in targets:
            yield (
                f"{page.at(line)}: `make {target}`: the Makefile has no target {target!r} "
                f"(its targets: {', '.join(sorted(targets))})"
            )


# -- agentrun and kubectl agentrun commands -------------------------------------------------


def agentrun_parser() -> argparse.ArgumentParser:
    return agentrun_cli.build_parser()


def plugin_parser() -> argparse.ArgumentParser:
    return plugin_commands.build_parser()


PROGRAMS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "agentrun": agentrun_parser,
    "kubectl agentrun": plugin_parser,
}


def command_mentions(page: Page) -> Iterator[tuple[int, str, list[str]]]:
    """(line, program, arguments) of every command line in code that runs a program of ours."""
    for code in page.code:
        text = without_comment(code.text) if code.block else code.text
        for segment in SEGMENT_BREAK.split(text):
            tokens = segment.split()
            while tokens and (tokens[0] == "$" or re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0])):
                tokens = tokens[1:]
            if tokens[:2] == ["uv", "run"]:
                tokens = tokens[2:]
                while tokens and tokens[0].startswith("--"):
                    tokens = tokens[1:]
            if not tokens:
                continue
            if tokens[:2] == ["kubectl", "agentrun"]:
                yield code.line, "kubectl agentrun", tokens[2:]
            elif tokens[0] == "kubectl-agentrun":
                yield code.line, "kubectl agentrun", tokens[1:]
            elif tokens[0] == "agentrun" or tokens[0].endswith("/agentrun"):
                yield code.line, "agentrun", tokens[1:]


def _subparsers(
    parser: argparse.ArgumentParser,
) -> argparse._SubParsersAction[argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _takes_value(parser: argparse.ArgumentParser, option: str) -> bool:
    for action in parser._actions:
        if option in action.option_strings:
            return action.nargs != 0
    return False


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


def normalize(token: str) -> str:
    """A command-line token without the brackets and ellipses of a usage line."""
    token = token.lstrip("[").rstrip(",)")
    return token.removesuffix("...").rstrip("]")


def command_problems(page: Page) -> Iterator[str]:
    for line, program, args in command_mentions(page):
        parser = PROGRAMS[program]()
        path = [program]
        tokens = [normalize(t) for t in args]
        i = 0
        while i < len(tokens):
            token = tokens[i]
            if token == "--":
                break
            if token.startswith("-"):
                option = token.split("=", 1)[0]
                if option not in _options(parser):
                    yield (
                        f"{page.at(line)}: `{' '.join(path)}` has no option {option} "
                        f"(it has: {', '.join(sorted(_options(parser)))})"
                    )
                elif "=" not in token and _takes_value(parser, option):
                    i += 1
                i += 1
                continue
            sub = _subparsers(parser)
            if sub is None or PLACEHOLDER.match(token) or not token:
                i += 1
                continue
            choices = token.split("|")
            unknown = [c for c in choices if c not in sub.choices]
            if unknown:
                yield (
                    f"{page.at(line)}: `{' '.join([*path, token])}`: {', '.join(unknown)} is not "
                    f"a subcommand of `{' '.join(path)}` (it has: {', '.join(sub.choices)})"
                )
                break
            if len(choices) > 1:
                break
            parser = sub.choices[token]
            path.append(token)
            i += 1


# -- repository paths -----------------------------------------------------------------------


def top_level_dirs() -> set[str]:
    return {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")} | {".ci"}


def path_mentions(page: Page) -> Iterator[tuple[int, str]]:
    tops = top_level_dirs()
    for code in page.code:
        for raw in re.split(r"[\s,;()\[\]\"'=`]+", code.text):
            token = raw.split("::", 1)[0].rstrip(".:")
            if not token or any(c in token for c in "<>*{}$~") or "..." in token:
                continue
            head = token.split("/", 1)[0]
            if ("/" in token and head in tops) or token in TOP_LEVEL_FILES:
                yield code.line, token


def path_problems(page: Page) -> Iterator[str]:
    for line, token in path_mentions(page):
        if not (ROOT / token).exists():
            yield f"{page.at(line)}: `{token}` does not exist in the repository"


# -- Python names ---------------------------------------------------------------------------


def python_mentions(page: Page) -> Iterator[tuple[int, str]]:
    for code in page.code:
        for match in PYTHON_NAME.finditer(code.text):
            name = match.group(0)
            if name.split(".")[1] == "dev":  # the API group agentrun.dev
                continue
            if code.text[: match.start()].rstrip().endswith("explain"):  # kubectl explain
                continue
            yield code.line, name


def resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def trace_names() -> set[str]:
    """Span and attribute names agentrun.telemetry.tracing emits (``agentrun.step_attempt``,
    ``agentrun.tokens``): the string constants of its source that look like Python names."""
    source = (ROOT / "operator" / "agentrun" / "telemetry" / "tracing.py").read_text()
    return {
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and PYTHON_NAME.fullmatch(node.value)
    }


def logger_names() -> set[str]:
    """The names of the operator's loggers (``agentrun.reconciler``), as its JSON log lines
    show them: the string arguments of ``logging.getLogger`` in its source."""
    return {
        node.args[0].value
        for path in (ROOT / "operator" / "agentrun").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and ast.unparse(node.func) == "logging.getLogger"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    }


def python_problems(page: Page) -> Iterator[str]:
    known = trace_names() | logger_names()
    for line, name in python_mentions(page):
        if not resolves(name) and name not in known:
            yield (
                f"{page.at(line)}: `{name}` cannot be imported (nor is it a span, an attribute "
                "or a logger)"
            )


# -- the tests ------------------------------------------------------------------------------

CHECKS: dict[str, Callable[[Page], Iterator[str]]] = {
    "links": link_problems,
    "make targets": make_problems,
    "commands": command_problems,
    "paths": path_problems,
    "python names": python_problems,
}


@pytest.mark.parametrize("check", CHECKS, ids=str)
@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_only_what_exists(doc: Path, check: str) -> None:
    problems = list(CHECKS[check](parse(doc)))
    assert not problems, f"{len(problems)} stale {check} in {doc.relative_to(ROOT)}:\n" + (
        "\n".join(problems)
    )


def test_the_docs_exist_and_the_checks_see_what_they_check() -> None:
    """Guards against a parser that silently matches nothing."""
    pages = [parse(doc) for doc in DOCS]
    assert len(DOCS) >= 8, [str(d) for d in DOCS]
    links = sum(len(LINK.findall(line)) for page in pages for _, line in page.prose)
    counts = {
        "links": links,
        "make targets": sum(len(list(make_mentions(p))) for p in pages),
        "agentrun commands": sum(
            1 for p in pages for _, prog, _ in command_mentions(p) if prog == "agentrun"
        ),
        "kubectl agentrun commands": sum(
            1 for p in pages for _, prog, _ in command_mentions(p) if prog == "kubectl agentrun"
        ),
        "paths": sum(len(list(path_mentions(p))) for p in pages),
        "python names": sum(len(list(python_mentions(p))) for p in pages),
    }
    assert all(n >= 5 for n in counts.values()), counts


FAKE = """\
# A page

## Some `code` here

See [the API](api.md), [nothing](missing.md), [a heading](#some-code-here),
[no heading](#nowhere) and [the API's status](api.md#no-such-section).

Run `make unit` and `make no-such-target`, `agentrun devcluster up --state-dir DIR`,
`agentrun devcluster down`, `agentrun run --no-such-flag`, and

```
$ kubectl agentrun -n demo approve RUN STEP --reason R
kubectl agentrun approve|frobnicate RUN STEP   # make it so
uv run agentrun crd -o crds/agentrun.dev_agentruns.yaml
```

Files: `examples/approval-gate.yaml`, `examples/no-such-example.yaml`, `hack/nothing.sh`.
Names: `agentrun.loop.ledger.Ledger`, `agentrun.loop.ledger.NO_SUCH_NAME`, `agentrun.dev/run`.
"""


def test_the_checks_report_what_is_missing_with_page_and_line() -> None:
    page = parse(ROOT / "docs" / "fake.md", FAKE)
    problems = [p for check in CHECKS.values() for p in check(page)]
    expected = [
        ("docs/fake.md:5:", "missing.md"),
        ("docs/fake.md:6:", "#nowhere"),
        ("docs/fake.md:6:", "#no-such-section"),
        ("docs/fake.md:8:", "no target 'no-such-target'"),
        ("docs/fake.md:9:", "down is not a subcommand of `agentrun devcluster`"),
        ("docs/fake.md:9:", "`agentrun run` has no option --no-such-flag"),
        ("docs/fake.md:13:", "frobnicate is not a subcommand of `kubectl agentrun`"),
        ("docs/fake.md:17:", "`examples/no-such-example.yaml` does not exist"),
        ("docs/fake.md:17:", "`hack/nothing.sh` does not exist"),
        ("docs/fake.md:18:", "`agentrun.loop.ledger.NO_SUCH_NAME` cannot be imported"),
    ]
    for where, what in expected:
        assert any(p.startswith(where) and what in p for p in problems), (where, what, problems)
    assert len(problems) == len(expected), "\n".join(problems)


# -- the front page and the index -----------------------------------------------------------

README_LINE_LIMIT = 300
"""The longest line README.md may have (a front page read in a browser and in a terminal)."""


def linked_pages(page: Page) -> set[Path]:
    """The files a page's relative links point to (anchors dropped)."""
    found: set[Path] = set()
    for _, line in page.prose:
        for match in LINK.finditer(line):
            target = match.group(1).partition("#")[0]
            if target and not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                found.add((page.path.parent / target).resolve())
    return found


@pytest.mark.parametrize("index", ["README.md", "docs/README.md"])
def test_the_front_page_and_the_index_link_every_page_of_docs(index: str) -> None:
    page = parse(ROOT / index)
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
    missing = sorted(str(p.relative_to(ROOT)) for p in pages - linked_pages(page))
    assert not missing, f"{index} does not link {', '.join(missing)}"


def test_no_line_of_the_front_page_is_over_the_limit() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    long = [
        (n, len(line)) for n, line in enumerate(lines, start=1) if len(line) > README_LINE_LIMIT
    ]
    assert not long, ", ".join(
        f"README.md:{n} has {width} characters (at most {README_LINE_LIMIT})" for n, width in long
    )


def test_the_index_check_sees_a_page_left_out() -> None:
    page = parse(
        ROOT / "docs" / "README.md", "- [API](api.md)\n- [Design](design.md#trust-model)\n"
    )
    assert linked_pages(page) == {ROOT / "docs" / "api.md", ROOT / "docs" / "design.md"}
