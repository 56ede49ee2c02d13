"""How a decoding compares with ar, as every face prints it."""

import pytest

from ssd_pipelines.speedup import against_ar


@pytest.mark.parametrize(
    "passes, seconds, said",
    [
        (100, 1.0, "2.6x fewer forward passes and 1.5x faster than ar"),
        (100, 1.65, "2.6x fewer forward passes and 1.1x slower than ar"),  # was "0.9x less time"
        (100, 1.47, "2.6x fewer forward passes and as fast as ar"),
        (512, 0.5, "2.0x more forward passes and 3.0x faster than ar"),
    ],
)
def test_a_ratio_below_one_is_said_as_slower(passes, seconds, said):
    assert against_ar({"forward_passes": passes, "seconds": seconds}, {"forward_passes": 256, "seconds": 1.5}) == said
