"""Shared test fixtures: every test that takes `device` runs on CPU and, when
a GPU is present, on CUDA too -- the same suite on both backends."""

import pytest
import torch

import baracuda_torch  # noqa: F401  (registers torch.ops.baracuda)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture
def rng():
    """A seeded generator, so a failure reproduces."""
    g = torch.Generator().manual_seed(1234)
    return g


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device")
