"""Model selection benchmark: Clipper's bandits replayed over the digits demo models.

Every demo model's prediction on the held-out set is computed once with ONNX Runtime; streams of queries
(several shuffled passes over the 540 held-out rows, fixed seeds) are then replayed through the policies
of ``clipper.selection``, each query followed by its feedback label. Experiments:

1. accuracy: Exp4, Exp3, epsilon-greedy and the single-model policy against every fixed model;
   Exp4's error at each confidence level; Exp3's cumulative regret against the best fixed model.
2. robustness: midway through the stream the best model starts answering a wrong label; how many
   queries Exp3 and Exp4 need until their accuracy stays within 1 point of their accuracy before the fault
   (sustained recovery: every later 100-query window within the band, not the first one).
3. Exp3 at several learning rates: accuracy, regret per pass, sustained recovery.
4. personalisation: three user groups whose inputs are transformed differently (plain, mirrored, noisy),
   so that each group has a different best model; per-user Exp3 against the app-wide Exp3.

Run ``python bench/selection.py`` from the repository root (``make bench-selection``). It prints its
figures and writes ``bench/results/selection.json`` and ``bench/results/selection.png``.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.selection_plot import plot  # noqa: E402
from bench.selection_recovery import recovery  # noqa: E402
from clipper.selection import (  # noqa: E402
    EpsilonGreedyPolicy,
    Exp3Policy,
    Exp4Policy,
    SelectionPolicy,
    SelectionState,
    SinglePolicy,
    initial_state,
    state_for_user,
)
from infra.demo.train_models import ensure_models  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SEED = 2017
PASSES = 5  # shuffled passes over the held-out set per stream
RUNS = 20  # streams per experiment (different shuffles and policy seeds)
WINDOW = 100  # queries per accuracy window (robustness)
BAND = 0.01  # recovered: every later window at most 1 point under the accuracy before the fault
ETAS = (0.02, 0.05, 0.2, 0.5)  # Exp3's learning rates compared (0.2: the default)
USERS_PER_GROUP = 3
CONFIDENCE_BINS = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)

Preds = dict[str, np.ndarray]


def log(line: str) -> None:
    print(line, flush=True)


def load() -> tuple[list[str], Callable[[np.ndarray], Preds], np.ndarray, np.ndarray]:
    """The model names (link order), a predictor over all models, the held-out X and y."""
    import onnxruntime as ort

    manifest = ensure_models(ROOT / "build" / "models", log=log)
    out = Path(manifest["out_dir"])
    holdout = np.load(out / manifest["dataset"]["holdout"])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sessions = {
        m["name"]: ort.InferenceSession(str(out / m["path"]), options, providers=["CPUExecutionProvider"])
        for m in manifest["models"]
    }

    def predict(x: np.ndarray) -> Preds:
        x = np.ascontiguousarray(x, dtype=np.float32)
        return {n: np.asarray(s.run(None, {s.get_inputs()[0].name: x})[0], dtype=np.int64) for n, s in sessions.items()}

    return list(sessions), predict, holdout["X"], holdout["y"]


def stream_order(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.concatenate([rng.permutation(n) for _ in range(PASSES)])


def replay(
    policy: SelectionPolicy, models: list[str], preds: Preds, labels: np.ndarray, seed: int
) -> dict[str, np.ndarray]:
    """One stream through one policy: per query, whether the answer was right, its confidence, the
    first selected model (index in ``models``)."""
    rng = random.Random(seed)
    columns = {m: preds[m].tolist() for m in models}
    truth = labels.tolist()
    n = len(truth)
    correct, confidence, chosen = np.zeros(n, bool), np.zeros(n), np.zeros(n, np.int64)
    state = initial_state(policy.name, models)
    for t in range(n):
        selection = policy.select(state, rng)
        outputs = {m: columns[m][t] for m in selection.models}
        combined = policy.combine(state, selection, outputs)
        correct[t] = combined.output == truth[t]
        confidence[t] = combined.confidence
        chosen[t] = models.index(selection.models[0])
        state = policy.update(state, selection, outputs, truth[t])
    return {"correct": correct, "confidence": confidence, "chosen": chosen}


def accuracy_experiment(models: list[str], base: Preds, y: np.ndarray) -> dict[str, Any]:
    policies: dict[str, SelectionPolicy] = {
        "single": SinglePolicy(),
        "epsilon_greedy": EpsilonGreedyPolicy(),
        "exp3": Exp3Policy(),
        "exp4": Exp4Policy(),
    }
    curves: dict[str, list[np.ndarray]] = {name: [] for name in [*models, *policies]}
    regret, random_regret, confidence, right, chosen = [], [], [], [], []
    for run in range(RUNS):
        order = stream_order(np.random.default_rng(SEED + run), len(y))
        preds, labels = {m: base[m][order] for m in models}, y[order]
        for m in models:
            curves[m].append(preds[m] == labels)
        for name, policy in policies.items():
            r = replay(policy, models, preds, labels, SEED * 1000 + run)
            curves[name].append(r["correct"])
            if name == "exp3":
                best = max(models, key=lambda m: int(np.sum(preds[m] == labels)))
                regret.append(np.cumsum((preds[best] == labels).astype(float) - r["correct"]))
                uniform = np.mean([preds[m] == labels for m in models], axis=0)  # expected, picking at random
                random_regret.append(float(np.sum((preds[best] == labels) - uniform)))
                chosen.append(r["chosen"])
            if name == "exp4":
                confidence.append(r["confidence"])
                right.append(r["correct"])
    acc = {name: float(np.mean(c)) for name, c in curves.items()}
    last_pass = {name: float(np.mean([x[-len(y) :] for x in c])) for name, c in curves.items()}
    best_model = max(models, key=lambda m: acc[m])
    conf, ok = np.concatenate(confidence), np.concatenate(right)
    levels = []
    for lo, hi in itertools.pairwise(CONFIDENCE_BINS):
        mask = (conf >= lo) & ((conf < hi) if hi < 1.0 else (conf <= hi))
        at_least = conf >= lo
        levels.append(
            {
                "confidence": [lo, hi],
                "share": float(mask.mean()),
                "error": float(1 - ok[mask].mean()) if mask.any() else None,
                "error_at_or_above": float(1 - ok[at_least].mean()),
                "coverage_at_or_above": float(at_least.mean()),
            }
        )
    mean_regret = np.mean(regret, axis=0)
    share = np.mean([np.eye(len(models))[c] for c in chosen], axis=0)
    return {
        "accuracy": acc,
        "accuracy_last_pass": last_pass,
        "best_model": best_model,
        "levels": levels,
        "curves": {name: np.mean(c, axis=0) for name, c in curves.items()},
        "regret_curve": mean_regret,
        "regret_runs": [float(r[-1]) for r in regret],
        "regret_per_pass": np.diff(mean_regret[len(y) - 1 :: len(y)], prepend=0.0).tolist(),
        "regret_uniform_random": float(np.mean(random_regret)),
        "exp3_share": share,
    }


def fault_experiment(
    models: list[str], base: Preds, y: np.ndarray, broken: str, policies: dict[str, SelectionPolicy] | None = None
) -> dict[str, Any]:
    """From the middle of the stream on, ``broken`` answers a random wrong label."""
    policies = policies or {"exp3": Exp3Policy(), "exp4": Exp4Policy()}
    curves: dict[str, list[np.ndarray]] = {name: [] for name in policies}
    n = PASSES * len(y)
    fault = n // 2
    for run in range(RUNS):
        rng = np.random.default_rng(SEED + 500 + run)
        order = stream_order(rng, len(y))
        preds, labels = {m: base[m][order].copy() for m in models}, y[order]
        preds[broken][fault:] = (labels[fault:] + rng.integers(1, 10, n - fault)) % 10
        for name, policy in policies.items():
            curves[name].append(replay(policy, models, preds, labels, SEED * 2000 + run)["correct"])
    out: dict[str, Any] = {"fault_at": fault, "broken_model": broken, "curves": {}}
    for name, c in curves.items():
        mean = np.mean(c, axis=0)
        before = float(mean[fault - len(y) : fault].mean())  # the last pass before the fault
        after = float(mean[-len(y) :].mean())  # the last pass: the level it settles at
        out[name] = {
            "accuracy_before": before,
            "accuracy_after": after,
            **recovery(mean, fault, before, WINDOW, BAND),
            # settling: every later window within 1 point of the level after the fault (control's settling time)
            "settling_queries": recovery(mean, fault, after, WINDOW, BAND)["recovery_queries"],
        }
        out["curves"][name] = mean
    return out


def exp3_eta_sweep(models: list[str], base: Preds, y: np.ndarray, broken: str) -> dict[str, Any]:
    """Exp3 at several learning rates (gamma at its default) over the accuracy experiment's streams: its accuracy,
    its regret against the best fixed model per pass, the share of its last pass on that model, and its sustained
    recovery from the fault."""
    out: dict[str, Any] = {}
    for eta in ETAS:
        policy = Exp3Policy(eta=eta)
        regret, right, on_best = [], [], []
        for run in range(RUNS):
            order = stream_order(np.random.default_rng(SEED + run), len(y))
            preds, labels = {m: base[m][order] for m in models}, y[order]
            r = replay(policy, models, preds, labels, SEED * 1000 + run)
            best = max(models, key=lambda m: int(np.sum(preds[m] == labels)))
            regret.append(np.cumsum((preds[best] == labels).astype(float) - r["correct"]))
            right.append(r["correct"])
            on_best.append(float(np.mean(r["chosen"][-len(y) :] == models.index(best))))
        mean = np.mean(regret, axis=0)
        fault = fault_experiment(models, base, y, broken, {"exp3": policy})["exp3"]
        out[f"{eta:g}"] = {
            "accuracy": float(np.mean(right)),
            "regret": float(mean[-1]),
            "regret_per_pass": np.diff(mean[len(y) - 1 :: len(y)], prepend=0.0).round(2).tolist(),
            "last_pass_on_best": float(np.mean(on_best)),
            "accuracy_after_fault": fault["accuracy_after"],
            "settling_queries": fault["settling_queries"],
            "recovery_queries": fault["recovery_queries"],
            "first_within_band_queries": fault["first_within_band_queries"],
        }
    return out


def transforms(x: np.ndarray) -> dict[str, np.ndarray]:
    """The user groups' inputs: as they are (mlp is best), mirrored left-right (logreg is best) and with
    Gaussian noise of sigma 2 on the 0-16 pixel scale (forest is best; the MLP collapses)."""
    noise = np.random.default_rng(SEED).normal(0.0, 2.0, x.shape)
    mirrored = x.reshape(-1, 8, 8)[:, :, ::-1].reshape(-1, 64)
    return {"plain": x, "mirrored": mirrored, "noisy": np.clip(x + noise, 0.0, 16.0)}


def personalisation_experiment(
    models: list[str], predict: Callable[[np.ndarray], Preds], x: np.ndarray, y: np.ndarray
) -> dict[str, Any]:
    groups = {g: predict(xg) for g, xg in transforms(x).items()}
    group_acc = {g: {m: float(np.mean(p[m] == y)) for m in models} for g, p in groups.items()}
    best = {g: max(models, key=lambda m: a[m]) for g, a in group_acc.items()}
    if len(set(best.values())) != len(best):
        raise RuntimeError(f"the user groups do not have different best models: {best}")
    names = list(groups)
    users = [(g, i) for g in names for i in range(USERS_PER_GROUP)]
    policy = Exp3Policy()
    scores: dict[str, list[float]] = {"contextual": [], "global": []}
    by_group = {k: {g: [0, 0] for g in names} for k in scores}  # right, asked
    for run in range(RUNS):
        rng = np.random.default_rng(SEED + 900 + run)
        order = stream_order(rng, len(y))
        who = rng.integers(0, len(users), len(order))
        choice = random.Random(SEED * 3000 + run)
        app_ctx = app_global = initial_state(policy.name, models)
        per_user: dict[int, SelectionState] = {}
        right = {"contextual": 0, "global": 0}
        for row, u in zip(order.tolist(), who.tolist(), strict=True):
            outputs_all = {m: int(groups[users[u][0]][m][row]) for m in models}
            label = int(y[row])
            # contextual: the user's state (a copy of the app-wide one for a new user); feedback updates both
            state = state_for_user(app_ctx, per_user.get(u))
            sel = policy.select(state, choice)
            outputs = {m: outputs_all[m] for m in sel.models}
            hit = policy.combine(state, sel, outputs).output == label
            right["contextual"] += hit
            by_group["contextual"][users[u][0]][0] += hit
            by_group["contextual"][users[u][0]][1] += 1
            per_user[u] = policy.update(state, sel, outputs, label)
            app_ctx = policy.update(app_ctx, sel, outputs, label)
            # global: the app-wide state only
            sel = policy.select(app_global, choice)
            outputs = {m: outputs_all[m] for m in sel.models}
            hit = policy.combine(app_global, sel, outputs).output == label
            right["global"] += hit
            by_group["global"][users[u][0]][0] += hit
            by_group["global"][users[u][0]][1] += 1
            app_global = policy.update(app_global, sel, outputs, label)
        for k, v in right.items():
            scores[k].append(v / len(order))
    oracle = float(np.mean([group_acc[g][best[g]] for g in names]))
    global_best = max(models, key=lambda m: float(np.mean([group_acc[g][m] for g in names])))
    return {
        "groups": group_acc,
        "best_model_per_group": best,
        "oracle_per_group_best": oracle,
        "best_single_model_overall": global_best,
        "best_single_model_overall_accuracy": float(np.mean([group_acc[g][global_best] for g in names])),
        "users": len(users),
        "accuracy_contextual": float(np.mean(scores["contextual"])),
        "accuracy_global": float(np.mean(scores["global"])),
        "accuracy_by_group": {k: {g: r / n for g, (r, n) in v.items()} for k, v in by_group.items()},
        "runs_contextual_better": int(sum(c > g for c, g in zip(scores["contextual"], scores["global"], strict=True))),
    }


def main() -> int:
    started = time.perf_counter()
    models, predict, x, y = load()
    base = predict(x)
    log(f"{len(y)} held-out rows, {PASSES} passes per stream, {RUNS} streams per experiment, models {models}")
    for m in models:
        log(f"  {m:>7}: held-out accuracy {np.mean(base[m] == y):.4f}")

    acc = accuracy_experiment(models, base, y)
    best = acc["best_model"]
    log(f"accuracy over the stream (mean of {RUNS} streams; best fixed model: {best}):")
    for name, value in acc["accuracy"].items():
        log(f"  {name:>14}: {value:.4f} (last pass {acc['accuracy_last_pass'][name]:.4f})")
    log("exp4 error by confidence:")
    for lv in acc["levels"]:
        err = "  -   " if lv["error"] is None else f"{lv['error']:.4f}"
        lo, hi = lv["confidence"]
        log(
            f"  [{lo:.2f}, {hi:.2f}{']' if hi == 1.0 else ')'}: error {err} on {lv['share']:5.1%} of queries; "
            f"at or above {lo:.2f}: error {lv['error_at_or_above']:.4f} on {lv['coverage_at_or_above']:.1%}"
        )
    regret = float(acc["regret_curve"][-1])
    n = len(acc["regret_curve"])
    log(f"exp3 cumulative regret vs the best fixed model: {regret:.1f} answers over {n} queries ({regret / n:.4f})")
    share = dict(zip(models, acc["exp3_share"][-len(y) :].mean(0).round(3).tolist(), strict=True))
    log(
        f"  regret per pass {[round(r, 1) for r in acc['regret_per_pass']]}; a uniformly random choice: "
        f"{acc['regret_uniform_random']:.1f}"
    )
    log(f"  share of exp3's last pass on each model: {share}")

    fault = fault_experiment(models, base, y, best)
    log(f"robustness: {best} answers wrong labels from query {fault['fault_at']} on")
    for name in ("exp3", "exp4"):
        r = fault[name]
        sustained = "not by the end" if r["recovery_queries"] is None else f"after {r['recovery_queries']} queries"
        log(
            f"  {name}: accuracy before {r['accuracy_before']:.4f}, after {r['accuracy_after']:.4f}; worst "
            f"{WINDOW}-query window after {r['worst_window_after']:.4f}; every later window within 1 point of "
            f"the accuracy before {sustained} (first within it after {r['first_within_band_queries']}, then "
            f"{r['windows_outside_band_after_first_entry']} windows outside); within 1 point of the level after "
            f"the fault for good after {r['settling_queries']} queries"
        )

    sweep = exp3_eta_sweep(models, base, y, best)
    log(f"exp3 by learning rate eta (gamma {Exp3Policy().gamma}; default eta {Exp3Policy().eta}):")
    for eta, r in sweep.items():
        log(
            f"  eta {eta:>4}: accuracy {r['accuracy']:.4f}, regret {r['regret']:5.1f} (per pass "
            f"{r['regret_per_pass']}), last pass on the best model {r['last_pass_on_best']:.1%}, "
            f"after the fault {r['accuracy_after_fault']:.4f}, settled after {r['settling_queries']}, sustained "
            f"recovery {r['recovery_queries']} (first entry {r['first_within_band_queries']})"
        )

    pers = personalisation_experiment(models, predict, x, y)
    for g, a in pers["groups"].items():
        log(
            f"  group {g:>6}: "
            + ", ".join(f"{m} {v:.3f}" for m, v in a.items())
            + f" (best {pers['best_model_per_group'][g]})"
        )
    log(
        f"personalisation: per-user exp3 {pers['accuracy_contextual']:.4f}, "
        f"app-wide exp3 {pers['accuracy_global']:.4f} (per-group best {pers['oracle_per_group_best']:.4f}; "
        f"per-user better in {pers['runs_contextual_better']}/{RUNS} streams)"
    )

    result = {
        "accuracy_best_single": acc["accuracy"][best],
        "accuracy_exp4": acc["accuracy"]["exp4"],
        "regret_exp3": regret,
        "recovery_queries_exp3": fault["exp3"]["recovery_queries"],
        "recovery_queries_exp4": fault["exp4"]["recovery_queries"],
        "settling_queries_exp3": fault["exp3"]["settling_queries"],
        "settling_queries_exp4": fault["exp4"]["settling_queries"],
        "accuracy_contextual": pers["accuracy_contextual"],
        "accuracy_global": pers["accuracy_global"],
        "detail": {
            "setup": {
                "rows": len(y),
                "passes": PASSES,
                "queries_per_stream": n,
                "runs": RUNS,
                "seed": SEED,
                "window": WINDOW,
                "models": models,
                "policies": {
                    "exp3": vars(Exp3Policy()),
                    "exp4": vars(Exp4Policy()),
                    "epsilon_greedy": vars(EpsilonGreedyPolicy()),
                },
            },
            "best_single_model": best,
            "accuracy": acc["accuracy"],
            "accuracy_last_pass": acc["accuracy_last_pass"],
            "exp4_error_by_confidence": acc["levels"],
            "regret_exp3_per_query": regret / n,
            "regret_exp3_runs": acc["regret_runs"],
            "regret_exp3_per_pass": acc["regret_per_pass"],
            "regret_uniform_random": acc["regret_uniform_random"],
            "exp3_share_last_pass": share,
            "robustness": {k: v for k, v in fault.items() if k != "curves"},
            "exp3_by_eta": sweep,
            "personalisation": pers,
        },
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "selection.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(models, acc, fault, pers, RESULTS / "selection.png", WINDOW)
    log(f"wrote {RESULTS.relative_to(ROOT)}/selection.json and selection.png in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
