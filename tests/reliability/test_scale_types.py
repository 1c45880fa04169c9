"""softmax_scale accepts any real number (numpy scalars of every width, fractions, ints) and refuses the rest,
in one clear line."""

import fractions
import math

import numpy as np
import pytest
import torch

import autoflash
from conftest import DEVICE
from helpers import assert_matches_reference, make_qkv


@pytest.mark.parametrize("scale", [np.float32(0.1), np.float64(0.1), np.float16(0.1), np.int64(1), fractions.Fraction(1, 10), 2],
                         ids=repr)
def test_real_numbers_are_accepted(scale):
    q, k, v = make_qkv(1, 2, 2, 19, 23, 32, torch.float32, DEVICE, seed=3)
    out, lse = autoflash.attention(q, k, v, softmax_scale=scale, return_lse=True)
    assert_matches_reference(out, lse, q, k, v, False, float(scale))


@pytest.mark.parametrize("scale, error", [(True, TypeError), (np.bool_(True), TypeError), ("0.1", TypeError),
                                          (torch.tensor(0.1), TypeError), (np.array([0.1]), TypeError),
                                          (np.float32("nan"), ValueError), (np.float32("inf"), ValueError),
                                          (np.float32(0), ValueError), (np.float64(-0.5), ValueError),
                                          (10 ** 400, ValueError), (-math.inf, ValueError)], ids=repr)
def test_others_are_refused(scale, error):
    q, k, v = make_qkv(1, 2, 2, 8, 8, 32, torch.float32, DEVICE)
    with pytest.raises(error, match="softmax_scale must be") as refused:
        autoflash.attention(q, k, v, softmax_scale=scale)
    assert "\n" not in str(refused.value)
