"""Pure targets and losses (core/losses.py) against numbers computed by hand."""

import torch

from ctrl_rl.core.losses import edac_diversity, td_target


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


def test_edac_diversity_by_hand():
    # E=2 members, B=2 rows, A=2: row 0 gradients (3,4) and (4,3) -> unit vectors with <g0, g1> = 24/25;
    # row 1 gradients (1,0) and (-2,0) -> <g0, g1> = -1. Sum over i != j counts each pair twice; 1/(E-1) = 1.
    g = torch.tensor([[[3.0, 4.0], [1.0, 0.0]], [[4.0, 3.0], [-2.0, 0.0]]])  # [E,B,A]
    assert torch.allclose(edac_diversity(g), torch.tensor((2 * 24 / 25 + 2 * -1.0) / 2))


def test_edac_diversity_of_identical_members_is_one_per_pair_and_zero_gradients_count_zero():
    g = torch.randn(1, 5, 3).expand(4, 5, 3)  # [E=4,B,A] all members alike: every <g_i, g_j> = 1
    assert torch.allclose(edac_diversity(g), torch.tensor(4 * 3 / 3.0), atol=1e-5)  # E(E-1) pairs / (E-1)
    assert edac_diversity(torch.zeros(3, 2, 2)).item() == 0.0  # the 1e-10 keeps a zero gradient finite
