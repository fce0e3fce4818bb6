"""Benchmarks record the machine's load and say when their figures are not comparable."""

from benchmarks.common import THREADS, finish_notes, load_line, machine_notes


def test_a_quiet_run_is_marked_comparable() -> None:
    notes = {"load_avg_before": 0.2, "load_avg_after": 0.4, "loaded": False}
    line = load_line(notes)
    assert "0.20 before, 0.40 after" in line
    assert line.endswith(": comparable")


def test_a_loaded_run_is_recorded_and_flagged_not_refused() -> None:
    notes = {"load_avg_before": THREADS + 3.0, "load_avg_after": 0.1, "loaded": True}
    line = load_line(notes)
    assert f"{THREADS + 3.0:.2f} before" in line
    assert "not comparable" in line


def test_machine_notes_record_load_before_and_after() -> None:
    notes = machine_notes()
    finish_notes(notes)
    assert {"load_avg_before", "load_avg_after", "loaded"} <= notes.keys()
    assert isinstance(notes["loaded"], bool)
    assert "before" in load_line(notes)
