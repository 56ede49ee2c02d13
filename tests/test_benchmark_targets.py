"""Heads against the drafts' targets: which lossy decoding is judged, each value, and whether it is met."""

from ssd_bench.targets import lossy_default, targets_table

AR = {"heads": "-", "decoding": "ar", "passes": 256, "seconds": 2.0, "frechet": 50.0, "acceptance": [], "drafting": 0}


def row(heads, decoding, passes, frechet, first, adherence_diff, drafting, seconds=1.0):
    return {
        "heads": heads,
        "decoding": decoding,
        "passes": passes,
        "frechet": frechet,
        "acceptance": [first, 0.7],
        "adherence_diff": adherence_diff,
        "drafting": drafting,
        "seconds": seconds,
    }


ROWS = [
    AR,
    row("good", "ssd r=2", 54, 300.0, 0.5, -0.1, 0.2),
    row("good", "ssd W=17 r=4", 60, 74.0, 0.61, -0.01, 0.1),  # within 1.5x of AR's 50: judged
    row("good", "ssd W=17 r=6", 70, 60.0, 0.62, 0.0, 0.1),  # within too, more passes
    row("good", "exact", 50, 55.0, 0.6, 0.02, 0.3, seconds=0.5),
    row("weak", "ssd r=2", 54, 700.0, 0.3, -0.13, 0.06),
    row("weak", "ssd W=17 r=6", 72, 76.0, 0.36, -0.14, 0.14),  # just past 1.5x: none is within
    row("weak", "exact", 85, 65.0, 0.33, 0.0, 0.13, seconds=1.0),
]


def cells(lines, measure):
    (line,) = [line for line in lines if line.startswith(f"| {measure} |")]
    return line.strip("| ").split(" | ")[1:]


def test_the_lossy_decoding_judged_is_the_fewest_passes_within_the_frechet_budget_else_r2():
    by_decoding = {r["decoding"]: r for r in ROWS[1:5]}
    assert lossy_default(by_decoding, AR) == "ssd W=17 r=4"
    assert lossy_default({r["decoding"]: r for r in ROWS[5:]}, AR) == "ssd r=2"
    assert cells(targets_table(ROWS), "lossy decoding judged")[1:] == ["ssd W=17 r=4", "ssd r=2"]


def test_each_target_shows_its_bound_value_and_whether_it_is_met():
    lines = targets_table(ROWS)
    assert lines[0] == "| target | bound | good | weak |"
    assert cells(lines, "lossy: first-round acceptance") == [">= 0.60", "0.61 (met)", "0.30"]
    assert cells(lines, "lossy: Fréchet distance against AR's") == ["<= 1.5x", "1.5x (met)", "14.0x"]
    assert cells(lines, "lossy: adherence lost against AR") == ["<= 0.030", "0.010 (met)", "0.130"]
    assert cells(lines, "lossy: fewer passes than AR") == [">= 5.0x", "4.3x", "4.7x"]
    assert cells(lines, "lossy: drafting share of a call") == ["<= 15%", "10% (met)", "6% (met)"]
    assert cells(lines, "exact: fewer passes than AR") == [">= 5.0x", "5.1x (met)", "3.0x"]
    assert cells(lines, "exact: faster than AR, one image") == [">= 2.5x", "4.0x (met)", "2.0x"]
    assert cells(lines, "exact: drafting share of a call") == ["<= 15%", "30%", "13% (met)"]


def test_adherence_gained_against_ar_is_no_loss():
    gained = [AR, row("h", "ssd r=2", 54, 60.0, 0.6, +0.05, 0.1), row("h", "exact", 80, 50.0, 0.5, 0.0, 0.1)]
    assert cells(targets_table(gained), "lossy: adherence lost against AR") == ["<= 0.030", "0.000 (met)"]
