import os

import pytest
import torch

# 2 threads unless REINFORGE_TEST_THREADS says otherwise (`make test` re-runs the numerics tests with 1);
# 1 in each pytest-xdist worker (`make test` runs 2 workers, which already share the cores)
TEST_THREADS = int(os.environ.get("REINFORGE_TEST_THREADS", "1" if "PYTEST_XDIST_WORKER" in os.environ else "2"))
torch.set_num_threads(TEST_THREADS)
# train.autocast=auto (the default recipe's) resolves to float32 in every test and every run a test starts, on any
# CPU: a result must not depend on whether this CPU has bf16 instructions (tests that want bf16 ask for it)
os.environ.setdefault("REINFORGE_CPU_BF16", "0")


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """Every test starts with TEST_THREADS torch threads, whatever an earlier test (or a training loop
    it ran in this process) set."""
    torch.set_num_threads(TEST_THREADS)
    yield


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from reinforge.models.loading import load_tokenizer

    return load_tokenizer("tiny-base")


@pytest.fixture()
def tiny_model():
    from reinforge.models.loading import load_model

    return load_model("tiny-base")


def pytest_collection_modifyitems(config, items):
    """End-to-end runs (marked ``slow``) first, the longest of them (also ``heavy``) at the very front,
    each in their collected order. `make test` runs xdist with
    ``--dist worksteal``: each worker starts on its share of the list and an idle worker takes half of
    the rest of a busy one's queue, from its end; with the long runs at the front they start early and
    the short tests fill the end, so the workers finish within about one short test of each other.
    (``--dist load`` hands out the first quarter of the list round-robin and never rebalances it: one
    worker was left running its half of the long runs alone for minutes.)"""
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, item.get_closest_marker("heavy") is None))
    if os.environ.get("REINFORGE_TEST_DEVICE", "cuda").startswith("cuda") and not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU: scripts/device_check.py runs these on a GPU machine (docs/gpu.md)")
        for item in items:
            if item.get_closest_marker("cuda") is not None:
                item.add_marker(skip)
