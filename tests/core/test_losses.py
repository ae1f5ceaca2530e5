"""Pure targets and losses (core/losses.py) against numbers computed by hand."""

import torch

from ctrl_rl.core.losses import td_target


def test_td_target_uses_min_over_the_given_subset_and_stops_at_termination():
    q_next = torch.tensor([[5.0, 1.0], [2.0, 7.0], [3.0, 0.0]])  # [E=3,B=2]
    y = td_target(q_next, torch.tensor([0, 1]), torch.tensor([1.0, 1.0]), torch.tensor([False, True]),
                  torch.zeros(2), torch.tensor(0.0), 0.5, True)
    assert torch.allclose(y, torch.tensor([1.0 + 0.5 * 2.0, 1.0]))  # min(5, 2) = 2 bootstrapped; terminated -> r
    y2 = td_target(q_next, torch.tensor([2]), torch.tensor([0.0, 0.0]), torch.tensor([False, False]),
                   torch.tensor([1.0, 1.0]), torch.tensor(0.5), 1.0, True)
    assert torch.allclose(y2, torch.tensor([3.0 - 0.5, 0.0 - 0.5]))  # entropy term in the backup
    y3 = td_target(q_next, torch.tensor([2]), torch.tensor([0.0, 0.0]), torch.tensor([False, False]),
                   torch.tensor([1.0, 1.0]), torch.tensor(0.5), 1.0, False)
    assert torch.allclose(y3, torch.tensor([3.0, 0.0]))  # no entropy term in the backup

