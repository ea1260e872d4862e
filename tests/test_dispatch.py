"""CPU (CI): how the tuner ranks schedules (support/dispatch.py), from made-up times.

The timing itself needs a GPU (tests/test_gpu.py, test_the_tuner_ranks_its_finalists_back_to_back).
"""

import pytest
import torch

from support import dispatch

SCHEDULES = [{"block_m": 128, "block_n": n, "stream_k": sk} for n, sk in [(256, False), (128, True), (64, False), (64, True)]]


def test_the_burst_pass_picks_the_finalists():
    burst = {0: 0.30, 1: 0.10, 2: 0.20, 3: 0.40}
    assert dispatch.finalists(burst, 2) == [1, 2]
    assert dispatch.finalists(burst, 9) == [1, 2, 0, 3]


def test_back_to_back_decides_where_the_regimes_disagree():
    # schedule 1 wins the burst, schedule 2 the loop a program runs: 2 is the pick
    burst = {0: 0.0520, 1: 0.0489, 2: 0.0500, 3: 0.0600}
    loop = {1: 0.0504, 2: 0.0470, 0: 0.0510}
    timed = dispatch.ranking(burst, loop)
    assert [t.index for t in timed] == [2, 1, 0, 3]
    assert timed[0] == dispatch.Timed(2, 0.0500, 0.0470)
    assert timed[-1].loop_ms is None  # not a finalist: ranked by its burst time, after every finalist


def test_a_back_to_back_tie_goes_to_the_faster_burst():
    # where the host sets the loop's pace the finalists tie: the burst time breaks it
    tie = 1 + dispatch.TUNE_TIE / 2
    burst = {0: 0.020, 1: 0.010, 2: 0.015}
    loop = {0: 0.030, 1: 0.030 * tie, 2: 0.030 * tie * tie}
    assert [t.index for t in dispatch.ranking(burst, loop)] == [1, 0, 2]
    # just past the tie: the loop decides
    loop[1] = 0.030 * (1 + 2 * dispatch.TUNE_TIE)
    assert dispatch.ranking(burst, loop)[0].index == 0


def test_a_gap_within_the_windows_spread_is_level_and_the_burst_breaks_it():
    # 3000x5000x2056 on an H100: clusters of four 6% ahead in the burst, 1% behind in three noisy windows (±4%)
    burst = {0: 0.1077, 1: 0.1008, 2: 0.1100}
    loop = {0: 0.1184, 1: 0.1196, 2: 0.1250}
    assert dispatch.ranking(burst, loop)[0].index == 0  # without the spread, past TUNE_TIE: the loop decides
    timed = dispatch.ranking(burst, loop, {0: 0.0010, 1: 0.0045, 2: 0.0010})
    assert [t.index for t in timed] == [1, 0, 2] and timed[0].loop_spread_ms == 0.0045
    # a gap past both spreads: the loop decides
    assert dispatch.ranking(burst, loop, {0: 0.0010, 1: 0.0005, 2: 0.0010})[0].index == 0


def test_a_level_finalist_whose_burst_ties_too_does_not_take_the_pick():
    # 256x14336x4096 on an H100: 128 x 224 alone, one noisy window (±0.0031), called level with the pairs; the
    # bursts 0.2% apart cannot break that tie, so the pairs' median stays the pick (0.0586 ms against 0.0618 in
    # five 0.3-s windows)
    burst = {0: 0.0622, 1: 0.0621, 2: 0.0630}
    loop = {0: 0.0575, 1: 0.0592, 2: 0.0593}
    assert dispatch.ranking(burst, loop, {0: 0.0000, 1: 0.0031, 2: 0.0027})[0].index == 0


def test_every_schedule_is_ranked_once():
    burst = {index: 0.1 + 0.01 * ((index * 7) % 19) for index in range(19)}
    chosen = dispatch.finalists(burst)
    timed = dispatch.ranking(burst, {index: 1.0 - burst[index] for index in chosen})
    assert sorted(t.index for t in timed) == list(range(19))
    assert [t.index for t in timed[:len(chosen)]] == sorted(chosen, key=lambda i: -burst[i])


