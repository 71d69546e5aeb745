"""Shared test fixtures: every test that takes `device` runs on CPU and, when
a GPU is present, on CUDA too -- the same suite on both backends.

Test tiers: tests marked ``slow`` (the long parametrized sweeps, the
packaging round trip) run only with ``--runslow`` or BARACUDA_RUNSLOW=1;
scripts/test.sh sets it, so the README's test command runs everything, while
a plain ``pytest tests`` is the quick tier and reports each slow test as
skipped with the way to run it.
"""

import os

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


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run the tests marked slow (BARACUDA_RUNSLOW=1 does the same)")


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device")
    config.addinivalue_line(
        "markers", "slow: a long sweep or build; runs only with --runslow or BARACUDA_RUNSLOW=1")


def run_slow(config) -> bool:
    return config.getoption("--runslow") or os.environ.get("BARACUDA_RUNSLOW", "") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    if run_slow(config):
        return
    skip = pytest.mark.skip(reason="slow tier: run with --runslow or BARACUDA_RUNSLOW=1 "
                                   "(scripts/test.sh does)")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)
