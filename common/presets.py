"""Presets: each seed system as a named bundle of policy choices and parameters.

Keys are run-config keys (``build_config`` accepts the same): top-level
fields, policy names, and dotted ``section.field`` parameters.
"""

from __future__ import annotations

import difflib
from typing import Any

DEFAULT_PRESET = "hermes"

PRESETS: dict[str, dict[str, Any]] = {
    # Hermes with five measured deviations (docs/papers.md): pushes are the change since the
    # worker's last pull, added by the Eq. 5-6 share instead of blended as a whole model
    # (a convex blend moves the model at most as far as one worker); local SGD momentum 0.9
    # (Table I: plain SGD, the same lr 0.1); the push and its reply overlap the next cycle
    # (overlap_push); a worker whose local model diverged while the gate held its pushes takes
    # the global model again (zscore.resync_factor). mnist1d HL8 (2026-11-26): since-pull deltas
    # took 3.4-4x fewer samples to target than the paper's blend, momentum another 1.1-1.9x;
    # on lan 0.45-0.61x torch DDP's time against the paper configuration's 2.29x. Four
    # assignments per work request (the paper: one). The gate scores 128 validation
    # samples a cycle, not 256 (the paper gives no number): the fast worker's gate costs half,
    # and to 0.9 on mnist1d HL8 lan it was faster in 7 of 8 paired seeds (median 7.1 s against 7.8 s, 2026-11-27).
    # The server scores each candidate and each new global model on 256 validation samples, not
    # 512: that scoring took 2.5 of the server's 8.0 CPU s (start-up included, py-spy) in a run that
    # trained 6.7 s on 2 cores shared with the agents; over 18 paired seeds the mean time to 0.9
    # fell from 6.79 to 6.12 s, the median from 6.33 to 6.18 s (2026-11-27).
    # Shares from the squared inverse losses (loss.sharpness 2): a stale delta that makes the
    # model worse (candidate loss 0.92 against 0.40) is added at 16%, not Eq. 6's 30%. To 0.9 on
    # mnist1d HL8 (2026-11-27): lan, 19 paired seeds, faster in 13, median 6.72 s against 7.46 s
    # (Wilcoxon p 0.055); lte, faster in 3 of 3, 11.1 s against 11.7 s; p = 4 no faster than 1.
    # With n > 5 workers training at once each since-pull delta is added at 5 / n of its share
    # (loss.concurrency_scale): with 100 devices at once the undamped deltas (60-80 versions stale)
    # diverged (docs/simulation.md, "Hermes at 1,000 devices"); 4 agents are unchanged. Under a
    # concurrency.limit a turn lasts until the gate pushes (concurrency.turn_ends push): turns of one
    # gated cycle pushed 9% of the cycles on 1,000 devices (limit 10: 0.55 after 850 cycles; until
    # the push: 0.88 after 1,248); without a limit nothing changes. BatchNorm statistics are measured on
    # the probe's samples, not folded (loss.bn_stats; models without BatchNorm: no change).
    "hermes": {
        "sync": "hermes", "aggregation": "loss", "gate": "zscore", "allocation": "dual-search",
        "momentum": 0.9, "lr": 0.1, "assignments_per_request": 4, "loss.reference": "pull", "overlap_push": True,
        "zscore.resync_factor": 4.0, "zscore.validation_samples": 128, "loss.eval_samples": 256,
        "loss.sharpness": 2.0, "loss.concurrency_scale": 5, "concurrency.turn_ends": "push",
        "loss.bn_stats": "recalibrate",
    },
    # Hermes as the paper runs it (paper 004; each switch at the paper's rule, tests/unit/policies/
    # test_paper_fidelity.py holds the paper's line for each): gated async pushes of w - w0, the
    # loss-weighted blend of Eq. 5-6, plain SGD at Table I's eta 0.1, lambda 5, w 10, alpha -1.3,
    # beta 0.1 (the policies' defaults), patience 25; alpha decays by beta after every silent
    # iteration once N_iter >= lambda and is not reset by a push (Alg. 1 lines 8, 11-12); the
    # current loss is scored inside the window (Sec. IV-B-1); only IQR outliers are resized
    # (Sec. IV-A), with a constant K per mini-batch fitted from the first run (Eq. 3), aiming at
    # t_median itself (no dead-band) over MBS powers of two from 2; one assignment per request and
    # one request per purpose (the paper counts each API call).
    "hermes-paper": {
        "sync": "hermes", "aggregation": "loss", "gate": "zscore", "allocation": "dual-search",
        "momentum": 0.0, "lr": 0.1, "early_stop.patience": 25, "early_stop.metric": "loss",
        "combine_messages": False,
        "zscore.relaxation": "paper", "zscore.alpha_reset": False, "zscore.current_in_window": True,
        "dual_search.balance_band": 0.0, "dual_search.cost_fit": "constant", "dual_search.tolerance": 0.0,
        "dual_search.mbs_min": 2, "rebalance.warmup_cycles": 0, "rebalance.min_observations": 1,
        "dual_search.judgements_per_round": 0,
    },
    # Local momentum on top of asynchronous, stale updates diverged on the
    # testbed (digits, HL4: accuracy back to chance within 10 s); plain SGD
    # converges, so ASP runs without it.
    "asp": {"sync": "asp", "aggregation": "mean", "momentum": 0.0},
    "bsp": {"sync": "bsp", "aggregation": "samples"},
    # Bounded staleness: a worker runs at most ssp.staleness pushes ahead of
    # the slowest (Hermes Table III runs SSP with s = 125 on 12 workers).
    "ssp": {"sync": "ssp", "aggregation": "mean", "momentum": 0.0},
    # Elastic BSP (Zipline-style): the barrier falls where predicted waiting
    # is least within ebsp.lookahead pushes of the fastest worker.
    "ebsp": {"sync": "ebsp", "aggregation": "samples"},
    # OmniLearn (paper 000) BSP: proportional control of each worker's batch
    # once per epoch (Eq. 6-7), global batch kept at K*b (Eq. 8), gradients
    # weighted by lambda_k = b_k / sum(b) (Eq. 4b); bounds and dead-band of
    # Fig. 11. OmniLearn bounds batches by fixed bounds and memory (Eq. 9)
    # only: the throughput-drop cap is ACSOS's, so it is off here.
    "omnilearn-bsp": {
        "sync": "bsp", "aggregation": "samples", "allocation": "pcontrol", "pcontrol.interval": "epoch",
        "batch_bounds.b_min": 4, "batch_bounds.b_max": 96, "pcontrol.deadband": 0.1, "pcontrol.throughput_cap": False,
    },
    # OmniLearn ASP (Alg. 2): the same controller without a global batch,
    # learning rate scaled by b_k / B instead of gradient weighting (Eq. 5b).
    # lr 0.2 so that a worker at the initial b = B/K steps at 0.05.
    "omnilearn-asp": {
        "sync": "asp", "aggregation": "mean", "allocation": "pcontrol", "pcontrol.interval": "epoch",
        "lr_scaling": "batch-scaled", "lr": 0.2, "momentum": 0.0, "batch_bounds.b_min": 4, "batch_bounds.b_max": 96,
        "pcontrol.deadband": 0.1, "pcontrol.throughput_cap": False,
    },
    # ACSOS dynamic batching (paper 001): the same proportional law adjusted
    # at any iteration with EWMA-smoothed times, global batch fixed (Eq. 4-5).
    "dynamic-batching": {
        "sync": "bsp", "aggregation": "samples", "allocation": "pcontrol", "pcontrol.interval": "round",
        "batch_bounds.b_min": 4, "batch_bounds.b_max": 96, "pcontrol.deadband": 0.1,
    },
    # OmniLearn's variable batching (Sec. III-A): batches from declared
    # cores, never re-measured.
    "variable-batching": {"sync": "bsp", "aggregation": "samples", "allocation": "static",
                          "batch_bounds.b_min": 4, "batch_bounds.b_max": 96},
    # Chao et al. (paper 002): w_i micro-batches accumulated per step (Eq. 10),
    # aggregation weighted by each worker's share of the step's samples.
    "task-allocation": {"sync": "bsp", "aggregation": "samples", "allocation": "adaptive", "lr": 0.1},
    # DP-SGD / EDP-SGD (paper 003): per-epoch partitions by compute power
    # (Alg. 1); EDP-SGD also weighs gradients by normalised compute power (Sec. 4.2).
    "dp-sgd": {"sync": "bsp", "aggregation": "mean", "allocation": "partition"},
    # FedAsync (Xie, Koyejo, Gupta 2019, Alg. 1): every update mixed into the
    # global model on arrival with alpha_t = alpha * s(t - tau), polynomial
    # s with a = 0.5 and alpha = 0.6, and the workers' proximal term
    # rho/2 ||x - x_tau||^2 with rho = 0.005 (the paper's Sec. 6 settings,
    # the fedasync section's defaults); plain local SGD as in the paper's workers.
    "fedasync": {"sync": "asp", "aggregation": "fedasync", "momentum": 0.0, "lr": 0.1},
    # FedBuff (Nguyen et al., AISTATS 2022, Alg. 1): deltas buffered without
    # waiting, one server step per K = 10 of them with eta_g = 1 and
    # s = 1/sqrt(1+tau) (the fedbuff section's defaults).
    "fedbuff": {"sync": "fedbuff", "aggregation": "fedbuff", "momentum": 0.0, "lr": 0.1},
    # FedBuff with K = 2: the paper's K = 10 is for 100-1000 concurrent clients; with a
    # handful of agents one step waits for 2-3 pushes of each (docs/papers.md, deviations).
    "fedbuff-k2": {"sync": "fedbuff", "aggregation": "fedbuff", "momentum": 0.0, "lr": 0.1,
                   "fedbuff.buffer_size": 2},
    "edp-sgd": {"sync": "bsp", "aggregation": "power", "allocation": "partition"},
}

