"""Cost model, gamma estimator and sparsity characteristics (single process)."""
import math

import numpy as np
import pytest

from zen_hvd import characteristics, costmodel, stats, workloads


def test_universe_estimator_recovers_independence():
    M, k, n = 100_000, 1000, 8
    union = M * (1 - (1 - k / M) ** n)          # independent uniform sets
    gamma = costmodel.gamma_curve(n, k, union / k)
    for m in (2, 3, 4):
        assert math.isclose(gamma(m), M * (1 - (1 - k / M) ** m) / k, rel_tol=1e-6)
    assert costmodel.gamma_curve(n, k, float(n))(4) == 4          # disjoint
    assert costmodel.gamma_curve(n, k, 1.0)(4) == 1.0             # identical


def test_measured_stage_gammas_override_the_estimate():
    gamma = costmodel.gamma_curve(8, 100, 5.0, [1.0, 1.2, 3.0])
    assert gamma(2) == 1.2 and gamma(4) == 3.0 and gamma(8) == 5.0


def test_balanced_bytes_match_the_formula_in_stats():
    M, n, d, g, D = 1_000_000, 8, 0.01, 3.0, 4
    pred = costmodel.predict_bytes(n, M, d, lambda m: g if m == n else 1.0, 4 * D, ["balanced"])
    ref = stats.balanced_bytes_formula(M, n, d, g, D, 4, 4)["total"]
    assert math.isclose(pred["balanced"], ref, rel_tol=1e-9)


def test_hierarchical_beats_balanced_only_without_overlap():
    M, n, d, v = 1_000_000, 16, 0.001, 4
    disjoint = costmodel.predict_bytes(n, M, d, lambda m: m, v, ["balanced", "hierarchical"])
    same = costmodel.predict_bytes(n, M, d, lambda m: 1.0, v, ["balanced", "hierarchical"])
    assert disjoint["hierarchical"] < disjoint["balanced"]
    assert same["balanced"] < same["hierarchical"]


def test_characteristics_of_controlled_sets():
    M = 10_000
    a, b = np.arange(0, 100), np.arange(50, 150)
    assert characteristics.overlap_ratio(a, b) == 0.5
    assert characteristics.densification([a, b]) == 1.5
    assert characteristics.skew_ratio(np.arange(100), M, 4) == 4.0   # all in the first quarter
    sets = workloads.rank_units(M, 4, 0.05, 0.5, 1.0, 0)
    ch = characteristics.characterize(sets, M)
    assert 1 <= ch["gamma_n"] <= 4 and ch["skew_union"] > 1 and ch["push_imbalance"] < 1.5
    assert ch["stage_gammas"][0] == 1.0


def test_characteristics_command_explains_and_writes_every_column(tmp_path, capsys, monkeypatch):
    import csv
    import sys

    out = tmp_path / "ch.csv"
    monkeypatch.setattr(sys, "argv", ["characteristics", "--workload", "dgc", "--ranks", "2", "--out", str(out)])
    characteristics.main()
    text = capsys.readouterr().out
    assert text.splitlines()[1].strip().startswith("reproduce: python -m zen_hvd.characteristics")
    legend = text[text.index("columns:"):]
    assert all(f"  {c} " in legend for c in characteristics.COLUMNS)
    (row,) = list(csv.DictReader(open(out)))
    assert list(row) == ["workload", *characteristics.COLUMNS]
    sets, w = characteristics.workload_sets("dgc", 2, 0)
    ref = characteristics.characterize(sets, w["M"], w["D"])
    assert row["workload"] == "dgc" and int(row["n"]) == 2
    assert math.isclose(float(row["gamma_n"]), ref["gamma_n"]) and math.isclose(float(row["overlap"]), ref["overlap"])


