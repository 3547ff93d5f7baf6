"""A YAML loader for untrusted text: libyaml's safe loader with two guards.

- Aliases: a document whose aliases would expand to more than `ALIAS_BUDGET` extra nodes (a
  "billion laughs") is refused before anything walks it; composing keeps aliases shared, so the
  check costs the document's real size.
- Integers longer than Python converts (`sys.int_max_str_digits`, 4,300 digits) are refused with
  their line instead of escaping as a bare ValueError.

Both raise `yaml.MarkedYAMLError` subclasses, so callers' usual YAML error handling names the line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

ALIAS_BUDGET = 100_000
"""Nodes that aliases may add on top of the nodes written out: generous for anchors reused in
manifests (env lists, resource blocks), far below what hangs a review."""

_Base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class AliasExpansionError(yaml.constructor.ConstructorError):
    """The document's aliases expand beyond `ALIAS_BUDGET` nodes."""


class IntegerTooLargeError(yaml.constructor.ConstructorError):
    """An integer literal too long to convert."""


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def check_aliases(root: yaml.Node, budget: int = ALIAS_BUDGET) -> None:
    """Raise AliasExpansionError when expanding every alias under `root` exceeds `budget` extra nodes.

    Sizes are computed once per distinct node (post-order, no recursion); the reported mark is the
    first node whose expansion alone passes the budget, i.e. the anchor the bomb is built from.
    """
    size: dict[int, int] = {}
    open_: set[int] = set()  # nodes whose children are being sized: meeting one again is a cycle
    unique = 0
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in size:
            continue
        kids = _children(node)
        if not expanded and kids:
            if id(node) in open_:
                raise AliasExpansionError(
                    None,
                    None,
                    "YAML alias refers to an anchor that contains it (a recursive structure); "
                    "Kubernetes objects are trees: write the data out",
                    node.start_mark,
                )
            open_.add(id(node))
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in size)
            continue
        open_.discard(id(node))
        total = 1 + sum(size[id(k)] for k in kids)
        size[id(node)] = total
        unique += 1
        if total - unique > budget:
            raise AliasExpansionError(
                None,
                None,
                f"YAML alias expansion too large: the aliases here expand to over {total:,} nodes "
                f"(the limit is {budget:,} beyond those written out); write the data out or use "
                "fewer aliases",
                node.start_mark,
            )


class WatchedStream:
    """A text stream handed to the loader, noting whether `&` and `*` have been read so far.

    libyaml reads a stream ahead of the document it composes, so once a document is composed its
    whole text has passed through here: a document that holds an alias has made both flags true
    by then. The flags only ever turn on, so the check stays conservative for later documents.
    """

    __slots__ = ("_stream", "alias", "anchor")

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.anchor = False
        self.alias = False

    def read(self, size: int = -1) -> Any:
        chunk = self._stream.read(size)
        if not self.anchor and "&" in chunk:
            self.anchor = True
        if not self.alias and "*" in chunk:
            self.alias = True
        return chunk

    @property
    def may_alias(self) -> bool:
        return self.anchor and self.alias


class SafeLoader(_Base):  # type: ignore[misc, valid-type]
    """libyaml's safe loader (pure Python when libyaml is missing) with the guards above.

    `stream` is text, or a text stream read in chunks (one document at a time is held, not the
    file): the alias walk then runs only once the text read so far holds both `&` and `*`.
    """

    def __init__(self, stream: Any) -> None:
        self._watch: WatchedStream | None = None
        if not isinstance(stream, str | bytes):
            stream = self._watch = WatchedStream(stream)
        super().__init__(stream)
        # An alias needs an anchor (`&a`) and a reference (`*a`): text without both has none, and
        # most manifests skip the walk.
        self._text_may_alias = not isinstance(stream, str) or ("&" in stream and "*" in stream)

    @property
    def may_alias(self) -> bool:
        return self._watch.may_alias if self._watch is not None else self._text_may_alias

    def construct_document(self, node: yaml.Node) -> Any:
        if self.may_alias:
            check_aliases(node)
        return super().construct_document(node)


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    try:
        return yaml.constructor.SafeConstructor.construct_yaml_int(loader, node)  # type: ignore[arg-type]
    except ValueError:
        digits = sum(ch.isdigit() for ch in str(node.value))
        raise IntegerTooLargeError(
            None,
            None,
            f"integer with {digits} digits is too large (Kubernetes integers are 64-bit)",
            node.start_mark,
        ) from None


SafeLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def load_all(text: str) -> Iterator[Any]:
    """Every document of `text`, guarded; raises yaml.YAMLError subclasses with marks."""
    loader = SafeLoader(text)
    try:
        while loader.check_data():
            yield loader.get_data()
    finally:
        loader.dispose()


def load(text: str) -> Any:
    """The single document of `text` (None when empty), guarded."""
    loader = SafeLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def compose_all(text: str) -> Iterator[yaml.Node]:
    """Every document's node graph (aliases still shared), alias-checked."""
    loader = SafeLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                if loader.may_alias:
                    check_aliases(node)
                yield node
    finally:
        loader.dispose()
