"""cost_model.ep_chunks: the micro-chunk pipeline model of an expert-parallel layer."""

from __future__ import annotations

import pytest

from trex.cost_model.ep_chunks import (
    choose_chunks,
    chunked_backward_seconds,
    chunked_layer_seconds,
    chunked_step_seconds,
)


def test_one_chunk_is_the_serial_layer():
    assert chunked_layer_seconds(3.0, 2.0, 4.0, 0.5, 1, counts_s=0.25) == pytest.approx(0.25 + 3 + 2 + 4)


def test_two_chunks_overlap_the_second_dispatch_and_the_first_combine_with_the_experts():
    # d = b = c = 2, no latency: link D1 [0,1] D2 [1,2]; E1 [1,2]; B1 [2,3]; E2 [2,3]; B2 [3,4]
    assert chunked_layer_seconds(2.0, 2.0, 2.0, 0.0, 2) == pytest.approx(4.0)
    # every chunk pays the latency again: each exchange message costs alpha + its share of the bytes
    assert chunked_layer_seconds(2.0, 2.0, 2.0, 1.0, 2) > chunked_layer_seconds(2.0, 2.0, 2.0, 0.0, 2)


def test_the_split_is_chosen_only_when_it_pays():
    latency_bound = choose_chunks(13e-3, 0.3e-3, 13e-3, 10e-3, counts_s=10e-3)
    assert latency_bound.chunks == 1 and "one chunk" in latency_bound.reason
    balanced = choose_chunks(1e-3, 2e-3, 1e-3, 10e-6, counts_s=10e-6)
    assert balanced.chunks > 1 and balanced.seconds[balanced.chunks] < 0.95 * balanced.seconds[1]
    assert f"{balanced.chunks} chunks save" in balanced.reason
    assert choose_chunks(1e-3, 2e-3, 1e-3, 10e-6, max_chunks=1).chunks == 1  # one token cannot be split


def test_the_backward_and_the_weight_gradient_sums_are_part_of_the_choice():
    # forward alone: the link (d + c = 4) dwarfs the experts (1): splitting saves little
    forward_only = choose_chunks(2e-3, 1e-3, 2e-3, 0.0)
    with_backward = choose_chunks(2e-3, 1e-3, 2e-3, 0.0, experts_backward_s=4e-3)

    def saved(choice):
        return (choice.seconds[1] - choice.seconds[choice.chunks]) / choice.seconds[1]

    # the backward's experts (4) can hide both gradient exchanges: the split pays more over the whole step
    assert saved(with_backward) > saved(forward_only)
    assert "experts backward 4.000 ms" in with_backward.reason
    # each extra chunk's weight-gradient sum is paid once per chunk beyond the first
    costly = choose_chunks(2e-3, 1e-3, 2e-3, 0.0, experts_backward_s=4e-3, extra_chunk_s=1e-3)
    assert costly.seconds[4] == pytest.approx(with_backward.seconds[4] + 3e-3)
    assert costly.seconds[1] == pytest.approx(with_backward.seconds[1])
    assert chunked_step_seconds(2e-3, 1e-3, 2e-3, 0.0, 2) == pytest.approx(
        chunked_layer_seconds(2e-3, 1e-3, 2e-3, 0.0, 2)
    )


def test_the_choice_prices_the_experts_at_each_chunk_count_own_rows():
    # the link and the experts balanced: splitting pays when a chunk's experts cost their share of the rows
    proportional = choose_chunks(2e-3, 2e-3, 2e-3, 0.0, experts_backward_s=4e-3)
    assert proportional.chunks > 1
    # the same layer where every call of the experts costs as much as all rows (a fixed cost per call, e.g. a
    # GEMM padded to its tile): n chunks pay n times the experts, and the split no longer pays
    fixed = {n: (n * 2e-3, n * 4e-3) for n in (1, 2, 4)}
    per_call = choose_chunks(2e-3, 2e-3, 2e-3, 0.0, experts_backward_s=4e-3, experts_by_chunks=fixed)
    assert per_call.chunks == 1, per_call.reason
    assert per_call.seconds[1] == pytest.approx(proportional.seconds[1])
    assert per_call.seconds[4] > proportional.seconds[4]
    assert "4 calls 8.000 / 16.000 ms" in per_call.reason


def test_a_backward_without_weight_gradients_of_its_own_is_the_one_node_pipeline():
    for chunks in (1, 2, 4):
        assert chunked_backward_seconds(3.0, 2.0, 0.0, 4.0, 0.5, chunks) == pytest.approx(
            chunked_layer_seconds(3.0, 2.0, 4.0, 0.5, chunks)
        )


def test_weight_gradients_after_the_data_gradients_let_the_dispatch_gradient_leave_earlier():
    # link-bound (combine gradient 2, experts backward 2 of which 1 weight gradients, dispatch gradient 2, 2 chunks):
    # link C1 [0,1] C2 [1,2]; I1 [1,1.5]; W1 fills the wait for C2 [1.5,2]; D1 [2,3]; I2 [2,2.5]; W2 [2.5,3];
    # D2 [3,4]: the link's 4.0, as without the split (E1 [1,2], D1 [2,3], E2 [2,3], D2 [3,4])
    split = chunked_backward_seconds(2.0, 1.0, 1.0, 2.0, 0.0, 2)
    whole = chunked_backward_seconds(2.0, 2.0, 0.0, 2.0, 0.0, 2)
    assert split == pytest.approx(4.0) and split <= whole
    # compute-bound: experts backward 6 per layer; the split issues each dispatch gradient 1.5 earlier
    split = chunked_backward_seconds(2.0, 3.0, 3.0, 2.0, 0.0, 2)
    whole = chunked_backward_seconds(2.0, 6.0, 0.0, 2.0, 0.0, 2)
    assert split < whole
    # nothing waits for the last weight gradients but the end of the layer: they count once, after the data ones
    assert chunked_backward_seconds(0.0, 1.0, 5.0, 0.0, 0.0, 1) == pytest.approx(6.0)


def test_the_choice_reports_the_weight_gradient_part():
    choice = choose_chunks(2e-3, 1e-3, 2e-3, 0.0, experts_backward_s=4e-3, experts_weight_backward_s=2e-3)
    assert "(2.000 ms weight gradients)" in choice.reason
    assert choice.seconds[2] <= choose_chunks(2e-3, 1e-3, 2e-3, 0.0, experts_backward_s=4e-3).seconds[2]
