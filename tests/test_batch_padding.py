"""``Batch.from_trajectories``: right-padded rows, hand-checked field by field."""

import torch

from reinforge.types import Batch, Trajectory


def test_rows_are_right_padded_and_an_untrainable_row_has_no_loss():
    trajs = [
        Trajectory([1, 5, 6], [0, 1, 1], [0.0, -0.5, -0.25], version=0, group_id=0, task_id="a", reward=1.0),
        Trajectory([1, 7], [0, 1], [0.0, -1.5], version=0, group_id=0, task_id="a", reward=0.0),
        Trajectory([2, 8, 9, 3], [0, 0, 1, 1], [0.0, 0.0, -0.125, -2.0], version=0, group_id=1, task_id="b",
                   reward=0.5, trainable=False),
    ]
    batch = Batch.from_trajectories(trajs, pad_id=4)
    assert batch.input_ids.tolist() == [[1, 5, 6, 4], [1, 7, 4, 4], [2, 8, 9, 3]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert batch.loss_mask.tolist() == [[0, 1, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]]
    assert batch.sampling_logprobs.tolist() == [[0.0, -0.5, -0.25, 0.0], [0.0, -1.5, 0.0, 0.0], [0.0, 0.0, -0.125, -2.0]]
    assert batch.prefix_len.tolist() == [1, 1, 2]
    assert batch.group_index.tolist() == [0, 0, 1]
    assert batch.rewards.tolist() == [1.0, 0.0, 0.5]
    assert batch.input_ids.dtype == batch.attention_mask.dtype == torch.long
    assert batch.loss_mask.dtype == batch.sampling_logprobs.dtype == torch.float32