PRESET_SOURCES: dict[str, str] = {
    "hermes": "Hermes (When Less is More) with since-pull deltas added by the loss share, local momentum and "
              "overlapped pushes (measured deviations)",
    "hermes-paper": "Hermes (When Less is More) as published: gated pushes, loss-weighted blend, dual binary search, "
                    "every switch at the paper's rule",
    "asp": "asynchronous parallel baseline",
    "bsp": "bulk-synchronous baseline, uniform batches",
    "ssp": "stale-synchronous parallel baseline (bounded staleness)",
    "ebsp": "elastic BSP baseline (Zipline-style predicted barrier)",
    "omnilearn-bsp": "OmniLearn BSP: proportional-control dynamic batching per epoch, fixed global batch",
    "omnilearn-asp": "OmniLearn ASP: proportional-control dynamic batching, batch-scaled learning rate",
    "dynamic-batching": "ACSOS dynamic batching: proportional control at every round, fixed global batch",
    "variable-batching": "OmniLearn/ACSOS static variable batching from declared cores",
    "task-allocation": "Chao et al.: self-adaptive gradient-accumulation counts per worker",
    "dp-sgd": "DP-SGD: per-epoch data partitions by measured compute power",
    "edp-sgd": "EDP-SGD: DP-SGD plus gradients weighted by compute power",
    "fedasync": "FedAsync (Xie et al. 2019): staleness-weighted mixing of each update on arrival, proximal local loss",
    "fedbuff": "FedBuff (Nguyen et al. 2022): K = 10 buffered deltas per step, server lr, staleness scaling",
    "fedbuff-k2": "FedBuff with K = 2 buffered deltas per step, for a few agents (our variant)",
}


# Presets that were renamed: the old name's message says where it went.
RENAMED = {"hermes-fast": "'hermes' (since 2026-11-27; the paper's configuration is 'hermes-paper')"}


def unknown_preset(name: str) -> str:
    """The one-line reason ``name`` is not a preset: a renamed one, a likely typo, or the known names."""
    if name in RENAMED:
        return f"unknown preset {name!r}; it is now {RENAMED[name]}"
    close = difflib.get_close_matches(name, list(PRESETS), n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(sorted(PRESETS))}"
    return f"unknown preset {name!r}; {hint}"
