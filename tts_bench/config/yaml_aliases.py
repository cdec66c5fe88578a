"""The YAML alias budget: a document is refused by its expanded size before it is built.

PyYAML shares the object an alias points to, so reading `&a [x, x]`, `&b [*a, *a]`, ... is fast;
everything after it (the strict loader's `_plain`, JSON, pydantic) copies, so nine levels of ten
aliases ("billion laughs") would expand to 10^9 values and never finish. The composed node graph
is measured instead, each node once (linear in the text), and a document whose values, with
every alias written out, exceed MAX_EXPANDED_NODES is refused naming the key that holds them.

    check_expansion(loader.get_single_node())   # raises AliasBlowUp
"""

from __future__ import annotations

import yaml

MAX_EXPANDED_NODES = 100_000  # configs hold hundreds; 100k values still load in well under a second


class AliasBlowUp(Exception):
    """A document whose aliases expand beyond MAX_EXPANDED_NODES; `key` is the dotted key."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key

    def message(self, source: str) -> str:
        key = f"{self.key} " if self.key else "the value "
        return (f"error: {key}expands YAML aliases to over {MAX_EXPANDED_NODES:,} values ({source}); "
                "an alias of an alias multiplies its size: write the value out or nest fewer aliases")


def check_expansion(root: yaml.Node) -> None:
    """Raise AliasBlowUp if `root`, aliases copied out, holds over MAX_EXPANDED_NODES nodes."""
    sizes: dict[int, int] = {}
    if _expanded(root, sizes) <= MAX_EXPANDED_NODES:
        return
    key, node = "", root
    while isinstance(node, yaml.MappingNode):  # down the mapping keys that hold the blow-up
        big = [(k, v) for k, v in node.value if sizes[id(v)] > MAX_EXPANDED_NODES]
        if not big or not isinstance(big[0][0], yaml.ScalarNode):
            break
        key, node = f"{key}.{big[0][0].value}" if key else str(big[0][0].value), big[0][1]
    raise AliasBlowUp(key)


def _expanded(node: yaml.Node, sizes: dict[int, int]) -> int:
    if id(node) in sizes:  # counted before, or in progress: a cycle, which the loader names later
        return max(sizes[id(node)], 1)
    sizes[id(node)] = 0
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded(child, sizes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded(k, sizes) + _expanded(v, sizes) for k, v in node.value)
    else:
        size = 1
    sizes[id(node)] = size = min(size, 10 * MAX_EXPANDED_NODES)  # no need to count on to 10^9
    return size
