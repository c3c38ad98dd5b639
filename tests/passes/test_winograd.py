"""passes/winograd.py: the weight transform lands U = G g G^T in the packed panels the product reads."""

import numpy as np
import pytest

from relaxc.passes import winograd
from relaxc.passes.dense import pack_panels
from relaxc.passes.dispatch import blocked_taps
from relaxc.passes.ir import TVM_ALIGNMENT
from relaxc.passes.layout_algebra import pack_conv_weight


@pytest.mark.parametrize("out_channels, channels, block, panel", [
    (40, 24, 8, 16),  # the last panel half padding
    (48, 16, 16, 24),  # a 16-channel block across two 24-column panels
    (40, 20, 8, 24),  # padded input channels, a panel of three blocks
])
def test_blocked_taps_are_the_unblocked_weights_packed(out_channels, channels, block, panel):
    weight = np.random.default_rng(panel).standard_normal((out_channels, channels, 3, 3)).astype(np.float32)
    kernel, _, _ = pack_conv_weight(weight, 1, block, block)  # OIHW{i}i{o}o, channels padded to the block
    padded = np.zeros((kernel.shape[0] * block, kernel.shape[1] * block, 3, 3), np.float32)
    padded[:out_channels, :channels] = weight
    taps = blocked_taps(kernel, panel)
    np.testing.assert_array_equal(taps, pack_panels(padded.reshape(*padded.shape[:2], 9).T, panel))
    assert taps.ctypes.data % TVM_ALIGNMENT == 0


@pytest.mark.parametrize("m", winograd.TILE_SIZES)
def test_transformed_weights_land_in_their_panels(m):
    out_channels, channels, panel = 40, 24, 16  # 40 output channels: the last panel is half padding
    weight = np.random.default_rng(m).standard_normal((out_channels, channels, 3, 3)).astype(np.float32)
    packed = winograd.transform_weight(pack_panels(weight.reshape(out_channels, channels, 9).T, panel), m)
    alpha = m + 2
    assert packed.shape == (alpha * alpha, 3, channels, panel) and packed.dtype == np.float32
    assert packed.ctypes.data % TVM_ALIGNMENT == 0  # ir.constant takes it without a copy
    _, g, _ = winograd.MATRICES[m]
    for o, i in [(0, 0), (17, 5), (39, 23), (31, 11)]:
        want = g @ weight[o, i].astype(np.float64) @ g.T  # alpha x alpha, per channel pair
        np.testing.assert_allclose(packed[:, o // panel, i, o % panel].reshape(alpha, alpha), want, rtol=1e-6, atol=1e-6)
    assert not packed[:, 2, :, out_channels % panel:].any()  # columns past the output channels are zero