def test_the_report_names_both_regimes_and_the_pick_first():
    timed = dispatch.ranking({0: 0.0489, 1: 0.0500, 2: 0.0600, 3: 0.0700}, {0: 0.0504, 1: 0.0470})
    text = dispatch.tuning_report(timed, SCHEDULES)
    header, _, first, second, third, _ = text.splitlines()
    assert "back to back" in header and "burst" in header and "pick" in header
    assert first.split() == ["0.0470", "ms", "±0.0000", "0.0500", "ms", "block_m=128", "block_n=128", "stream_k=True"]
    assert second.split()[:5] == ["0.0504", "ms", "±0.0000", "0.0489", "ms"]
    assert third.split()[:3] == ["-", "0.0600", "ms"]


def test_back_to_back_operand_sets_rotate_past_l2_and_keep_the_other_arguments():
    def args(m, n, k, device):
        a = torch.empty(m, k, dtype=torch.float16, device=device)
        b = torch.empty(n, k, dtype=torch.float16, device=device)
        return (m, n, k, a, b, torch.empty(m, n, dtype=torch.float16, device=device), 132, 11, 22)

    small = args(64, 64, 64, "cpu")  # 24 KiB a set: as many sets as the cap allows
    sets = dispatch.loop_sets(small)
    assert len(sets) == dispatch.TUNE_SETS_MAX and sets[0] == small
    for m, n, k, a, b, c, *rest in sets[1:]:
        assert (m, n, k, *rest) == (64, 64, 64, 132, 11, 22)
        assert a.shape == small[3].shape and b.shape == small[4].shape and c.shape == small[5].shape
        assert a.dtype == torch.float16 and a.std() > 0.5  # random normal, never zeros
    assert len({x[3].data_ptr() for x in sets}) == len(sets)  # distinct operands
    large = args(8192, 8192, 8192, "meta")  # 384 MiB a set: the caller's and one more
    assert len(dispatch.loop_sets(large)) == 2


def test_without_room_for_copies_the_loop_rotates_what_fits(monkeypatch):
    made = []

    def random_like(x):
        if len(made) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory")
        made.append(x)
        return torch.empty_like(x)

    monkeypatch.setattr(dispatch, "random_like", random_like)
    a, b, c = torch.empty(64, 64), torch.empty(64, 64), torch.empty(64, 64)
    assert len(dispatch.loop_sets((64, 64, 64, a, b, c))) == 2  # the caller's set and the one that fit


def test_fp8_operands_get_random_fp8_copies():
    a = torch.zeros(32, 64, dtype=torch.float8_e4m3fn)
    copy = dispatch.random_like(a)
    assert copy.dtype == a.dtype and copy.shape == a.shape and copy.float().abs().sum() > 0


def test_a_window_holds_enough_calls_and_not_too_many():
    assert dispatch.calls_in(dispatch.TUNE_WINDOW_S, 0.05) == int(dispatch.TUNE_WINDOW_S / 0.05e-3)
    assert dispatch.calls_in(dispatch.TUNE_WINDOW_S, 50.0) == 10
    assert dispatch.calls_in(dispatch.TUNE_WINDOW_S, 1e-5) == 50_000


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the driver's count is used (tests/test_gpu.py)")
def test_clusters_of_four_take_the_sms_they_fill_without_a_gpu_all_of_them():
    # v9's last argument: the SMs clusters of four fill at once (the driver's count on a GPU, tests/test_gpu.py);
    # building without a GPU, every whole cluster of the SM count given
    import matmul_v9

    args = dispatch.kernel_args(matmul_v9.KERNELS["hopper"], 4096, 4096, 4096, 0, 0, 0, num_sms=130)
    assert args[6] == 130 and args[-1] == 128
    assert len(dispatch.kernel_args(matmul_v9.KERNELS["blackwell"], 4096, 4096, 4096, 0, 0, 0)) == 9
