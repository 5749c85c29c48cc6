"""Shards are atomic, typed by the schema, and aggregate into DuckDB-readable tables."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime, timezone

import duckdb
import pyarrow.parquet as pq
import pytest

from sweeper.core.schema import TABLES, TRIALS, arrow_schema, to_table
from sweeper.run.storage import ResultStore


def trial_row(trial_id: str, status: str = "ok", **extra):
    return {"trial_id": trial_id, "status": status, "model": "m", "batch_size": 1,
            "started_at": datetime.now(timezone.utc), **extra}


def test_shard_roundtrip_and_schema(tmp_path):
    store = ResultStore(str(tmp_path))
    store.write_shard("trials", "a", [trial_row("a", throughput_tok_s=12.5)])
    table = pq.read_table(tmp_path / "shards" / "trials" / "a.parquet")
    assert table.schema == arrow_schema("trials")
    assert table.num_rows == 1 and table.column("throughput_tok_s")[0].as_py() == 12.5
    assert table.column("energy_j")[0].as_py() is None  # exists, null until measured


def test_unknown_column_is_a_bug_not_a_silent_drop(tmp_path):
    with pytest.raises(KeyError, match="energy_kwh"):
        ResultStore(str(tmp_path)).write_shard("trials", "a", [trial_row("a", energy_kwh=1.0)])


def test_a_failed_write_leaves_no_visible_shard(tmp_path, monkeypatch):
    store = ResultStore(str(tmp_path))
    real_write = pq.write_table

    def write_then_crash(table, where, **kw):
        real_write(table, where, **kw)  # the bytes hit the disk...
        raise OSError("disk full")       # ...then the writer dies before the rename

    monkeypatch.setattr(pq, "write_table", write_then_crash)
    with pytest.raises(OSError):
        store.write_shard("trials", "a", [trial_row("a")])
    monkeypatch.undo()
    assert store.shard_paths("trials") == []
    assert list((tmp_path / "shards" / "trials").iterdir()) == []  # temp file cleaned up
    assert store.stored_trials() == {}


def test_readers_never_see_a_partial_shard(tmp_path):
    """Concurrent readers only ever see whole shards (rename is atomic)."""
    store = ResultStore(str(tmp_path))
    rows = [trial_row("x", throughput_tok_s=float(i)) for i in range(1)]
    errors = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            try:
                for path in store.shard_paths("trials"):
                    pq.read_table(path)
            except Exception as exc:  # a torn file would fail to parse
                errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    for i in range(200):
        store.write_shard("trials", f"t{i % 7}", rows)
    stop.set()
    t.join()
    assert not errors
    assert len(store.shard_paths("trials")) == 7


def test_rewrite_replaces_the_trials_shard(tmp_path):
    store = ResultStore(str(tmp_path))
    store.write_shard("trials", "a", [trial_row("a", status="failed", error="boom")])
    store.write_shard("trials", "a", [trial_row("a", status="ok")])
    assert store.stored_trials()["a"].status == "ok"
    assert store.aggregate()["trials"] == 1


def _committed(store: ResultStore, *ids: str) -> None:
    for tid in ids:
        store.write_shard("requests", tid, [{"trial_id": tid, "iteration": 0, "request_index": 0}])
        store.write_shard("trials", tid, [trial_row(tid)])


def _cut(path, keep: float = 0.5) -> bytes:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])
    return data


def test_the_index_is_never_believed_over_the_shard_it_describes(tmp_path):
    told = []
    store = ResultStore(str(tmp_path), on_quarantine=told.append)
    _committed(store, "a", "b", "c")
    assert set(store.stored_trials()) == {"a", "b", "c"}
    _cut(tmp_path / "shards" / "trials" / "b.parquet")  # indexed, then truncated
    # The next run's store finds the damage before anything is decided.
    store = ResultStore(str(tmp_path), on_quarantine=told.append)
    assert set(store.stored_trials()) == {"a", "c"}
    assert len(told) == 1 and "unreadable trials shard b.parquet" in told[0]
    assert [f.name.split(".parquet")[0] for f in (tmp_path / "quarantine" / "trials").iterdir()] == ["b"]
    again = ResultStore(str(tmp_path), on_quarantine=told.append)
    assert set(again.stored_trials()) == {"a", "c"} and len(told) == 1  # said once: the shard is aside


def test_a_store_reads_its_index_plan_and_listing_once_and_knows_what_it_wrote(tmp_path, monkeypatch):

    from sweeper.run.shards import ShardFiles
    from sweeper.run.trial_index import TrialIndex

    _committed(ResultStore(str(tmp_path)), "a", "b")
    ResultStore(str(tmp_path)).write_plan("s", ["a", "b", "c"])
    calls = {"index": 0, "listing": 0, "plan": 0}
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path=".": calls.__setitem__(
        "listing", calls["listing"] + str(path).startswith(str(tmp_path / "shards"))) or listdir(path))
    read, sizes = TrialIndex._read, ShardFiles.shard_sizes
    monkeypatch.setattr(TrialIndex, "_read", lambda self: calls.__setitem__("index", calls["index"] + 1) or read(self))
    monkeypatch.setattr(ShardFiles, "shard_sizes",
                        lambda self, kind: calls.__setitem__("listing", calls["listing"] + 1) or sizes(self, kind))
    from sweeper.core.plan_record import PlanRecord

    parse = PlanRecord.parse
    monkeypatch.setattr(PlanRecord, "parse", staticmethod(
        lambda text: calls.__setitem__("plan", calls["plan"] + 1) or parse(text)))
    stale = tmp_path / "shards" / "trials" / ".x.parquet.0123.tmp"  # a killed run's half-written shard
    stale.write_bytes(b"half")
    store = ResultStore(str(tmp_path))
    assert set(store.stored_trials()) == {"a", "b"} and store.planned_ids() == {"a", "b", "c"}
    assert store.remove_stale_temporaries() == 1 and not stale.exists()  # from that one listing
    _committed(store, "c")  # a trial this run wrote: in the view without another look
    assert set(store.stored_trials()) == {"a", "b", "c"} and store.plan_record() is not None
    store.aggregate()
    # One listing per table's directory, and one of shards/ itself for the index's cut rewrites.
    assert calls == {"index": 1, "listing": len(TABLES) + 1, "plan": 1}
    # The trials table it wrote, as it holds it: what the run's end shows, not read back.
    assert store.aggregated_trials is not None
    assert store.aggregated_trials.equals(pq.read_table(tmp_path / "trials.parquet", schema=arrow_schema("trials")))


def test_the_runs_best_table_comes_from_the_table_its_aggregation_holds(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    import sweeper.analysis.results as results_module
    from sweeper.console import print_best

    store = ResultStore(str(tmp_path))
    store.write_plan("s", ["a", "b"])
    for tid, batch, tok_s in (("a", 1, 10.0), ("b", 2, 30.0)):
        store.write_shard("trials", tid, [trial_row(tid, backend="noop", precision="fp32", input_len=8, output_len=4,
                                                    batch_size=batch, throughput_tok_s=tok_s)])
    store.aggregate()
    (tmp_path / "trials.parquet").unlink()  # had the table been read back, there would be none to read
    monkeypatch.setattr(results_module, "load_results", lambda *a, **k: pytest.fail("read the results back"))
    out = io.StringIO()
    print_best(Console(file=out, width=200), store)
    best = [line for line in out.getvalue().splitlines() if line.startswith("│ m ")]
    cells = [c.strip() for c in best[0].strip("│").split("│")] if len(best) == 1 else []
    assert cells[-1] == "b" and cells[3] == "2" and cells[6] == "30", out.getvalue()  # trial, batch, tok/s


@pytest.mark.parametrize("damage", ["truncate", "remove"])
def test_a_damaged_or_lost_shard_of_another_table_takes_its_trial_aside(tmp_path, damage):
    told = []
    store = ResultStore(str(tmp_path), on_quarantine=told.append)
    _committed(store, "a", "b")
    requests = tmp_path / "shards" / "requests" / "b.parquet"
    _cut(requests) if damage == "truncate" else requests.unlink()
    assert set(store.stored_trials()) == {"a"}  # b is incomplete: it runs again
    assert not (tmp_path / "shards" / "trials" / "b.parquet").exists()
    assert len(list((tmp_path / "quarantine" / "trials").iterdir())) == 1  # its row kept aside, not deleted
    assert len(told) == 1 and ("unreadable requests shard" if damage == "truncate" else "lost its requests") in told[0]
    assert store.aggregate(full=True)["trials"] == 1


def test_shards_the_index_lacks_or_knows_without_sizes_are_read_once_then_indexed(tmp_path):
    store = ResultStore(str(tmp_path))
    _committed(store, "a", "b")
    index = tmp_path / "shards" / "trials.index"
    index.write_text('{"trial_id": "a", "status": "failed", "reason": null}\n')  # an older sweeper's line
    _cut(tmp_path / "shards" / "requests" / "b.parquet")  # b is not indexed at all: checked whole
    assert {k: v.status for k, v in store.stored_trials().items()} == {"a": "ok"}
    lines = {d["trial_id"]: d for d in map(json.loads, index.read_text().splitlines()[1:])}
    assert lines["a"]["status"] == "ok" and set(lines["a"]["sizes"]) == {"trials", "requests"}
    assert set(ResultStore(str(tmp_path)).stored_trials()) == {"a"}  # b's trial stays aside: it runs again


@pytest.mark.parametrize("damage", [
    b"\xff\xfe\x00garbage\n",     # bytes no UTF-8 decoder takes, on a line of their own
    b"\x80",                        # one stray byte where the next line would begin
    "é".encode("latin-1"),          # text in another encoding
], ids=["binary-line", "stray-byte", "latin-1"])
def test_an_index_that_does_not_decode_is_rebuilt_from_the_shards_with_a_warning(tmp_path, monkeypatch, damage):
    store = ResultStore(str(tmp_path))
    _committed(store, "a", "b")
    store.write_shard("trials", "c", [trial_row("c", status="failed", error="boom")])
    index = tmp_path / "shards" / "trials.index"
    lines = index.read_bytes().splitlines(keepends=True)
    index.write_bytes(lines[0] + damage + b"".join(lines[1:]) + b"\x00" * 16)  # and a crash's zero bytes

    told: list[str] = []
    assert {k: v.status for k, v in ResultStore(str(tmp_path), on_quarantine=told.append).stored_trials().items()} \
        == {"a": "ok", "b": "ok", "c": "failed"}
    assert len(told) == 1 and "trials.index: undecodable bytes" in told[0] and "rebuilding it" in told[0], told
    rebuilt = [json.loads(line) for line in index.read_text(encoding="utf-8").splitlines()]  # whole, and UTF-8
    assert sorted(d["trial_id"] for d in rebuilt) == ["a", "b", "c"]
    assert all(set(d["sizes"]) == ({"trials", "requests"} if d["trial_id"] != "c" else {"trials"}) for d in rebuilt)

    # The next store believes the rebuilt index: no shard is read again, nothing is said.
    from sweeper.run.shards import ShardFiles

    monkeypatch.setattr(ShardFiles, "read_shards", lambda *a, **k: pytest.fail("a shard was read"))
    again = ResultStore(str(tmp_path), on_quarantine=told.append)
    assert set(again.stored_trials()) == {"a", "b", "c"} and len(told) == 1
    monkeypatch.undo()
    _committed(again, "d")  # and a trial committed after it is appended as usual
    assert set(ResultStore(str(tmp_path)).stored_trials()) == {"a", "b", "c", "d"}
    assert [json.loads(line)["trial_id"] for line in index.read_text().splitlines()][-1] == "d"


def _zero_a_page(path, column: int) -> None:
    """Zero the header of a column's first page: the footer still reads, that column does not."""
    chunk = pq.read_metadata(path).row_group(0).column(column)
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[start:start + 32] = bytes(32)
    path.write_bytes(bytes(data))


