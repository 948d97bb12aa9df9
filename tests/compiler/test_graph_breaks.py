"""A model trex cannot capture whole: every break is listed with its line; fallback='eager' runs it."""

import pytest
import torch

import trex


class DataDependentBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(8, 8)
        self.second = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.first(x)
        if h.sum().item() > 0:  # data-dependent Python control flow: a graph break
            h = h * 2
        h = torch.relu(h)
        active = torch.nonzero(h).shape[0]  # an output shape that depends on data: a second break
        return self.second(h).sum() + active


def test_graph_breaks_raise_capture_error_listing_each_with_its_source_line():
    model = DataDependentBranch()
    compiled = trex.compile(model)
    with pytest.raises(trex.CaptureError) as error:
        compiled(torch.randn(4, 8))
    message = str(error.value)
    assert "graph break" in message and "DataDependentBranch" in message
    assert "test_graph_breaks.py" in message
    assert "h.sum().item() > 0" in message
    assert "torch.nonzero(h).shape[0]" in message
    assert "2 graph break(s)" in message
    assert "fallback='eager'" in message


def test_fallback_eager_runs_region_by_region_says_so_and_matches_eager():
    torch.manual_seed(0)
    model = DataDependentBranch()
    x = torch.randn(4, 8)
    compiled = trex.compile(model, fallback="eager")
    with pytest.warns(trex.TrexFallbackWarning, match="not captured whole") as warned:
        loss = compiled(x)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = model(x)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for got, want in zip(grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(got, want)
    assert len(compiled.trex.graphs) >= 2 and compiled.trex.graph_breaks
    assert "test_graph_breaks.py" in str(warned[0].message)


def test_unknown_fallback_is_refused():
    with pytest.raises(trex.TrexError, match="unknown fallback 'python'"):
        trex.compile(DataDependentBranch(), fallback="python")


def test_compile_refuses_what_is_not_a_module():
    with pytest.raises(trex.TrexError, match="takes a torch.nn.Module"):
        trex.compile(lambda x: x)
