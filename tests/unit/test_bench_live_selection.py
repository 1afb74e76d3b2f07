"""The live selection benchmark's pure parts: distinct tagged inputs, the replay (the offline benchmark's when
feedback is seen at once; slower to learn when it is seen late), the band comparison, the lags, the broken
model's permuted labels, and how a live run's answers and records are read."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bench.live_selection.analysis import user_due, visible_from
from bench.live_selection.compare import band, lags, window_means
from bench.live_selection.driver import LiveRun
from bench.live_selection.replay import replay, replay_users
from bench.live_selection.streams import Stream, all_distinct, plain_stream, tagged
from bench.selection import replay as offline_replay
from clipper.selection import Exp3Policy, Exp4Policy

pytestmark = pytest.mark.unit

MODELS = ["a", "b", "c"]


def _stream(n: int, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``a`` right 95 %, ``b`` 70 %, ``c`` 40 % of the time (wrong: label + 1)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    right = dict(zip(MODELS, (0.95, 0.7, 0.4), strict=True))
    preds = {m: np.where(rng.random(n) < p, labels, (labels + 1) % 10) for m, p in right.items()}
    return preds, labels


def test_tags_make_every_input_distinct_and_stay_small() -> None:
    x = np.zeros((5, 64), np.float32)
    rows = np.array([0, 1, 2, 3, 4, 0, 1, 2, 3, 4])  # two passes over the same rows
    one, two = plain_stream(x, np.arange(5), rows, 0), plain_stream(x, np.arange(5), rows, 10)
    assert all_distinct([one, two])
    assert not all_distinct([one, plain_stream(x, np.arange(5), rows, 5)])  # serials 5..9 twice
    assert float(np.abs(one.x - x[rows]).max()) <= 0.11 and one.x.dtype == np.float32
    assert tagged(x[:1], 1234)[0, 56] == np.float32(1) * np.float32(1e-4)  # serial 1234: pixel 56 carries the 1


@pytest.mark.parametrize("policy", [Exp3Policy(), Exp4Policy()])
def test_feedback_seen_at_once_is_the_offline_benchmarks_replay(policy) -> None:
    preds, labels = _stream(400)
    ours = replay(policy, MODELS, preds, labels, seed=7)
    assert np.array_equal(ours, offline_replay(policy, MODELS, preds, labels, seed=7)["correct"])
    assert np.array_equal(ours, replay(policy, MODELS, preds, labels, seed=7, visible=np.arange(400)))


def test_feedback_seen_late_slows_learning() -> None:
    # b and c agree (and are wrong) on every query, a alone is right: Exp4 needs feedback to outvote them
    labels = np.arange(200) % 10
    preds = {"a": labels.copy(), "b": (labels + 1) % 10, "c": (labels + 1) % 10}
    at_once = replay(Exp4Policy(), MODELS, preds, labels, seed=0)
    never = replay(Exp4Policy(), MODELS, preds, labels, seed=0, visible=np.zeros(200, np.int64))
    late = replay(Exp4Policy(), MODELS, preds, labels, seed=0, visible=np.maximum(0, np.arange(200) - 50))
    assert never.sum() == 0  # the first state throughout: the majority wins
    assert at_once[:40].sum() > late[:40].sum() == 0  # nothing seen during the first 50 queries
    assert at_once[60:].all() and late[60:].all()


def test_per_user_states_beat_one_state_when_users_differ() -> None:
    # user 0: a is right and b wrong; user 1: the other way round
    n = 600
    users = np.arange(n) % 2
    labels = np.zeros(n, np.int64)
    preds = {"a": np.where(users == 0, 0, 1), "b": np.where(users == 1, 0, 1), "c": np.ones(n, np.int64)}
    policy = Exp3Policy(eta=0.5)
    per_user = [replay_users(policy, MODELS, preds, labels, users, s).mean() for s in range(5)]
    app_wide = [replay(policy, MODELS, preds, labels, s).mean() for s in range(5)]
    assert min(per_user) > max(app_wide)
    frozen = replay_users(policy, MODELS, preds, labels, users, 0, np.zeros(n), np.zeros(n))
    assert abs(frozen.mean() - 1 / 3) < 0.08  # never learns: one of three models drawn uniformly
    assert np.array_equal(
        replay_users(policy, MODELS, preds, labels, users, 3),
        replay_users(policy, MODELS, preds, labels, users, 3, user_due(users), np.arange(n)),
    )


def test_band_counts_windows_inside_the_seeds_range() -> None:
    live = np.array([1, 1, 0, 0, 1, 1], bool)  # windows of 2: 1.0, 0.0, 1.0
    replays = np.array([[1, 0, 1, 0, 1, 1], [1, 1, 1, 1, 0, 1], [0, 1, 1, 1, 1, 1]], bool)
    b = band(live, replays, 2)
    assert [w["live"] for w in b["per_window"]] == [1.0, 0.0, 1.0]
    assert [w["inside"] for w in b["per_window"]] == [True, False, True]  # the seeds' second window: 0.5..1.0
    assert (b["windows_inside"], b["windows"], b["inside_share_by_chance"]) == (2, 3, 0.5)
    assert b["live_rank"] == 0 and b["replay_accuracy"]["min"] == pytest.approx(4 / 6)
    assert list(window_means(np.ones(5), 2)) == [1.0, 1.0, 1.0]


def test_lags_in_queries_and_in_the_age_of_the_oldest_unseen_update() -> None:
    visible = np.array([0, 0, 0, 2, 2])  # query 3 saw updates 0 and 1, not 2
    query_at = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    feedback_at = query_at + 0.5
    out = lags(visible, query_at, feedback_at)
    assert out["queries"]["max"] == 2 and out["queries"]["mean"] == pytest.approx((0 + 1 + 2 + 1 + 2) / 5)
    assert out["ms"]["max"] == pytest.approx(1500.0)  # query 2 at 2.0 s had not seen feedback 0, sent at 0.5 s
    per_user = lags(np.array([0, 0, 1]), query_at[:3], feedback_at[:3], due=np.array([0, 1, 1]))
    assert per_user["queries"]["max"] == 1 and "ms" not in per_user


def test_a_live_run_counts_defaults_errors_and_missing_records() -> None:
    run = LiveRun("app", outputs=[1, 2, 3, None], defaults=[False, True, False, False], statuses=[200, 200, 200, 0])
    assert run.correct(np.array([1, 2, 4, 1])).tolist() == [True, False, False, False]
    run.records = [{"selection": {"state_version": 0}}, None, {"selection": {"state_version": 2}}, None]
    assert run.visible().tolist() == [0, -1, 2, -1]
    assert visible_from(run).tolist() == [0, 0, 2, 2]
    assert user_due(np.array([4, 4, 1, 4])).tolist() == [0, 1, 0, 2]


def test_the_broken_model_answers_a_permuted_label(tmp_path) -> None:
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    from bench.live_selection.broken import broken_model, permutation

    graph = helper.make_graph(
        [helper.make_node("ArgMax", ["input"], ["label"], axis=1, keepdims=0)],
        "argmax",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, 10])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, [None])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "ok.onnx"))
    target = broken_model(tmp_path / "ok.onnx", tmp_path / "broken.onnx")
    x = np.eye(10, dtype=np.float32)[random.Random(0).choices(range(10), k=50)]
    (got,) = ort.InferenceSession(str(target)).run(None, {"input": x})
    assert got.tolist() == permutation()[x.argmax(1)].tolist()
    assert (permutation() != np.arange(10)).all()  # no class keeps its label


def test_a_stream_says_its_user() -> None:
    s = Stream(np.arange(2), np.zeros((2, 64), np.float32), np.arange(2), np.array([3, 5]), ("g",) * 6)
    assert (s.uid(1), len(s), Stream(np.arange(1), np.zeros((1, 64)), np.arange(1)).uid(0)) == (5, 2, None)


def test_the_app_wide_stream_names_no_user_and_the_per_user_one_does() -> None:
    """global-exp3 sends the personalisation stream without ``uid`` (else the frontend would select per user,
    and the run would measure per-user Exp3 under the app-wide name); user-exp3 sends it with."""
    from bench.live_selection.__main__ import build_streams
    from bench.live_selection.config import QUICK

    rng = np.random.default_rng(0)
    streams = build_streams(QUICK, rng.random((QUICK.rows, 64)).astype(np.float32), rng.integers(0, 10, QUICK.rows))
    users, app_wide = streams["user-exp3"], streams["global-exp3"]
    assert users.users is not None and app_wide.users is not None
    assert [users.uid(t) for t in range(len(users))] == users.users.tolist()
    assert {app_wide.uid(t) for t in range(len(app_wide))} == {None}