def _aggregated_store(tmp_path) -> dict[str, list[dict]]:
    store = ResultStore(str(tmp_path))
    _committed(store, "a", "b")
    store.write_plan("s", ["a", "b"])
    store.aggregate()
    return {kind: pq.read_table(tmp_path / f"{kind}.parquet").to_pylist() for kind in TABLES}


@pytest.mark.parametrize("damage", ["truncate", "empty", "remove"])
@pytest.mark.parametrize("kind", ["trials", "requests"])
def test_a_damaged_aggregate_is_not_up_to_date_and_the_next_aggregation_rebuilds_it(tmp_path, kind, damage):
    """What a resume with nothing to run asks (``up_to_date``) before it skips aggregating."""
    before = _aggregated_store(tmp_path)
    target = tmp_path / f"{kind}.parquet"
    assert ResultStore(str(tmp_path)).up_to_date()
    if damage == "remove":
        target.unlink()
    else:
        target.write_bytes(b"" if damage == "empty" else target.read_bytes()[:100])
    told: list[str] = []
    store = ResultStore(str(tmp_path), on_quarantine=told.append)
    assert not store.up_to_date()
    store.aggregate()
    assert {k: pq.read_table(tmp_path / f"{k}.parquet").to_pylist() for k in TABLES} == before
    if damage == "remove":
        assert told == []  # nothing there to call damaged: it is simply written again
    else:
        assert len(told) == 1 and f"{target}: not a readable Parquet table" in told[0], told
        assert "rebuilding it from the shards" in told[0]
    assert ResultStore(str(tmp_path)).up_to_date()


