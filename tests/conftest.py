import os

import pytest
import torch

# 2 threads unless REINFORGE_TEST_THREADS says otherwise (`make test` re-runs the numerics tests with 1)
torch.set_num_threads(int(os.environ.get("REINFORGE_TEST_THREADS", "2")))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from reinforge.train.model import load_tokenizer

    return load_tokenizer("tiny-base")


@pytest.fixture()
def tiny_model():
    from reinforge.train.model import load_model

    return load_model("tiny-base")
