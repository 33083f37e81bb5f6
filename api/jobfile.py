"""Reading a job file safely: bytes -> YAML documents, before any model sees them.

Every reader of a job file (``asyncrl validate``, ``asyncrl run``, ``asyncrl driver --spec``) goes
through :func:`read_documents`. It refuses, each as one :class:`~asyncrl.api.validation.SpecProblem`
naming the document and the line, with the fix:

- a missing file, a directory, an unreadable file, a file over :data:`MAX_FILE_BYTES` (checked from the
  file's size before a byte is parsed), bytes that are not UTF-8;
- a document whose aliases expand beyond :data:`MAX_NODES` nodes ("billion laughs": the budget is
  counted while composing, an alias adds the size of what it names, so a 700-byte bomb stops after a
  few thousand nodes instead of building 10^9 of them), and an alias used inside its own anchor;
- nesting deeper than :data:`MAX_DEPTH` (the composer is recursive: no ``RecursionError``);
- a mapping key given twice (YAML keeps the last one silently), naming both lines;
- YAML syntax errors (the rest of that file cannot be read) and tags no safe loader constructs.

A problem of one document does not hide the others': composition stops at a refused document, skips to
its end and goes on with the next one.
"""

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer, ComposerError
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, DocumentEndEvent, MappingEndEvent, SequenceEndEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

try:  # libyaml's event parser (C) when present: 4x faster; composition stays in Python, bounded below
    from yaml._yaml import CParser as _Parser

    _C_PARSER = True
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml.parser import Parser as _Parser  # type: ignore[assignment]

    _C_PARSER = False

MAX_FILE_BYTES = 1 << 20  # 1 MiB: a job is a few KiB; the API server's own limit on an object is ~1.5 MB
MAX_NODES = 20_000  # YAML nodes per document once aliases are expanded; a job has a few hundred
MAX_DEPTH = 64  # nesting levels; the deepest job field (an affinity term) is about 12 levels down


@dataclass(frozen=True)
class FileProblem:
    """One problem of a job file: ``document`` is 1-based (None: the whole file), ``path`` like ``spec.train``."""

    path: str
    message: str
    document: int | None = None


@dataclass
class Documents:
    """What :func:`read_documents` found: the parsed documents (1-based index, value) and the problems."""

    source: str
    documents: list[tuple[int, Any]] = field(default_factory=list)
    problems: list[FileProblem] = field(default_factory=list)
    count: int = 0  # documents seen, refused ones included
    duplicated: set[int] = field(default_factory=set)  # documents with a key given twice: validated, never run