@pytest.mark.parametrize(("kind", "damage"), [("trials", "truncate"), ("trials", "page"), ("requests", "page")])
def test_an_in_place_update_over_a_damaged_aggregate_rebuilds_every_table(tmp_path, kind, damage):
    """A resume with work, the plan unchanged: the tables are updated in place from the shards
    written since, unless the previous table does not read, footer or pages."""
    _aggregated_store(tmp_path)
    target = tmp_path / f"{kind}.parquet"
    if damage == "page":  # the footer reads: found only as the rows are read
        _zero_a_page(target, column=0 if kind == "trials" else 3)
    else:
        target.write_bytes(target.read_bytes()[:100])
    told: list[str] = []
    store = ResultStore(str(tmp_path), on_quarantine=told.append)
    store.write_shard("trials", "b", [trial_row("b", status="failed", error="boom")])  # b ran again
    assert store.aggregate() == {"trials": 2, "requests": 2, "timeline": 0, "layers": 0, "stages": 0}
    assert {r["trial_id"]: r["status"] for r in pq.read_table(tmp_path / "trials.parquet").to_pylist()} == \
        {"a": "ok", "b": "failed"}
    assert sorted(pq.read_table(tmp_path / "requests.parquet").column("trial_id").to_pylist()) == ["a", "b"]
    assert len(told) == 1 and f"{target}: not a readable Parquet table" in told[0], told


