"""A token tree as level 1 drafts it and level 2 verifies it: nodes in breadth-first order, node 0 the root (the last
decided token); every other node is a candidate after its parent, at the root's position plus its depth."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class TokenTree:
    """Nodes ``tokens[i]`` with ``parents[i]`` (``-1``: the root) and ``depths[i]``; ``shape_nodes[i]``: the node of
    the planned ``TreeShape`` it fills; ``draft_probs[i]``: the ``[V]`` distribution its children were drawn from
    (``None`` at leaves and when greedy).

    Example:
        >>> tree = TokenTree.rooted(5)
        >>> a = tree.add(7, parent=0, shape_node=1); b = tree.add(8, parent=0, shape_node=2)
        >>> c = tree.add(9, parent=a, shape_node=3)
        >>> tree.children, tree.path_to(c), tree.depths
        ([[1, 2], [3], [], []], [1, 3], [0, 1, 1, 2])
        >>> tree.visibility([3], [0, 1, 3]).int().tolist()  # node 3 sees the root, node 1 and itself
        [[1, 1, 1]]
    """

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    shape_nodes: list[int]
    draft_probs: list[torch.Tensor | None] = field(default_factory=list)

    @classmethod
    def rooted(cls, token: int) -> TokenTree:
        return cls([token], [-1], [0], [0], [None])

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in self.tokens]
        for i, parent in enumerate(self.parents[1:], start=1):
            kids[parent].append(i)
        return kids

    def add(self, token: int, parent: int, shape_node: int) -> int:
        """A new node ``token`` under ``parent``; returns its index."""
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.shape_nodes.append(shape_node)
        self.draft_probs.append(None)
        return self.size - 1

    def path_to(self, node: int) -> list[int]:
        """The nodes from the root's child down to ``node`` (``[]`` for the root)."""
        path = []
        while node > 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def visibility(self, queries: list[int], keys: list[int]) -> torch.Tensor:
        """The ``[len(queries), len(keys)]`` bool tree mask: ``keys[j]`` is ``queries[i]`` or an ancestor of it."""
        rows = torch.zeros(len(queries), len(keys), dtype=torch.bool)
        where = {node: j for j, node in enumerate(keys)}
        for i, node in enumerate(queries):
            while node >= 0:
                if node in where:
                    rows[i, where[node]] = True
                node = self.parents[node]
        return rows

    def context(self, prefix: torch.Tensor, node: int) -> torch.Tensor:
        """``[n + depth]``: ``prefix`` (the row's tokens, ending with the root), then the path to ``node``."""
        path = [self.tokens[n] for n in self.path_to(node)]
        return torch.cat([prefix, prefix.new_tensor(path)]) if path else prefix

    def token_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.tensor(self.tokens, dtype=torch.long, device=device)

    def draft_matrix(self, vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[N, V]`` level 1's distributions, zeros at the nodes that have none (leaves)."""
        rows = [p if p is not None else torch.zeros(vocab, device=device) for p in self.draft_probs]
        return torch.stack([r.to(device).float() for r in rows])
