"""HDA across audits, against values worked out by hand."""

from __future__ import annotations

from fractions import Fraction as F

from holedger.audit.across import Setting, summarize


def test_mean_shares_over_half_and_dominant_term() -> None:
    settings = [
        Setting("a1", "r1", "alf", "decomposed", F(2, 5), (F(5, 8), F(1, 4), F(1, 8))),
        Setting("a2", "r2", "alf", "decomposed", F(1, 5), (F(1, 4), F(0), F(3, 4))),
        Setting("a3", "r3", "math", "decomposed", F(1, 10), (F(0), F(3, 5), F(2, 5))),
        Setting("a4", "r4", "math", "not_significant", None, None),
    ]
    out = summarize(settings)
    assert out["decomposed"] == 3
    # o: (5/8 + 1/4 + 0) / 3 = 7/24; t: (1/4 + 0 + 3/5) / 3 = 17/60; g the rest
    assert out["mean_shares"] == {"o": "7/24", "t": "17/60", "g": "0.425"}  # 17/40
    # o + t: 7/8, 1/4, 3/5 -> a1 and a3 exceed one half
    assert out["o_plus_t_over_half"] == {"count": 2, "audits": ["a1", "a3"]}
    # alf: o sums to 7/8, t to 1/4, g to 7/8: a tie, both named
    assert out["dominant_term_per_task"]["alf"]["term"] == "O/G"
    assert out["dominant_term_per_task"]["math"]["term"] == "T"
    assert [s["status"] for s in out["settings"]][-1] == "not_significant"


def test_no_decomposed_audit_has_no_means() -> None:
    out = summarize([Setting("a", "r", "t", "pending_neutral", None, None)])
    assert out["mean_shares"] is None and out["o_plus_t_over_half"]["count"] == 0


def test_transfer_counts_by_hand() -> None:
    def setting(name: str, delta: F, held: F | None) -> Setting:
        return Setting(name, "r", "t", "decomposed", delta, (F(1), F(0), F(0)), held)

    out = summarize(
        [
            setting("a", F(2, 5), F(3, 10)),  # below 2/5, not below 1/5
            setting("b", F(2, 5), F(1, 10)),  # below 2/5 and below 1/5
            setting("c", F(1, 5), F(-1, 20)),  # below all three
            setting("d", F(1, 5), F(1, 5)),  # equal: below none
            setting("e", F(1, 5), None),  # not scored: left out
        ]
    )
    t = out["transfer"]
    assert t["settings"] == 4
    assert t["below_search"] == {"count": 3, "audits": ["a", "b", "c"]}
    assert t["below_half_search"] == {"count": 2, "audits": ["b", "c"]}
    assert t["below_zero"] == {"count": 1, "audits": ["c"]}


def test_val_selection_counts_by_hand() -> None:
    def setting(name: str, search: F, val: F, below: bool) -> Setting:
        v = {
            "held_out_search_selected": str(search),
            "held_out_val_selected": str(val),
            "improves": val > search,
            "worsens": val < search,
            "val_below_search_gain": below,
        }
        return Setting(name, "r", "t", "decomposed", F(1, 2), (F(1), F(0), F(0)), search, v)

    out = summarize(
        [
            setting("a", F(1, 10), F(3, 10), True),
            setting("b", F(2, 5), F(1, 5), True),
            setting("c", F(1, 5), F(1, 5), False),
        ]
    )["val_selection"]
    assert out["settings"] == 3
    # means: search (1/10 + 2/5 + 1/5)/3 = 7/30; val (3/10 + 1/5 + 1/5)/3 = 7/30
    assert out["mean_held_out_search_selected"] == "7/30"
    assert out["mean_held_out_val_selected"] == "7/30"
    assert out["improves"] == {"count": 1, "audits": ["a"]}
    assert out["worsens"] == {"count": 1, "audits": ["b"]}
    assert out["still_below_search_gain"] == {"count": 2, "audits": ["a", "b"]}