def test_aggregate_writes_every_kind_readable_by_duckdb(tmp_path):
    store = ResultStore(str(tmp_path))
    for tid in ("a", "b"):
        store.write_shard("requests", tid, [{"trial_id": tid, "iteration": i, "request_index": 0,
                                              "ttft_s": 0.1 * i} for i in range(3)])
        store.write_shard("trials", tid, [trial_row(tid, throughput_tok_s=10.0)])
    counts = store.aggregate()
    assert counts == {"trials": 2, "requests": 6, "timeline": 0, "layers": 0, "stages": 0}
    con = duckdb.connect()
    n, avg = con.execute(f"SELECT count(*), avg(throughput_tok_s) FROM '{tmp_path}/trials.parquet'").fetchone()
    assert (n, avg) == (2, 10.0)
    assert con.execute(f"SELECT count(*) FROM '{tmp_path}/requests.parquet' WHERE trial_id='b'").fetchone()[0] == 3
    # an empty kind still aggregates to a typed, empty table
    assert pq.read_table(tmp_path / "timeline.parquet").schema == arrow_schema("timeline")


def test_old_shards_gain_new_columns_as_nulls(tmp_path):
    old = to_table("trials", [trial_row("old")]).drop_columns(["energy_j", "unstable"])
    (tmp_path / "shards" / "trials").mkdir(parents=True)
    pq.write_table(old, tmp_path / "shards" / "trials" / "old.parquet")
    table = ResultStore(str(tmp_path)).read_shards("trials")
    assert table.column("energy_j").to_pylist() == [None]


