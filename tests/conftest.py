import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from reinforge.train.model import load_tokenizer

    return load_tokenizer("tiny-base")


@pytest.fixture()
def tiny_model():
    from reinforge.train.model import load_model

    return load_model("tiny-base")
