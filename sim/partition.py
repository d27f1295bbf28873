"""Training data per simulated device: IID shards, or non-IID by a Dirichlet draw per device.

Both return one array of sample indices per device: disjoint, together
covering ``range(n_samples)``, and the same for the same seed.
"""

from __future__ import annotations

import numpy as np


def iid_split(n_samples: int, n_devices: int, seed: int) -> list[np.ndarray]:
    """A seeded permutation cut into ``n_devices`` parts whose sizes differ by at most one."""
    if n_devices <= 0:
        raise ValueError(f"n_devices must be positive, got {n_devices}")
    if n_samples < n_devices:
        raise ValueError(f"{n_samples} samples cannot give each of {n_devices} devices one")
    perm = np.random.default_rng(seed).permutation(n_samples)
    return [np.sort(part) for part in np.array_split(perm, n_devices)]


def dirichlet_split(labels: np.ndarray, n_devices: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Hsu, Qi and Brown 2019 ("Measuring the effects of non-identical data distribution for federated
    visual classification", Sec. 3): each device's class mix q ~ Dir(alpha * p), p the data set's class
    shares; each device then draws its samples (as many for every device, +-1) by q, without replacement.

    alpha -> 0: each device holds one class; alpha -> inf: every device holds p (IID). When a class
    runs out, a device's remaining draws renormalise q over the classes left (the paper samples with
    replacement from an unlimited pool; here the shards must stay disjoint and cover the data).
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {labels.shape}")
    if not alpha > 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    rng = np.random.default_rng(seed)
    classes, encoded = np.unique(labels, return_inverse=True)
    pools = [rng.permutation(np.flatnonzero(encoded == k)) for k in range(len(classes))]
    remaining = np.array([len(p) for p in pools])
    taken = np.zeros(len(classes), dtype=np.int64)
    prior = remaining / remaining.sum()
    sizes = [len(part) for part in np.array_split(np.arange(len(labels)), n_devices)]
    if min(sizes) == 0:
        raise ValueError(f"{len(labels)} samples cannot give each of {n_devices} devices one")
    # Hsu et al. Sec. 3: q ~ Dir(alpha p), one draw per device.
    # Tiny alphas can underflow a whole draw to zeros (NaN); such a device falls back to the classes left.
    q_all = np.nan_to_num(rng.dirichlet(alpha * prior, size=n_devices))
    out: list[np.ndarray] = []
    for dev, need in enumerate(sizes):
        counts = np.zeros(len(classes), dtype=np.int64)
        while need > 0:
            left = remaining - counts
            p = np.where(left > 0, q_all[dev], 0.0)
            if p.sum() <= 0:
                p = (left > 0).astype(float)
            draw = rng.multinomial(need, p / p.sum())
            draw = np.minimum(draw, left)
            counts += draw
            need -= int(draw.sum())
        parts = [pools[k][taken[k]:taken[k] + counts[k]] for k in range(len(classes))]
        taken += counts
        remaining -= counts
        out.append(np.sort(np.concatenate(parts)))
    return out