class _Refused(Exception):
    """A document the composer stops on (budget, depth, recursion): skipped to its end, reported."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path, self.message = path, message


def _line(node_or_mark: Any) -> int:
    mark = getattr(node_or_mark, "start_mark", node_or_mark)
    return int(mark.line) + 1


def _dotted(parts: list[str | int]) -> str:
    out = ""
    for part in parts:
        part = part if isinstance(part, int) or part.isprintable() else repr(part)  # one line, always
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


class _BoundedLoader(Composer, SafeConstructor, Resolver, _Parser):  # type: ignore[misc, valid-type]
    """PyYAML's safe loader with a composer that counts, limits depth and refuses duplicate keys.

    The composer is PyYAML's own (``yaml/composer.py``) with three hooks; everything else (resolution
    of scalars, construction) is the stock safe loader's.
    """

    def __init__(self, text: str) -> None:
        _Parser.__init__(self, text)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        Composer.__init__(self)
        self.duplicates: list[tuple[str, str]] = []
        self._reset_document()

    def _reset_document(self) -> None:
        self._nodes = 0  # nodes of this document so far, aliases expanded
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> its expanded size, for aliases to it
        self._open: set[int] = set()  # nodes being composed (an alias to one is recursive)
        self._keys: list[str | int] = []  # where the composer is, for messages

    def _count(self, n: int, line: int) -> None:
        self._nodes += n
        if self._nodes > MAX_NODES:
            raise _Refused(
                _dotted(self._keys),
                f"the document expands to more than {MAX_NODES} YAML nodes (at line {line}; aliases count as "
                f"many nodes as what they name); a job needs a few hundred: write repeated parts out once "
                f"instead of nesting aliases (*name), or split the file",
            )

    def compose_document(self) -> Node | None:
        self._reset_document()
        return super().compose_document()  # type: ignore[no-any-return]

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):
            event: Any = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None:
                if id(target) in self._open:
                    raise _Refused(
                        _dotted(self._keys),
                        f"alias *{event.anchor} at line {_line(event)} is used inside its own anchor "
                        f"&{event.anchor} (a recursive structure); write the value out",
                    )
                self._count(self._sizes.get(id(target), 1), _line(event))
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(_dotted(self._keys), _depth_message(f" at line {_line(self.peek_event())}"))
        before = self._nodes
        self._count(1, _line(self.peek_event()))
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._sizes[id(node)] = self._nodes - before
        return node  # type: ignore[no-any-return]

    # The two collection composers below are PyYAML's with the path, the open set and the duplicate check.
    def compose_sequence_node(self, anchor: Any) -> SequenceNode:
        start_event: Any = self.get_event()
        tag = start_event.tag
        if tag is None or tag == "!":
            tag = self.resolve(SequenceNode, None, start_event.implicit)
        node = SequenceNode(tag, [], start_event.start_mark, None, flow_style=start_event.flow_style)
        if anchor is not None:
            self.anchors[anchor] = node
        self._open.add(id(node))
        index = 0
        while not self.check_event(SequenceEndEvent):
            self._keys.append(index)
            node.value.append(self.compose_node(node, index))
            self._keys.pop()
            index += 1
        end_event: Any = self.get_event()
        node.end_mark = end_event.end_mark
        self._open.discard(id(node))
        return node

    def compose_mapping_node(self, anchor: Any) -> MappingNode:
        start_event: Any = self.get_event()
        tag = start_event.tag
        if tag is None or tag == "!":
            tag = self.resolve(MappingNode, None, start_event.implicit)
        node = MappingNode(tag, [], start_event.start_mark, None, flow_style=start_event.flow_style)
        if anchor is not None:
            self.anchors[anchor] = node
        self._open.add(id(node))
        first_line: dict[tuple[str, str], int] = {}
        while not self.check_event(MappingEndEvent):
            key_node = self.compose_node(node, None)
            name = key_node.value if isinstance(key_node, ScalarNode) else "?"
            if isinstance(key_node, ScalarNode):
                key = (key_node.tag, key_node.value)
                if key in first_line:
                    here = _dotted([*self._keys, name])
                    self.duplicates.append((here, (
                        f"key {name!r} is given twice, at line {first_line[key]} and at line {_line(key_node)} "
                        "(YAML would keep only the last one silently); merge the two into one"
                    )))
                else:
                    first_line[key] = _line(key_node)
            self._keys.append(name)
            value_node = self.compose_node(node, key_node)
            self._keys.pop()
            node.value.append((key_node, value_node))
        end_event: Any = self.get_event()
        node.end_mark = end_event.end_mark
        self._open.discard(id(node))
        return node

    def skip_document(self) -> None:
        """After a refused document: drop its remaining events, so the next document can be read."""
        while not self.check_event(DocumentEndEvent):
            self.get_event()
        self.get_event()
        self.anchors = {}


def _yaml_error(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: what, where (line, column), and the context."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        context = f" ({exc.context})" if exc.context else ""
        return f"{exc.problem}{where}{context}"
    return " ".join(str(exc).split())


def _depth_message(where: str) -> str:
    return (f"nesting deeper than {MAX_DEPTH} levels{where}; a job's deepest field is about 12 levels down: check "
            "the indentation or unbalanced brackets")


def _syntax(exc: yaml.YAMLError) -> str:
    """A parse error (the rest of the file cannot be read): one line, with the fix."""
    text = _yaml_error(exc)
    if "maximum nesting depth" in text:  # libyaml's own limit (1000), met while it scans ahead of the composer
        mark = getattr(exc, "problem_mark", None)
        return _depth_message(f" at line {mark.line + 1}" if mark is not None else "")
    return f"not valid YAML: {text}; fix the syntax"


def parse_documents(text: str, source: str) -> Documents:
    """The documents of a job file's text; every problem of every document (see the module docstring)."""
    out = Documents(source)
    loader = _BoundedLoader(text)
    position = 0
    try:
        while True:
            try:
                if not loader.check_node():
                    break
            except yaml.YAMLError as exc:
                out.problems.append(FileProblem("(file)", _syntax(exc), position + 1 if position else None))
                break
            out.count += 1
            position += 1
            index = position  # 1-based position in the file (empty documents count, as editors show them)
            loader.duplicates = []
            try:
                node = loader.get_node()
            except _Refused as refused:
                out.problems.append(FileProblem(refused.path, refused.message, index))
                try:
                    loader.skip_document()
                except yaml.YAMLError as exc:
                    out.problems.append(FileProblem("(file)", _syntax(exc), index))
                    break
                continue
            except ComposerError as exc:  # an undefined or repeated anchor: skip the document
                out.problems.append(FileProblem("(document)", f"{_yaml_error(exc)}; define each &anchor once, "
                                                "before its *aliases", index))
                try:
                    loader.skip_document()
                except yaml.YAMLError:
                    break
                continue
            except yaml.YAMLError as exc:  # a syntax error: the parser cannot go on past it
                out.problems.append(FileProblem("(file)", _syntax(exc), index))
                break
            out.problems.extend(FileProblem(path, msg, index) for path, msg in loader.duplicates)
            try:
                value = loader.construct_document(node)
            except (yaml.YAMLError, TypeError, ValueError) as exc:  # an unknown tag, a key that is a list
                msg = _yaml_error(exc) if isinstance(exc, yaml.YAMLError) else str(exc)
                out.problems.append(FileProblem("(document)", f"cannot be read as plain data: {msg}; a job file "
                                                "holds mappings, lists and scalars only (no !!python tags)", index))
                continue
            if value is None:
                out.count -= 1  # an empty document (a trailing '---') is no document
                continue
            if loader.duplicates:  # reported; its other problems too, but it is never a job to run
                out.duplicated.add(index)
            out.documents.append((index, value))
    finally:
        loader.dispose()
    return out


