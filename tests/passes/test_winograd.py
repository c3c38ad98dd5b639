"""passes/winograd.py: the weight transform lands U = G g G^T in the packed panels the product reads."""

import numpy as np
import pytest

from passes import winograd
from passes.ir import TVM_ALIGNMENT


@pytest.mark.parametrize("m", winograd.TILE_SIZES)
def test_transformed_weights_land_in_their_panels(m):
    out_channels, channels, panel = 40, 24, 16  # 40 output channels: the last panel is half padding
    weight = np.random.default_rng(m).standard_normal((out_channels, channels, 3, 3)).astype(np.float32)
    packed = winograd.transform_weight(weight, m, panel)
    alpha = m + 2
    assert packed.shape == (alpha * alpha, 3, channels, panel) and packed.dtype == np.float32
    assert packed.ctypes.data % TVM_ALIGNMENT == 0  # ir.constant takes it without a copy
    _, g, _ = winograd.MATRICES[m]
    for o, i in [(0, 0), (17, 5), (39, 23), (31, 11)]:
        want = g @ weight[o, i].astype(np.float64) @ g.T  # alpha x alpha, per channel pair
        np.testing.assert_allclose(packed[:, o // panel, i, o % panel].reshape(alpha, alpha), want, rtol=1e-6, atol=1e-6)
    assert not packed[:, 2, :, out_channels % panel:].any()  # columns past the output channels are zero
