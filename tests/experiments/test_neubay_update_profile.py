"""experiments/model_based_speed/neubay_update_profile.py: a NeuBay update timed under both scan strategies, which
compute the same recurrence, with operator counts; the library's own choice restored afterwards."""

import json

from tests.scripts import experiment_script


def test_both_scan_strategies_are_timed_and_agree_and_the_library_choice_is_restored(tmp_path, monkeypatch):
    from ctrl_rl.core import sequence

    chosen = sequence._scan
    with experiment_script("experiments/model_based_speed/neubay_update_profile.py", "neubay_update_profile") as nup:
        monkeypatch.setattr("sys.argv", ["neubay_update_profile.py", "--device", "cpu", "--rows", "300",
                                         "--tape-len", "50", "--steps", "1", "--repeats", "1", "--profile-steps",
                                         "1", "--top", "3", "--tiny", "--out", str(tmp_path / "p")])
        nup.main()
    assert sequence._scan is chosen
    rec = json.loads((tmp_path / "p.json").read_text())
    times = rec["ms_per_update"]
    assert set(times) == {"blocked", "hillis"} and all(len(v) == 1 for v in times.values())
    assert rec["max_abs_diff_encoder"] < 1e-4
    # the blocked scan steps ~sqrt(T) times, Hillis-Steele log2(T) times: more operator calls at 300+ rows
    prof = rec["profile"]
    assert prof["blocked"]["aten_calls_per_update"] > prof["hillis"]["aten_calls_per_update"] > 0
    assert len(prof["hillis"]["top"]) == 3 and "| hillis |" in (tmp_path / "p.md").read_text()