def _not_utf8(data: bytes, exc: UnicodeDecodeError) -> str:
    line = data.count(b"\n", 0, exc.start) + 1
    column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
    return (f"not UTF-8: byte 0x{data[exc.start]:02x} at line {line}, column {column} (offset {exc.start}); "
            "save the file as UTF-8")


def read_documents(path: str | os.PathLike[str]) -> Documents:
    """Read the job file at ``path`` (see the module docstring); never raises for what the file holds."""
    source = str(path)
    p = Path(path)

    def refused(message: str) -> Documents:
        return Documents(source, problems=[FileProblem("(file)", message)])

    try:
        st = p.stat()
    except FileNotFoundError:
        return refused("no such file; check the path")
    except OSError as exc:
        return refused(f"cannot be read: {os.strerror(exc.errno or errno.EIO)}; check the path")
    if p.is_dir():
        return refused("is a directory, not a job file; name the YAML files in it (e.g. DIR/*.yaml)")
    too_big = (f"is larger than {MAX_FILE_BYTES} bytes (1 MiB), the most a job file may be (a job is a few KiB); "
               "remove what is not the job, or split the file")
    if st.st_size > MAX_FILE_BYTES:
        return refused(f"{too_big}: it has {st.st_size} bytes")
    try:
        with p.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)  # a pipe or device has no size: read at most the cap
    except OSError as exc:
        return refused(f"cannot be read: {os.strerror(exc.errno or errno.EIO)}; check its permissions")
    if len(data) > MAX_FILE_BYTES:
        return refused(too_big)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return refused(_not_utf8(data, exc))
    return parse_documents(text, source)
