"""The disk KV tier: a pinned branch head's pages are written to files, and a new engine (a
restarted worker) on the same directory loads them instead of recomputing, with the same
greedy output."""

from __future__ import annotations

from pathlib import Path

from engine.cache.host_tier import page_keys
from engine.engine import Engine
from engine.models.loader import LoadedModel
from engine.protocol import Extend
from engine.sampling_params import SamplingParams
from tests.engine.test_engine_core import finished, make_engine, prompt

PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def first_life(loaded: LoadedModel, kv_dir: Path, **config: object) -> list[int]:
    """Run one turn bound to "t1", pin it (which writes it out); the path it leaves."""
    engine = make_engine(loaded, kv_dir=str(kv_dir), kv_disk_bytes=1 << 20, **config)
    path = prompt(50)
    engine.submit(Extend("a", "ns", None, path, PARAMS, bind_turn_id="t1"))
    out = finished(engine.run_until_idle())["a"].output_token_ids
    assert engine.pin("t1", 60)
    engine.check_invariants()
    return [*path, *out, *prompt(10, 4000)]


def next_turn(engine: Engine, path: list[int]) -> tuple[list[int], int]:
    engine.submit(Extend("b", "ns", None, path, PARAMS))
    done = finished(engine.run_until_idle())["b"]
    engine.check_invariants()
    return done.output_token_ids, done.cached_len


def test_a_restarted_engine_loads_the_pinned_head_from_disk(tiny: LoadedModel,
                                                           tmp_path: Path) -> None:
    path = first_life(tiny, tmp_path)
    restarted = make_engine(tiny, kv_dir=str(tmp_path), kv_disk_bytes=1 << 20)
    output, cached_len = next_turn(restarted, path)
    cold, cold_cached = next_turn(make_engine(tiny), path)
    assert output == cold and cold_cached == 0
    assert cached_len >= 48 and restarted.tiers.disk is not None  # 12 of 14 whole pages
    assert restarted.tiers.disk.num_loaded == cached_len // 4


def test_a_damaged_page_file_is_recomputed(tiny: LoadedModel, tmp_path: Path) -> None:
    path = first_life(tiny, tmp_path)
    (model_dir,) = tmp_path.iterdir()
    (model_dir / f"{page_keys('ns', path, 4)[5].hex()}.kv").write_bytes(b"short")  # page 6
    restarted = make_engine(tiny, kv_dir=str(tmp_path), kv_disk_bytes=1 << 20)
    output, cached_len = next_turn(restarted, path)
    assert output == next_turn(make_engine(tiny), path)[0]
    assert cached_len == 5 * 4  # pages before the damaged one


def test_the_directory_stays_within_its_bound(tiny: LoadedModel, tmp_path: Path) -> None:
    engine = make_engine(tiny, kv_dir=str(tmp_path), kv_disk_bytes=6 * 2048)
    for i in range(3):
        engine.submit(Extend(f"r{i}", "ns", None, prompt(30, 100 + 1000 * i), PARAMS,
                             bind_turn_id=f"t{i}"))
        engine.run_until_idle()
        engine.pin(f"t{i}", 60)
    assert len(list(tmp_path.rglob("*.kv"))) == 6
    engine.check_invariants()
