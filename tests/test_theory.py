"""The dynamic-regret simulation of ``atlas.theory``: its parts, its CLI, and the claimed shapes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from atlas.theory import (
    TheoryConfig,
    drift_path,
    loglog_slope,
    simulate,
    sweep,
    total_variation,
    window_estimates,
)
from atlas.theory.__main__ import format_table, main, parse_ints


def test_drift_spends_the_budget_on_the_sphere() -> None:
    rng = np.random.default_rng(0)
    theta = drift_path(rng, 1000, 5, 2.0, 4)
    assert theta.shape == (1000, 5)
    np.testing.assert_allclose(np.linalg.norm(theta, axis=1), 1.0, atol=1e-12)
    tv = total_variation(theta)
    # T-1 chords of angle B/T each: 2 (T-1) sin(B / 2T) <= B, and close to it
    assert tv == pytest.approx(2 * 999 * math.sin(2.0 / 2000), rel=1e-9)
    assert tv <= 2.0
    # real movement: the path ends far from where it started (a random walk would not)
    assert np.linalg.norm(theta[-1] - theta[0]) > 0.5
    still = drift_path(np.random.default_rng(0), 100, 5, 0.0, 4)
    assert total_variation(still) == 0.0


def test_warm_started_newton_tracks_the_exact_window_fit() -> None:
    rng = np.random.default_rng(1)
    n, d, w, reg = 300, 4, 60, 1.0
    theta = np.array([1.5, -1.0, 0.5, 0.0])
    z = rng.standard_normal((1, n, d))
    y = (rng.random((1, n)) < 1 / (1 + np.exp(-z[0] @ theta))).astype(float)
    est = window_estimates(z, y, w, reg, newton_steps=2)[0]
    assert np.all(est[0] == 0.0)  # no data before round 1
    for t in (1, 30, 150, 299):  # the exact minimiser of Eq. 21 by Newton to convergence
        zw, yw = z[0, max(0, t - w):t], y[0, max(0, t - w):t]
        exact = np.zeros(d)
        for _ in range(50):
            p = 1 / (1 + np.exp(-zw @ exact))
            grad = zw.T @ (p - yw) + reg * exact
            hess = (zw * (p * (1 - p))[:, None]).T @ zw + reg * np.eye(d)
            exact -= np.linalg.solve(hess, grad)
        assert np.linalg.norm(est[t] - exact) < 1e-3 * (1 + np.linalg.norm(exact))
    # and with a long stationary window it finds theta (up to the ridge shrinkage)
    big_z = rng.standard_normal((1, 4000, d))
    big_y = (rng.random((1, 4000)) < 1 / (1 + np.exp(-big_z[0] @ theta))).astype(float)
    final = window_estimates(big_z, big_y, 4000, reg, 2)[0, -1]
    assert np.linalg.norm(final - theta) < 0.25


def test_regret_splits_into_bias_and_learning_error() -> None:
    cfg = TheoryConfig(window=30)
    res = simulate(200, [0, 1], cfg)
    for m in ("fixed", "evolving"):
        parts = res[m]
        assert parts["regret"].shape == (2, 200)
        np.testing.assert_allclose(parts["regret"], parts["bias"] + parts["learning"], atol=1e-12)
        assert parts["regret"].min() >= -1e-12  # instantaneous optimum is the best policy
        assert parts["bias"].min() >= -1e-12
    # round 1: no data, both policies are the uniform reference -> identical regret
    np.testing.assert_allclose(res["fixed"]["regret"][:, 0], res["evolving"]["regret"][:, 0])
    assert res["_env"]["window"] == 30 and np.all(res["_env"]["tv"] <= cfg.budget)


def test_fixed_reference_bias_is_set_by_beta() -> None:
    """A uniform reference keeps beta-limited mass on bad arms: its bias shrinks with beta."""
    bias = [simulate(300, [0], TheoryConfig(beta=b))["fixed"]["bias"].sum() for b in (0.3, 0.1)]
    assert bias[0] > 3 * bias[1] > 0


def test_closed_form_evolving_reference_matches_the_explicit_recursion() -> None:
    """A vanishing floor turns the tracked recursion into the closed form used for 'evolving'.

    beta=1 keeps every log-probability above log(1e-300) over 120 rounds; at beta=0.1 the
    evolving reference drops below 1e-100 on bad arms within ~25 rounds (Assumption 2 fails).
    """
    res = simulate(120, [3], TheoryConfig(window=20, beta=1.0, floor=1e-300))
    np.testing.assert_allclose(res["evolving_floor"]["regret"], res["evolving"]["regret"],
                               rtol=1e-7, atol=1e-12)
    assert res["evolving"]["regret"][:, 60:].sum() < 0.5 * res["fixed"]["regret"][:, 60:].sum()
    floored = simulate(120, [3], TheoryConfig(window=20, beta=1.0, floor=1e-2))
    assert not np.allclose(floored["evolving_floor"]["regret"], res["evolving"]["regret"])


def test_common_random_numbers_across_horizons() -> None:
    """One seed, two horizons: same contexts and duels at the start -> same first estimates."""
    cfg = TheoryConfig(window=20, budget=0.0)
    short, long_ = simulate(50, [7], cfg), simulate(100, [7], cfg)
    np.testing.assert_allclose(short["fixed"]["regret"], long_["fixed"]["regret"][:, :50])


def test_config_and_inputs_fail_with_the_field_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"beta=0.*--beta"):
        TheoryConfig(beta=0)
    with pytest.raises(ValueError, match=r"floor=0.5.*1/n_arms"):
        TheoryConfig(floor=0.5)
    with pytest.raises(ValueError, match=r"window=0"):
        TheoryConfig(window=0)
    with pytest.raises(ValueError, match="horizon=1"):
        simulate(1, [0], TheoryConfig())
    with pytest.raises(ValueError, match="seeds"):
        simulate(10, [], TheoryConfig())
    with pytest.raises(ValueError, match="--seeds"):
        parse_ints("0-x", "seeds")
    assert parse_ints("0-2,7", "seeds") == [0, 1, 2, 7]
    assert TheoryConfig(window=None, budget=1.0).window_for(1000) == 100
    assert loglog_slope([10, 100], [3, 300]) == pytest.approx(2.0)


def test_cli_writes_png_json_and_table(tmp_path, capsys) -> None:
    out = tmp_path / "theory.png"
    record = main(["--horizons", "60,120", "--seeds", "0-1", "--window", "20",
                   "--out", str(out)])
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["horizons"] == [60, 120] and saved["seeds"] == [0, 1]
    assert saved["slopes"] == pytest.approx(record["slopes"])
    row = saved["rows"][1]
    assert row["fixed"]["mean"] == pytest.approx(np.mean(row["fixed"]["per_seed"]))
    assert len(saved["curve"]["t"]) == len(saved["curve"]["evolving"]) == 120
    text = capsys.readouterr().out
    assert "slope" in text and format_table(record).splitlines()[0] in text
    with pytest.raises(SystemExit, match="--window"):
        main(["--window", "big", "--out", str(out)])


def test_claimed_shapes_fixed_linear_evolving_sublinear() -> None:
    """Paper 2.3 on small horizons: the fixed reference grows ~linearly, the evolving one not."""
    horizons = [250, 500, 1000, 2000]
    record = sweep(horizons, list(range(5)), TheoryConfig())
    slopes = record["slopes"]
    assert slopes["fixed"] >= 0.85, slopes
    assert slopes["evolving"] <= 0.75, slopes
    last = record["rows"][-1]
    assert last["evolving"]["mean"] < 0.5 * last["fixed"]["mean"]
    # the fixed reference's regret is bias + learning error that both grow linearly
    first = record["rows"][0]
    assert last["fixed"]["bias"] / first["fixed"]["bias"] > 0.85 * 2000 / 250


def test_evolving_reference_lag_grows_with_the_drift_budget() -> None:
    """The honest caveat: the evolving reference sums all past estimates, so it lags the drift."""
    regret = [sweep([1000], list(range(3)), TheoryConfig(budget=b))["rows"][0]["evolving"]["mean"]
              for b in (0.0, 4.0)]
    assert regret[1] > 2 * regret[0]