def test_aggregate_of_an_empty_directory_is_a_user_error(tmp_path):
    from sweeper.core.errors import ResultsError

    with pytest.raises(ResultsError, match="no trial shards"):
        ResultStore(str(tmp_path)).aggregate()


def test_schema_names_carry_units():
    unitless_ok = {"trial_id", "sweep", "model", "model_source", "model_location", "backend",
                   "precision", "batch_size", "input_len", "output_len", "dataset", "seed", "repeat",
                   "backend_options", "warmup_iters", "min_iters", "status", "reason", "error",
                   "started_at", "finished_at", "n_iterations", "n_requests", "output_tokens",
                   "energy_method", "unstable", "unstable_reason", "device", "device_name",
                   "gpu_uuids", "gpu_names", "hostname", "ray_node_id", "ray_gpu_ids", "max_iteration_cv",
                   "iteration_energy_cv", "iteration_throughput_cv",
                   "layer_profile", "layer_profile_status", "layer_profile_overhead",
                   "tensor_parallel", "fidelity", "fidelity_reference", "fidelity_kl",
                   "fidelity_top1", "fidelity_status", "compile_status", "mfu", "mbu", "flops_per_token",
                   "perplexity", "perplexity_tokens", "perplexity_status",
                   # serving mode: counts, shares, flags and names; request_rate is the sweep
                   # file's key (requests per second, as offered_rate_req_s says)
                   "mode", "arrival", "burstiness", "num_prompts", "request_rate", "max_concurrency",
                   "n_failed_requests", "max_concurrency_reached", "steady_batch", "mean_running_batch",
                   "saturated", "saturation_reason", "queue_growth", "slo_attainment", "request_energy_method",
                   # datasets and reply lengths: lengths are tokens (as input_len), shares are ratios
                   "dataset_sha256", "min_input_len", "max_input_len", "chat", "output_lengths", "prefix_len", "num_prefixes",
                   "input_len_mean", "output_len_mean", "output_len_p50", "output_len_p90",
                   "prompt_pad_share", "decode_idle_slot_share", "fidelity_method", "fidelity_reference_source",
                   # precision of the window: relative half-widths (ratios), a block count, a verdict
                   "target_rel_ci", "throughput_rel_ci95", "energy_per_token_rel_ci95", "ci_blocks",
                   "target_met",
                   # how the idle baseline was obtained: a flag
                   "idle_baseline_reused",
                   # the verdict: a bound on relative intervals (a ratio), the host-noise flag
                   "max_rel_ci", "noisy_host", "noisy_host_reason",
                   # serving: the client's own lateness verdict, a flag and its reason; how many
                   # processes sent the requests; the prefix cache's hit rate (a share of tokens)
                   "client_behind", "client_behind_reason", "client_processes", "prefix_cache_hit_rate",
                   # speculative decoding: counts of draft steps and tokens, a share, tokens per step
                   "spec_drafts", "spec_draft_tokens", "spec_accepted_tokens", "spec_acceptance_rate",
                   "spec_tokens_per_step",
                   # conversations: a flag, how earlier replies were sent, counts of conversations and turns
                   "conversations", "history", "n_conversations", "conversations_completed", "conversations_cut",
                   "turns_per_conversation",
                   # serving: the share of requests' energy spent in their prefills (a ratio)
                   "request_prefill_share", "request_prefill_from",
                   # the server backend: names, a command line, a path, process lists, a flag, a reason
                   "server_engine", "server_command", "server_url", "server_log", "gpu_processes",
                   "energy_exclusive", "energy_unmetered_reason",
                   # searches: ids, steps, the target share of requests within the SLO, parameters (JSON)
                   "capacity_id", "probe_step", "slo_attainment_target", "search_id", "search_step",
                   "search_params",
                   # scoring: the method (JSON), counts of replies, a share and its interval
                   "scoring", "n_scored", "n_correct", "n_questions", "n_truncated", "accuracy", "accuracy_ci95_low",
                   "accuracy_ci95_high", "likelihood_n_scored", "likelihood_accuracy", "likelihood_accuracy_ci95_low",
                   "likelihood_accuracy_ci95_high", "likelihood_accuracy_norm", "likelihood_status"}
    for col in TRIALS:
        # rates and per-token quantities carry their unit before the "per"
        if (col.name in unitless_ok or col.name.endswith("_version")
                or "_flop" in col.name or "_bytes_per_" in col.name):
            continue
        assert col.name.rsplit("_", 1)[-1] in {"s", "j", "kj", "w", "bytes"}, col.name