def test_message_steps_count_the_header_round_of_the_schemes_whose_headers_do_not_ride_in_a_push():
    # balanced: Push and Pull, its headers inside the Push; agsparse: one Push of its whole
    # set, the header inside; the others: the header round (header.exchange) first.
    assert costmodel.message_steps(4, "balanced") == 2
    assert costmodel.message_steps(4, "agsparse") == 1
    assert costmodel.message_steps(4, "hierarchical") == 2 * 2 + 1
    assert costmodel.message_steps(6, "hierarchical") == 2 * 2 + 4 + 1   # fold and unfold
    assert costmodel.message_steps(4, "allreduce") == 2 * 3 + 1
    # The schemes the cost model spares the header round are exactly those that do not run
    # planned.Planned's sync (whose header round is header.exchange).
    from zen_hvd.planned import Planned
    from zen_hvd.sync import SCHEMES

    assert set(costmodel.HEADER_IN_PUSH) == {"balanced", "agsparse"}
    assert set(costmodel.HEADER_IN_PUSH) == {s for s, impl in SCHEMES.items() if not isinstance(impl, Planned)}


def test_two_level_bytes_with_one_rank_per_host_are_the_flat_sync():
    b = costmodel.two_level_bytes(8, 1, 200_000, 1900.0, 10_000.0, 1900.0, 256)
    assert b["flat"]["off_host"] == pytest.approx(b["two-level"]["off_host"])
    assert b["flat"]["inside"] == 0 and b["two-level"]["inside"] == 0


def test_two_levels_win_where_a_host_shares_its_rows_and_lose_on_a_small_tensor():
    # 4 hosts x 4 ranks, every rank of a host holding the same rows (gamma_L = 1): each host
    # sends its union once instead of four times, over an in-host link 100x the network's.
    shared = costmodel.two_level_costs(4, 4, 10 ** 6, 1e4, 4e4, 1e4, 256, rate_ratio=0.01)
    assert shared["two-level"] < 0.8 * shared["flat"]
    # a small tensor, disjoint rows inside the host (gamma_L = L): the three rounds more cost
    # more than the few bytes they save
    small = costmodel.two_level_costs(4, 4, 10 ** 4, 100.0, 1600.0, 400.0, 256, rate_ratio=0.01,
                                      round_bytes=128 << 10)
    assert small["flat"] < small["two-level"]


def test_time_model_takes_the_slower_of_wire_and_the_shared_cpu():
    from zen_hvd import timemodel

    g = timemodel.Gradient(M=200_000, D=64, t=4096.0, k=1900.0,
                           unions={1: 1900.0, 2: 3700.0, 3: 5300.0, 4: 6900.0, 8: 10300.0, 16: 15000.0})
    assert timemodel.critical_bytes("horovod-sparse", 8, g) == 7 * 4096 * (8 + 4 * 64)
    assert timemodel.critical_bytes("horovod-dense", 4, g) == 2 * 3 / 4 * 200_000 * 256
    points = [dict(kind="tcp", method="zen-balanced", n=n, rate="1gbit", cpu_s=cpu, time_s=t, rate_bps=1e9,
                   sharing=n / 2, gradient=g) for n, cpu, t in ((2, 0.009, 0.010), (3, 0.007, 0.012))]
    constants = timemodel.calibrate(points)
    assert constants[("tcp", "zen-balanced", "1gbit")] == 0.007          # the largest launch's CPU
    alpha = constants[("tcp", "alpha")]
    assert 0.0 <= alpha <= 1.0
    wire = timemodel.critical_bytes("zen-balanced", 16, g) * 8 / 1e9
    got = timemodel.predict("zen-balanced", 16, g, 1e9, "tcp", constants, sharing=8, rate="1gbit")
    shared = 0.007 * 8                                                    # 16 ranks on 2 cores
    assert got["time"] == pytest.approx(max(wire, shared) + alpha * min(wire, shared)
                                        + timemodel.steps("zen-balanced", 16) * timemodel.LATENCY_S["tcp"])
    # one rank per host with cores of its own: the CPU is not shared out
    alone = timemodel.predict("zen-balanced", 16, g, 1e9, "tcp", constants, rate="1gbit")
    assert alone["cpu"] == pytest.approx(0.007) and alone["time"] < got["time"]
