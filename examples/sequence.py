"""A sequence model: a GRU over int64 token ids, trained with AdamW.

    hermes-testbed --task examples.sequence:task --clients 4 --profile hl4 --preset hermes --target accuracy=0.9

Target: test accuracy 0.9, reached at HL4 with ``--preset hermes`` and with ``--preset bsp``.

The data is generated here (no download): four "languages", each a Markov chain over 16
tokens with its own sparse transition table; a sample is 16 tokens drawn from one chain, and
the task is to say which chain spoke. One bigram is seldom enough, so the model must read
the whole sequence. Inputs are int64 token ids of shape (16,), targets int64 class ids.

The optimizer is the task's own (AdamW): each agent keeps its optimizer's state (Adam's
moments) across cycles and pulls; the server folds the parameter updates the agents push.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from hermes import Task

VOCAB, LENGTH, LANGUAGES = 16, 16, 4


def markov_corpus(samples: int = 2500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``samples`` sequences (int64, (samples, LENGTH)) and the language (int64) that generated each."""
    rng = np.random.default_rng(seed)
    # Sparse rows (Dirichlet 0.3): each language prefers a few successors of each token.
    tables = rng.dirichlet(np.full(VOCAB, 0.3), size=(LANGUAGES, VOCAB))
    labels = rng.integers(0, LANGUAGES, size=samples)
    tokens = np.empty((samples, LENGTH), dtype=np.int64)
    tokens[:, 0] = rng.integers(0, VOCAB, size=samples)
    for t in range(1, LENGTH):
        probs = tables[labels, tokens[:, t - 1]]  # (samples, VOCAB): each row the next-token distribution
        u = rng.random((samples, 1))
        tokens[:, t] = np.minimum((probs.cumsum(axis=1) < u).sum(axis=1), VOCAB - 1)
    return tokens, labels.astype(np.int64)


TOKENS, LABELS = markov_corpus()
SPLIT = int(0.8 * len(TOKENS))


class GRUClassifier(nn.Module):
    def __init__(self, vocab: int = VOCAB, classes: int = LANGUAGES, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _, last = self.gru(self.embed(tokens))  # last: (1, batch, dim), the state after the final token
        return self.head(last[0])


def adamw(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=3e-3, weight_decay=1e-4)


task = Task(model=GRUClassifier, train_data=(TOKENS[:SPLIT], LABELS[:SPLIT]),
            test_data=(TOKENS[SPLIT:], LABELS[SPLIT:]), optimizer=adamw, name="markov-gru")