def test_the_next_run_removes_temporaries_a_killed_run_left(tmp_path):
    store = ResultStore(str(tmp_path))
    store.write_shard("trials", "a", [trial_row("a")])
    left = [tmp_path / "shards" / "trials" / ".b.parquet.0123.tmp", tmp_path / "shards" / "requests" / ".c.tmp",
            tmp_path / "shards" / ".trials.index.4567.tmp"]  # the index's rewrite, cut
    for path in left:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"partial")
    assert store.remove_stale_temporaries() == 3
    assert not any(p.exists() for p in left) and (tmp_path / "shards" / "trials" / "a.parquet").exists()


def _trial_rows(store: ResultStore, ids: range, value: float) -> None:
    for i in ids:
        tid = f"t{i:04d}"
        store.write_shard("requests", tid, [{"trial_id": tid, "iteration": 0}, {"trial_id": tid, "iteration": 1}])
        store.write_shard("trials", tid, [{"trial_id": tid, "status": "ok", "throughput_tok_s": value}])


def _tables(root) -> dict[str, list]:
    return {kind: sorted(pq.read_table(root / f"{kind}.parquet").to_pylist(), key=str)
            for kind in ("trials", "requests")}


def test_a_run_adds_to_the_aggregates_reading_only_new_shards(tmp_path, monkeypatch):
    store = ResultStore(str(tmp_path))
    _trial_rows(store, range(40), 1.0)
    store.write_plan("s", [f"t{i:04d}" for i in range(50)])
    store.aggregate()
    os.utime(tmp_path / "trials.parquet", (1, 1))  # older than anything written from here on
    for kind in ("requests", "timeline", "layers", "stages"):
        os.utime(tmp_path / f"{kind}.parquet", (1, 1))
    for p in (tmp_path / "shards").rglob("*.parquet"):
        os.utime(p, (0.5, 0.5))
    os.utime(tmp_path / "plan.json", (0.5, 0.5))
    _trial_rows(store, range(3, 4), 2.0)  # a re-run trial
    _trial_rows(store, range(40, 45), 3.0)  # new ones
    read: list[str] = []
    from sweeper.run.shards import ShardFiles

    real = ShardFiles._read_batch
    monkeypatch.setattr(ShardFiles, "_read_batch",
                        lambda self, kind, paths, *a: read.extend(paths) or real(self, kind, paths, *a))
    counts = store.aggregate()
    assert counts["trials"] == 45 and counts["requests"] == 90
    assert {os.path.basename(p) for p in read} == {f"t{i:04d}.parquet" for i in (3, 40, 41, 42, 43, 44)}
    incremental = _tables(tmp_path)
    assert {r["trial_id"]: r["throughput_tok_s"] for r in incremental["trials"]}["t0003"] == 2.0
    store.aggregate(full=True)  # what a rebuild from every shard gives
    assert _tables(tmp_path) == incremental


def test_aggregates_are_rebuilt_when_the_plan_changed_or_a_shard_is_gone(tmp_path, monkeypatch):
    store = ResultStore(str(tmp_path))
    _trial_rows(store, range(10), 1.0)
    store.write_plan("s", [f"t{i:04d}" for i in range(10)])
    store.aggregate()
    stored = {f"t{i:04d}" for i in range(10)}
    from sweeper.run.aggregation import Aggregation

    aggregation = Aggregation(store.files, stored)
    assert aggregation._changed_since_aggregate(stored, stored) is not None
    # a trial the aggregate holds whose shard went away (quarantined, moved): no update in place
    assert aggregation._changed_since_aggregate(stored - {"t0001"}, stored - {"t0001"}) is None
    time.sleep(0.01)
    store.write_plan("s", [f"t{i:04d}" for i in range(8)])  # another plan: another answer
    assert aggregation._changed_since_aggregate(stored, stored) is None
    assert store.aggregate()["trials"] == 8
